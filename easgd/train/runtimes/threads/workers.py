"""The workers of runtime=threads: a host thread each, and the master they share.

Each worker's thread loops over its own local steps, dispatching them to its
own device and waiting for nobody. The center x~ (and the master's
optimizer state) lives on the mesh's first device; a request copies the
worker's row there, runs the master's operation, and copies the answer back
(real device-to-device transfers). The master is not a thread: a request is
served by the requesting worker's thread, under the rule's discipline:
  * fcfs (Async EASGD / MEASGD / SGD / MSGD, Downpour): one request at a time
    under the master lock, in the order the lock is taken;
  * round_robin (original EASGD): as fcfs, and worker i's k-th request also
    waits for worker i-1's k-th (a turn passed round the workers);
  * hogwild: no lock over a request. Its READ (the increment from the x~ it
    sees, and the worker's own update) and its WRITE (x~ <- x~ + increment)
    are two operations, each atomic; any other request's READ or WRITE may
    fall between them, so requests that overlap read the same x~ and all
    their increments are added. (A WRITE adds a whole tree at once, never
    torn: no increment is lost, as in the simulated runtime.)
A thread per worker, not per device: workers that share a device then share
it as programs queued on it, as processes sharing a GPU do, and no worker
waits for another's request to be answered before it computes.

Every event (a local step, a master operation) is placed into ticks as it
commits, by the simulated runtime's packer (easgd.sim.events), and written
to the trace (easgd.train.runtimes.trace). A worker commits only events that fall
in a tick <= `limit`; it waits ("parks") before the next one. When every
worker is parked the state is a consistent cut of that tick: every worker
between two steps, the master idle (easgd.train.runtimes.threads.runtime uses it).

Stragglers: cluster.speed_spread and cluster.stragglers become real delays
(a worker c_i/c_min times slower than the fastest sleeps (c_i/c_min - 1)
times its measured step after each step); the other timing fields describe
a network and a master that this runtime measures instead.

Two-tier servers (outer.two_tier, easgd.rules.tiers): a worker's request is
served on its group's center (round robin: in its group's own turn), and the
thread of the worker whose request is its group's K-th since the last merge
sends at once; a thread per group server then carries the send to the global
server (APPLY) and the reply back (MERGE), parking at the limit as the workers
do. Every server's operation runs under the one lock, as the one master's do:
they all run on the center's device, one after another anyway, and the order
they take is the trace's.
"""

import dataclasses
import threading
import time
from typing import Any

import jax
import numpy as np
from absl import logging

from easgd.errors import WorkerFailed
from easgd.rules import Rule
from easgd.sim import clocks, timing
from easgd.train.runtimes import trace as trace_lib
from easgd.train.runtimes.threads import live_clock
from easgd.train.runtimes.threads.live_clock import LiveClock

# Seconds between the loop's checks for a failed worker while it waits.
POLL = 0.05


@dataclasses.dataclass
class Rows:
  """The training state split for the threads: one row per worker on its device, and
  the center on the first device."""

  workers: list  # each worker's parameters (a tree of [1, ...] leaves), on its device
  worker_opt: list  # each worker's optimizer state, on its device
  images: list  # each worker's training partition [1, n, H, W, C], on its device
  labels: list  # and its labels [1, n]
  steps: list[int]  # each worker's local steps so far
  center: Any  # the center's tree, on the first device
  center_opt: Any  # the master's optimizer state (two tiers: theirs), on the first device
  rng_on: dict  # the run's key on each device


@dataclasses.dataclass(frozen=True)
class TwoTier:
  """What the threads need of two-tier servers (outer.two_tier): the groups' sizes, K,
  the model's bytes (a send's and a reply's) and which group servers reach the
  global server between groups."""

  groups: tuple[int, ...]
  every: int
  model_bytes: float
  between: tuple[bool, ...]

  @classmethod
  def of(cls, rule: Rule, cluster: timing.Cluster, model_bytes: float) -> "TwoTier | None":
    hyper = rule.hyper
    if not hyper.two_tier:
      return None
    groups = cluster.group_sizes(hyper.num_workers)
    between = tuple(g != cluster.server_group for g in range(len(groups)))
    return cls(tuple(groups), hyper.global_every, model_bytes, between)


class _Stop(Exception):
  """Unwinds a worker thread when the run ends."""


class Workers:
  """The workers' rows on their devices, the center on its device, the master's
  locks, and a thread per worker (`start`)."""

  def __init__(
    self,
    rule: Rule,
    rows: Rows,
    devices: list,
    programs: tuple,
    clock: LiveClock,
    trace: trace_lib.Writer,
    sent_bytes: float,
    delay_factor: np.ndarray,
    periods: tuple[int, ...],
    cut: int,
    tiers: TwoTier | None = None,
  ):
    """programs: (local step per device, master operation[, a server's operation]) as
    compiled; periods: each worker's local steps between two of its requests
    (`rule.periods`); tiers: two-tier servers' settings (None: one master)."""
    self.rule, self.clock, self.trace = rule, clock, trace
    self.num_workers = len(rows.workers)
    self.devices, self.center_device = devices, devices[0]
    self.per_device = self.num_workers // len(devices)
    self.workers, self.worker_opt = rows.workers, rows.worker_opt
    self.images, self.labels, self.steps = rows.images, rows.labels, rows.steps
    self.center, self.center_opt, self.rng_on = rows.center, rows.center_opt, rows.rng_on
    self.local, self.master_op, *server_op = programs
    self.server_op = server_op[0] if server_op else None
    self.sent_bytes, self.delay_factor, self.periods = sent_bytes, delay_factor, periods
    self.cond = threading.Condition()
    self.master = threading.Lock()  # held while an operation runs
    self.tiers = tiers
    self.limit = cut - 1  # the last tick events may be committed to
    groups = len(tiers.groups) if tiers else 0
    # The limit each worker (then each group server's sender) waits at.
    self.parked_at: list[int | None] = [None] * (self.num_workers + groups)
    self.stopping = False
    self.failure: WorkerFailed | None = None
    self.compute_seconds = [0.0] * self.num_workers  # each worker's latest local step
    self._paused = 0.0  # seconds parked at cuts (evaluations, checkpoints)
    self._paused_at: float | None = None
    self._taken: dict[str, list[float]] = {"loss": [], "accuracy": []}
    self._before: list = [None] * self.num_workers  # `_snapshot`
    self._started = 0.0  # when `start` started the threads
    self._time_at_start = clock.time
    self.threads = [
      threading.Thread(target=self._worker, args=(j,), name=f"worker-{j}", daemon=True)
      for j in range(self.num_workers)
    ]
    if tiers is not None:
      self.group_of = [int(g) for g in timing.group_of(tiers.groups, self.num_workers)]
      self.members = [
        [j for j in range(self.num_workers) if self.group_of[j] == g] for g in range(groups)
      ]
      # Each group server's state, and the global server's optimizer state (the
      # center is x~): they change under their own servers' locks.
      self.group_states = list(self.center_opt["groups"])
      self.global_opt = self.center_opt["global"]
      self.threads += [
        threading.Thread(target=self._uplink, args=(g,), name=f"group-server-{g}", daemon=True)
        for g in range(groups)
      ]

  def start(self) -> None:
    self._started = time.perf_counter()
    for thread in self.threads:
      thread.start()

  def stop(self) -> None:
    """Ends every worker's thread (each finishes the program it is in)."""
    with self.cond:
      self.stopping = True
      self.cond.notify_all()
    for thread in self.threads:
      if thread.is_alive():
        thread.join(timeout=60)
    alive = [thread.name for thread in self.threads if thread.is_alive()]
    if alive:
      logging.warning("%s still running after 60 s (a program that does not end)", alive)

  # The loop's side (call with self.cond held).

  def raise_limit(self, limit: int) -> None:
    """Lets the workers commit events up to tick `limit`."""
    if limit > self.limit:
      if self._paused_at is not None:
        self._paused += time.perf_counter() - self._paused_at
        self._paused_at = None
      self.limit = limit
      self.cond.notify_all()

  def wait(self, done) -> None:
    """Waits until `done()`, raising a worker's failure."""
    while not done():
      if self.failure is not None:
        raise self.failure
      self.cond.wait(POLL)
    if self.failure is not None:
      raise self.failure

  def parked(self) -> bool:
    workers = self.parked_at[: self.num_workers]
    servers = [
      at == self.limit or self.clock.phase[g] == live_clock.IDLE
      for g, at in enumerate(self.parked_at[self.num_workers :])
    ]
    return all(at == self.limit for at in workers) and all(servers)

  def _center_of(self, j: int):
    """The center worker j restarts from: the one master's, or its group server's."""
    return self.center if self.tiers is None else self.group_states[self.group_of[j]]["center"]

  def center_opt_now(self):
    """The master's optimizer state as the tick program holds it (two tiers: theirs)."""
    if self.tiers is None:
      return self.center_opt
    return {"global": self.global_opt, "groups": tuple(self.group_states)}

  def wait_for_cut(self) -> None:
    """Until every worker is parked at the limit: then the state is the cut of that
    tick, and the clock stops until the limit rises."""
    self.wait(self.parked)
    self._paused_at = time.perf_counter()

  def _last(self, j: int) -> int:
    """The tick of worker j's latest event."""
    return self.clock.packer.index_of(j, True, False) - 1

  def wait_for_leader(self, tick: int) -> None:
    """Until some worker has reached tick `tick`, or every worker is parked."""
    self.wait(lambda: max(map(self._last, range(self.num_workers))) >= tick or self.parked())

  def lower_limit(self) -> None:
    """Brings the limit down to one tick past the leading worker: no event has been
    committed past it, and none in progress can land past it (a worker's next
    event falls at most one tick past its last, or at the last operation's)."""
    self.limit = min(self.limit, max(map(self._last, range(self.num_workers))) + 1)
    self.cond.notify_all()

  def take_local_steps(self) -> dict[str, list[float]]:
    """The loss and accuracy of each local step committed since the last call."""
    taken, self._taken = self._taken, {"loss": [], "accuracy": []}
    return taken

  # The workers' side.

  def _worker(self, j: int) -> None:
    try:
      self._steps(j)
    except _Stop:
      return
    except BaseException as error:  # noqa: BLE001 (any failure stops the run, named)
      message = str(error).splitlines()[0] if str(error) else ""
      name = type(error).__name__
      self._fail(f"worker {j} failed at its local step {self.steps[j]}: {name}: {message}")

  def _fail(self, message: str) -> None:
    """Stops the run with `message` (the first failure's), raised by the loop."""
    with self.cond:
      if self.failure is None:
        self.failure = WorkerFailed(message)
      self.stopping = True
      self.cond.notify_all()

  def _steps(self, j: int) -> None:
    """Worker j's local steps and requests, until the run stops (_Stop)."""
    while True:
      step = self.steps[j]
      if self.rule.elastic:
        self._elastic_step(j, exchange=(step + 1) % self.periods[j] == 0)
      else:
        self._sgd_step(j, push=(step + 1) % self.periods[j] == 0)

  def _check_stop(self) -> None:
    if self.stopping:
      raise _Stop

  def _park_until(self, j: int, fits) -> None:
    """Waits (under self.cond) until `fits()`: an event that would fall beyond the
    limit waits for the loop to raise it."""
    while True:
      self._check_stop()
      if fits():
        self.parked_at[j] = None
        return
      self.parked_at[j] = self.limit
      self.cond.notify_all()
      self.cond.wait()

  def _local_fits(self, j: int) -> bool:
    return self.clock.packer.index_of(j, True, False) <= self.limit

  def _timed(self, j: int, local_step) -> tuple[float, float]:
    """Runs `local_step()` (a hook below), keeps its seconds as worker j's latest, and
    delays a slower worker; returns its (loss, accuracy)."""
    started = time.perf_counter()
    loss, accuracy = local_step()
    seconds = time.perf_counter() - started
    self.compute_seconds[j] = seconds
    if self.delay_factor[j] > 0:
      time.sleep(self.delay_factor[j] * seconds)  # a slower worker, for real
    return loss, accuracy

  def _now(self) -> float:
    """Seconds of training: the time parked at cuts is left out (during a cut: the
    time it began)."""
    now = time.perf_counter() if self._paused_at is None else self._paused_at
    return self._time_at_start + now - self._started - self._paused

  def _commit_local(self, j: int, op: str | None, expected: int | None, **record):
    """Records worker j's local step, with its request for `op` (which fell in
    tick `expected`); under self.cond."""
    clock = self.clock
    staleness, wait = record.get("staleness", -1), record.get("wait", 0.0)
    tick = self._emit(j, True, op, expected, staleness, wait)
    if op is None:  # a request's step computes after it: no time of its own yet
      record["compute"] = self.compute_seconds[j]
    self._record(j, op or "local", True, tick, **record)
    clock.worker_steps[j] += 1
    self.steps[j] += 1

  def _add_metrics(self, loss: float, accuracy: float) -> None:
    self._taken["loss"].append(loss)
    self._taken["accuracy"].append(accuracy)

  def _record(self, j: int, op: str, local: bool, tick: int, **record) -> None:
    event = trace_lib.Event(j, self.steps[j], op, local, tick, time=self._now(), **record)
    self.trace.add(event)
    self.clock.events += 1
    self.clock.time = event.time
    if "staleness" in record:
      self.clock.requests[j] += 1
      self.clock.bytes_sent[j] += self.sent_bytes
      if self.tiers is not None:
        self.clock.count_levels([0])
    self.cond.notify_all()

  def _local_only(self, j: int) -> None:
    """A local step without a request."""
    with self.cond:
      self._park_until(j, lambda: self._local_fits(j))
    step = self.steps[j]
    loss, accuracy = self._timed(j, lambda: self._local_step(j, step))
    with self.cond:
      self._check_stop()
      self._commit_local(j, None, None)
      self._add_metrics(loss, accuracy)

  def _elastic_step(self, j: int, exchange: bool) -> None:
    if not exchange:
      self._local_only(j)
      return
    # The request carries x_j from before the step, whose gradient is taken there
    # too; the step's update is added to the x_j - e of the answer.
    step = self.steps[j]
    self._snapshot(j)
    hogwild = self.rule.policy == clocks.Policy.HOGWILD
    if not self._serve(j, "read" if hogwild else "exchange", time.perf_counter(), local=True):
      return  # parked at the limit: the step is taken again, the same, when it rises
    loss, accuracy = self._timed(j, lambda: self._exchange_local_step(j, step))
    with self.cond:
      self._add_metrics(loss, accuracy)
    if hogwild:
      self._serve(j, "write", time.perf_counter())

  def _sgd_step(self, j: int, push: bool) -> None:
    self._local_only(j)
    if not push:
      return
    arrival = time.perf_counter()
    if self.rule.policy == clocks.Policy.HOGWILD:
      self._serve(j, "read", arrival)
      self._serve(j, "write", time.perf_counter())
    else:
      self._serve(j, "exchange", arrival)

  def _serve(self, j: int, op: str, arrival: float, local: bool = False) -> bool:
    """One master operation for worker j; False if it would fall beyond the limit
    (nothing is then changed, and worker j has parked)."""
    packer = self.clock.packer
    if self.rule.policy == clocks.Policy.ROUND_ROBIN:
      with self.cond:
        while self._turn_holder(j) != j:
          self._check_stop()
          holder = self._turn_holder(j)
          if self.parked_at[holder] == self.limit:
            # The request before ours falls beyond the limit, so ours does too.
            self._park_until(j, lambda holder=holder: self.parked_at[holder] != self.limit)
            return False
          self.cond.wait()
    with self.master:
      with self.cond:
        self._check_stop()
        tick = packer.index_of(j, local, True)
        # A WRITE follows its READ, and a push its local step, at once: they fall in
        # that event's tick or the last operation's, both within the limit.
        fits = op == "write" or not local or tick <= self.limit
        position = packer.ops_in(tick)
      if fits:
        self._operate(j, op, tick, position, time.perf_counter() - arrival, local)
        return True
    with self.cond:  # parked outside the master lock: the others go on to their cut
      self._park_until(j, lambda: packer.index_of(j, local, True) <= self.limit)
    return False

  def _turn_holder(self, j: int) -> int:
    """Round robin: whose request is next at worker j's server."""
    if self.tiers is None:
      return self.clock.turn
    members = self.members[self.group_of[j]]
    return members[self.clock.turns[self.group_of[j]]]

  def _operate(self, j, op, tick, position, wait, local) -> None:
    """Runs worker j's operation at its server and records it (master lock held)."""
    steps_done = self.steps[j] + 1 if local else self.steps[j]
    with self.cond:  # the others' writes since j's last read: none lands under the lock
      staleness = 0 if op == "write" else self.clock.missed[j]
    started = time.perf_counter()
    answer = self._master_operation(j, op, tick, position, steps_done, staleness)
    service = time.perf_counter() - started
    if op == "write":
      with self.cond:
        self._written(j)
        self._emit(j, False, op, tick)
        self._record(j, op, False, tick, wrote=self.clock.version, service=service)
        sends = self._served(j)
      if sends:
        self._server_operation(self.group_of[j], "send")
      return
    with self.cond:
      self.clock.missed[j] = 0
      record = {"staleness": staleness, "wait": wait, "read": self.clock.version}
      record["service"] = service
      if op == "exchange":
        self._written(j)
        record["wrote"] = self.clock.version
      self._answer(j, answer)
      if local:
        self._commit_local(j, op, tick, **record)
      else:
        self._emit(j, False, op, tick, staleness, wait)
        self._record(j, op, False, tick, **record)
      if self.rule.policy == clocks.Policy.ROUND_ROBIN:
        self._advance_turn(j)
      sends = op == "exchange" and self._served(j)
    if sends:
      self._server_operation(self.group_of[j], "send")

  def _advance_turn(self, j: int) -> None:
    """Round robin: the turn passes from worker j to the next of its server's."""
    if self.tiers is None:
      self.clock.turn = self._next_turn(j)
    else:
      g = self.group_of[j]
      self.clock.turns[g] = (self.clock.turns[g] + 1) % len(self.members[g])

  def _next_turn(self, j: int) -> int:
    """Round robin: whose request follows worker j's."""
    return (j + 1) % self.num_workers

  # Two tiers: the group servers' sends, and their threads.

  def _served(self, j: int) -> bool:
    """Worker j's request is applied at its group's server (self.cond held): whether it
    is the K-th since the last merge, with no send in flight, so that the server
    sends (`_server_operation`, under the master lock still)."""
    if self.tiers is None:
      return False
    g = self.group_of[j]
    self.clock.since_merge[g] += 1
    return self.clock.since_merge[g] >= self.tiers.every and self.clock.phase[g] == live_clock.IDLE

  def _server_operation(self, g: int, op: str) -> None:
    """Group g's server's operation `op` (send, apply, merge), run and recorded (the
    master lock held: no other operation falls between its tick and its record)."""
    row = self.num_workers + g
    with self.cond:
      self._check_stop()
      tick = self.clock.packer.index_of(row, False, True)
    started = time.perf_counter()
    self._run_server_op(g, op, tick)
    service = time.perf_counter() - started
    with self.cond:
      if self.clock.packer.emit(self._now(), row, False, trace_lib.OPS[op]) != tick:
        raise RuntimeError(f"group {g}'s {op} fell in another tick than {tick}")
      event = trace_lib.Event(g, 0, op, False, tick, time=self._now(), service=service)
      self.trace.add(event)
      self.clock.events += 1
      self.clock.time = event.time
      if op == "send":
        self.clock.count_levels([1])
      if op in ("send", "merge"):  # a send's change goes out, the global model comes back
        self.clock.server_bytes[int(self.tiers.between[g])] += self.tiers.model_bytes
      self.clock.phase[g] = {"send": live_clock.SENT, "apply": live_clock.APPLIED}.get(
        op, live_clock.IDLE
      )
      if op == "merge":
        self.clock.since_merge[g] = 0
        for worker in self.members[g]:
          self.clock.missed[worker] += 1
        self.clock.version += 1
      self.cond.notify_all()

  def _run_server_op(self, g: int, op: str, tick: int) -> None:
    """The server operation's program on this host's devices (the center's)."""
    del tick
    numbers = (np.int32(trace_lib.OPS[op]),)
    center, global_opt, group = self.server_op(
      self.center, self.global_opt, self.group_states[g], *numbers
    )
    self.center, self.global_opt, self.group_states[g] = jax.block_until_ready(
      (center, global_opt, group)
    )

  def _uplink(self, g: int) -> None:
    try:
      while True:
        self._carry(g)
    except _Stop:
      return
    except BaseException as error:  # noqa: BLE001 (any failure stops the run, named)
      message = str(error).splitlines()[0] if str(error) else ""
      self._fail(f"group {g}'s server failed: {type(error).__name__}: {message}")

  def _carry(self, g: int) -> None:
    """Group g's send to the global server (APPLY), then its reply back (MERGE), each
    under the master lock, parking at the limit as a worker does."""
    row = self.num_workers + g
    with self.cond:
      while self.clock.phase[g] == live_clock.IDLE:
        self._check_stop()
        self.cond.wait()
    with self.master:
      with self.cond:
        self._check_stop()
        fits = self.clock.packer.index_of(row, False, True) <= self.limit
        op = "apply" if self.clock.phase[g] == live_clock.SENT else "merge"
      if fits:
        self._server_operation(g, op)
        return
    with self.cond:  # parked outside the lock: the others go on to their cut
      self._park_until(row, lambda: self.clock.packer.index_of(row, False, True) <= self.limit)

  # Where the workers' rows and the center are: on this host's devices. A runtime
  # whose workers are elsewhere (easgd.train.runtimes.ray.workers) overrides these.

  def _local_step(self, j: int, step: int) -> tuple[float, float]:
    """Worker j's local step `step` at x_j, kept; returns its (loss, accuracy)."""
    at = self.workers[j]
    args = self._local_args(j, at, self.worker_opt[j], at, step)
    self.workers[j], self.worker_opt[j], loss, accuracy = self.local[self._device_of(j)](*args)
    return float(loss[0]), float(accuracy[0])

  def _snapshot(self, j: int) -> None:
    """Keeps x_j and worker j's optimizer state from before its exchange step."""
    self._before[j] = (self.workers[j], self.worker_opt[j])

  def _exchange_local_step(self, j: int, step: int) -> tuple[float, float]:
    """The local step of an exchange step, at the snapshot, its update added to the
    x_j - e of the answer; the answer's request fields kept."""
    before, opt_before = self._before[j]
    answered = self.worker_opt[j]
    args = self._local_args(j, before, opt_before, self.workers[j], step)
    workers, opt, loss, accuracy = self.local[self._device_of(j)](*args)
    fields = {f: answered[f] for f in self.rule.request_fields()}
    self.workers[j], self.worker_opt[j] = workers, dict(opt, **fields)
    return float(loss[0]), float(accuracy[0])

  def _master_operation(
    self, j: int, op: str, tick: int, position: int, steps_done: int, staleness: int
  ):
    """Worker j's operation `op`, the position-th of tick `tick`, at its `staleness`, on
    the center; returns its answer for `_answer` (None for a WRITE)."""
    center_device = self.center_device
    row = jax.device_put(self._row(j, steps_done), center_device)
    numbers = (np.int32(tick), np.int32(position), np.int32(trace_lib.OPS[op]))
    numbers += (np.int32(staleness),)
    if self.tiers is not None:  # on its group server's center and optimizer state
      g = self.group_of[j]
      group = self.group_states[g]
      center, opt, row = self.master_op(
        group["center"], group["opt"], row, self.rng_on[center_device], *numbers
      )
      center, opt = jax.block_until_ready((center, opt))
      self.group_states[g] = dict(group, center=center, opt=opt)
      return None if op == "write" else jax.device_put(row, self._device_of(j))
    center, center_opt, row = self.master_op(
      self.center, self.center_opt, row, self.rng_on[center_device], *numbers
    )
    self.center, self.center_opt = jax.block_until_ready((center, center_opt))
    return None if op == "write" else jax.device_put(row, self._device_of(j))

  def _answer(self, j: int, row) -> None:
    """Worker j takes the master's answer: its new x_j and request fields."""
    fields = {f: row[f] for f in self.rule.request_fields()}
    self.workers[j], self.worker_opt[j] = row["workers"], dict(self.worker_opt[j], **fields)

  def _emit(self, j, local, op, expected, staleness=-1, wait=0.0) -> int:
    """Places worker j's event into its tick (under self.cond)."""
    sent = self.sent_bytes if staleness >= 0 else 0.0
    opkind = trace_lib.OPS[op or "local"]
    tick = self.clock.packer.emit(self._now(), j, local, opkind, staleness, wait, sent)
    if expected is not None and tick != expected:
      raise RuntimeError(f"worker {j}'s {op} fell in tick {tick}, not {expected}")
    return tick

  def _written(self, j: int) -> None:
    self.clock.version += 1
    others = range(self.num_workers) if self.tiers is None else self.members[self.group_of[j]]
    for other in others:
      if other != j:
        self.clock.missed[other] += 1

  def _local_args(self, j: int, at, opt, base, step: int):
    """The local program's arguments: the step's gradient at x_j = `at` with
    worker_opt `opt`, its update added to `base`."""
    device = self._device_of(j)
    return (
      at,
      opt,
      jax.device_put(np.asarray([step], np.int32), device),
      self.rng_on[device],
      self.images[j],
      self.labels[j],
      jax.device_put(np.asarray([j], np.int32), device),
      base,
    )

  def _row(self, j: int, steps_done: int) -> dict:
    """What a request of worker j carries to the master (easgd.rules.parameter_server);
    `steps_done`: its local steps, the one it is taking included."""
    fields = {f: self.worker_opt[j][f] for f in self.rule.request_fields()}
    steps = jax.device_put(np.asarray([steps_done], np.int32), self._device_of(j))
    return {"workers": self.workers[j], **fields, "worker_steps": steps}

  def _device_of(self, worker: int):
    return self.devices[worker // self.per_device]
