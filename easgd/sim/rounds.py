"""Rounds that proceed at a quorum: which workers a synchronous exchange waits for.

By default a synchronous rule's exchange (its all-reduce) waits for every
worker. With `outer.quorum` below the workers a round closes without the
slowest, at the time torchft's lighthouse forms a quorum (`quorum_compute`:
at least `min_replicas` present, and everyone joined or `join_timeout` passed
since the first join). With a_(1) <= ... <= a_(P) the workers' arrivals at the
round (the ends of their local steps), m the quorum and D the deadline
(`outer.deadline`, seconds after the first arrival):

  T = max(a_(m), min(a_(P), a_(1) + D))

so D = 0 closes at the m-th arrival, and a D past every arrival (or m = P)
waits for all, as a round without a quorum does. The members are the workers
that arrived by T; the others missed it, and `outer.missed` says what becomes
of them:

  drop  (torchft's heal) the worker abandons its local steps since the last
        exchange at T and takes the round's result: its parameters are set
        to the new center and its inner optimizer's state to that of the
        round's first member (the state torchft's healing replica downloads
        from a peer); its steps of the round are lost.
  late  (FedBuff, Decoupled DiLoCo) the worker finishes its steps, sends the
        same message it would have sent, and takes the round's result when it
        arrives; its message enters the next round with weight
        w = 1/sqrt(1 + s), s = 1 its staleness in rounds (FedBuff's staleness
        scaling, Nguyen et al., "Federated Learning with Buffered Asynchronous
        Aggregation", AISTATS 2022, section 3). The next round never closes
        before the late messages of this one have arrived, so a message is at
        most one round stale: the devices step every worker every step, and
        a worker's next local steps start from this round's result.

The round's average is over its contributions, never over absent zeros
(torchft's `WorldSizeMode.DYNAMIC`); `outer.world_size=fixed` divides by the P
workers instead, the absent ones' messages (differences, gradients) counting
as zeros: a world size fixed at P, where torchft's `FIXED_WITH_SPARES` fixes it
at min_replicas and zeroes the gradients of the replicas beyond them. The
equations of each rule under each policy are docs/algorithms.md's.

The round's all-reduce takes the time it takes over every worker (the
timing model's, easgd.sim.timing): after it a member or a dropped worker
starts its next steps at T + that time, a late worker at its own arrival plus
that time. What the policy saves is measured against a clock of the same
cluster and seed that waits for every worker: its simulated time after the
same steps, less this one's.
"""

import dataclasses
import math

import numpy as np

from easgd.declare import Allowed, Field, Shapes, number, one_of
from easgd.errors import require

MISSED = ("drop", "late")
WORLD_SIZES = ("dynamic", "fixed")
# The staleness in rounds of a late message: the next round takes it.
LATE_STALENESS = 1


def late_weight(staleness: int) -> float:
  """FedBuff's weight of a message `staleness` rounds late: 1/sqrt(1 + s)."""
  return 1.0 / math.sqrt(1.0 + staleness)


def _quorum_value(value) -> bool:
  if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
    return False
  return 0 < value <= 1 or (value > 1 and float(value).is_integer())


QUORUM = Field(
  "outer.quorum",
  1.0,
  Allowed(
    _quorum_value,
    "must be a fraction of the workers in (0, 1] or a count of workers >= 2 (e.g. 0.75 or 6)",
  ),
  "the contributions a synchronous round closes with: a fraction of the workers in (0, 1] "
  "(rounded up) or a count >= 2; 1.0 waits for every worker (easgd/sim/rounds.py)",
  Shapes.IF_READ,
  earlier=1.0,
  setting="quorum",
  exclusive="quorum rounds",
)
DEADLINE = Field(
  "outer.deadline",
  0.0,
  number(0, infinite=True, words="must be a number of seconds >= 0 (inf: wait for every worker)"),
  "seconds after a round's first arrival that it waits beyond its quorum for the others "
  "(torchft's join_timeout); 0 closes it at the quorum",
  Shapes.IF_READ,
  earlier=0.0,
  setting="deadline",
  exclusive="quorum rounds",
)
MISSED_FIELD = Field(
  "outer.missed",
  "drop",
  one_of(MISSED),
  "what becomes of a worker that misses a round: drop (it takes the round's result and its "
  "steps since the last exchange are lost) or late (its message enters the next round, "
  "weighted 1/sqrt(2))",
  Shapes.IF_READ,
  earlier="drop",
  setting="missed",
  exclusive="quorum rounds",
)
WORLD_SIZE = Field(
  "outer.world_size",
  "dynamic",
  one_of(WORLD_SIZES),
  "what a round's sum is divided by: dynamic (its contributions) or fixed (the workers, the "
  "absent ones' messages counting as zeros)",
  Shapes.IF_READ,
  earlier="dynamic",
  setting="world_size",
  exclusive="quorum rounds",
)
FIELDS = (QUORUM, DEADLINE, MISSED_FIELD, WORLD_SIZE)
READS = tuple(field.path for field in FIELDS)


def quorum_count(quorum: float, num_workers: int) -> int:
  """m: the count a `outer.quorum` value asks of P workers (a fraction rounded up)."""
  if quorum <= 1:
    return max(1, math.ceil(quorum * num_workers - 1e-9))
  return int(quorum)


def check(config, honoured: tuple[str, ...], reason: str) -> None:
  """The round policy across fields, for a rule that honours the `honoured` kinds of
  `outer.missed` (`reason`: why not the others). Raises ConfigError."""
  outer, workers = config.outer, config.workers
  require(
    outer.quorum <= 1 or outer.quorum <= workers,
    QUORUM,
    outer.quorum,
    f"must be at most config.workers={workers} (or a fraction in (0, 1])",
  )
  require(
    outer.missed in honoured,
    MISSED_FIELD,
    outer.missed,
    f"{config.algorithm} takes {', '.join(honoured)}: {reason}",
  )


@dataclasses.dataclass(frozen=True)
class Policy:
  """A round policy: its quorum m of P workers, deadline D and what a miss means."""

  count: int
  deadline: float
  missed: str

  @classmethod
  def of(cls, hyper) -> "Policy | None":
    """The rule's policy; None where every round waits for every worker (m = P)."""
    count = quorum_count(hyper.quorum, hyper.num_workers)
    if count >= hyper.num_workers:
      return None
    return cls(count, float(hyper.deadline), hyper.missed)

  def closing_time(self, arrivals: np.ndarray) -> float:
    """T = max(a_(m), min(a_(P), a_(1) + D))."""
    ordered = np.sort(arrivals)
    return float(max(ordered[self.count - 1], min(ordered[-1], ordered[0] + self.deadline)))

  def due(self, arrived: list[float], num_workers: int) -> float | None:
    """T as a live round knows it with only `arrived` in (their times): -inf once every
    worker arrived, None until m did, else a_(1) + D (the round closes then unless
    the last arrives first). Closing at the first moment it is passed gives
    `closing_time`."""
    if len(arrived) == num_workers:
      return -math.inf
    if len(arrived) < self.count:
      return None
    return min(arrived) + self.deadline


@dataclasses.dataclass
class Round:
  """One round's membership: bool [P] masks of its members, of the workers late for
  it and of those dropped, and of the workers whose late message of the previous
  round it takes."""

  members: np.ndarray
  late: np.ndarray
  dropped: np.ndarray
  held: np.ndarray

  def to_dict(self) -> dict:
    return {
      "members": self.members.tolist(),
      "late": self.late.tolist(),
      "dropped": self.dropped.tolist(),
      "held": self.held.tolist(),
    }

  @classmethod
  def from_dict(cls, values: dict) -> "Round":
    masks = {key: np.array(values[key], bool) for key in ("members", "late", "dropped", "held")}
    return cls(**masks)
