"""Hierarchical Local SGD (hierarchical model averaging, as PyTorch's
HierarchicalModelAverager runs it; Lin, Stich, Patel, Jaggi, ICLR 2020, its
hierarchical post-local SGD; Wang et al. 2020): workers step alone and average
their models in groups of growing size at growing periods, the whole at the
longest.

Levels k = 1, ..., K (`outer.levels`, (period, group size) pairs in any order,
sorted by period: ((p_1, g_1), ..., (p_K, g_K)), the last group size P or 0 for
all the workers): level k averages the models within each contiguous block of
g_k workers every p_k steps; p_1 < ... < p_K, g_1 <= ... <= g_K = P, each p_k
dividing p_{k+1} and each g_k dividing g_{k+1} (the levels nest in time as the
groups nest in the workers). With t the steps
taken before this one (`state.step`, from 0), t0 the warm-up
(`outer.switch_step`) and inner(g, s, x) the inner optimizer's update and new
state (easgd.rules.optimizers):

  t < t0   one all-reduce of the gradients, every worker the same step (the
           warm-up of post_local_sgd, PyTorch's post_localSGD_hook before
           start_localSGD_iter):  g = (1/P) sum_i g_i;  u, s <- inner(g, s, x);
           x_i <- x <- x + u
  t >= t0  each worker alone:  u_i, s_i <- inner(g_i, s_i, x_i);  x_i <- x_i + u_i
           then, with k the largest level whose p_k divides t - t0 (if any):
             x_i <- (1/g_k) sum_{j in B_k(i)} x_j     B_k(i): i's block of g_k
           and at the top level (g_K = P) x~ <- that mean (the center the
           evaluation scores; a lower level leaves it as it was).

Only the largest level due averages: the whole's average subsumes its blocks'.
The optimizer states s_i are never averaged; BatchNorm statistics are averaged
with the models (outer.batch_stats=averaged) or stay each worker's (local).
With one level ((H, P)) this is post_local_sgd at period H, bit for bit.

Where it differs from PyTorch's HierarchicalModelAverager
(torch/distributed/algorithms/model_averaging/hierarchical_model_averager.py),
deliberately, as docs/algorithms.md says with the source lines:
  * the level is the one with the largest period that divides the step, whatever
    the order the levels are given in (PyTorch walks its dict's keys in reverse
    insertion order and takes the first that divides: the largest period only
    if the dict was given in increasing order);
  * the step tested against each period counts from the end of the warm-up
    (t - t0), as PyTorch's PeriodicModelAverager and post_local_sgd count it;
    PyTorch's hierarchical averager tests the absolute step, so that with a
    warm-up of 100 and periods 4 and 16 its first global average falls at 112;
  * levels whose groups do not nest or whose periods do not divide one another
    are refused (PyTorch accepts them: its groups then overlap between levels
    and its largest level due is ill-defined); the last level's group size may
    be given as 0, all the workers, so that one config serves any P;
  * after the warm-up each worker steps alone (PyTorch's post_localSGD_hook
    all-reduces gradients within a machine by default).
"""

import types

import jax
import jax.numpy as jnp
from jax import lax

from easgd.declare import Allowed, Field, Shapes
from easgd.errors import is_int, require
from easgd.rules import model_state
from easgd.rules.base import BASE_READS
from easgd.rules.post_local import SWITCH_STEP, PostLocalSGD
from easgd.rules.spmd import rows_of_blocks, sum_over_blocks
from easgd.sim import timing


def _pairs(value) -> bool:
  return (
    isinstance(value, (tuple, list))
    and len(value) >= 1
    and all(
      isinstance(pair, (tuple, list))
      and len(pair) == 2
      and all(is_int(n) for n in pair)
      and pair[0] >= 1
      and pair[1] >= 0
      for pair in value
    )
  )


LEVELS = Field(
  "outer.levels",
  ((4, 2), (16, 0)),
  Allowed(
    _pairs,
    "must be (period, group size) pairs of integers, periods >= 1 and group sizes >= 1, "
    "the last group all the workers (0 for all), e.g. ((4, 2), (16, 0))",
  ),
  "the hierarchical rules' levels: (period, group size) pairs, each group size's contiguous "
  "blocks of workers exchanging every period steps; the last group is all the workers (its "
  "size P, or 0 for all)",
  Shapes.IF_READ,
  earlier=((4, 2), (16, 0)),
  setting="levels",
  exclusive="levels",
)


def pairs(levels, workers: int) -> tuple[tuple[int, int], ...]:
  """(period, group size) of each level, sorted by period, a group size of 0 as `workers`."""
  return tuple(sorted((int(period), int(size) or workers) for period, size in levels))


def check_levels(config, count: int | None = None) -> None:
  """The levels nest: increasing periods, each dividing the next; group sizes that do
  not decrease, each dividing the next, the last all the workers; `count` levels if
  given. Raises ConfigError."""
  given = tuple(tuple(pair) for pair in LEVELS.of(config))
  workers = config.workers
  example = "e.g. ((4, 2), (16, 0))"
  if count is not None:
    require(
      len(given) == count,
      LEVELS,
      given,
      f"{config.algorithm} has {count} levels: (period, group size) pairs, {example}",
    )
  levels = pairs(given, workers)
  require(
    all(size >= 1 for _, size in sorted(given)[:-1]),
    LEVELS,
    given,
    f"only the last level's group size may be 0 (all the workers), {example}",
  )
  require(
    levels[-1][1] == workers,
    LEVELS,
    given,
    f"the last level's groups must be all {workers} workers (its size {workers} or 0), {example}",
  )
  for (period, size), (longer, larger) in zip(levels, levels[1:], strict=False):
    require(
      period < longer and longer % period == 0,
      LEVELS,
      given,
      f"each period must divide the next, larger one ({period} and {longer} do not): "
      "a longer level's average must fall on a shorter one's step",
    )
    require(
      size <= larger and larger % size == 0,
      LEVELS,
      given,
      f"each group size must divide the next one ({size} and {larger} do not): "
      "a level's groups are unions of the level below's",
    )


class HierarchicalLocalSGD(PostLocalSGD):
  """Hierarchical Local SGD: see the module docstring."""

  name = "hierarchical_local_sgd"
  declares = (LEVELS,)
  reads = (*BASE_READS, model_state.BATCH_STATS.path, SWITCH_STEP.path, LEVELS.path)
  # Its levels' rounds wait for every worker.
  missed = ()
  # No warm-up (PyTorch's default), not post_local_sgd's 50 steps; the levels' default
  # (pairs every 4 steps, all the workers every 16) is the field's.
  defaults = types.MappingProxyType({})

  @classmethod
  def check_config(cls, config):
    super().check_config(config)
    check_levels(config)

  @property
  def pairs(self) -> tuple[tuple[int, int], ...]:
    """The levels' (period, group size), in increasing order (any order is taken)."""
    return pairs(self.hyper.levels, self.hyper.num_workers)

  @property
  def period(self):
    """The shortest level's: a worker's local steps between two of its exchanges."""
    return self.pairs[0][0]

  def levels(self):
    return tuple(
      timing.Exchange(block=0 if size == self.hyper.num_workers else size) for _, size in self.pairs
    )

  def level_exchanges(self, step):
    """Before t0 the whole (its gradients); then the largest level due, alone."""
    switch = self.hyper.switch_step
    since = step - switch
    periods = [period for period, _ in self.pairs]
    fired = []
    for k, period in enumerate(periods):
      due = (step >= switch) & (since % period == 0)
      for longer in periods[k + 1 :]:
        due = due & (since % longer != 0)
      fired.append(due)
    fired[-1] = fired[-1] | (step < switch)
    return tuple(fired)

  def exchanges_after(self, step):
    """Every step before t0 (its gradients), then each step a level is due."""
    switch = self.hyper.switch_step
    return (step < switch) | ((step >= switch) & ((step - switch) % self.period == 0))

  def _averaged(self, step, stepped, center, as_workers, average_stats, tick):
    """The largest level due averages its blocks; the top level is post_local_sgd's."""
    levels = self.pairs
    level = sum(k * fires for k, fires in enumerate(self.level_exchanges(step)))

    def top():
      return super(HierarchicalLocalSGD, self)._averaged(
        step, stepped, center, as_workers, average_stats, tick
      )

    def blocks(size):
      def average():
        count = jax.tree.leaves(stepped)[0].shape[0]
        moved = stepped if average_stats else model_state.trainable(stepped)
        totals = sum_over_blocks(moved, size, self.hyper.num_workers, self.hyper.deterministic_sums)
        means = rows_of_blocks(jax.tree.map(lambda t: t / size, totals), size, count)
        if not average_stats:
          means = model_state.with_trainable(stepped, means)
        return means, center

      return average

    branches = [blocks(size) for _, size in levels[:-1]] + [top]
    return lax.switch(jnp.asarray(level, jnp.int32), branches)
