"""The timing model of a cluster (`config.cluster`): how long things take.

Nothing in it depends on parameter values, so a whole run's schedule follows
from it and the seed alone (Seconds, bytes and bytes/second):

  local step k of worker i:  c_i * exp(jitter * z_ik - jitter^2 / 2)
      c_i = compute_time * (1 + speed_spread * i / (P - 1))
            [* straggler_slowdown if i is in stragglers; the k-th straggler's
             straggler_slowdowns[k] where those are given]
            [* group_slowdowns[g] for the workers of group g]
      z_ik ~ N(0, 1), drawn from (seed, i, k) alone (so it needs no RNG state)
  one message, either way:   L + bytes / B
  the master, per request:   (master_time + 2 * model_bytes / server_bandwidth) / servers
      (under the lock, if the rule has one): the center is split evenly over
      `servers` parameter servers that serve a request's shards in parallel,
      and each server's own link carries the request's shard in and out
  an all-reduce of n bytes over P workers:
                              ring  2 (P - 1) (L + n / (P B))
                              tree  2 ceil(log2 P) (L + n / B)

The network has two levels. The workers form `groups`, contiguous blocks of
the given sizes (a node, a rack, a region; () is one group of all the
workers: a flat cluster). A message between two workers of one group, or
between a worker and a server placed in its group (`server_group`), takes
the link inside a group, L = latency and B = bandwidth; one that crosses
groups takes the link between groups, L = between_latency and B =
between_bandwidth. An all-reduce over workers in several groups is
hierarchical, as NCCL's and the hierarchical averagers' are: with s_g of its
members in group g (G groups, s_min the fewest):
  1. inside each group, a reduce-scatter: each member holds the sum of 1/s_g;
  2. between the groups, the members' shards all-reduced: a ring of G over
     the link between groups, 2 (G - 1) rounds of n / (s_min G);
  3. inside each group, an all-gather.
  ring  max_g 2 (s_g - 1)(L_in + n / (s_g B_in)) + 2 (G - 1)(L_out + n / (s_min G B_out))
  tree  max_g 2 ceil(log2 s_g)(L_in + n / B_in) + 2 ceil(log2 G)(L_out + n / (s_min B_out))
One group (a flat cluster, or members all in one group) is the single
all-reduce above on the link inside. An exchange among centers that each
block of u workers holds whole (a hierarchical rule's group centers,
`Exchange.unit`) skips steps 1 and 3: each member carries its 1/u of its
block's center in a ring of the k blocks, 2 (k - 1)(L + n / (u k B)) on the
link its blocks span. Each worker sends 2 (s_g - 1)/s_g n inside its group
and 2 (G - 1)/G n/s_g between groups (ring; a tree sends the same on
average); the clocks count both.

The clocks (easgd.sim.clocks) turn it into a schedule; easgd.sim.sizing
solves its steady state in closed form.
"""

import dataclasses
import enum
import math

import ml_collections
import numpy as np

from easgd.declare import Allowed, Field, integer, number, read, settings
from easgd.errors import is_int, require


@dataclasses.dataclass(frozen=True)
class Exchange:
  """One level of a synchronous rule's exchanges, as the network carries it: an
  all-reduce among contiguous blocks of `block` workers (0: one block of every
  worker), every block at once; with `unit` > 1, among the centers that each
  `unit` workers of a block hold whole (a hierarchical rule's group centers),
  each of their holders carrying its 1/unit (`Cluster.exchange`)."""

  block: int = 0
  unit: int = 1


class Allreduce(enum.StrEnum):
  """How the synchronous rules' all-reduce is modelled."""

  RING = "ring"  # bandwidth-optimal; latency grows with P
  TREE = "tree"  # latency-optimal


def _distinct_indices(value) -> bool:
  return (
    isinstance(value, (tuple, list))
    and all(is_int(i) and i >= 0 for i in value)
    and len(set(value)) == len(value)
  )


# The groups of the two-level network (a two-tier master's groups too: easgd.rules.tiers).
GROUPS = Field(
  "cluster.groups",
  (),
  Allowed(
    lambda v: isinstance(v, (tuple, list)) and all(is_int(n) and n >= 1 for n in v),
    "must be () or a tuple of group sizes >= 1 that add up to the workers, e.g. (4, 4, 4, 4)",
  ),
  "the workers' groups (nodes, regions): contiguous blocks of these sizes, in worker order; "
  "() is one group of every worker (a flat cluster)",
  earlier=(),
  setting="groups",
  convert=tuple,
)


def group_of(groups: tuple[int, ...], num_workers: int) -> np.ndarray:
  """Each worker's group, [P]: contiguous blocks of `groups`' sizes (() : one group)."""
  sizes = groups or (num_workers,)
  return np.repeat(np.arange(len(sizes)), sizes)


# config.cluster's timing fields, each read into the `Cluster` attribute of its name;
# off (a Cluster given only what differs): no spread, jitter, stragglers, latency,
# master time or link limits.
FIELDS = (
  Field(
    "cluster.compute_time",
    0.01,
    number(0, low_open=True),
    "seconds: the mean local step of the fastest worker",
    setting="compute_time",
  ),
  Field(
    "cluster.speed_spread",
    0.5,
    number(0),
    "worker i is (1 + speed_spread * i / (P - 1)) times slower than worker 0",
    setting="speed_spread",
    off=0.0,
  ),
  Field(
    "cluster.jitter",
    0.1,
    number(0),
    "the lognormal sigma of each step's time",
    setting="jitter",
    off=0.0,
  ),
  Field(
    "cluster.stragglers",
    (),
    Allowed(_distinct_indices, "must be distinct worker indices >= 0, e.g. (3,) or (0, 5)"),
    "worker indices that are stragglers, e.g. (3,)",
    setting="stragglers",
    convert=tuple,
  ),
  Field(
    "cluster.straggler_slowdown",
    4.0,
    number(1, note="how many times slower a straggler is"),
    "how many times slower a straggler is",
    setting="straggler_slowdown",
    off=1.0,
  ),
  Field(
    "cluster.straggler_slowdowns",
    (),
    Allowed(
      lambda v: isinstance(v, (tuple, list)) and all(number(1).accepts(x) for x in v),
      "must be () or a tuple of finite numbers >= 1, one per straggler, e.g. (2.0, 4.0)",
    ),
    "each straggler's own slowdown, in the order of cluster.stragglers (then "
    "cluster.straggler_slowdown is not read); () gives every straggler "
    "cluster.straggler_slowdown",
    earlier=(),
    setting="straggler_slowdowns",
    convert=tuple,
  ),
  Field("cluster.latency", 5e-4, number(0), "seconds per message", setting="latency", off=0.0),
  Field(
    "cluster.bandwidth",
    1.25e8,
    number(0, low_open=True, infinite=True, words="must be > 0 (bytes/second)"),
    "bytes/second of each worker's link",
    setting="bandwidth",
    off=math.inf,
  ),
  Field(
    "cluster.master_time",
    1e-3,
    number(0),
    "the master's service time per request",
    setting="master_time",
    off=0.0,
  ),
  Field(
    "cluster.servers",
    1,
    integer(1),
    "parameter servers the center is split over",
    setting="servers",
  ),
  Field(
    "cluster.server_bandwidth",
    math.inf,
    number(
      0,
      low_open=True,
      infinite=True,
      words="must be > 0 (bytes/second; inf: the servers' links are not modelled)",
    ),
    "bytes/second of each server's link; inf: not modelled",
    setting="server_bandwidth",
  ),
  Field(
    "cluster.allreduce",
    Allreduce.RING.value,
    Allowed(lambda v: v in tuple(Allreduce), f"must be one of {', '.join(Allreduce)}"),
    "the synchronous rules' all-reduce: ring or tree",
    setting="allreduce",
  ),
  GROUPS,
  Field(
    "cluster.group_slowdowns",
    (),
    Allowed(
      lambda v: isinstance(v, (tuple, list)) and all(number(1).accepts(x) for x in v),
      "must be () or a tuple of finite numbers >= 1, one per group of cluster.groups",
    ),
    "how many times slower each group's workers step, one per group (() for none)",
    earlier=(),
    setting="group_slowdowns",
    convert=tuple,
  ),
  Field(
    "cluster.between_latency",
    5e-3,
    number(0),
    "seconds per message on the link between groups (read with cluster.groups)",
    earlier=5e-3,
    setting="between_latency",
    off=0.0,
  ),
  Field(
    "cluster.between_bandwidth",
    1.25e7,
    number(0, low_open=True, infinite=True, words="must be > 0 (bytes/second)"),
    "bytes/second of each worker's link between groups (read with cluster.groups)",
    earlier=1.25e7,
    setting="between_bandwidth",
    off=math.inf,
  ),
  Field(
    "cluster.server_group",
    0,
    integer(0),
    "the group whose link inside reaches the parameter servers (a two-tier run's global "
    "server); the other groups' workers reach them between groups",
    earlier=0,
    setting="server_group",
  ),
)


@settings(FIELDS)
class Cluster:
  """The timing model; seconds, bytes and bytes/second. One attribute a field of
  `FIELDS`; a field not given is off."""

  @classmethod
  def from_config(cls, group: ml_collections.ConfigDict) -> "Cluster":
    """The timing model of a config's cluster group (the fields other parts declare in
    that group, such as cluster.replay, are not timings)."""
    return read(cls, {"cluster": group})

  def mean_step_times(self, num_workers: int) -> np.ndarray:
    """c_i for every worker."""
    position = np.arange(num_workers) / max(num_workers - 1, 1)
    times = self.compute_time * (1 + self.speed_spread * position)
    slowdowns = self.straggler_slowdowns or (self.straggler_slowdown,) * len(self.stragglers)
    for worker, slowdown in zip(self.stragglers, slowdowns, strict=True):
      times[worker] *= slowdown
    if self.group_slowdowns:
      times *= np.asarray(self.group_slowdowns)[self.group_of(num_workers)]
    return times

  # The two-level network.

  def group_sizes(self, num_workers: int) -> tuple[int, ...]:
    """Each group's workers, in order: `groups`, or one group of all (a flat cluster)."""
    return self.groups or (num_workers,)

  def group_of(self, num_workers: int) -> np.ndarray:
    """Each worker's group, [P]: contiguous blocks of `group_sizes`."""
    return group_of(self.groups, num_workers)

  def link(self, between: bool) -> tuple[float, float]:
    """(latency, bandwidth) of the link between groups, or inside one."""
    if between:
      return self.between_latency, self.between_bandwidth
    return self.latency, self.bandwidth

  def worker_message_time(self, num_bytes: float, worker: int, num_workers: int) -> float:
    """One message between `worker` and the parameter servers (in `server_group`)."""
    latency, bandwidth = self.link(self.reaches_servers_between(worker, num_workers))
    return latency + num_bytes / bandwidth

  def reaches_servers_between(self, worker: int, num_workers: int) -> bool:
    """Whether `worker`'s messages to the parameter servers cross groups."""
    return bool(self.group_of(num_workers)[worker] != self.server_group)

  def exchange(self, num_bytes: float, num_workers: int, block: int = 0, unit: int = 1):
    """An all-reduce of num_bytes among the workers in contiguous blocks of `block`
    (0: one block of all), every block at once (`Exchange`), or among the centers that
    each `unit` workers of a block hold whole. Returns (seconds, bytes each worker sends
    [P], the part of them between groups [P]): the module docstring's hierarchical
    all-reduce, the slowest block's time."""
    block = block or num_workers
    group = self.group_of(num_workers)
    seconds = 0.0
    sent, between = np.zeros(num_workers), np.zeros(num_workers)
    done = {}  # blocks of the same shape (their members' group sizes) cost the same
    for start in range(0, num_workers, block):
      members = slice(start, min(start + block, num_workers))
      _, shape = np.unique(group[members], return_counts=True)
      key = tuple(shape.tolist())
      if key not in done:
        done[key] = self._block_exchange(num_bytes, group[members], unit)
      time, out, across = done[key]
      seconds = max(seconds, time)
      sent[members], between[members] = out, across
    return seconds, sent, between

  def _block_exchange(self, num_bytes: float, groups: np.ndarray, unit: int):
    """One block's all-reduce; `groups`: its members' groups, in worker order."""
    count = len(groups)
    if unit > 1:  # a ring of the k centers, each carried 1/unit by each of its holders
      parts = count // unit
      spans = len(np.unique(groups)) > 1
      time = self._ring(num_bytes / unit, parts, spans)
      out = np.full(count, _ring_bytes(num_bytes / unit, parts))
      return time, out, out if spans else np.zeros(count)
    _, sizes = np.unique(groups, return_counts=True)
    if len(sizes) == 1:
      return (
        self._ring(num_bytes, count, False),
        np.full(count, _ring_bytes(num_bytes, count)),
        (np.zeros(count)),
      )
    inside = max(self._ring(num_bytes, int(size), False) for size in sizes)
    outside = self._ring(num_bytes / sizes.min(), len(sizes), True)
    size_of = dict(zip(np.unique(groups).tolist(), sizes.tolist(), strict=True))
    each = np.array([size_of[g] for g in groups.tolist()], np.float64)
    across = np.array([_ring_bytes(num_bytes / s, len(sizes)) for s in each])
    within = np.array([_ring_bytes(num_bytes, int(s)) for s in each])
    return inside + outside, within + across, across

  def _ring(self, num_bytes: float, members: int, between: bool) -> float:
    """An all-reduce of num_bytes among `members` on one kind of link, in `allreduce`'s
    shape (inside a group of a hierarchical one, its reduce-scatter and all-gather
    take the same 2 (s - 1) rounds of n/s)."""
    if members <= 1:
      return 0.0
    latency, bandwidth = self.link(between)
    if self.allreduce == Allreduce.TREE:
      return 2 * math.ceil(math.log2(members)) * (latency + num_bytes / bandwidth)
    return 2 * (members - 1) * (latency + num_bytes / members / bandwidth)

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
    """An all-reduce of num_bytes over P workers of a flat cluster (on the link inside).

    ring: 2(P-1) rounds, each moving num_bytes/P between neighbours
    (bandwidth-optimal, latency grows with P); tree: a reduction up a binary
    tree and a broadcast down it, 2 ceil(log2 P) rounds of whole messages
    (latency-optimal). `exchange` is the same on a cluster of groups.
    """
    return self._ring(num_bytes, num_workers, False)


def check_stragglers(cluster: ml_collections.ConfigDict, workers: int) -> None:
  """The stragglers are workers, and each has its slowdown where slowdowns are given.
  Raises ConfigError."""
  stragglers = cluster.stragglers
  require(
    all(i < workers for i in stragglers),
    "cluster.stragglers",
    stragglers,
    f"must be distinct worker indices in [0, {workers}), e.g. (3,) or (0, 5)",
  )
  slowdowns = cluster.straggler_slowdowns
  require(
    len(slowdowns) in (0, len(stragglers)),
    "cluster.straggler_slowdowns",
    slowdowns,
    f"must be () or one slowdown for each of cluster.stragglers={tuple(stragglers)}"
    + ("" if stragglers else " (no straggler yet: set cluster.stragglers first)"),
  )


def _ring_bytes(num_bytes: float, members: int) -> float:
  return 2 * (members - 1) / members * num_bytes if members > 1 else 0.0


def check_groups(cluster: ml_collections.ConfigDict, workers: int) -> None:
  """The groups cover the workers, each group has its slowdown where slowdowns are
  given, and the parameter servers are in a group. Raises ConfigError."""
  groups = tuple(cluster.groups)
  require(
    not groups or sum(groups) == workers,
    "cluster.groups",
    groups,
    f"must be () or group sizes that add up to the {workers} workers, e.g. "
    f"{(workers // 2, workers - workers // 2) if workers > 1 else (1,)}",
  )
  slowdowns = cluster.group_slowdowns
  require(
    len(slowdowns) in (0, max(len(groups), 1)) and (groups or not slowdowns),
    "cluster.group_slowdowns",
    slowdowns,
    f"must be () or one slowdown for each of cluster.groups={groups}"
    + ("" if groups else " (no groups yet: set cluster.groups first)"),
  )
  count = max(len(groups), 1)
  require(
    cluster.server_group < count,
    "cluster.server_group",
    cluster.server_group,
    f"must be a group of cluster.groups={groups}, in [0, {count})"
    + ("" if groups else " (a flat cluster has one group: 0)"),
  )


def allreduce_bytes(model_bytes: int, num_workers: int) -> float:
  """Bytes each worker sends in one bandwidth-optimal (ring) all-reduce of the model.

  A ring all-reduce of n bytes over P participants sends 2*(P-1)/P*n bytes
  from each (reduce-scatter, then all-gather). A tree sends the same on
  average: (P-1) whole messages up and (P-1) down, over P workers.
  """
  return 2 * (num_workers - 1) / num_workers * model_bytes
