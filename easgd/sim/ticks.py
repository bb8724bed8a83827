"""Ticks: the unit of the device program, and what the clocks hand it.

In a tick every worker takes at most one local step, then the master serves
an ordered list of operations (`OpKind`) on behalf of workers.
"""

import dataclasses
import enum

import numpy as np

from easgd.sim.rounds import Round


class OpKind(enum.IntEnum):
  """Kinds of master operations in a tick (the device program switches on them)."""

  EXCHANGE = 0  # a request served under the lock: read and write at once
  READ = 1  # Hogwild: the request reads the center on arrival
  WRITE = 2  # Hogwild: its increment lands one service time later
  # A worker process (re)joins or leaves (runtime=ray, cluster.on_worker_loss): its row
  # restarts from the center, x_j <- x~, with fresh optimizer state.
  RESET = 3
  # Two-tier servers (easgd.rules.tiers), each on behalf of a group g, not a worker:
  SEND = 4  # g's server sends its change since its last merge
  APPLY = 5  # the global server applies it
  MERGE = 6  # g's server merges the global model back


# The operations that serve a worker's request, each with its staleness (Tick.staleness).
REQUESTS = (OpKind.EXCHANGE, OpKind.READ)


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
    left: workers whose process left the run for good in the tick (a RESET
      "leave" of runtime=ray's cluster.on_worker_loss=continue).
    unvalued: workers whose local step in the tick gave the recorded run no loss
      or accuracy (runtime=ray: the process died as it computed the step, after
      its request was served); a replay leaves them out of the logged means too.
    bytes_between: the part of bytes_sent that crossed groups (easgd.sim.timing's
      two-level network), [P]; None: none did.
    levels: the level of each exchange round in the tick (a hierarchical rule's
      levels, `Rule.levels`; under two-tier servers a worker's request is level 0
      and a group server's send level 1).
    server_bytes: [inside groups, between groups]: what the two-tier servers sent
      each other in the tick (None: nothing).
    round: the membership of a synchronous round that closed in the tick under a
      round policy (easgd.sim.rounds); None: no such round.
  """

  time: float
  local: np.ndarray
  ops: list[tuple[int, int]]
  staleness: list[int]
  waits: list[float]
  requests: np.ndarray
  bytes_sent: np.ndarray
  left: list[int] = dataclasses.field(default_factory=list)
  unvalued: list[int] = dataclasses.field(default_factory=list)
  bytes_between: np.ndarray | None = None
  levels: list[int] = dataclasses.field(default_factory=list)
  server_bytes: list[float] | None = None
  round: Round | None = None

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
      "left": list(self.left),
      "unvalued": list(self.unvalued),
      **({} if self.bytes_between is None else {"bytes_between": self.bytes_between.tolist()}),
      **({"levels": list(self.levels)} if self.levels else {}),
      **({} if self.server_bytes is None else {"server_bytes": list(self.server_bytes)}),
      **({} if self.round is None else {"round": self.round.to_dict()}),
    }

  @classmethod
  def from_dict(cls, values: dict) -> "Tick":
    """Inverse of `to_dict`."""
    return cls(
      time=float(values["time"]),
      local=np.array(values["local"], bool),
      ops=[(OpKind(int(kind)), int(worker)) for kind, worker in values["ops"]],
      staleness=[int(n) for n in values["staleness"]],
      waits=[float(w) for w in values["waits"]],
      requests=np.array(values["requests"], np.int64),
      bytes_sent=np.array(values["bytes_sent"], np.float64),
      left=[int(worker) for worker in values.get("left", ())],
      unvalued=[int(worker) for worker in values.get("unvalued", ())],
      bytes_between=(
        np.array(values["bytes_between"], np.float64) if "bytes_between" in values else None
      ),
      levels=[int(level) for level in values.get("levels", ())],
      server_bytes=(
        [float(n) for n in values["server_bytes"]] if "server_bytes" in values else None
      ),
      round=Round.from_dict(values["round"]) if "round" in values else None,
    )

  def device_inputs(self, servers: bool = False) -> dict[str, np.ndarray]:
    """The arrays the device program reads: masks and the padded list of operations,
    with each request's staleness (`staleness`, at the position of the EXCHANGE or
    READ that served it; 0 elsewhere); with two-tier `servers`, room for their
    operations besides (SEND, APPLY, MERGE: the operation's index is its group's)."""
    num_workers = len(self.local)
    # At most three operations a worker in a tick: a READ, its WRITE, and runtime=ray's
    # join or leave at a cut (easgd.sim.events); and at most a SEND, APPLY and MERGE
    # for each request a group server serves.
    size = 3 * num_workers * (2 if servers else 1)
    kinds = np.zeros(size, np.int32)
    workers = np.zeros(size, np.int32)
    staleness = np.zeros(size, np.int32)
    served = iter(self.staleness)
    for position, (kind, worker) in enumerate(self.ops):
      kinds[position], workers[position] = kind, worker
      if kind in REQUESTS:
        staleness[position] = next(served, 0)  # a tick built by hand may record none
    return {
      "local": self.local.copy(),
      "op_kind": kinds,
      "op_worker": workers,
      "op_staleness": staleness,
      "num_ops": np.int32(len(self.ops)),
    }
