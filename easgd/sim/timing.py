"""The timing model of a cluster (`config.cluster`): how long things take.

Nothing in it depends on parameter values, so a whole run's schedule follows
from it and the seed alone (Seconds, bytes and bytes/second):

  local step k of worker i:  c_i * exp(jitter * z_ik - jitter^2 / 2)
      c_i = compute_time * (1 + speed_spread * i / (P - 1))
            [* straggler_slowdown if i is in stragglers; the k-th straggler's
             straggler_slowdowns[k] where those are given]
      z_ik ~ N(0, 1), drawn from (seed, i, k) alone (so it needs no RNG state)
  one message, either way:   latency + model_bytes / bandwidth
  the master, per request:   (master_time + 2 * model_bytes / server_bandwidth) / servers
      (under the lock, if the rule has one): the center is split evenly over
      `servers` parameter servers that serve a request's shards in parallel,
      and each server's own link carries the request's shard in and out
  an all-reduce of the model: ring  2 (P - 1) (latency + model_bytes / (P bandwidth))
                              tree  2 ceil(log2 P) (latency + model_bytes / bandwidth)

The clocks (easgd.sim.clocks) turn it into a schedule; easgd.sim.sizing
solves its steady state in closed form.
"""

import enum
import math

import ml_collections
import numpy as np

from easgd.declare import Allowed, Field, integer, number, read, settings
from easgd.errors import is_int, require


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
    if self.allreduce == Allreduce.TREE:
      return 2 * math.ceil(math.log2(num_workers)) * self.message_time(num_bytes)
    return 2 * (num_workers - 1) * self.message_time(num_bytes / num_workers)


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


def allreduce_bytes(model_bytes: int, num_workers: int) -> float:
  """Bytes each worker sends in one bandwidth-optimal (ring) all-reduce of the model.

  A ring all-reduce of n bytes over P participants sends 2*(P-1)/P*n bytes
  from each (reduce-scatter, then all-gather). A tree sends the same on
  average: (P-1) whole messages up and (P-1) down, over P workers.
  """
  return 2 * (num_workers - 1) / num_workers * model_bytes
