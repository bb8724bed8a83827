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

import dataclasses
import enum
import math

import ml_collections
import numpy as np

from easgd.errors import require


class Allreduce(enum.StrEnum):
  """How the synchronous rules' all-reduce is modelled."""

  RING = "ring"  # bandwidth-optimal; latency grows with P
  TREE = "tree"  # latency-optimal


@dataclasses.dataclass(frozen=True)
class Cluster:
  """The timing model; seconds, bytes and bytes/second."""

  compute_time: float = 0.01
  speed_spread: float = 0.0
  jitter: float = 0.0
  stragglers: tuple[int, ...] = ()
  straggler_slowdown: float = 1.0
  straggler_slowdowns: tuple[float, ...] = ()
  latency: float = 0.0
  bandwidth: float = math.inf
  master_time: float = 0.0
  servers: int = 1
  server_bandwidth: float = math.inf
  allreduce: str = Allreduce.RING

  @classmethod
  def from_config(cls, config: ml_collections.ConfigDict) -> "Cluster":
    values = config.to_dict()
    values["stragglers"] = tuple(values["stragglers"])
    values["straggler_slowdowns"] = tuple(values["straggler_slowdowns"])
    values.pop("replay", None)  # a recorded order, not a timing (easgd.train.runtimes.trace)
    values.pop("on_worker_loss", None)  # what runtime=ray does when a worker dies
    return cls(**values)

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
