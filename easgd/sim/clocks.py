"""Clocks: the timing model (easgd.sim.timing) turned into a run's schedule of ticks.

A clock advances one *tick* at a time (easgd.sim.ticks). For the synchronous
rules a tick is one step of every worker (`SyncClock`); for the
parameter-server rules `AsyncClock` runs a discrete-event simulation of
workers and master and packs its events into ticks (easgd.sim.events) so
that each worker's own events and the master's order of service keep their
order. Slow workers therefore sit out ticks and take fewer steps.
"""

import abc
import enum
import fractions
import heapq
import math
import operator
from collections.abc import Callable, Sequence

import numpy as np

from easgd.sim import rounds
from easgd.sim.events import TickPacker
from easgd.sim.ticks import OpKind, Tick
from easgd.sim.timing import Cluster, Exchange


class Policy(enum.StrEnum):
  """How the master serves requests."""

  FCFS = "fcfs"  # one at a time in arrival order, under a lock
  ROUND_ROBIN = "round_robin"  # one at a time in worker order
  HOGWILD = "hogwild"  # no lock: read on arrival, write a service time later


class _Event(enum.IntEnum):
  """Simulation events, in the order they are handled when they fall on the same
  time: a write that lands when another request arrives is seen by that request."""

  MERGE = -1  # two tiers: the global model reaches a group server (a write there)
  WRITE = 0
  ARRIVE = 1
  DONE = 2
  START = 3
  GLOBAL = 4  # two tiers: a group server's change reaches the global server


class LogWindow:
  """What the reports average since the last log: the training values, as exact
  sums and a count; each worker's local steps at that log; each request's
  staleness and seconds queued. A checkpoint saves them with the clock: a run
  resumed between two logs logs what it would have logged without stopping.

  Each value is added exactly (a fractions.Fraction of the float), so the sums
  do not depend on the order of the additions: a run that hands its local
  steps one by one as they commit and the replay that hands a tick's at once
  reach the same means. A value that is not finite turns its sum into that
  float (nan or inf).
  """

  def __init__(self, worker_steps: np.ndarray):
    self.restart(worker_steps)

  def add(self, values: dict[str, float]) -> None:
    for tag, value in values.items():
      exact = fractions.Fraction(value) if math.isfinite(value) else float(value)
      self.sums[tag] = self.sums.get(tag, fractions.Fraction(0)) + exact
    self.count += 1

  def means(self) -> dict[str, float]:
    """Each tag's mean, rounded once to the nearest float; {} when nothing was added."""
    if not self.count:
      return {}
    return {tag: float(total / self.count) for tag, total in self.sums.items()}

  def restart(self, worker_steps: np.ndarray) -> None:
    """After a log: empty, from the workers' steps at it."""
    self.sums: dict[str, fractions.Fraction | float] = {}
    self.count = 0
    self.start_steps = np.array(worker_steps, np.int64)
    self.staleness: list[int] = []
    self.waits: list[float] = []

  def state_dict(self) -> dict:
    return {
      "sums": {tag: str(total) for tag, total in self.sums.items()},
      "count": self.count,
      "start_steps": self.start_steps.tolist(),
      "staleness": list(self.staleness),
      "waits": list(self.waits),
    }

  def load_state_dict(self, state: dict) -> None:
    def parsed(text: str) -> fractions.Fraction | float:
      try:
        return fractions.Fraction(text)
      except ValueError:  # nan, inf
        return float(text)

    self.sums = {tag: parsed(text) for tag, text in state["sums"].items()}
    self.count = int(state["count"])
    self.start_steps = np.array(state["start_steps"], np.int64)
    self.staleness = [int(n) for n in state["staleness"]]
    self.waits = [float(w) for w in state["waits"]]


class RunTotals:
  """What a run's workers did so far (sim/time, worker steps, requests, bytes), as
  the reports read it and a checkpoint saves it: simulated by a `Clock`, or
  measured (easgd.train.runtimes.threads.live_clock)."""

  def __init__(self, num_workers: int):
    self.time = 0.0
    self.worker_steps = np.zeros(num_workers, np.int64)
    self.requests = np.zeros(num_workers, np.int64)
    self.bytes_sent = np.zeros(num_workers)
    # The part of bytes_sent that crossed groups (easgd.sim.timing's two-level network).
    self.bytes_between = np.zeros(num_workers)
    # Exchange rounds of each level (Tick.levels).
    self.level_exchanges: list[int] = []
    # What two-tier servers sent each other: [inside groups, between groups].
    self.server_bytes = np.zeros(2)
    # Workers whose process left the run for good (runtime=ray's
    # cluster.on_worker_loss=continue, and the replay of its trace).
    self.gone: list[int] = []
    self.window = LogWindow(self.worker_steps)

  def count_levels(self, levels: list[int]) -> None:
    """Adds a tick's exchange rounds of each level (Tick.levels)."""
    for level in levels:
      self.level_exchanges += [0] * (level + 1 - len(self.level_exchanges))
      self.level_exchanges[level] += 1

  def live_workers(self) -> int:
    return len(self.worker_steps) - len(self.gone)

  def state_dict(self) -> dict:
    """Everything needed to continue, as JSON-serialisable values."""
    return {
      "time": self.time,
      "worker_steps": self.worker_steps.tolist(),
      "requests": self.requests.tolist(),
      "bytes_sent": self.bytes_sent.tolist(),
      "gone": list(self.gone),
      "window": self.window.state_dict(),
      # Only where something crossed groups or a level was counted: a flat run's
      # clock state is what it was before the two-level network.
      **({"bytes_between": self.bytes_between.tolist()} if self.bytes_between.any() else {}),
      **({"level_exchanges": list(self.level_exchanges)} if self.level_exchanges else {}),
      **({"server_bytes": self.server_bytes.tolist()} if self.server_bytes.any() else {}),
    }

  def load_state_dict(self, state: dict) -> None:
    """Continues from a `state_dict()`."""
    self.time = float(state["time"])
    self.worker_steps = np.array(state["worker_steps"], np.int64)
    self.requests = np.array(state["requests"], np.int64)
    self.bytes_sent = np.array(state["bytes_sent"], np.float64)
    between = state.get("bytes_between")
    self.bytes_between = (
      np.zeros_like(self.bytes_sent) if between is None else np.array(between, np.float64)
    )
    self.level_exchanges = [int(n) for n in state.get("level_exchanges", ())]
    self.server_bytes = np.array(state.get("server_bytes", (0.0, 0.0)), np.float64)
    self.gone = [int(j) for j in state.get("gone", ())]
    if "window" in state:
      self.window.load_state_dict(state["window"])
    else:  # a checkpoint of an earlier version: its window starts here
      self.window.restart(self.worker_steps)

  def peak_bytes_per_step(self) -> float | None:
    """The most bytes a worker sends in one step, where the schedule fixes it (None)."""
    return None


class Clock(RunTotals, abc.ABC):
  """Yields the ticks of a run and keeps the run's totals; its state is saved
  with every checkpoint."""

  def __init__(
    self,
    cluster: Cluster,
    num_workers: int,
    model_bytes: float,
    seed: int,
    sent_bytes: float | None = None,
  ):
    """model_bytes: the size of a message either way (its time); sent_bytes: what a
    worker's request carries (its count), model_bytes if None. A compressed
    exchange (easgd.rules.exchange.sizes) sends less than it gets back."""
    super().__init__(num_workers)
    self.cluster = cluster
    self.num_workers = num_workers
    self.model_bytes = model_bytes
    self.sent_bytes = model_bytes if sent_bytes is None else sent_bytes
    self.seed = seed
    self.mean_step_times = cluster.mean_step_times(num_workers)

  def _step_time(self, worker: int, step: int) -> float:
    return self.cluster.step_time(self.mean_step_times[worker], self.seed, worker, step)

  def next_tick(self) -> Tick:
    """Advances the simulation by one tick."""
    tick = self._advance()
    self.time = tick.time
    self.worker_steps += tick.local
    self.requests += tick.requests
    self.bytes_sent += tick.bytes_sent
    if tick.bytes_between is not None:
      self.bytes_between += tick.bytes_between
    self.count_levels(tick.levels)
    if tick.server_bytes is not None:
      self.server_bytes += tick.server_bytes
    self.gone += tick.left
    return tick

  @abc.abstractmethod
  def _advance(self) -> Tick:
    """The next tick."""


class RoundTotals:
  """What a round policy's rounds did so far (easgd.sim.rounds): rounds, contributions
  taken (members, and late messages of the round before), late and dropped workers,
  local steps lost to drops, and the simulated seconds saved against waiting for all
  (the waiting clock's time after the same steps, less this one's)."""

  KEYS = ("rounds", "contributions", "late", "dropped", "lost_steps", "saved")

  def __init__(self):
    self.values = dict.fromkeys(self.KEYS, 0)
    self.values["saved"] = 0.0

  def add(self, this_round: rounds.Round, steps: int) -> None:
    values = self.values
    values["rounds"] += 1
    values["contributions"] += int(this_round.members.sum() + this_round.held.sum())
    values["late"] += int(this_round.late.sum())
    values["dropped"] += int(this_round.dropped.sum())
    values["lost_steps"] += int(this_round.dropped.sum()) * steps

  def scalars(self) -> dict[str, float]:
    """The reports' rounds/ values (totals since step 0, and the mean round's size)."""
    values = self.values
    return {
      "rounds/contributions_per_round": values["contributions"] / max(values["rounds"], 1),
      "rounds/late": float(values["late"]),
      "rounds/dropped": float(values["dropped"]),
      "rounds/work_lost_steps": float(values["lost_steps"]),
      "rounds/wait_saved_seconds": float(values["saved"]),
    }

  def state_dict(self) -> dict:
    return dict(self.values)

  def load_state_dict(self, state: dict) -> None:
    self.values = {key: state[key] for key in self.KEYS}


class SyncClock(Clock):
  """All workers take their steps together; every `period`-th step ends with a
  barrier and an all-reduce (or each step for which `exchanges_after(steps
  taken before it)` says so, when the rule decides: `Rule.exchanges_after`).
  A rule of several levels (`Rule.levels`) names the levels whose exchange ends
  each step (`level_exchanges`), each an all-reduce among its blocks of workers
  (`timing.Exchange`) on the links it crosses (`Cluster.exchange`), one after
  another.

  Between all-reduces each worker runs at its own pace; the all-reduce starts
  when the slowest worker arrives and ends its time later for all.
  A tick's time is that of the latest worker.
  """

  def __init__(
    self,
    cluster,
    num_workers,
    model_bytes,
    seed,
    period: int,
    sent_bytes=None,
    exchanges_after: Callable[[int], bool] | None = None,
    levels: Sequence[Exchange] = (Exchange(),),
    level_exchanges: Callable[[int], Sequence[bool]] | None = None,
    policy: rounds.Policy | None = None,
  ):
    super().__init__(cluster, num_workers, model_bytes, seed, sent_bytes)
    self.period = period
    self.exchanges_after = exchanges_after or (lambda step: (step + 1) % period == 0)
    self.levels = tuple(levels)
    self.level_exchanges_after = level_exchanges or (lambda step: (self.exchanges_after(step),))
    self.policy = policy
    self.steps = 0
    self._worker_time = np.zeros(num_workers)
    # Under a round policy: the late workers of the last round, when their messages
    # arrive, the step of the last exchange, and the rounds' totals (`RoundTotals`).
    self._held = np.zeros(num_workers, bool)
    self._held_until = -math.inf
    self._last_exchange = 0
    self.round_totals = None if policy is None else RoundTotals()
    # The same cluster's schedule waiting for every worker, beside it (what it saves).
    self._waiting = None
    if policy is not None:
      self._waiting = self._waiting_for_all(sent_bytes, exchanges_after, levels, level_exchanges)

  def _waiting_for_all(self, sent_bytes, exchanges_after, levels, level_exchanges) -> "SyncClock":
    """This clock's schedule without a round policy: every round waits for every worker."""
    return SyncClock(
      self.cluster,
      self.num_workers,
      self.model_bytes,
      self.seed,
      self.period,
      sent_bytes,
      exchanges_after=exchanges_after,
      levels=levels,
      level_exchanges=level_exchanges,
    )

  def _advance(self) -> Tick:
    step = self.steps
    self.steps += 1
    for i in range(self.num_workers):
      self._worker_time[i] += self._step_time(i, step)
    requests = np.zeros(self.num_workers, np.int64)
    bytes_sent = np.zeros(self.num_workers)
    bytes_between = np.zeros(self.num_workers)
    levels = []
    this_round = None
    exchanges = self._exchanges_at_this_step()
    if exchanges and self.num_workers > 1:
      seconds = 0.0
      for level, size in exchanges:
        time, sent, between = self.cluster.exchange(
          size, self.num_workers, self.levels[level].block, self.levels[level].unit
        )
        seconds += time
        bytes_sent += sent
        bytes_between += between
        requests += 1
        if len(self.levels) > 1:
          levels.append(level)
      if self.policy is None:
        self._all_reduced(self._worker_time.max() + seconds)
      else:
        this_round = self._close_round(seconds)
        # A dropped worker sends nothing; a late one sends when it arrives.
        sending = this_round.members | this_round.late
        requests *= sending
        bytes_sent *= sending
        bytes_between *= sending
        healing = self._heal_messages(this_round)
        if healing is not None:
          bytes_sent += healing[0]
          bytes_between += healing[1]
    self._apply_arrivals()
    local = np.ones(self.num_workers, bool)
    if self._waiting is not None:
      waited = self._waiting.next_tick().time
      self.round_totals.values["saved"] = waited - float(self._worker_time.max())
    return Tick(
      float(self._worker_time.max()),
      local,
      [],
      [],
      [],
      requests,
      bytes_sent,
      bytes_between=bytes_between if bytes_between.any() else None,
      levels=levels,
      round=this_round,
    )

  def _close_round(self, seconds: float) -> rounds.Round:
    """A round under the policy (easgd.sim.rounds): it closes at T, and not before the
    late messages of the last round arrived; members and dropped workers go on at T +
    `seconds` (its all-reduce), late ones at their arrival + `seconds`."""
    arrivals = self._worker_time.copy()
    close = max(self.policy.closing_time(arrivals), self._held_until)
    members = arrivals <= close
    missed = ~members
    late = missed if self.policy.missed == "late" else np.zeros_like(missed)
    this_round = rounds.Round(
      members=members,
      late=late,
      dropped=missed & ~late,
      held=self._held,
    )
    self._worker_time[:] = close + seconds
    self._worker_time[late] = arrivals[late] + seconds
    self._held = late
    self._held_until = float(arrivals[late].max()) if late.any() else -math.inf
    self.round_totals.add(this_round, self.steps - self._last_exchange)
    self._last_exchange = self.steps
    return this_round

  def _heal_messages(self, this_round: rounds.Round) -> tuple[np.ndarray, np.ndarray] | None:
    """(bytes [P], of them between groups [P]) that the round's heals send beyond its
    all-reduce; None: none (a dropped worker takes the round's result, the whole model)."""
    del this_round

  def _exchanges_at_this_step(self) -> list[tuple[int, float]]:
    """(level, bytes) of each all-reduce at the end of this step (`self.steps` done)."""
    fired = self.level_exchanges_after(self.steps - 1)
    return [(level, self.model_bytes) for level, fires in enumerate(fired) if fires]

  def _all_reduced(self, end: float) -> None:
    """An all-reduce that started when the slowest worker arrived ends at `end`: every
    worker waits for it."""
    self._worker_time[:] = end

  def _apply_arrivals(self) -> None:
    """Results waited for later than their all-reduce: none here."""

  def state_dict(self):
    state = {**super().state_dict(), "steps": self.steps, "worker_time": self._worker_time.tolist()}
    if self.round_totals is not None:
      state["rounds"] = {
        "held": self._held.tolist(),
        # None: no late message (JSON has no -inf).
        "held_until": None if self._held_until == -math.inf else self._held_until,
        "last_exchange": self._last_exchange,
        "totals": self.round_totals.state_dict(),
        "waiting": self._waiting.state_dict(),
      }
    return state

  def load_state_dict(self, state):
    super().load_state_dict(state)
    self.steps = int(state["steps"])
    self._worker_time = np.array(state["worker_time"], np.float64)
    if self.round_totals is not None:
      saved = state["rounds"]
      self._held = np.array(saved["held"], bool)
      until = saved["held_until"]
      self._held_until = -math.inf if until is None else float(until)
      self._last_exchange = int(saved["last_exchange"])
      self.round_totals.load_state_dict(saved["totals"])
      self._waiting.load_state_dict(saved["waiting"])

  def peak_bytes_per_step(self) -> float:
    """The most bytes a worker sends in one step: an all-reduce of the model; for a
    rule of several levels, of the levels that end one step together (those of its
    first 4096 steps)."""
    if self.num_workers == 1:
      return 0.0
    sent = [
      self.cluster.exchange(self.model_bytes, self.num_workers, level.block, level.unit)[1]
      for level in self.levels
    ]
    if len(sent) == 1:
      return float(sent[0].max())
    together = {tuple(bool(f) for f in self.level_exchanges_after(step)) for step in range(4096)}
    return max(
      float(sum((bytes_ for bytes_, f in zip(sent, fired, strict=True) if f), np.zeros(1)).max())
      for fired in together
    )


class StreamingClock(SyncClock):
  """The streaming rules' schedule (easgd.rules.streaming): every period/F steps one
  fragment's all-reduce, of that fragment's bytes, overlapped with the next
  `delay` steps. It starts when the slowest worker has sent, and a worker
  waits for its end only `delay` steps later, when the result is applied;
  with F = 1 and no delay this is SyncClock's schedule.

  Under a round policy (easgd.sim.rounds) each send is a round of its fragment:
  it closes at T (and not before the late messages of that fragment's round
  before have arrived), its all-reduce of the members' messages ends at T + c,
  and each worker waits for it `delay` steps later. A dropped worker abandons
  its steps in progress at T and downloads the round's first member's state
  (easgd.rules.streaming; `heal_bytes`, its parameters and inner optimizer
  state): the member sends the downloads one after another on its link, each
  on the link between the two, and a dropped worker goes on once its own has
  arrived (the member's own steps do not wait for them). A late worker sends
  at its arrival a_j, and waits for a_j + c. With F = 1 and no delay the
  round's result replaces every parameter at once, and as in SyncClock the
  heal (its inner state) is not costed: these are SyncClock's rounds.
  """

  def __init__(
    self,
    cluster,
    num_workers,
    model_bytes,
    seed,
    period,
    fragment_bytes,
    delay,
    policy=None,
    heal_bytes=None,
  ):
    """heal_bytes: what a dropped worker downloads of a member (its parameters as they
    are, where model_bytes is the exchanged message's size, and inner optimizer
    state), model_bytes if None."""
    self.fragment_bytes = [float(size) for size in fragment_bytes]
    self.delay = delay
    self.heal_bytes = float(model_bytes if heal_bytes is None else heal_bytes)
    super().__init__(cluster, num_workers, model_bytes, seed, period, policy=policy)
    # Step count at which a result is applied -> when each worker has it, [P].
    self._arrivals: dict[int, np.ndarray] = {}
    # Under a round policy, each fragment's late workers of its last round, and when
    # their messages arrive (its next round closes no sooner).
    count = len(self.fragment_bytes)
    self._fragment_held = np.zeros((count, num_workers), bool)
    self._fragment_held_until = [-math.inf] * count

  def _waiting_for_all(self, sent_bytes, exchanges_after, levels, level_exchanges):
    del sent_bytes, exchanges_after, levels, level_exchanges
    return StreamingClock(
      self.cluster,
      self.num_workers,
      self.model_bytes,
      self.seed,
      self.period,
      self.fragment_bytes,
      self.delay,
    )

  def _fragment(self) -> int | None:
    """The fragment f sent at the end of this step, (t - f*period/F) mod period == 0 with
    t = `self.steps`; None: none."""
    spacing = self.period // len(self.fragment_bytes)
    phase = self.steps % self.period
    return phase // spacing if phase % spacing == 0 else None

  def _exchanges_at_this_step(self) -> list[tuple[int, float]]:
    """Fragment f's bytes when it is sent at the end of this step."""
    fragment = self._fragment()
    return [] if fragment is None else [(0, self.fragment_bytes[fragment])]

  def _all_reduced(self, end: float) -> None:
    # The workers go on; they wait for it when its result is applied.
    self._arrivals[self.steps + self.delay] = np.full(self.num_workers, end)

  def _close_round(self, seconds: float) -> rounds.Round:
    fragment = self._fragment()
    arrivals = self._worker_time.copy()
    close = max(self.policy.closing_time(arrivals), self._fragment_held_until[fragment])
    members = arrivals <= close
    missed = ~members
    late = missed if self.policy.missed == "late" else np.zeros_like(missed)
    dropped = missed & ~late
    this_round = rounds.Round(
      members=members, late=late, dropped=dropped, held=self._fragment_held[fragment].copy()
    )
    ends = np.full(self.num_workers, close + seconds)
    ends[late] = arrivals[late] + seconds
    self._arrivals[self.steps + self.delay] = ends
    self._worker_time[dropped] = close
    if self._downloads():
      # The member sends the downloads one after another on its link: the k-th
      # dropped worker has its state k messages after the close.
      between, queued = self._heal_between(this_round), 0.0
      for j in np.flatnonzero(dropped):
        latency, bandwidth = self.cluster.link(bool(between[j]))
        queued += self.heal_bytes / bandwidth
        self._worker_time[j] += latency + queued
    self._fragment_held[fragment] = late
    self._fragment_held_until[fragment] = float(arrivals[late].max()) if late.any() else -math.inf
    self.round_totals.add(this_round, self.steps - self._last_exchange)
    self._last_exchange = self.steps
    return this_round

  def _downloads(self) -> bool:
    """Whether a dropped worker downloads a member's parameters: unless the round's
    result replaces all of them before its next step (F = 1 and no delay)."""
    return len(self.fragment_bytes) > 1 or self.delay > 0

  def _heal_between(self, this_round: rounds.Round) -> np.ndarray:
    """bool [P]: whether each worker is in another group than the round's first member."""
    groups = self.cluster.group_of(self.num_workers)
    return groups != groups[int(np.argmax(this_round.members))]

  def _heal_messages(self, this_round):
    if not (self._downloads() and this_round.dropped.any()):
      return None
    first = int(np.argmax(this_round.members))
    between = self._heal_between(this_round) & this_round.dropped
    sent, crossed = np.zeros(self.num_workers), np.zeros(self.num_workers)
    sent[first] = self.heal_bytes * int(this_round.dropped.sum())
    crossed[first] = self.heal_bytes * int(between.sum())
    return sent, crossed

  def _apply_arrivals(self) -> None:
    if self.steps in self._arrivals:
      np.maximum(self._worker_time, self._arrivals.pop(self.steps), out=self._worker_time)

  def state_dict(self):
    arrivals = [[step, ends.tolist()] for step, ends in sorted(self._arrivals.items())]
    state = {**super().state_dict(), "arrivals": arrivals}
    if self.round_totals is not None:
      state["fragment_rounds"] = {
        "held": self._fragment_held.tolist(),
        # None: no late message (JSON has no -inf).
        "held_until": [None if u == -math.inf else u for u in self._fragment_held_until],
      }
    return state

  def load_state_dict(self, state):
    super().load_state_dict(state)
    # An end saved as one number (before rounds) is every worker's.
    self._arrivals = {
      int(step): np.broadcast_to(np.asarray(ends, np.float64), (self.num_workers,)).copy()
      for step, ends in state["arrivals"]
    }
    if self.round_totals is not None:
      saved = state["fragment_rounds"]
      self._fragment_held = np.array(saved["held"], bool)
      self._fragment_held_until = [
        -math.inf if u is None else float(u) for u in saved["held_until"]
      ]

  def peak_bytes_per_step(self) -> float:
    """The most bytes a worker sends in one step: one all-reduce of the largest fragment,
    and under drop the round's first member's uploads to the P - m it may drop (an
    upper bound: the member need not be the worker that sends the most)."""
    if self.num_workers == 1:
      return 0.0
    peak = float(self.cluster.exchange(max(self.fragment_bytes), self.num_workers)[1].max())
    if self.policy is not None and self.policy.missed == "drop" and self._downloads():
      peak += (self.num_workers - self.policy.count) * self.heal_bytes
    return peak


class AsyncClock(Clock):
  """A parameter server and its workers, simulated event by event.

  A worker's life is a loop of steps. Every `period`-th step (its own period)
  includes a request to the master: one message there (the worker's
  parameters, or its accumulated gradient), the master's service, one
  message back.
    * exchange_first=True (the EASGD family): the request is sent at the
      start of the step, and the step's gradient is computed after the
      reply, at the parameters the worker had sent (the paper's Algorithm 1:
      both the elastic term and the gradient use x_i before the step).
    * exchange_first=False (SGD family, Downpour): the gradient is computed
      first and pushed at the end of the step; the reply holds the fresh
      parameters.
  Events are packed into ticks by `TickPacker` (easgd.sim.events).
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
    period: int | Sequence[int],
    policy: Policy,
    exchange_first: bool,
    sent_bytes=None,
  ):
    """period: local steps between two requests of a worker, the same for every
    worker or each worker's own (async_local_sgd's dynamic local steps)."""
    super().__init__(cluster, num_workers, model_bytes, seed, sent_bytes)
    if isinstance(period, Sequence):
      if len(period) != num_workers:
        raise ValueError(f"{len(period)} periods for {num_workers} workers")
      self.periods = [operator.index(p) for p in period]
    else:
      self.periods = [operator.index(period)] * num_workers
    self.policy = policy
    self.exchange_first = exchange_first
    # Each worker's one message to its server, inside its group or between groups.
    self._between = [self._reaches_server_between(j) for j in range(num_workers)]
    self.messages = [self._message_time(model_bytes, between) for between in self._between]
    self.service = cluster.service_time(model_bytes)
    self._heap: list[tuple[float, _Event, int]] = []
    self._begun = [0] * num_workers  # steps begun by each worker
    self._missed = [0] * num_workers  # others' master updates since a worker's last read
    self._master_free = 0.0
    self._turn = 0
    self._waiting: dict[int, float] = {}  # round robin: worker -> arrival time
    # Ticks still open to events, from the next one to be released on.
    self._ticks = TickPacker(num_workers, self._servers())
    for worker in range(num_workers):
      self._begin_step(worker, 0.0)

  def _reaches_server_between(self, worker: int) -> bool:
    """Whether `worker`'s messages to its server cross groups (the servers are in
    cluster.server_group)."""
    return self.cluster.reaches_servers_between(worker, self.num_workers)

  def _message_time(self, num_bytes: float, between: bool) -> float:
    latency, bandwidth = self.cluster.link(between)
    return latency + num_bytes / bandwidth

  def _servers(self) -> int:
    """Rows of the packer beyond the workers' (TickPacker): none here."""
    return 0

  # The simulation.

  def _push(self, time: float, kind: _Event, worker: int) -> None:
    heapq.heappush(self._heap, (time, kind, worker))

  def _begin_step(self, worker: int, time: float) -> None:
    step = self._begun[worker]
    self._begun[worker] += 1
    if self.exchange_first and (step + 1) % self.periods[worker] == 0:
      self._push(time + self.messages[worker], _Event.ARRIVE, worker)
    else:
      self._push(time + self._step_time(worker, step), _Event.DONE, worker)

  def _after_reply(self, worker: int, time: float) -> None:
    if self.exchange_first:
      # The step's gradient is computed after the reply; then the next step.
      step = self._begun[worker] - 1
      self._push(time + self._step_time(worker, step), _Event.START, worker)
    else:
      self._begin_step(worker, time)

  def _read(self, worker: int, time: float, op: OpKind, wait: float) -> None:
    staleness, self._missed[worker] = self._missed[worker], 0
    self._ticks.emit(
      time,
      worker,
      self.exchange_first,
      op,
      staleness,
      wait,
      self.sent_bytes,
      between=self._between[worker],
    )

  def _written(self, worker: int) -> None:
    for other in range(self.num_workers):
      if other != worker:
        self._missed[other] += 1

  def _serve(self, worker: int, arrival: float) -> None:
    """Serves a request under the lock, as soon as the master is free."""
    start = max(arrival, self._master_free)
    self._master_free = start + self.service
    self._read(worker, start, OpKind.EXCHANGE, wait=start - arrival)
    self._written(worker)
    self._after_reply(worker, self._master_free + self.messages[worker])

  def _handle(self, time: float, kind: _Event, worker: int) -> None:
    if kind == _Event.START:
      self._begin_step(worker, time)
    elif kind == _Event.DONE:
      self._ticks.emit(time, worker, local=True)
      if not self.exchange_first and self._begun[worker] % self.periods[worker] == 0:
        self._push(time + self.messages[worker], _Event.ARRIVE, worker)
      else:
        self._begin_step(worker, time)
    elif kind == _Event.ARRIVE and self.policy == Policy.FCFS:
      self._serve(worker, time)
    elif kind == _Event.ARRIVE and self.policy == Policy.ROUND_ROBIN:
      self._waiting[worker] = time
      while self._turn in self._waiting:
        turn = self._turn
        self._serve(turn, self._waiting.pop(turn))
        self._turn = (turn + 1) % self.num_workers
    elif kind == _Event.ARRIVE:  # hogwild: read now, write later
      self._read(worker, time, OpKind.READ, wait=0.0)
      self._push(time + self.service, _Event.WRITE, worker)
    else:  # _Event.WRITE
      self._ticks.emit(time, worker, local=False, op=OpKind.WRITE)
      self._written(worker)
      self._after_reply(worker, time + self.messages[worker])

  def _advance(self) -> Tick:
    while True:
      while not self._ticks.complete():
        self._handle(*heapq.heappop(self._heap))
      tick = self._ticks.release()
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
      **self._ticks.state_dict(),
    }

  def load_state_dict(self, state):
    super().load_state_dict(state)
    self._heap = [(float(t), _Event(int(k)), int(w)) for t, k, w in state["heap"]]
    self._begun = [int(n) for n in state["begun"]]
    self._missed = [int(n) for n in state["missed"]]
    self._master_free = float(state["master_free"])
    self._turn = int(state["turn"])
    self._waiting = {int(w): float(t) for w, t in state["waiting"]}
    self._ticks.load_state_dict(state)


class TwoTierClock(AsyncClock):
  """HALoS's two tiers of parameter servers (easgd.rules.tiers), simulated event by event.

  Each group of `cluster.groups` has its server, in the group: its workers reach it
  over the link inside the group, and it serves them with the rule's discipline,
  as AsyncClock's master does (first come first served under its own lock, round
  robin over its own workers, or Hogwild), one service time a request. Once
  `global_every` (K) of its workers' requests have been served since its last
  merge and none of its sends is in flight, it sends (SEND, when the K-th request's
  service ends); the send reaches the global server one message later (over the
  link between groups, or inside for the group of `cluster.server_group`), which
  serves sends one at a time, a service time each (APPLY, as the service
  starts); the global model reaches the group server one message later, which
  merges it (MERGE) once the requests queued before its arrival are served. A
  worker's staleness counts its group server's updates since its last read,
  merges included.
  """

  def __init__(
    self,
    cluster,
    num_workers,
    model_bytes,
    seed,
    period,
    policy: Policy,
    exchange_first: bool,
    global_every: int,
    sent_bytes=None,
  ):
    self.group_of = [int(g) for g in cluster.group_of(num_workers)]
    self.members = [
      [j for j in range(num_workers) if self.group_of[j] == g]
      for g in range(len(cluster.group_sizes(num_workers)))
    ]
    self.global_every = global_every
    groups = len(self.members)
    self._group_free = [0.0] * groups
    self._turns = [0] * groups  # round robin: each group's next worker, by position
    self._group_waiting: list[dict[int, float]] = [{} for _ in range(groups)]
    self._since_merge = [0] * groups
    self._in_flight = [False] * groups
    self._global_free = 0.0
    super().__init__(
      cluster, num_workers, model_bytes, seed, period, policy, exchange_first, sent_bytes
    )
    # A group server's message to the global server, and whether it crosses groups.
    self._uplinks = [g != cluster.server_group for g in range(groups)]
    self.uplink_times = [self._message_time(model_bytes, between) for between in self._uplinks]

  def _reaches_server_between(self, worker: int) -> bool:
    return False  # its group's server is in its group

  def _servers(self) -> int:
    return len(self.members)

  def _read(self, worker, time, op, wait):
    super()._read(worker, time, op, wait)
    self._ticks.note_level(self._ticks.last_tick(worker), 0)  # a request: level 0

  def _written(self, worker: int) -> None:
    for other in self.members[self.group_of[worker]]:
      if other != worker:
        self._missed[other] += 1

  def _served(self, group: int, time: float) -> None:
    """A request of the group's was applied at its server by `time`: the K-th since
    its last merge sends, if none of its sends is in flight."""
    self._since_merge[group] += 1
    if self._since_merge[group] >= self.global_every and not self._in_flight[group]:
      self._in_flight[group] = True
      row = self.num_workers + group
      index = self._ticks.emit(time, row, local=False, op=OpKind.SEND)
      self._ticks.note_level(index, 1)
      self._ticks.note_server_bytes(index, self.model_bytes, self._uplinks[group])
      self._push(time + self.uplink_times[group], _Event.GLOBAL, group)

  def _serve(self, worker: int, arrival: float) -> None:
    group = self.group_of[worker]
    start = max(arrival, self._group_free[group])
    self._group_free[group] = start + self.service
    self._read(worker, start, OpKind.EXCHANGE, wait=start - arrival)
    self._written(worker)
    self._served(group, start + self.service)
    self._after_reply(worker, self._group_free[group] + self.messages[worker])

  def _handle(self, time: float, kind: _Event, index: int) -> None:
    if kind == _Event.GLOBAL:
      start = max(time, self._global_free)
      self._global_free = start + self.service
      self._ticks.emit(start, self.num_workers + index, local=False, op=OpKind.APPLY)
      self._push(self._global_free + self.uplink_times[index], _Event.MERGE, index)
    elif kind == _Event.MERGE:
      locked = self.policy != Policy.HOGWILD
      at = max(time, self._group_free[index]) if locked else time
      row = self.num_workers + index
      tick = self._ticks.emit(at, row, local=False, op=OpKind.MERGE)
      self._ticks.note_server_bytes(tick, self.model_bytes, self._uplinks[index])
      self._since_merge[index] = 0
      self._in_flight[index] = False
      for worker in self.members[index]:
        self._missed[worker] += 1
    elif kind == _Event.ARRIVE and self.policy == Policy.ROUND_ROBIN:
      group = self.group_of[index]
      waiting, members = self._group_waiting[group], self.members[group]
      waiting[index] = time
      while members[self._turns[group]] in waiting:
        turn = members[self._turns[group]]
        self._serve(turn, waiting.pop(turn))
        self._turns[group] = (self._turns[group] + 1) % len(members)
    elif kind == _Event.WRITE:  # Hogwild: the increment lands at the group's server
      self._ticks.emit(time, index, local=False, op=OpKind.WRITE)
      self._written(index)
      self._served(self.group_of[index], time)
      self._after_reply(index, time + self.messages[index])
    else:
      super()._handle(time, kind, index)

  def state_dict(self):
    return {
      **super().state_dict(),
      "group_free": list(self._group_free),
      "turns": list(self._turns),
      "group_waiting": [
        sorted([w, t] for w, t in waiting.items()) for waiting in self._group_waiting
      ],
      "since_merge": list(self._since_merge),
      "in_flight": list(self._in_flight),
      "global_free": self._global_free,
    }

  def load_state_dict(self, state):
    super().load_state_dict(state)
    self._group_free = [float(t) for t in state["group_free"]]
    self._turns = [int(n) for n in state["turns"]]
    self._group_waiting = [{int(w): float(t) for w, t in pairs} for pairs in state["group_waiting"]]
    self._since_merge = [int(n) for n in state["since_merge"]]
    self._in_flight = [bool(b) for b in state["in_flight"]]
    self._global_free = float(state["global_free"])
