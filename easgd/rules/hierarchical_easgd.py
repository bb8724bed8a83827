"""Hierarchical elastic averaging (hierarchical_easgd): EASGD's symmetric elastic
pull at two levels. Each group's workers are pulled toward their group's center
every short period, and the group centers toward a global center every long
period; the moving rates are per level.

Levels (`outer.levels`, ((tau_1, g), (tau_2, P))): G = P/g groups, each a
contiguous block of g workers with its center c_b; the global center x~ (the
center the evaluation scores). With u_i worker i's inner update at x_i,
alpha_1 = outer.moving_rate (beta_1 = g alpha_1 < 1) and alpha_2 =
outer.global_moving_rate (beta_2 = G alpha_2 < 1; 0 asks for 0.9/g and 0.9/G),
the step t ((t+1) counting it) is:

  every step               x_i <- x_i + u_i
  (t+1) mod tau_1 == 0     d_i = x_i - c_b(i)           (x_i before the step)
                           x_i <- x_i + u_i - alpha_1 d_i
                           c_b <- c_b + alpha_1 sum_{i in b} d_i
  (t+1) mod tau_2 == 0     D_b = c_b - x~                (c_b after the groups')
                           c_b <- c_b - alpha_2 D_b
                           x~  <- x~ + alpha_2 sum_b D_b

EASGD's equations (Zhang, Choromanska, LeCun 2015, eqs. 5-6) at each level: a
worker and its group's center, then a group's center and the global one, pull
each other with equal and opposite forces. Where both fall on one step the
groups' exchange comes first, and the global one pulls the centers it left.

A block of one worker is its own center, and the one block of every worker is
the global center: with g = 1 the rule is sync_easgd at (alpha_2, tau_2) on
the workers and x~ (the "group centers" are the workers); with g = P it is
sync_easgd at (alpha_1, tau_1) on the workers and x~. With tau_2 beyond the run
(no global exchange) each group runs sync_easgd of its own, at (alpha_1,
tau_1), on its workers and its center. BatchNorm statistics move with the
models at both levels (outer.batch_stats=averaged), or stay each worker's and
out of the centers (local). The exchanges are float32. Its own levels, unless a
config sets any: ((4, 4), (8, 0)), groups of 4 pulled every 4 steps, their centers
and the global one every 8 (on the default config, 0.960 center accuracy at step
600, where the field's default, pairs and 16, ends at 0.939: its groups drift apart
between global pulls of at most 1/G).
"""

import dataclasses
import types

import jax
import jax.numpy as jnp
from jax import lax

from easgd.declare import Field, Shapes, number
from easgd.errors import require
from easgd.rules import model_state, optimizers
from easgd.rules.base import BASE_READS, DEFAULT_BETA, MOVING_RATE, Momentum, Pull, Rule
from easgd.rules.hierarchical_local import LEVELS, check_levels, pairs
from easgd.rules.optimizers import local_update, step_metrics
from easgd.rules.outer import SyncEASGD
from easgd.rules.spmd import rows_of_blocks, sum_over_blocks
from easgd.rules.state import initial_state, stack_workers
from easgd.sim import timing

GLOBAL_MOVING_RATE = Field(
  "outer.global_moving_rate",
  0.0,
  number(0, 1, words="must be in (0, 1), or 0 for beta_2 = groups*rate = 0.9"),
  "alpha_2: hierarchical_easgd's elastic pull between the group centers and the global "
  "center, beta_2 = groups*alpha_2 < 1; 0: beta_2 = 0.9",
  Shapes.IF_READ,
  earlier=0.0,
  setting="global_moving_rate",
  exclusive="pull between group centers",
)


class HierarchicalEASGD(Rule):
  """Hierarchical elastic averaging: see the module docstring."""

  name = "hierarchical_easgd"
  elastic = True
  momentum = Momentum.OPTIONAL
  nesterov = True
  pulls = (Pull.ELASTIC,)
  exchange_dtypes = ("float32",)
  declares = (LEVELS, GLOBAL_MOVING_RATE)
  # Its periods are its levels': outer.comm_period is not read.
  reads = (*BASE_READS, MOVING_RATE.path, model_state.BATCH_STATS.path, LEVELS.path)
  reads += (GLOBAL_MOVING_RATE.path,)
  # Groups of 4, the global pull every 8 steps: in the default run's band (the docstring).
  defaults = types.MappingProxyType({LEVELS.path: ((4, 4), (8, 0))})

  @classmethod
  def pull_members(cls, config):
    """A group's workers pull its center (alpha_1's beta is g alpha_1)."""
    levels = LEVELS.of(config)
    return pairs(levels, config.workers)[0][1] if levels else config.workers

  @classmethod
  def check_config(cls, config):
    check_levels(config, count=2)
    groups = config.workers // cls.pull_members(config)
    rate = GLOBAL_MOVING_RATE.of(config) or DEFAULT_BETA / groups
    require(
      groups * rate < 1,
      GLOBAL_MOVING_RATE,
      rate,
      f"beta_2 = groups*global_moving_rate = {groups * rate:g} must be < 1 ({groups} groups), "
      f"i.e. global_moving_rate < {1 / groups:g}",
    )

  def __init__(self, hyper):
    super().__init__(hyper)
    (self.short, self.size), (self.long, _) = pairs(hyper.levels, hyper.num_workers)
    self.groups = hyper.num_workers // self.size
    self.global_rate = hyper.global_moving_rate or DEFAULT_BETA / self.groups
    # A block of one is its own center; one block of all is the global center:
    # sync_easgd at the level that remains.
    self.collapsed = None
    if self.size == 1 or self.groups == 1:
      rate, period = (
        (self.global_rate, self.long) if self.size == 1 else (hyper.moving_rate, self.short)
      )
      self.collapsed = SyncEASGD(
        dataclasses.replace(hyper, moving_rate=rate, comm_period=period, levels=())
      )

  @property
  def period(self):
    """A worker's local steps between two of its exchanges (with groups of one, the
    global level's)."""
    return self.long if self.size == 1 else self.short

  def levels(self):
    return (timing.Exchange(block=self.size), timing.Exchange(unit=self.size))

  def level_exchanges(self, step):
    """The groups' pull every tau_1 steps, the global one every tau_2; none at a level
    that a block of one, or one block of all, makes its own center."""
    short = (step + 1) % self.short == 0
    long = (step + 1) % self.long == 0
    return (short & (self.size > 1), long & (self.groups > 1))

  def exchanges_after(self, step):
    return (step + 1) % self.period == 0

  def init(self, params, rng):
    if self.collapsed is not None:
      return self.collapsed.init(params, rng)
    workers = stack_workers(params, self.hyper.num_workers)
    worker_opt = {"inner": optimizers.init_workers(self.inner, workers)}
    center_opt = {"groups": stack_workers(params, self.groups)}
    return initial_state(rng, params, center_opt, workers, worker_opt, self.hyper.num_workers)

  def step(self, state, batch, loss_fn, tick):
    if self.collapsed is not None:
      return self.collapsed.step(state, batch, loss_fn, tick)
    del tick
    hyper = self.hyper
    count = state.worker_steps.shape[0]
    updates, inner_state, _, loss, aux = local_update(
      self.inner, state.workers, state.worker_opt["inner"], batch, loss_fn, at=state.workers
    )
    groups = state.center_opt["groups"]
    short, long = self.level_exchanges(state.step)

    def local_only():
      return jax.tree.map(jnp.add, state.workers, updates), groups

    def pulled_by_groups():
      own = rows_of_blocks(groups, self.size, count)
      distance = model_state.exchanged(
        jax.tree.map(jnp.subtract, state.workers, own), hyper.average_stats
      )
      totals = sum_over_blocks(distance, self.size, hyper.num_workers, hyper.deterministic_sums)
      alpha = hyper.moving_rate
      workers = jax.tree.map(lambda x, u, d: x + u - alpha * d, state.workers, updates, distance)
      return workers, jax.tree.map(lambda c, t: c + alpha * t, groups, totals)

    workers, groups = lax.cond(short, pulled_by_groups, local_only)

    def pulled_by_the_center():
      distance = model_state.exchanged(
        jax.tree.map(lambda c, x: c - x[None], groups, state.center), hyper.average_stats
      )
      rate = self.global_rate
      total = jax.tree.map(lambda d: d.sum(axis=0), distance)
      moved = jax.tree.map(lambda c, d: c - rate * d, groups, distance)
      return moved, jax.tree.map(lambda x, t: x + rate * t, state.center, total)

    groups, center = lax.cond(long, pulled_by_the_center, lambda: (groups, state.center))
    new_state = state.replace(
      step=state.step + 1,
      workers=workers,
      center=center,
      center_opt={"groups": groups},
      worker_opt={"inner": inner_state},
      worker_steps=state.worker_steps + 1,
    )
    learning_rate = self.learning_rate(state.worker_steps)
    return new_state, step_metrics(loss, aux, hyper, learning_rate)

  def worker_params(self, state):
    return state.workers
