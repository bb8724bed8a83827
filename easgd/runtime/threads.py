"""The parameter-server rules run for real on one host: a thread per worker.

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
    sees, the worker's own update) and its WRITE (x~ <- x~ + increment) are
    two operations, each atomic; any other request's READ or WRITE may fall
    between them, so requests that overlap read the same x~ and all their
    increments are added. (A WRITE is one addition of a whole tree, never
    torn: no increment is lost, as in the simulated runtime.)
A thread per worker, not per device: workers that share a device then
share it as separate programs queued on it, as processes sharing a GPU do,
and a worker is never held back by another's request.

The workers' arithmetic is the rule's own (`ParameterServerRule.local_step`,
`serve_read`, `serve_write`), one worker at a time; the data and
augmentation of each worker's step are those of the simulated runtime.

Ticks and cuts. Every event (a local step, a master operation) is placed
into ticks as it commits, by the simulated runtime's packer
(easgd.sim.events), and written to the trace (easgd.runtime.trace). The
training loop's step s is tick s. A worker may only commit an event that
falls in a tick <= the *limit*; the next one waits ("parks"). The loop
raises the limit a few ticks ahead of itself, and to exactly the next tick
at which it logs, evaluates or checkpoints: when every worker is parked
there, the state is a consistent cut (every worker between steps, the
master idle) of exactly that tick, which is what is evaluated and saved, and
what the replay reaches at the same tick.

Stragglers: cluster.speed_spread and cluster.stragglers become real delays
(a worker c_i/c_0 times slower sleeps (c_i/c_0 - 1) times its measured step
after each step); the other timing fields describe a network and a master
that this runtime measures instead.
"""

import threading
import time

import jax
import jax.numpy as jnp
import numpy as np
from absl import logging
from jax import lax
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from easgd import loop, steps
from easgd.data import augment as augment_lib
from easgd.errors import WorkerFailed
from easgd.infra import sharding
from easgd.infra.compile import compile_program
from easgd.reports import RuleReports
from easgd.rules import AXIS, Rule, TrainState
from easgd.rules.base import exchange_key
from easgd.runtime import trace as trace_lib
from easgd.sim import clocks, timing
from easgd.sim.events import TickPacker

# Ticks the workers may run ahead of the loop's step between two cuts: the
# most a preemption notice's checkpoint lands after the step that saw it.
LAG = 4
# Seconds between the loop's checks for a failed worker or a signal while it waits.
POLL = 0.05


class _Stop(Exception):
  """Unwinds a worker thread when the run ends."""


class LiveClock:
  """The measured counterpart of easgd.sim.clocks.Clock: the run's totals and
  everything the threads runtime needs to continue from a checkpoint."""

  def __init__(self, num_workers: int):
    self.time = 0.0  # seconds of training, over every resumption
    self.worker_steps = np.zeros(num_workers, np.int64)
    self.requests = np.zeros(num_workers, np.int64)
    self.bytes_sent = np.zeros(num_workers)
    self.packer = TickPacker(num_workers)
    self.missed = [0] * num_workers  # writes by others since each worker's last read
    self.version = 0  # writes to the center
    self.turn = 0  # round robin: whose request is next
    self.events = 0  # events in the trace

  def state_dict(self) -> dict:
    return {
      "time": self.time,
      "worker_steps": self.worker_steps.tolist(),
      "requests": self.requests.tolist(),
      "bytes_sent": self.bytes_sent.tolist(),
      "missed": list(self.missed),
      "version": self.version,
      "turn": self.turn,
      "events": self.events,
      **self.packer.state_dict(),
    }

  def load_state_dict(self, state: dict) -> None:
    self.time = float(state["time"])
    self.worker_steps = np.array(state["worker_steps"], np.int64)
    self.requests = np.array(state["requests"], np.int64)
    self.bytes_sent = np.array(state["bytes_sent"], np.float64)
    self.missed = [int(n) for n in state["missed"]]
    self.version = int(state["version"])
    self.turn = int(state["turn"])
    self.events = int(state["events"])
    self.packer.load_state_dict(state)


def _programs(rule: Rule, loss_fn, batch_size: int, augment):
  """The pieces, each jitted alone: a worker's local step, and the master's operations."""

  def local(workers, worker_opt, worker_steps, rng, images, labels, worker, base):
    """The local step at `workers`; the EASGD family adds its update to `base` (x_j,
    or x_j - e after the exchange), in the same program as the simulated runtime
    does: XLA fuses the update's last product into that sum."""
    batch = steps.sample_batches(images, labels, rng, worker, worker_steps, batch_size, augment)
    view = TrainState(
      step=0,
      rng=rng,
      center=(),
      center_opt=(),
      workers=workers,
      worker_opt=worker_opt,
      worker_steps=worker_steps,
    )
    stepping = worker >= 0  # always; a value XLA cannot fold, as in the tick program
    new_workers, new_opt, updates, loss, accuracy = rule.local_step(view, batch, loss_fn, stepping)
    # What the worker keeps crosses a conditional, as it crosses the master's in
    # the simulated step (ParameterServerRule.step): XLA then fuses (and rounds)
    # the update's arithmetic alike in both programs.
    kept = base if updates is not None else new_workers
    kept, new_opt = lax.cond(worker[0] >= 0, lambda *a: a, lambda *a: a, kept, new_opt)
    if updates is not None:
      kept = jax.tree.map(jnp.add, kept, updates)
    return kept, new_opt, loss, accuracy

  def master(center, center_opt, row, rng, tick, position, kind):
    """Operation `kind` of worker j (row 0), the position-th of tick `tick`: the tick
    program's loop and key (ParameterServerRule.serve), run for this one operation."""
    size = 2 * rule.hyper.num_workers
    ops = {
      "op_kind": jnp.zeros(size, jnp.int32).at[position].set(kind),
      "op_worker": jnp.zeros(size, jnp.int32),
      "num_ops": position + 1,
    }
    key = exchange_key(TrainState(tick, rng, (), (), (), (), ()))
    carry = (center, center_opt, row)
    return lax.cond(
      ops["num_ops"] > 0, lambda: rule.serve(ops, key, position, carry), lambda: carry
    )

  return local, master


class ThreadsTrainee(RuleReports):
  """The loop's trainee for runtime=threads (see the module docstring)."""

  def __init__(
    self,
    setup: loop.Setup,
    rule: Rule,
    state: TrainState,
    cluster: timing.Cluster,
    sent_bytes: float,
    clock_state: dict | None,
    resumed_at: int | None,
  ):
    config = setup.config
    num_workers = config.workers
    clock = LiveClock(num_workers)
    if clock_state is not None:
      clock.load_state_dict(clock_state)
    super().__init__(setup, rule, clock, resumed_at)
    self.num_workers = num_workers
    self.sent_bytes = sent_bytes
    self.schedule = config.run
    self.rng = state.rng
    # Loop step s runs tick s - 1 (ticks count from 0, as the simulated ones).
    self.cut = int(jax.device_get(state.step))  # the loop step of the last consistent cut
    self.limit = self.cut - 1  # the last tick the workers may commit events to
    self.devices = list(setup.mesh.devices.flat)
    self.per_device = num_workers // len(self.devices)
    self.center_device = self.devices[0]
    self.cond = threading.Condition()
    self.master = threading.Lock()  # held while an operation runs (not for hogwild's requests)
    self.parked_at: list[int | None] = [None] * num_workers  # the limit each is parked at
    self.stopping = False
    self.failure: WorkerFailed | None = None
    self._loop_step = self.cut  # the loop's last step
    self._sums = {"loss": 0.0, "accuracy": 0.0, "count": 0}
    mean_times = cluster.mean_step_times(num_workers)
    self.delay_factor = mean_times / mean_times.min() - 1.0
    self.trace = trace_lib.Writer(
      setup.workdir, config, None if clock_state is None else clock.events
    )
    self._split(state, setup.train_images, setup.train_labels)
    self._compile(rule, setup, config)
    self._started = time.perf_counter()
    self._time_at_start = clock.time
    self.threads = [
      threading.Thread(target=self._worker, args=(j,), name=f"worker-{j}", daemon=True)
      for j in range(num_workers)
    ]
    for thread in self.threads:
      thread.start()

  # Layout: the loop's sharded state <-> one row per worker on its device.

  def _device_of(self, worker: int):
    return self.devices[worker // self.per_device]

  def _split(self, state: TrainState, images, labels) -> None:
    def row(leaf, worker):
      shard = next(s for s in leaf.addressable_shards if s.device == self._device_of(worker))
      local = worker % self.per_device
      return shard.data[local : local + 1]

    def rows(tree, worker):
      return jax.tree.map(lambda leaf: row(leaf, worker), tree)

    def on_center(tree):
      center = self.center_device
      return jax.tree.map(
        lambda leaf: next(s.data for s in leaf.addressable_shards if s.device == center), tree
      )

    self.workers = [rows(state.workers, j) for j in range(self.num_workers)]
    self.worker_opt = [rows(state.worker_opt, j) for j in range(self.num_workers)]
    self.images = [row(images, j) for j in range(self.num_workers)]
    self.labels = [row(labels, j) for j in range(self.num_workers)]
    self.steps = [int(n) for n in np.asarray(jax.device_get(state.worker_steps))]
    self.center = on_center(state.center)
    self.center_opt = on_center(state.center_opt)
    self.rng_on = {device: jax.device_put(state.rng, device) for device in self.devices}

  @property
  def state(self) -> TrainState:
    """The training state at the last cut, in the simulated runtime's layout."""
    mesh = self.setup.mesh
    split, replicated = NamedSharding(mesh, P(AXIS)), NamedSharding(mesh, P())

    def stacked(rows):
      def leaf(*per_worker):
        parts = [
          jnp.concatenate(per_worker[d * self.per_device : (d + 1) * self.per_device])
          for d in range(len(self.devices))
        ]
        shape = (self.num_workers, *per_worker[0].shape[1:])
        return jax.make_array_from_single_device_arrays(shape, split, parts)

      return jax.tree.map(leaf, *rows)

    return TrainState(
      step=jax.device_put(np.int32(self.cut), replicated),
      rng=self.rng,
      center=jax.device_put(self.center, replicated),
      center_opt=jax.device_put(self.center_opt, replicated),
      workers=stacked(self.workers),
      worker_opt=stacked(self.worker_opt),
      worker_steps=jax.device_put(np.asarray(self.steps, np.int32), split),
    )

  def _compile(self, rule: Rule, setup: loop.Setup, config) -> None:
    """Every program as shard_map over a mesh of its one device: XLA then compiles
    each worker's step and each operation as it does inside the simulated
    runtime's program, to the same bits (a plain jit of the same function
    computes some matrix products' last bits differently)."""
    augment = augment_lib.get(config.data.augment)
    local, master = _programs(rule, setup.loss_fn, config.data.batch_size, augment)
    platform = setup.platform
    split, whole = P(AXIS), P()

    def compiled(function, device, in_specs, out_specs, *args):
      mesh = Mesh(np.array([device]), (AXIS,))
      program = sharding.jit_shard_map(function, mesh, in_specs, out_specs, donate=False)
      return compile_program(program.lower(*args), platform)

    self.local = {}
    for d, device in enumerate(self.devices):
      j = d * self.per_device
      workers = self.workers[j]
      args = self._local_args(j, workers, self.worker_opt[j], workers, self.steps[j])
      specs = (split, split, split, whole, split, split, split, split)
      self.local[device] = compiled(local, device, specs, split, *args)
    center = self.center_device
    row = jax.device_put(self._row(0), center)
    numbers = (self.rng_on[center], np.int32(0), np.int32(0), np.int32(0))
    specs = (whole,) * 7
    self.master_op = compiled(
      master, center, specs, whole, self.center, self.center_opt, row, *numbers
    )

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

  def _row(self, j: int, steps_done: int | None = None) -> dict:
    """What a request of worker j carries to the master (easgd.rules.parameter_server)."""
    fields = {f: self.worker_opt[j][f] for f in self.rule._request_fields()}
    count = self.steps[j] if steps_done is None else steps_done
    steps_done = jax.device_put(np.asarray([count], np.int32), self._device_of(j))
    return {"workers": self.workers[j], **fields, "worker_steps": steps_done}

  # The workers.

  def _worker(self, j: int) -> None:
    step = self.steps[j]
    try:
      while True:
        step = self.steps[j]
        if self.rule.elastic:
          self._elastic_step(j, exchange=(step + 1) % self.rule.period == 0)
        else:
          self._sgd_step(j, push=(step + 1) % self.rule.period == 0)
    except _Stop:
      return
    except BaseException as error:  # noqa: BLE001 (any failure stops the run, named)
      message = str(error).splitlines()[0] if str(error) else ""
      with self.cond:
        if self.failure is None:
          self.failure = WorkerFailed(
            f"worker {j} failed at its local step {step}: {type(error).__name__}: {message}"
          )
        self.stopping = True
        self.cond.notify_all()

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

  def _compute(self, j: int, at, opt, base, step: int):
    """Worker j's local step `step` on its device (`_local_args`); returns
    (x_j, worker_opt, loss, accuracy) once computed."""
    started = time.perf_counter()
    args = self._local_args(j, at, opt, base, step)
    workers, opt, loss, accuracy = self.local[self._device_of(j)](*args)
    loss, accuracy = float(loss[0]), float(accuracy[0])
    seconds = time.perf_counter() - started
    if self.delay_factor[j] > 0:
      time.sleep(self.delay_factor[j] * seconds)  # a slower worker, for real
    return workers, opt, loss, accuracy

  def _now(self) -> float:
    return self._time_at_start + time.perf_counter() - self._started

  def _commit_local(self, j: int, op: str | None, **record):
    """Records worker j's local step (with its request, for op); under self.cond."""
    self._check_stop()
    clock = self.clock
    tick = self._emit(j, True, op, None, record.get("staleness", -1), record.get("wait", 0.0))
    self._record(j, op or "local", True, tick, **record)
    clock.worker_steps[j] += 1
    self.steps[j] += 1

  def _add_metrics(self, loss: float, accuracy: float) -> None:
    self._sums["loss"] += loss
    self._sums["accuracy"] += accuracy
    self._sums["count"] += 1

  def _record(self, j: int, op: str, local: bool, tick: int, **record) -> None:
    event = trace_lib.Event(j, self.steps[j], op, local, tick, time=self._now(), **record)
    self.trace.add(event)
    self.clock.events += 1
    self.clock.time = event.time
    if "staleness" in record:
      self.clock.requests[j] += 1
      self.clock.bytes_sent[j] += self.sent_bytes
    self.cond.notify_all()

  def _local_only(self, j: int) -> None:
    """A local step without a request."""
    with self.cond:
      self._park_until(j, lambda: self._local_fits(j))
    at = self.workers[j]
    workers, opt, loss, accuracy = self._compute(j, at, self.worker_opt[j], at, self.steps[j])
    with self.cond:
      self._check_stop()
      self.workers[j], self.worker_opt[j] = workers, opt
      self._commit_local(j, None)
      self._add_metrics(loss, accuracy)

  def _elastic_step(self, j: int, exchange: bool) -> None:
    if not exchange:
      self._local_only(j)
      return
    # The request carries x_j from before the step, whose gradient is taken there
    # too; the step's update is added to the x_j - e of the answer.
    step, before, opt_before = self.steps[j], self.workers[j], self.worker_opt[j]
    hogwild = self.rule.policy == clocks.Policy.HOGWILD
    if not self._serve(j, "read" if hogwild else "exchange", time.perf_counter(), local=True):
      return  # parked at the limit: the step is taken again, the same, when it rises
    answered = self.worker_opt[j]
    workers, opt, loss, accuracy = self._compute(j, before, opt_before, self.workers[j], step)
    fields = {f: answered[f] for f in self.rule._request_fields()}
    with self.cond:
      self.workers[j], self.worker_opt[j] = workers, dict(opt, **fields)
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
        while self.clock.turn != j:
          self._check_stop()
          holder = self.clock.turn
          if self.parked_at[holder] == self.limit:
            # The request before ours falls beyond the limit, so ours does too.
            self._park_until(j, lambda holder=holder: self.parked_at[holder] != self.limit)
            return False
          self.cond.wait()
    with self.master:
      with self.cond:
        self._check_stop()
        tick = packer.index_of(j, local, True)
        # A WRITE follows its READ at once: it always falls within the limit.
        fits = op == "write" or tick <= self.limit
        position = packer.ops_in(tick)
      if fits:
        self._operate(j, op, tick, position, time.perf_counter() - arrival, local)
        return True
    with self.cond:  # parked outside the master lock: the others go on to their cut
      self._park_until(j, lambda: packer.index_of(j, local, True) <= self.limit)
    return False

  def _operate(self, j, op, tick, position, wait, local) -> None:
    """Runs worker j's operation on the center's device and records it (master lock held)."""
    center_device = self.center_device
    steps_done = self.steps[j] + 1 if local else self.steps[j]
    row = jax.device_put(self._row(j, steps_done), center_device)
    numbers = (np.int32(tick), np.int32(position), np.int32(trace_lib.OPS[op]))
    center, center_opt, row = self.master_op(
      self.center, self.center_opt, row, self.rng_on[center_device], *numbers
    )
    self.center, self.center_opt = jax.block_until_ready((center, center_opt))
    if op == "write":
      with self.cond:
        self._written(j)
        self._emit(j, False, op, tick)
        self._record(j, op, False, tick, wrote=self.clock.version)
      return
    row = jax.device_put(row, self._device_of(j))
    with self.cond:
      staleness, self.clock.missed[j] = self.clock.missed[j], 0
      record = {"staleness": staleness, "wait": wait, "read": self.clock.version}
      if op == "exchange":
        self._written(j)
        record["wrote"] = self.clock.version
      fields = {f: row[f] for f in self.rule._request_fields()}
      self.workers[j], self.worker_opt[j] = row["workers"], dict(self.worker_opt[j], **fields)
      if local:
        self._commit_local(j, op, **record)
      else:
        self._emit(j, False, op, tick, staleness, wait)
        self._record(j, op, False, tick, **record)
      if self.rule.policy == clocks.Policy.ROUND_ROBIN:
        self.clock.turn = (j + 1) % self.num_workers

  def _emit(self, j, local, op, expected, staleness=-1, wait=0.0) -> int:
    """Places worker j's event into its tick (under self.cond)."""
    sent = self.sent_bytes if staleness >= 0 else 0.0
    opkind = None if op in (None, "local") else trace_lib.OPS[op]
    tick = self.clock.packer.emit(self._now(), j, local, opkind, staleness, wait, sent)
    if expected is not None and tick != expected:
      raise RuntimeError(f"worker {j}'s {op} fell in tick {tick}, not {expected}")
    return tick

  def _written(self, j: int) -> None:
    self.clock.version += 1
    for other in range(self.num_workers):
      if other != j:
        self.clock.missed[other] += 1

  # The loop's side.

  def _boundary(self, step: int) -> int:
    """The first tick >= step at which the loop needs a cut."""
    schedule, total = self.schedule, self.schedule.total_steps
    for tick in range(step, min(step + LAG, total) + 1):
      if any(
        loop.due(tick, every, total)
        for every in (schedule.log_every, schedule.eval_every, schedule.checkpoint_every)
      ):
        return tick
    return min(step + LAG, total)

  def _wait(self, done) -> None:
    """Waits (under self.cond) until `done()`, raising a worker's failure."""
    while not done():
      if self.failure is not None:
        raise self.failure
      self.cond.wait(POLL)
    if self.failure is not None:
      raise self.failure

  def _parked(self) -> bool:
    return all(at == self.limit for at in self.parked_at)

  def _at_cut(self) -> None:
    """Waits for every worker to park at the limit: the state is then the cut of that
    tick. Its ticks go to the reports."""
    self._wait(self._parked)
    self.cut = self.limit + 1
    packer = self.clock.packer
    for tick in packer.release_all():
      self.totals.add(tick)

  def step(self):
    with self.cond:
      step = self._loop_step = self._loop_step + 1
      # Never past the next tick at which a cut is due; at most LAG ticks ahead.
      boundary = self._boundary(step) - 1
      if boundary > self.limit:
        self.limit = boundary
        self.cond.notify_all()
      if self._due(step):
        self._at_cut()
      else:
        packer = self.clock.packer
        self._wait(
          lambda: all(
            packer.index_of(j, True, False) >= step or self.parked_at[j] == self.limit
            for j in range(self.num_workers)
          )
        )
      sums, self._sums = self._sums, {"loss": 0.0, "accuracy": 0.0, "count": 0}
    count = max(sums["count"], 1)
    rate = float(np.mean(np.asarray(self.rule.learning_rate(jnp.asarray(self.steps)))))
    values = {"loss": sums["loss"] / count, "accuracy": sums["accuracy"] / count}
    return {**values, "learning_rate": rate}, None

  def _due(self, step: int) -> bool:
    schedule, total = self.schedule, self.schedule.total_steps
    return any(
      loop.due(step, every, total)
      for every in (schedule.log_every, schedule.eval_every, schedule.checkpoint_every)
    )

  def save(self, divergence):
    del divergence
    with self.cond:
      if self.cut != self.limit + 1 or not self._parked():
        # A checkpoint off the schedule (a preemption notice): at the limit,
        # at most LAG ticks on.
        self._at_cut()
      self.trace.sync()
      clock_state = self.clock.state_dict()
    self.setup.checkpointer.save(self.state, clock_state, self.setup.config)
    if self.cut != self._loop_step:
      logging.info("saved the consistent cut after step %d", self.cut)

  def finish(self):
    with self.cond:
      self.trace.end(self.cut)
    super().finish()

  def close(self):
    with self.cond:
      self.stopping = True
      self.cond.notify_all()
    for thread in self.threads:
      thread.join(timeout=60)
    self.trace.close()
    super().close()
