"""Steady state of the timing model (easgd/sim/timing.py) for P equal workers, in closed form.

The clocks simulate a run event by event; this module solves the same model
for its steady state, which is what sizing a cluster needs. Workers are
equal (no speed spread, jitter or stragglers). Notation: t_c compute time of
one local step, tau local steps between a worker's exchanges (the rule's
period), W model bytes, L latency, B bandwidth, m = L + W/B one message, and
the parameter servers' time per request s = (master_time + 2W/B_s)/S.

Synchronous rules (an all-reduce every tau steps, after a barrier):
    T(P) = t_c + A(P)/tau,
  or, for a rule of several levels (Rule.levels), each with its share r_k of
  the steps that end with its exchange (`Rule.level_rates`),
    T(P) = t_c + sum_k r_k A_k(P).
    A(P) = 2(P-1)(L + W/(P B))          ring
    A(P) = 2 ceil(log2 P)(L + W/B)        tree
  Communication dominates (takes at least half of T) from the smallest P with
  A(P) >= tau t_c. A grows with P (the ring through its latency term), so
  that P exists whenever L > 0 or the bandwidth term alone reaches tau t_c.

On a cluster of groups (timing.py's two-level network) A is the hierarchical
all-reduce, and m below the mean over the workers of their message to the
servers (inside their group or between groups). At a P other than the
config's the groups are blocks of the config's first group's size.

Parameter-server rules: a worker's cycle is tau steps, one request (message
there, service, message back):
    C = tau t_c + 2m + s.
  With a lock (original, Async and Async M- EASGD, Async SGD/MSGD, Downpour)
  the servers serve one request at a time, so P workers need P s of service
  per cycle: once P s > C the servers are saturated and every worker's cycle
  stretches to P s:
    cycle(P) = max(C, P s),   T(P) = cycle(P)/tau.
  Communication (messages, service and queueing) is 1 - tau t_c/cycle(P) of
  the time. It dominates at every P if 2m + s >= tau t_c; otherwise from
    P* = ceil(2 tau t_c / s),
  the smallest P with P s >= 2 tau t_c.
  The servers keep up with P workers (P s <= C, no queue) when
  (P-1) s <= tau t_c + 2m, that is with
    S >= (P-1)(master_time + 2W/B_s) / (tau t_c + 2m)
  servers: the lemma the sizing rule asks for, with 2W per request through
  the servers' links.
  Without a lock (Hogwild) requests overlap and nothing queues in the model:
  cycle(P) = C for every P, and the servers' links are the only limit.
"""

import dataclasses
import math

import numpy as np

from easgd.sim import timing
from easgd.sim.clocks import Policy

SYNC, LOCKED, LOCK_FREE = (
  "synchronous",
  "parameter server with a lock",
  "lock-free parameter server",
)


def family_of(policy: Policy | None) -> str:
  """The steady-state family of a rule whose master serves with `policy` (None: synchronous)."""
  if policy is None:
    return SYNC
  return LOCK_FREE if policy == Policy.HOGWILD else LOCKED


# The largest worker count the search for P* looks at.
MAX_WORKERS = 2**30


@dataclasses.dataclass(frozen=True)
class Timing:
  """The steady state of one rule family on one cluster, as a function of P."""

  cluster: timing.Cluster
  model_bytes: float
  compute_time: float  # t_c
  period: int  # tau
  family: str  # SYNC | LOCKED | LOCK_FREE
  # A synchronous rule's levels and the share of steps each ends (`Rule.level_rates`);
  # () for one level every tau-th step.
  levels: tuple[tuple[timing.Exchange, float], ...] = ()
  workers: int = 0  # the config's P, whose groups are the config's (0: any)
  # Two-tier servers (easgd.rules.tiers): a group server sends every K of its
  # workers' requests (0: one master).
  global_every: int = 0

  def _cluster(self, workers: int) -> timing.Cluster:
    """The cluster at P workers: the config's groups at its own P, else blocks of its
    first group's size."""
    groups = self.cluster.groups
    if not groups or workers == self.workers:
      return self.cluster
    size = groups[0]
    scaled = (size,) * (workers // size) + ((workers % size,) if workers % size else ())
    return dataclasses.replace(self.cluster, groups=scaled, group_slowdowns=())

  def _members(self, workers: int) -> int:
    """The workers one server serves: all of them, or with two tiers the largest group."""
    if not self.global_every:
      return workers
    return max(self._cluster(workers).group_sizes(workers))

  @property
  def message(self) -> float:
    """m = L + W/B (on a cluster of groups, the mean over the config's workers; with two
    tiers a worker's group server is in its group)."""
    if not self.cluster.groups or self.global_every:
      return self.cluster.message_time(self.model_bytes)
    count = self.workers or sum(self.cluster.groups)
    return (
      sum(self.cluster.worker_message_time(self.model_bytes, j, count) for j in range(count))
      / count
    )

  @property
  def service(self) -> float:
    """s = (master_time + 2W/B_s)/S."""
    return self.cluster.service_time(self.model_bytes)

  def allreduce(self, workers: int) -> float:
    """A(P): every exchange of a tau-step cycle (sum_k tau r_k A_k(P) for several levels)."""
    cluster = self._cluster(workers)
    if not self.levels:
      if not cluster.groups:
        return cluster.allreduce_time(self.model_bytes, workers)
      return cluster.exchange(self.model_bytes, workers)[0]
    return sum(
      self.period * rate * cluster.exchange(self.model_bytes, workers, level.block, level.unit)[0]
      for level, rate in self.levels
    )

  def cycle(self, workers: int) -> float:
    """Seconds between two exchanges of one worker (tau local steps)."""
    if self.family == SYNC:
      return self.period * self.compute_time + self.allreduce(workers)
    alone = self.period * self.compute_time + 2 * self.message + self.service
    if self.family == LOCKED:
      return max(alone, self._members(workers) * self.service)
    return alone

  def global_share(self, workers: int) -> float:
    """Two tiers: the share of its time the global server serves sends. Each group g of
    s_g sends after K of its requests, one every max(K cycle / s_g, its round trip to
    the global server and back) seconds, and each send takes s there."""
    cluster = self._cluster(workers)
    busy = 0.0
    group_of = cluster.group_of(workers)
    for g, size in enumerate(cluster.group_sizes(workers)):
      between = bool(np.any(group_of == g)) and g != cluster.server_group
      latency, bandwidth = cluster.link(between)
      trip = 2 * (latency + self.model_bytes / bandwidth) + self.service
      busy += self.service / max(self.global_every * self.cycle(workers) / size, trip)
    return busy

  def step_time(self, workers: int) -> float:
    """T(P): seconds per local step of each worker."""
    return self.cycle(workers) / self.period

  def comm_share(self, workers: int) -> float:
    """The part of a worker's time not spent computing."""
    return 1 - self.compute_time / self.step_time(workers)

  def images_per_sec(self, workers: int, batch_size: int) -> float:
    return workers * batch_size / self.step_time(workers)

  def critical_workers(self) -> int | None:
    """P*: the fewest workers for which communication takes at least half the time.

    None where no number of workers gets there.
    """
    work = self.period * self.compute_time
    if self.family == SYNC:
      # A cluster of groups or levels is costed block by block: searched up to 2**16.
      most = MAX_WORKERS if not (self.cluster.groups or self.levels) else 2**16
      if self.allreduce(most) < work:
        return None
      low, high = 1, most  # A(low) < work <= A(high); A(1) = 0
      while high - low > 1:
        middle = (low + high) // 2
        low, high = (middle, high) if self.allreduce(middle) < work else (low, middle)
      return high
    if 2 * self.message + self.service >= work:
      return 1
    if self.family == LOCK_FREE or self.service == 0:
      return None
    if self.global_every:  # each group server serves its group: P* counts a group's workers
      size = self.cluster.groups[0] if self.cluster.groups else MAX_WORKERS
      group = math.ceil(2 * work / self.service - 1e-9)
      return group * max(1, (self.workers or size) // size) if group <= size else None
    return math.ceil(2 * work / self.service - 1e-9)

  def servers_needed(self, workers: int) -> int | None:
    """The fewest servers with which P workers never queue (None: not a locked rule)."""
    if self.family != LOCKED:
      return None
    per_request = self.cluster.master_time + 2 * self.model_bytes / self.cluster.server_bandwidth
    free_time = self.period * self.compute_time + 2 * self.message
    members = self._members(workers)
    return max(1, math.ceil((members - 1) * per_request / free_time - 1e-9))

  def derivation(self, workers: int) -> list[str]:
    """The formulas above with this cluster's numbers in them."""
    c, tau, t_c = self.cluster, self.period, self.compute_time
    lines = [f"t_c = {t_c:.4g} s, tau = {tau}, W = {self.model_bytes:.4g} B, P = {workers}"]
    if self.family == SYNC:
      shape = (
        "2 ceil(log2 P)(L + W/B)" if c.allreduce == timing.Allreduce.TREE else "2(P-1)(L + W/(P B))"
      )
      if c.groups:
        lines.append(
          f"groups {c.groups}: hierarchical (inside each group, then between the groups at "
          f"L' = {c.between_latency:.4g} s, B' = {c.between_bandwidth:.4g} B/s)"
        )
      for level, rate in self.levels:
        blocks = f"blocks of {level.block}" if level.block else "all workers"
        among = f", among centers of {level.unit}" if level.unit > 1 else ""
        lines.append(f"level {blocks}{among}: ends r = {rate:.4g} of the steps")
      lines += [
        f"{c.allreduce} all-reduce A(P) = {shape}, "
        f"L = {c.latency:.4g} s, B = {c.bandwidth:.4g} B/s",
        f"A({workers}) = {self.allreduce(workers):.4g} s; "
        f"T(P) = t_c + A(P)/tau = {self.step_time(workers):.4g} s",
        f"communication dominates from the smallest P with A(P) >= tau t_c = {tau * t_c:.4g} s",
      ]
      return lines
    per_request = c.master_time + 2 * self.model_bytes / c.server_bandwidth
    if self.global_every:
      lines.append(
        f"two tiers: a server per group serves its workers (the largest group: "
        f"{self._members(workers)}); a group server sends every K = {self.global_every} "
        f"requests; the global server is busy {100 * self.global_share(workers):.1f}% "
        "of the time"
      )
    lines += [
      f"m = L + W/B = {self.message:.4g} s; "
      f"s = (master_time + 2W/B_s)/S = {per_request:.4g}/{c.servers} = {self.service:.4g} s",
      f"C = tau t_c + 2m + s = {self.cycle(1):.4g} s",
    ]
    if self.family == LOCKED:
      lines += [
        f"cycle(P) = max(C, P s) = {self.cycle(workers):.4g} s; "
        f"T(P) = cycle/tau = {self.step_time(workers):.4g} s",
        "communication dominates from P* = ceil(2 tau t_c / s) "
        f"= ceil({2 * tau * t_c:.4g}/{self.service:.4g}) (if 2m + s < tau t_c)",
        f"servers: S >= (P-1)(master_time + 2W/B_s)/(tau t_c + 2m) = "
        f"{workers - 1}*{per_request:.4g}/{tau * t_c + 2 * self.message:.4g}",
      ]
    else:
      lines += [
        f"no lock: cycle(P) = C for every P; T(P) = {self.step_time(workers):.4g} s",
      ]
    return lines
