"""Packing a discrete-event simulation's events into ticks.

`AsyncClock` (easgd.sim.clocks) simulates workers and master event by event;
`TickPacker` places each event into the earliest tick its order allows:
  * a worker's local step goes to the tick after that worker's previous event;
  * a master operation goes to the tick of the requester's previous event
    or later, never before the master's previous operation, after which it
    is appended;
  * a RESET (a worker process joining or leaving) goes to the tick after
    the worker's previous event or later, never before the master's
    previous operation: no other event of that worker shares its tick;
  * a RESET at a cut (runtime=ray: the process lost with every worker parked)
    goes to the cut's tick, still open, after its operations: the tick
    program then discards the worker's local step there, whose result the
    lost process held (easgd.rules.parameter_server).
Local steps of different workers commute, so each tick's state is a
consistent cut of the simulation, and `Tick.time` is the latest event in it.
"""

import collections

from easgd.sim.ticks import OpKind, Tick


class TickPacker:
  """The ticks still open to events, from the next one to be released on.

  With `servers` > 0 (two-tier servers, easgd.rules.tiers) rows P, ..., P + servers - 1
  are the group servers': their events are operations only (SEND, APPLY, MERGE on
  behalf of group row - P), placed as a worker's operation is, after their own last.
  """

  def __init__(self, num_workers: int, servers: int = 0):
    self.num_workers = num_workers
    self._open: collections.deque[Tick] = collections.deque()
    self._released = 0  # index of self._open[0]
    self._last_tick = [-1] * (num_workers + servers)  # tick of each row's latest event
    self._last_op_tick = 0
    self._cut_closed = -1  # the tick of the last reset at a cut: no later event falls in it

  def emit(
    self,
    time: float,
    worker: int,
    local: bool,
    op: OpKind | None = None,
    staleness: int = -1,
    wait: float = 0.0,
    sent: float = 0.0,
    at_cut: int | None = None,
    between: bool = False,
  ) -> int:
    """Places one event of `worker`: a local step (`local`) and/or a master operation
    (`op`); a served request also records its staleness, wait and bytes. Returns
    the index of the tick it falls in. `at_cut`: a RESET's cut, the tick it goes to;
    `between`: the bytes sent crossed groups."""
    if at_cut is None:
      index = self.index_of(worker, local, op is not None, reset=op == OpKind.RESET)
    else:
      earliest = max(self._last_tick[worker], self._last_op_tick)
      if op != OpKind.RESET or local or at_cut < earliest:
        raise ValueError(
          f"worker {worker}'s reset at the cut of tick {at_cut} falls before its own or "
          f"the master's last event (tick {earliest})"
        )
      index = at_cut
    if index < self._cut_closed or (at_cut is None and index == self._cut_closed):
      raise ValueError(f"worker {worker}'s event falls in tick {index}, closed by a cut")
    if at_cut is not None:
      self._cut_closed = at_cut
    if index < self._released:
      raise ValueError(f"worker {worker}'s event falls in tick {index}, already released")
    if op is not None:
      self._last_op_tick = index
    self._last_tick[worker] = index
    while len(self._open) <= index - self._released:
      self._open.append(Tick.empty(self.num_workers))
    tick = self._open[index - self._released]
    tick.time = max(tick.time, time)
    if worker >= self.num_workers:  # a group server's operation, on behalf of its group
      tick.ops.append((op, worker - self.num_workers))
      return index
    tick.local[worker] |= local
    if op is not None:
      tick.ops.append((op, worker))
    if staleness >= 0:
      tick.staleness.append(staleness)
      tick.waits.append(wait)
      tick.requests[worker] += 1
    tick.bytes_sent[worker] += sent
    if between and sent:
      if tick.bytes_between is None:
        tick.bytes_between = tick.bytes_sent * 0.0
      tick.bytes_between[worker] += sent
    return index

  def index_of(self, worker: int, local: bool, op: bool, reset: bool = False) -> int:
    """The tick an event of `worker` would fall in if it were emitted now."""
    last = self._last_tick[worker]
    if reset:
      return max(last + 1, self._last_op_tick)
    if not op:
      return last + 1
    return max(last + 1 if local else last, self._last_op_tick)

  def complete(self) -> bool:
    """Whether no future event can fall into the next tick to release."""
    # A worker's next local step goes to last + 1 or later; its next operation
    # to max(last, last operation's tick) or later; a group server's, the latter.
    workers = self._last_tick[: self.num_workers]
    earliest = min(min(last + 1, max(last, self._last_op_tick)) for last in workers)
    for last in self._last_tick[self.num_workers :]:
      earliest = min(earliest, max(last, self._last_op_tick))
    return self._released < earliest

  def last_tick(self, row: int) -> int:
    """The tick of the row's latest event."""
    return self._last_tick[row]

  def note_level(self, index: int, level: int) -> None:
    """Counts an exchange round of `level` in tick `index` (Tick.levels)."""
    self._open[index - self._released].levels.append(level)

  def note_server_bytes(self, index: int, sent: float, between: bool) -> None:
    """Bytes a two-tier server sent in tick `index`, inside a group or between groups."""
    tick = self._open[index - self._released]
    if tick.server_bytes is None:
      tick.server_bytes = [0.0, 0.0]
    tick.server_bytes[int(between)] += sent

  def release(self) -> Tick:
    """The next tick (call when `complete()`); it may be empty."""
    self._released += 1
    return self._open.popleft()

  def ops_in(self, index: int) -> int:
    """Master operations already in tick `index` (the next one's position there)."""
    position = index - self._released
    return len(self._open[position].ops) if 0 <= position < len(self._open) else 0

  def release_all(self) -> list[Tick]:
    """Every tick still open, in order: when no event can fall in them any more
    (the end of a trace; a cut of the threads runtime, after which every
    worker's next event falls past the last tick opened)."""
    ticks = list(self._open)
    self._released += len(ticks)
    self._open.clear()
    return ticks

  def state_dict(self) -> dict:
    return {
      "open": [tick.to_dict() for tick in self._open],
      "released": self._released,
      "last_tick": list(self._last_tick),
      "last_op_tick": self._last_op_tick,
    }

  def load_state_dict(self, state: dict) -> None:
    self._open = collections.deque(Tick.from_dict(tick) for tick in state["open"])
    self._released = int(state["released"])
    self._last_tick = [int(n) for n in state["last_tick"]]
    self._last_op_tick = int(state["last_op_tick"])
