"""runtime=threads for the synchronous rules with local steps between exchanges (the
center family: sync_easgd, sync_measgd, diloco, local_sgd, lookahead): each worker's
local steps in a thread of its own, each round closed on the workers' real arrivals.

A round is the exchange that ends a tick t (`Rule.exchanges_after(t)`). Its workers
start together, from the last round's result or from a cut (below); each thread runs
its worker's steps up to t - 1, each the rule's own step at a tick without an
exchange (easgd.steps.build_worker_step) on the worker's device, a straggler sleeping
after each (c_i/c_min - 1) times the step's measured seconds, as the
parameter-server rules' threads do (easgd.train.runtimes.threads.workers); then it
arrives. The round closes as its policy (easgd.sim.rounds) says, on the real arrival
times: with m the quorum and D the deadline, once m workers arrived and either all
did or D seconds passed since the first arrival (torchft's lighthouse); with no
quorum, once all did. The workers that arrived by then are its members. Under
`outer.missed=drop` a worker still stepping stops at the end of its step (a
straggler's sleep ends at the close) and is dropped; under `late` it finishes its
steps and arrives late.

The round's last tick is the simulated runtime's own tick program
(easgd.steps.build_train_step), every worker's step t and the exchange at once,
with the round's masks (easgd.rules.quorum), run once every worker that is to
arrive has: a member and a late worker step from their rows (the late worker's
message is held for the next round, as the program holds it), a dropped worker
from the center, which the program's heal overwrites with the round's result (its
steps of the round are lost). So under `late` the members' next steps wait for the
round's late workers here, as the next round would wait for their messages: late
saves no time in this runtime (the timing model's members go on at the close). The
training loss and accuracy count the steps whose work reached a round: a dropped
worker's steps in the round are left out (a cut's steps, taken before anyone was
dropped, count); the round's last step is the program's, whose values are its
mean over every worker, a dropped one's taken at the center. With
outer.comm_period=1 the arrivals carry no step (a round's one step is its last,
in the program): the round closes on the order the threads come in.

Cuts. The loop's logs, evaluations and checkpoints see consistent cuts: at a step s
inside a round every worker takes its steps up to s (no round closes), and the round
goes on from there. A run resumed from a checkpoint inside a round starts from that
cut, as the run that never stopped went on from it; a preemption notice stops the
workers at the end of their round or at the next scheduled cut, whichever comes
first, a point every run of the schedule reaches.

The record. Each round is a line of WORKDIR/trace.jsonl (easgd.train.runtimes.trace:
its members and late workers, each arrival and its close, in seconds after its first
arrival).
`cluster.replay=<trace>` under runtime=threads replays it: each round waits for the
members it names, whatever their pace, its late workers take all their steps and its
dropped ones none, under the schedule of cuts that recorded it; the programs,
their inputs and their order are the run's, so the replay ends with the run's bits
at every checkpoint (its times are its own).
"""

import concurrent.futures
import dataclasses
import math
import threading
import time

import jax
import numpy as np
from absl import logging
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from easgd import steps
from easgd.data import augment as augment_lib
from easgd.errors import WorkerFailed
from easgd.infra.compile import compile_program
from easgd.rules import AXIS, Rule, TrainState, model_state
from easgd.sim import rounds, ticks, timing
from easgd.train import loop
from easgd.train import setup as setup_lib
from easgd.train.runtimes import trace as trace_lib
from easgd.train.runtimes.rule_runtime import RuleReports
from easgd.train.runtimes.threads.layout import Layout
from easgd.train.runtimes.threads.live_clock import RoundsClock


def with_rounds(rule: Rule) -> Rule:
  """`rule` as runtime=threads and runtime=ray run it: every round's program takes the
  round's members, also one that waits for every worker, so that a worker whose process
  was lost (runtime=ray) is absent, not a worker at the center. With every worker in,
  the program is the rule's, bit for bit (tests/rules/test_quorum.py)."""
  if rule.round_policy is None:
    rule.round_policy = rounds.Policy(rule.hyper.num_workers, math.inf, "drop")
  return rule


class Gate:
  """One round's closing, on its workers' arrivals: by its policy (`policy`; None:
  every worker), or, replayed, once the members it recorded arrived."""

  def __init__(
    self,
    num_workers: int,
    policy: rounds.Policy | None,
    replayed: tuple | None = None,
    closes: bool = True,
  ):
    """replayed: the round's (members, late) as recorded; closes: whether a round closes
    (False: the steps before a cut)."""
    self.cond = threading.Condition()
    self.closes = closes
    self.policy = policy
    # Under outer.missed=late a worker that misses the round steps on and arrives late.
    self.keeps_late = policy is not None and policy.missed == "late"
    self.arrivals: list[float | None] = [None] * num_workers
    self.replayed = replayed is not None
    self.members = None if replayed is None else np.array(replayed[0], bool)
    self.late = np.zeros(num_workers, bool) if replayed is None else np.array(replayed[1], bool)
    self.closed_at: float | None = None
    self.gone: set[int] = set()  # workers whose process was lost (runtime=ray)
    self.failure: WorkerFailed | None = None
    # Set at the close under drop (a dropped straggler's sleep ends), or at a failure.
    self.woken = threading.Event()

  def out(self, worker: int) -> bool:
    """Whether `worker` missed the round (it then stops stepping)."""
    if self.failure is not None:
      return True
    if self.replayed:
      return not (self.members[worker] or self.late[worker])
    return self.closed_at is not None and not self.members[worker] and not self.keeps_late

  def pause(self, seconds: float) -> None:
    """A straggler's sleep, which the round's close ends under drop."""
    self.woken.wait(seconds)

  def arrive(self, worker: int) -> None:
    with self.cond:
      self.arrivals[worker] = time.perf_counter()
      self.cond.notify_all()

  def leave(self, worker: int) -> None:
    """`worker` will not arrive (its process was lost): the round waits for the others."""
    with self.cond:
      self.gone.add(worker)
      self.cond.notify_all()

  def fail(self, failure: WorkerFailed) -> None:
    with self.cond:
      self.failure = self.failure or failure
      self.woken.set()
      self.cond.notify_all()

  def _due(self) -> float | None:
    """The perf_counter time at which the round closes given the arrivals so far
    (-inf: now; None: not until another arrives)."""
    arrived = [a for a in self.arrivals if a is not None]
    if self.replayed:
      everyone = all(self.arrivals[j] is not None for j in np.flatnonzero(self.members))
      return -math.inf if everyone else None
    # A round waits for no more workers than are alive.
    alive = len(self.arrivals) - len(self.gone)
    if len(arrived) >= alive:
      return -math.inf
    if self.policy is None:
      return None
    policy = dataclasses.replace(self.policy, count=min(self.policy.count, alive))
    return policy.due(arrived, alive)

  def close(self) -> np.ndarray:
    """Waits until the round closes; returns its members (bool [P]). Raises the first
    worker's failure."""
    with self.cond:
      while True:
        if self.failure is not None:
          raise self.failure
        due = self._due()
        now = time.perf_counter()
        if due is not None and now >= due:
          break
        self.cond.wait(None if due is None or math.isinf(due) else due - now)
      if not self.replayed:
        # Before closed_at: a worker that sees the round closed (`out`) reads them.
        self.members = np.array([a is not None for a in self.arrivals])
      self.closed_at = time.perf_counter()
      if not self.keeps_late:
        self.woken.set()  # a late worker sleeps on: it is as slow as before
      if not self.members.any():
        raise WorkerFailed("a round closed without a worker: every worker's process was lost")
      return self.members.copy()

  def missed(self, stepped: np.ndarray) -> np.ndarray:
    """The round's late workers, once every worker's steps are done (`stepped`: those
    that took all theirs): under outer.missed=late, those that finished after the close
    (or as the trace recorded)."""
    if self.replayed:
      return self.late.copy()
    return (stepped & ~self.members) if self.keeps_late else np.zeros_like(stepped)

  def record(self) -> tuple[list, float]:
    """(each worker's arrival, the close), in seconds after the first arrival."""
    with self.cond:
      first = min(a for a in self.arrivals if a is not None)
      return [None if a is None else a - first for a in self.arrivals], self.closed_at - first


@dataclasses.dataclass
class Work:
  """What a worker's thread did in a segment: its row at the end (None if it missed
  the round), each step's loss and accuracy, and its failure."""

  row: TrainState | None
  losses: list[float]
  accuracies: list[float]
  failure: WorkerFailed | None = None


class RoundsTrainee(RuleReports):
  """The loop's trainee for a synchronous rule under runtime=threads (the module
  docstring says how it runs)."""

  def __init__(
    self,
    setup: setup_lib.Setup,
    rule: Rule,
    state: TrainState,
    cluster: timing.Cluster,
    sent_bytes: float,
    clock_state: dict | None,
    resumed_at: int | None,
    replayed: trace_lib.RoundsReplay | None,
  ):
    config = setup.config
    clock = RoundsClock(config.workers)
    if clock_state is not None:
      clock.load_state_dict(clock_state)
    # First: a resumed run whose trace is missing or short stops here, having written nothing.
    keep = None if clock_state is None else clock.events
    self.trace = trace_lib.Writer(setup.workdir, config, keep)
    super().__init__(setup, rule, clock, resumed_at)
    with_rounds(rule)
    self.replayed = replayed
    self.segments = 0  # the segments of steps run so far (a cut's or a round's)
    self.schedule = loop.Schedule.from_config(config.run)
    self.sent_bytes = sent_bytes
    self.num_workers = config.workers
    self.layout = Layout(setup.mesh, config.workers)
    self.at = self._loop_step = int(jax.device_get(state.step))
    self.round_start = self.at
    while self.round_start > 0 and not rule.exchanges_after(self.round_start - 1):
      self.round_start -= 1
    mean_times = cluster.mean_step_times(config.workers)
    self.delay_factor = mean_times / mean_times.min() - 1.0
    self._set(state)
    self._compile(setup, state)
    self.pool = concurrent.futures.ThreadPoolExecutor(config.workers, "worker")

  def _paced(self) -> bool:
    return True  # the workers' steps come one by one (add_local_steps)

  # Layout: the loop's state <-> one row per worker, each on its device.

  def _set(self, state: TrainState) -> None:
    self._state = state
    shared = (state.step, state.rng, state.center, state.center_opt)
    on = {device: Layout.on(shared, device) for device in self.layout.devices}
    workers, worker_opt, worker_steps = (
      self.layout.rows(tree) for tree in (state.workers, state.worker_opt, state.worker_steps)
    )
    self.rows = []
    for j in range(self.num_workers):
      step, rng, center, center_opt = on[self.layout.device_of(j)]
      self.rows.append(
        TrainState(step, rng, center, center_opt, workers[j], worker_opt[j], worker_steps[j])
      )

  def _stacked(self, rows: list[TrainState], step: int) -> TrainState:
    state = self._state
    return TrainState(
      step=jax.device_put(np.int32(step), NamedSharding(self.setup.mesh, P())),
      rng=state.rng,
      center=state.center,  # no step between rounds moves it
      center_opt=state.center_opt,
      workers=self.layout.stacked([row.workers for row in rows]),
      worker_opt=self.layout.stacked([row.worker_opt for row in rows]),
      worker_steps=self.layout.stacked([row.worker_steps for row in rows]),
    )

  @property
  def state(self) -> TrainState:
    """The training state at the last cut or round."""
    return self._state

  def _compile(self, setup: setup_lib.Setup, state: TrainState) -> None:
    """The workers' steps (`_start_workers`), and the round's tick program over the mesh."""
    config = setup.config
    augment = augment_lib.get(config.data.augment)
    self.images = self.layout.rows(setup.train_images)
    self.labels = self.layout.rows(setup.train_labels)
    self._start_workers(setup, augment)
    program = steps.build_train_step(
      self.rule, setup.loss_fn, setup.mesh, state, config.data.batch_size, augment, donate=False
    )
    empty = self.rule.tick_inputs(ticks.Tick.empty(self.num_workers))
    lowered = program.lower(state, setup.train_images, setup.train_labels, empty)
    self.exchange = compile_program(lowered, setup.platform)

  def _start_workers(self, setup: setup_lib.Setup, augment) -> None:
    """Each device's worker step, compiled here (the workers' threads run it)."""
    config, layout, rule = setup.config, self.layout, self.rule
    self.index = [
      jax.device_put(np.array([j], np.int32), layout.device_of(j)) for j in range(self.num_workers)
    ]
    empty = rule.tick_inputs(ticks.Tick.empty(self.num_workers))
    self.empty_tick = {device: jax.device_put(empty, device) for device in layout.devices}
    self.local = {}
    for d, device in enumerate(layout.devices):
      j = d * layout.per_device
      mesh = Mesh(np.array([device]), (AXIS,))
      program = steps.build_worker_step(
        rule, setup.loss_fn, mesh, self.rows[j], config.data.batch_size, augment
      )
      args = (self.rows[j], self.images[j], self.labels[j], self.index[j], self.empty_tick[device])
      self.local[device] = compile_program(program.lower(*args), setup.platform)

  # The workers' side.

  def _work(self, j: int, start: int, end: int, gate: Gate) -> Work:
    """Worker j's steps start, ..., end - 1 from its row, then (with a round) its arrival."""
    device = self.layout.device_of(j)
    program, row, step = self.local[device], self.rows[j], start
    data = (self.images[j], self.labels[j], self.index[j], self.empty_tick[device])
    losses, accuracies = [], []
    try:
      while step < end:
        if gate.out(j):
          return Work(None, losses, accuracies)
        began = time.perf_counter()
        row, values = program(row, *data)
        loss, accuracy = jax.device_get((values["loss"], values["accuracy"]))
        if self.delay_factor[j] > 0:
          gate.pause(self.delay_factor[j] * (time.perf_counter() - began))
        # The step's metrics are means over the run's P workers, of which it is one.
        losses.append(float(loss) * self.num_workers)
        accuracies.append(float(accuracy) * self.num_workers)
        step += 1
      gate.arrive(j)
      return Work(row, losses, accuracies)
    except BaseException as error:  # noqa: BLE001 (any failure stops the run, named)
      message = str(error).splitlines()[0] if str(error) else ""
      failure = WorkerFailed(
        f"worker {j} failed at its local step {step}: {type(error).__name__}: {message}"
      )
      gate.fail(failure)
      return Work(None, losses, accuracies, failure)

  def _closed(self, gate: Gate, members: np.ndarray | None) -> None:
    """The round closed with `members` (None: it failed): the others stop (here, the
    gate's `out` stops their threads)."""
    del gate, members

  def _gone(self, start: int) -> set[int]:
    """The workers gone for good (runtime=ray's cluster.on_worker_loss=continue), who
    take no step from tick `start` on: the run's, or the replayed trace's."""
    if self.replayed is not None:
      for j, tick in sorted(self.replayed.gone.items()):
        if tick <= start and j not in self.clock.gone:
          self.clock.gone.append(j)
          self.trace.gone(j, tick)  # the replay's trace replays too
          self.clock.events += 1
    return set(self.clock.gone)

  def _segment(self, end: int, exchange: bool) -> dict[str, list[float]]:
    """Every worker's steps from the cut up to `end`; with `exchange`, then the round
    that ends tick `end` (the state after it is at end + 1). Returns the steps' values."""
    began, start, count = time.perf_counter(), self.at, self.num_workers
    self.segments += 1
    recorded = None
    if exchange and self.replayed is not None:
      recorded = self.replayed.rounds.get(end)
      if recorded is None:
        raise WorkerFailed(f"cluster.replay's trace has no round at tick {end}")
    gate = Gate(count, self.rule.round_policy if exchange else None, recorded, closes=exchange)
    gone = self._gone(start)
    for j in gone:
      gate.leave(j)
    futures = {
      j: self.pool.submit(self._work, j, start, end, gate) for j in range(count) if j not in gone
    }
    try:
      members = np.ones(count, bool)
      if exchange:
        try:
          members = gate.close()
        except BaseException as error:
          if not isinstance(error, WorkerFailed):  # e.g. an interrupt: the workers stop too
            gate.fail(WorkerFailed(f"the round at tick {end} was interrupted"))
          self._closed(gate, None)
          raise
        self._closed(gate, members)
    finally:
      done = [futures[j].result() if j in futures else Work(None, [], []) for j in range(count)]
    failure = next((work.failure for work in done if work.failure is not None), None)
    if failure is not None:
      raise failure
    late = gate.missed(np.array([work.row is not None for work in done])) if exchange else None
    # The steps whose work reaches a round: the members' and, under late, the late workers'.
    reached = members if late is None else members | late
    taken = [work for j, work in enumerate(done) if reached[j]]
    values = {
      "loss": [value for work in taken for value in work.losses],
      "accuracy": [value for work in taken for value in work.accuracies],
    }
    # A worker that took no step (gone for good, at a cut) keeps its row.
    rows = [
      work.row if reached[j] and work.row is not None else self.rows[j]
      for j, work in enumerate(done)
    ]
    if exchange:
      self._round(end, rows, members, late, gate, values)
    else:
      self._set(self._stacked(rows, end))
      self.at = end
    # A worker gone for good took no step since: the program's heal counts them.
    counts = np.array(jax.device_get(self._state.worker_steps))
    for j in self.clock.gone:
      counts[j] = self.clock.worker_steps[j]
    self.clock.worker_steps[:] = counts
    self.clock.time += time.perf_counter() - began
    self.totals.add_steps(sum(len(work.losses) for work in done))
    return values

  def _round(
    self, end: int, rows: list, members: np.ndarray, late: np.ndarray, gate: Gate, values: dict
  ) -> None:
    """The round's last tick: every worker's step `end` and the exchange, in one program.
    Its late workers' messages are held for the next round (the program holds them)."""
    count = self.num_workers
    dropped = ~members & ~late
    for j in np.flatnonzero(dropped):
      # A dropped worker steps from the center, at the round's step: the program's heal
      # overwrites what it computes, and its values count nowhere. (Its optimizer's
      # state and error feedback's residual are its own, which heal replaces and a
      # round alone changes.)
      # Statistics kept local (outer.batch_stats=local) stay its own, as the reset keeps them.
      row = rows[j]
      center = jax.tree.map(lambda leaf: leaf[None], row.center)
      if model_state.has_stats(center) and not self.rule.hyper.average_stats:
        center = dict(center, **{model_state.STATS: row.workers[model_state.STATS]})
      steps_now = jax.device_put(np.array([end], np.int32), self.layout.device_of(j))
      rows[j] = row.replace(workers=center, worker_steps=steps_now)
    tick = ticks.Tick.empty(count)
    tick.round = rounds.Round(members, late, dropped, self.clock.held.copy())
    state, step_values = self.exchange(
      self._stacked(rows, end),
      self.setup.train_images,
      self.setup.train_labels,
      self.rule.tick_inputs(tick),
    )
    loss, accuracy = jax.device_get((step_values["loss"], step_values["accuracy"]))
    values["loss"] += [float(loss)] * count  # the mean over every worker's step
    values["accuracy"] += [float(accuracy)] * count
    self.totals.add_steps(count)
    self._set(state)
    clock = self.clock
    # A worker gone for good is not dropped from its rounds: it is not there.
    gone = np.isin(np.arange(count), list(self.clock.gone))
    counted = rounds.Round(members, late, dropped & ~gone, tick.round.held)
    clock.round_totals.add(counted, end + 1 - self.round_start)
    sent = members | late  # a late worker sends its message too, on arrival
    clock.requests += sent
    clock.bytes_sent += sent * self.sent_bytes
    clock.held = late
    arrivals, closed = gate.record()
    self.trace.round(end, members.tolist(), late.tolist(), arrivals, closed)
    clock.events += 1
    self.at = self.round_start = end + 1

  # The loop's side.

  def step(self):
    step = self._loop_step = self._loop_step + 1
    if self.rule.exchanges_after(step - 1):
      return self._segment(step - 1, exchange=True), None
    if self.schedule.stops_at(step):
      return self._segment(step, exchange=False), None
    # The workers take this tick's steps with the round's (or at the next cut).
    return {"loss": [], "accuracy": []}, None

  def add(self, values, context) -> np.ndarray:
    del context
    return self.add_local_steps(values["loss"], values["accuracy"])

  def stop_at(self, step):
    """A preemption notice after the loop's `step`: the workers go on to the first point
    every run of this schedule stops at, the end of the round or the next scheduled
    stop, whichever comes first, and stop there; a resume then goes on as the run that
    never stopped did."""
    if self.at == step:
      return step, None
    stop = self.schedule.next_stop(step)
    for end in range(step - 1, stop):
      if self.rule.exchanges_after(end):
        values, stop = self._segment(end, exchange=True), end + 1
        break
    else:
      values = self._segment(stop, exchange=False)
    self._loop_step = stop
    logging.info("stopping at the consistent cut after step %d", stop)
    return stop, values

  def save(self, divergence):
    del divergence  # every step's loss was checked as the loop added it
    self.trace.sync()
    self.setup.checkpointer.save(self._state, self.clock.state_dict(), self.setup.config)

  def finish(self):
    self.trace.end(self.clock.events, self.at)
    super().finish()

  def close(self):
    self.pool.shutdown(wait=True)
    self.trace.close()
    super().close()
