"""A seeded timing model of the cluster, and the clocks that turn it into a schedule.

The timing model (`config.cluster`) says how long things take; nothing in it
depends on parameter values, so a whole run's schedule follows from it and
the seed alone:

  local step k of worker i:  c_i * exp(jitter * z_ik - jitter^2 / 2)
      c_i = compute_time * (1 + speed_spread * i / (P - 1))
            [* straggler_slowdown if i is in stragglers]
      z_ik ~ N(0, 1), drawn from (seed, i, k) alone (so it needs no RNG state)
  one message, either way:   latency + model_bytes / bandwidth
  the master, per request:   (master_time + 2 * model_bytes / server_bandwidth) / servers
      (under the lock, if the rule has one): the center is split evenly over
      `servers` parameter servers that serve a request's shards in parallel,
      and each server's own link carries the request's shard in and out
  an all-reduce of the model: ring  2 (P - 1) (latency + model_bytes / (P bandwidth))
                              tree  2 ceil(log2 P) (latency + model_bytes / bandwidth)

`device_memory` and `device_flops` describe a device for the planner
(easgd/plan.py); the clocks do not read them.

A clock advances one *tick* at a time: the unit of the device program. In a
tick every worker takes at most one local step, then the master serves an
ordered list of requests. For the synchronous rules a tick is one step of
every worker; for the parameter-server rules `AsyncClock` runs a
discrete-event simulation of workers and master and packs its events into
ticks so that each worker's own events and the master's order of service
keep their order (local steps of different workers commute, so nothing else
matters). Slow workers therefore sit out ticks and take fewer steps.
"""

import abc
import collections
import dataclasses
import heapq
import math

import ml_collections
import numpy as np

# Kinds of master operations in a tick (the device program switches on them).
EXCHANGE, READ, WRITE = 0, 1, 2
# Master policies.
FCFS, ROUND_ROBIN, HOGWILD = "fcfs", "round_robin", "hogwild"
# All-reduce algorithms.
RING, TREE = "ring", "tree"
ALLREDUCES = (RING, TREE)
# Event kinds, in the order they are handled when they fall on the same time:
# a write that lands when another request arrives is seen by that request.
_WRITE, _ARRIVE, _DONE, _START = 0, 1, 2, 3


@dataclasses.dataclass(frozen=True)
class Cluster:
  """The timing model; seconds, bytes and bytes/second."""

  compute_time: float = 0.01
  speed_spread: float = 0.0
  jitter: float = 0.0
  stragglers: tuple[int, ...] = ()
  straggler_slowdown: float = 1.0
  latency: float = 0.0
  bandwidth: float = math.inf
  master_time: float = 0.0
  servers: int = 1
  server_bandwidth: float = math.inf
  allreduce: str = RING
  device_memory: float = 0.0
  device_flops: float = 0.0

  @classmethod
  def from_config(cls, config: ml_collections.ConfigDict) -> "Cluster":
    values = config.to_dict()
    values["stragglers"] = tuple(values["stragglers"])
    return cls(**values)

  def mean_step_times(self, num_workers: int) -> np.ndarray:
    """c_i for every worker."""
    position = np.arange(num_workers) / max(num_workers - 1, 1)
    times = self.compute_time * (1 + self.speed_spread * position)
    times[list(self.stragglers)] *= self.straggler_slowdown
    return times

  def step_time(self, mean: float, seed: int, worker: int, step: int) -> float:
    """Duration of local step `step` of `worker`, whose mean is `mean`."""
    if self.jitter == 0:
      return float(mean)
    z = np.random.default_rng([seed % 2**63, worker, step]).standard_normal()
    return float(mean * math.exp(self.jitter * z - self.jitter**2 / 2))

  def message_time(self, num_bytes: float) -> float:
    return self.latency + num_bytes / self.bandwidth

  def service_time(self, model_bytes: float) -> float:
    """Time the parameter servers spend on one request (the lock is held that long)."""
    return (self.master_time + 2 * model_bytes / self.server_bandwidth) / self.servers

  def allreduce_time(self, num_bytes: float, num_workers: int) -> float:
    """An all-reduce of num_bytes over P workers.

    ring: 2(P-1) rounds, each moving num_bytes/P between neighbours
    (bandwidth-optimal, latency grows with P); tree: a reduction up a binary
    tree and a broadcast down it, 2 ceil(log2 P) rounds of whole messages
    (latency-optimal).
    """
    if num_workers == 1:
      return 0.0
    if self.allreduce == TREE:
      return 2 * math.ceil(math.log2(num_workers)) * self.message_time(num_bytes)
    return 2 * (num_workers - 1) * self.message_time(num_bytes / num_workers)


def allreduce_bytes(model_bytes: int, num_workers: int) -> float:
  """Bytes each worker sends in one bandwidth-optimal (ring) all-reduce of the model.

  A ring all-reduce of n bytes over P participants sends 2*(P-1)/P*n bytes
  from each (reduce-scatter, then all-gather). A tree sends the same on
  average: (P-1) whole messages up and (P-1) down, over P workers.
  """
  return 2 * (num_workers - 1) / num_workers * model_bytes


@dataclasses.dataclass
class Tick:
  """What happened in one tick, for the device program and for the logs.

  Attributes:
    time: simulated seconds at the end of the tick.
    local: bool [P], the workers that take a local step.
    ops: the master's operations in order, as (kind, worker) pairs.
    staleness: for each request served, the master updates made by other
      workers since the requesting worker last read from the master.
    waits: for each request served, seconds it queued at the master.
    requests: exchanges each worker began in the tick, [P].
    bytes_sent: bytes each worker sent in the tick, [P].
  """

  time: float
  local: np.ndarray
  ops: list[tuple[int, int]]
  staleness: list[int]
  waits: list[float]
  requests: np.ndarray
  bytes_sent: np.ndarray

  @classmethod
  def empty(cls, num_workers: int) -> "Tick":
    """A tick in which nothing happens (for shapes)."""
    zeros = np.zeros(num_workers)
    return cls(0.0, np.zeros(num_workers, bool), [], [], [], zeros.astype(np.int64), zeros)

  def to_dict(self) -> dict:
    """As JSON-serialisable values."""
    return {
      "time": self.time,
      "local": self.local.tolist(),
      "ops": [list(op) for op in self.ops],
      "staleness": list(self.staleness),
      "waits": list(self.waits),
      "requests": self.requests.tolist(),
      "bytes_sent": self.bytes_sent.tolist(),
    }

  @classmethod
  def from_dict(cls, values: dict) -> "Tick":
    """Inverse of `to_dict`."""
    return cls(
      time=float(values["time"]),
      local=np.array(values["local"], bool),
      ops=[(int(kind), int(worker)) for kind, worker in values["ops"]],
      staleness=[int(n) for n in values["staleness"]],
      waits=[float(w) for w in values["waits"]],
      requests=np.array(values["requests"], np.int64),
      bytes_sent=np.array(values["bytes_sent"], np.float64),
    )

  def device_inputs(self) -> dict[str, np.ndarray]:
    """The arrays the device program reads: masks and the padded list of operations."""
    num_workers = len(self.local)
    kinds = np.zeros(2 * num_workers, np.int32)
    workers = np.zeros(2 * num_workers, np.int32)
    for position, (kind, worker) in enumerate(self.ops):
      kinds[position], workers[position] = kind, worker
    return {
      "local": self.local.copy(),
      "op_kind": kinds,
      "op_worker": workers,
      "num_ops": np.int32(len(self.ops)),
    }


class Clock(abc.ABC):
  """Yields the ticks of a run and keeps the run's totals; its state is saved
  with every checkpoint."""

  def __init__(self, cluster: Cluster, num_workers: int, model_bytes: int, seed: int):
    self.cluster = cluster
    self.num_workers = num_workers
    self.model_bytes = model_bytes
    self.seed = seed
    self.mean_step_times = cluster.mean_step_times(num_workers)
    self.time = 0.0
    self.worker_steps = np.zeros(num_workers, np.int64)
    self.requests = np.zeros(num_workers, np.int64)
    self.bytes_sent = np.zeros(num_workers)

  def _step_time(self, worker: int, step: int) -> float:
    return self.cluster.step_time(self.mean_step_times[worker], self.seed, worker, step)

  def next_tick(self) -> Tick:
    """Advances the simulation by one tick."""
    tick = self._advance()
    self.time = tick.time
    self.worker_steps += tick.local
    self.requests += tick.requests
    self.bytes_sent += tick.bytes_sent
    return tick

  @abc.abstractmethod
  def _advance(self) -> Tick:
    """The next tick."""

  def state_dict(self) -> dict:
    """Everything needed to continue, as JSON-serialisable values."""
    return {
      "time": self.time,
      "worker_steps": self.worker_steps.tolist(),
      "requests": self.requests.tolist(),
      "bytes_sent": self.bytes_sent.tolist(),
    }

  def load_state_dict(self, state: dict) -> None:
    """Continues from a `state_dict()`."""
    self.time = float(state["time"])
    self.worker_steps = np.array(state["worker_steps"], np.int64)
    self.requests = np.array(state["requests"], np.int64)
    self.bytes_sent = np.array(state["bytes_sent"], np.float64)


class SyncClock(Clock):
  """All workers take their steps together; every `period`-th step ends with a
  barrier and a ring all-reduce.

  Between all-reduces each worker runs at its own pace; the all-reduce starts
  when the slowest worker arrives and ends `allreduce_time` later for all.
  A tick's time is that of the latest worker.
  """

  def __init__(self, cluster, num_workers, model_bytes, seed, period: int):
    super().__init__(cluster, num_workers, model_bytes, seed)
    self.period = period
    self.steps = 0
    self._worker_time = np.zeros(num_workers)

  def _advance(self) -> Tick:
    step = self.steps
    self.steps += 1
    for i in range(self.num_workers):
      self._worker_time[i] += self._step_time(i, step)
    requests = np.zeros(self.num_workers, np.int64)
    bytes_sent = np.zeros(self.num_workers)
    if self.steps % self.period == 0 and self.num_workers > 1:
      allreduce = self.cluster.allreduce_time(self.model_bytes, self.num_workers)
      self._worker_time[:] = self._worker_time.max() + allreduce
      requests[:] = 1
      bytes_sent[:] = allreduce_bytes(self.model_bytes, self.num_workers)
    local = np.ones(self.num_workers, bool)
    return Tick(float(self._worker_time.max()), local, [], [], [], requests, bytes_sent)

  def state_dict(self):
    return {**super().state_dict(), "steps": self.steps, "worker_time": self._worker_time.tolist()}

  def load_state_dict(self, state):
    super().load_state_dict(state)
    self.steps = int(state["steps"])
    self._worker_time = np.array(state["worker_time"], np.float64)


class AsyncClock(Clock):
  """A parameter server and its workers, simulated event by event.

  A worker's life is a loop of steps. Every `period`-th step includes a
  request to the master: one message there (the worker's parameters, or its
  accumulated gradient), the master's service, one message back.
    * exchange_first=True (the EASGD family): the request is sent at the
      start of the step, and the step's gradient is computed after the
      reply, at the parameters the worker had sent (the paper's Algorithm 1:
      both the elastic term and the gradient use x_i before the step).
    * exchange_first=False (SGD family, Downpour): the gradient is computed
      first and pushed at the end of the step; the reply holds the fresh
      parameters.
  Events are packed into ticks as early as their order allows: a worker's
  local step goes to the tick after its previous event; a master operation
  goes to the tick of the requester's previous event or later, never
  before the master's previous operation, after which it is appended. A
  tick's state is therefore a consistent cut of the simulation, and
  `Tick.time` the latest event in it.
  The master serves
    * fcfs: requests one at a time in arrival order (a lock; requests that
      find it busy queue);
    * round_robin: one at a time in worker order 0, 1, ..., P-1, 0, ...
      (worker i's k-th request waits for worker i-1's k-th);
    * hogwild: without a lock: a request reads the master's parameters on
      arrival and writes its increment the service time later; requests that
      overlap read the same snapshot and all their increments are added.
  """

  def __init__(
    self,
    cluster,
    num_workers,
    model_bytes,
    seed,
    period: int,
    policy: str,
    exchange_first: bool,
  ):
    super().__init__(cluster, num_workers, model_bytes, seed)
    self.period = period
    self.policy = policy
    self.exchange_first = exchange_first
    self.message = cluster.message_time(model_bytes)
    self.service = cluster.service_time(model_bytes)
    self._heap: list[tuple[float, int, int]] = []
    self._begun = [0] * num_workers  # steps begun by each worker
    self._missed = [0] * num_workers  # others' master updates since a worker's last read
    self._master_free = 0.0
    self._turn = 0
    self._waiting: dict[int, float] = {}  # round robin: worker -> arrival time
    # Ticks still open to events, from the next one to be released on.
    self._open: collections.deque[Tick] = collections.deque()
    self._released = 0  # index of self._open[0]
    self._last_tick = [-1] * num_workers  # tick of each worker's latest event
    self._last_op_tick = 0
    for worker in range(num_workers):
      self._begin_step(worker, 0.0)

  # The simulation.

  def _push(self, time: float, kind: int, worker: int) -> None:
    heapq.heappush(self._heap, (time, kind, worker))

  def _begin_step(self, worker: int, time: float) -> None:
    step = self._begun[worker]
    self._begun[worker] += 1
    if self.exchange_first and (step + 1) % self.period == 0:
      self._push(time + self.message, _ARRIVE, worker)
    else:
      self._push(time + self._step_time(worker, step), _DONE, worker)

  def _after_reply(self, worker: int, time: float) -> None:
    if self.exchange_first:
      # The step's gradient is computed after the reply; then the next step.
      step = self._begun[worker] - 1
      self._push(time + self._step_time(worker, step), _START, worker)
    else:
      self._begin_step(worker, time)

  def _emit(self, time, local, kind, worker, staleness=-1, wait=0.0, sent=0.0):
    """Packs one event of `worker` (a local step and/or a master operation) into a tick."""
    last = self._last_tick[worker]
    if kind < 0:
      index = last + 1
    else:
      index = max(last + 1 if local else last, self._last_op_tick)
      self._last_op_tick = index
    self._last_tick[worker] = index
    while len(self._open) <= index - self._released:
      self._open.append(Tick.empty(self.num_workers))
    tick = self._open[index - self._released]
    tick.time = max(tick.time, time)
    tick.local[worker] |= local
    if kind >= 0:
      tick.ops.append((kind, worker))
    if staleness >= 0:
      tick.staleness.append(staleness)
      tick.waits.append(wait)
      tick.requests[worker] += 1
    tick.bytes_sent[worker] += sent

  def _read(self, worker: int, time: float, kind: int, wait: float) -> None:
    staleness, self._missed[worker] = self._missed[worker], 0
    self._emit(time, self.exchange_first, kind, worker, staleness, wait, self.model_bytes)

  def _written(self, worker: int) -> None:
    for other in range(self.num_workers):
      if other != worker:
        self._missed[other] += 1

  def _serve(self, worker: int, arrival: float) -> None:
    """Serves a request under the lock, as soon as the master is free."""
    start = max(arrival, self._master_free)
    self._master_free = start + self.service
    self._read(worker, start, EXCHANGE, wait=start - arrival)
    self._written(worker)
    self._after_reply(worker, self._master_free + self.message)

  def _handle(self, time: float, kind: int, worker: int) -> None:
    if kind == _START:
      self._begin_step(worker, time)
    elif kind == _DONE:
      self._emit(time, True, -1, worker)
      if not self.exchange_first and self._begun[worker] % self.period == 0:
        self._push(time + self.message, _ARRIVE, worker)
      else:
        self._begin_step(worker, time)
    elif kind == _ARRIVE and self.policy == FCFS:
      self._serve(worker, time)
    elif kind == _ARRIVE and self.policy == ROUND_ROBIN:
      self._waiting[worker] = time
      while self._turn in self._waiting:
        turn = self._turn
        self._serve(turn, self._waiting.pop(turn))
        self._turn = (turn + 1) % self.num_workers
    elif kind == _ARRIVE:  # hogwild: read now, write later
      self._read(worker, time, READ, wait=0.0)
      self._push(time + self.service, _WRITE, worker)
    else:  # _WRITE
      self._emit(time, False, WRITE, worker)
      self._written(worker)
      self._after_reply(worker, time + self.message)

  def _complete(self) -> bool:
    """Whether no future event can fall into the next tick to release."""
    # A worker's next local step goes to last + 1 or later; its next operation
    # to max(last, last operation's tick) or later.
    earliest = min(min(last + 1, max(last, self._last_op_tick)) for last in self._last_tick)
    return self._released < earliest

  def _advance(self) -> Tick:
    while True:
      while not self._complete():
        self._handle(*heapq.heappop(self._heap))
      self._released += 1
      tick = self._open.popleft()
      if tick.local.any() or tick.ops:  # a tick every worker jumped over is skipped
        tick.time = max(tick.time, self.time)  # sim/time never runs backwards
        return tick

  def state_dict(self):
    return {
      **super().state_dict(),
      "heap": [list(event) for event in self._heap],
      "begun": list(self._begun),
      "missed": list(self._missed),
      "master_free": self._master_free,
      "turn": self._turn,
      "waiting": sorted([worker, time] for worker, time in self._waiting.items()),
      "open": [tick.to_dict() for tick in self._open],
      "released": self._released,
      "last_tick": list(self._last_tick),
      "last_op_tick": self._last_op_tick,
    }

  def load_state_dict(self, state):
    super().load_state_dict(state)
    self._heap = [(float(t), int(k), int(w)) for t, k, w in state["heap"]]
    self._begun = [int(n) for n in state["begun"]]
    self._missed = [int(n) for n in state["missed"]]
    self._master_free = float(state["master_free"])
    self._turn = int(state["turn"])
    self._waiting = {int(w): float(t) for w, t in state["waiting"]}
    self._open = collections.deque(Tick.from_dict(tick) for tick in state["open"])
    self._released = int(state["released"])
    self._last_tick = [int(n) for n in state["last_tick"]]
    self._last_op_tick = int(state["last_op_tick"])
