"""NoLoCo (Kolehmainen et al. 2025, arXiv 2506.10911; reference code jkolehm/noloco):
DiLoCo without an all-reduce and without a center. Each worker keeps outer weights
phi_i of its own; every H = tau steps the workers are cut into random groups of n
(pairs by default), and each worker's outer step takes its group's mean
pseudo-gradient plus an elastic pull toward its group's mean outer weights.

With x_i the worker's inner weights (theta_i in the paper), u_i its inner
optimizer's update, t the steps taken before this one, eta_o, mu_o the outer
learning rate and momentum and kappa = outer.consensus, every step

  x_i <- x_i + u_i

and after step t with (t+1) mod tau == 0 (x_i now the stepped weights):

  pi = a permutation of the P workers drawn from (run key, GROUP_STREAM, t)
  G(i) = the group of n consecutive entries of pi that holds i
  Delta_i = -(1/n) sum_{j in G(i)} (x_j - phi_j)       the group's pseudo-gradient
  c_i     = phi_i - (1/n) sum_{j in G(i)} phi_j         the distance from the group's mean
  g_i     = Delta_i + kappa * c_i
  phi_i  <- phi_i + outer update_i of g_i               (worker i's own optimizer state)
  x_i    <- phi_i

With outer SGD at eta_o with heavy-ball momentum (outer.nesterov False; the reference
code's), in the code's units M_i = -eta_o * m_i:

  M_i <- mu_o * M_i + eta_o * mean_G(x - phi) + gamma * (mean_G phi - phi_i)
  phi_i <- phi_i + M_i                                  gamma = kappa * eta_o

which is `src/noloco/sparse_optimizer_c.py` lines 57-66 (m_ = (outer_momentum - 1)*m +
outer_lr*mean_g + outer_lr*(mean - p_old); m += m_; p_old += m; p = p_old): the
pseudo-gradient theta - phi and the pull toward the group's mean outer weights
(the worker's own included) are both added, with gamma = eta_o (kappa = 1, the
default). The paper lists gamma apart from eta_o; here kappa scales it, and
kappa = 0 leaves the pull out. With kappa = 1 the update reads
M_i <- mu_o*M_i + eta_o*(mean_G x - phi_i): only the group's mean inner weights are
needed. Groups: the code draws a permutation seeded by the step on every rank
(lines 6-8, 102-109) and deals it into groups of n by stride (lines 19-25); here
the permutation comes from the run's key and the step (jax.random), replicated on
every device, and its consecutive n-blocks are the groups: the same distribution
of groups, and no random state besides the run's key, so a run replays and resumes
bit for bit. The code's inner optimizer is Adam, never averaged or reset; here any
inner optimizer, each worker's own, is neither (as DiLoCo's).

The reference repository also has a variant that adds the pull to the inner
gradient instead (`src/noloco/sparse_optimizer.py`, lines 50-52: on sync steps
g <- g + 2*eta_o*(theta_i - mean_G theta), then Adam, with no outer weights or
momentum); no config of the repository uses it, and it is not this rule.

No center takes part: `state.center` is (1/P) sum_i phi_i after the last outer step,
kept for evaluation only (one all-reduce the algorithm does not have, which the
clock does not charge): "center accuracy" is that mean model's,
eval/worker_accuracy the mean of every worker's own, and eval/consensus_distance
their spread, mean_i ||x_i - x~|| / ||x~||. Each worker's x_i, phi_i and outer
optimizer state are in its row of the state (`workers`, `worker_opt`).

The group means are formed on every device from an all-gather of the workers'
x_j - phi_j and phi_j, summed in the order of pi: the members of a group compute
the same bits, on any layout. The clock times each exchange as an all-reduce among
blocks of n workers (a level of timing.Exchange(block=n)), of one model (kappa 0 or 1:
the group's mean of x - phi, or of x) or two (otherwise), behind a barrier of all
the workers (the clock does not know the groups, which the step draws): on workers
of unequal speed it charges the wait for the slowest of all, where a group waits
for its slowest member only.

BatchNorm statistics: averaged, each worker's become its group's mean at the outer
step (averaged, not optimized), and the center's the mean of all; local, each
worker keeps its own and the center's never move.
"""

import types

import jax
import jax.numpy as jnp
import optax
from jax import lax

from easgd.declare import Field, Shapes, integer, number
from easgd.errors import require
from easgd.rules import model_state, optimizers
from easgd.rules.base import BASE_READS, COMM_PERIOD, WORKERS, Pull
from easgd.rules.optimizers import local_update, step_metrics
from easgd.rules.outer import OUTER_LEARNING_RATE, OUTER_MOMENTUM, OUTER_NESTEROV, CenterRule
from easgd.rules.spmd import AXIS, local_workers, mean_over_workers
from easgd.rules.state import initial_state, stack_workers
from easgd.sim import clocks, timing

GROUP_SIZE = Field(
  "outer.group_size",
  2,
  integer(1, note="dividing workers"),
  "n: noloco's workers averaging together at an outer step, a random group of n drawn "
  "anew at each (2: pairs)",
  Shapes.IF_READ,
  earlier=2,
  setting="group_size",
  exclusive="gossip groups",
)
CONSENSUS = Field(
  "outer.consensus",
  1.0,
  number(0),
  "kappa: noloco's pull of each worker's outer weights toward its group's mean, in units "
  "of outer.learning_rate (gamma = kappa*eta_o; 1: the reference code's, 0: none)",
  Shapes.IF_READ,
  earlier=1.0,
  setting="consensus",
  exclusive="consensus pull",
)

# Keys of the groups are drawn apart from the data's and the exchanges'.
GROUP_STREAM = 2**31 - 2


class NoLoCo(CenterRule):
  """NoLoCo: see the module docstring."""

  name = "noloco"
  # Its workers are reset to their own outer weights, not to a center.
  pulls = (Pull.RESET,)
  # The reference code's exchanges are float32, uncompressed.
  exchange_dtypes = ("float32",)
  declares = (GROUP_SIZE, CONSENSUS)
  reads = (
    *BASE_READS,
    COMM_PERIOD.path,
    model_state.BATCH_STATS.path,
    OUTER_LEARNING_RATE.path,
    OUTER_MOMENTUM.path,
    OUTER_NESTEROV.path,
    GROUP_SIZE.path,
    CONSENSUS.path,
  )
  # The reference code's outer optimizer (every NoLoCo config of its repository):
  # heavy-ball momentum 0.5 at eta_o = 0.7, the default config's rate.
  defaults = types.MappingProxyType({OUTER_MOMENTUM.path: 0.5, OUTER_NESTEROV.path: False})

  @classmethod
  def check_config(cls, config):
    workers, size = WORKERS.of(config), GROUP_SIZE.of(config)
    require(
      workers % size == 0,
      GROUP_SIZE,
      size,
      f"must divide workers={workers}: at each outer step the workers are cut into "
      "groups of that many",
    )
    # Its random groups cross the network's groups as the permutation falls, which the
    # timing model, pricing blocks of contiguous workers, does not follow.
    require(
      not timing.GROUPS.of(config),
      timing.GROUPS,
      timing.GROUPS.of(config),
      "must be () with noloco: the timing model prices its random groups as contiguous "
      "blocks, and a cluster of groups would count their messages on the wrong links",
    )

  def outer_settings(self):
    """Outer SGD at eta_o with momentum mu_o (heavy-ball, or Nesterov's form): it has no
    choice of outer optimizer."""
    hyper = self.hyper
    return "sgd", hyper.outer_learning_rate, hyper.outer_momentum, hyper.outer_nesterov

  def init(self, params, rng):
    count = self.hyper.num_workers
    workers = stack_workers(params, count)
    worker_opt = {
      "inner": optimizers.init_workers(self.inner, workers),
      "outer_weights": workers,
      "outer_opt": jax.vmap(self.outer().init)(model_state.trainable(workers)),
    }
    return initial_state(rng, params, (), workers, worker_opt, count)

  def make_clock(self, cluster, model_bytes, seed, sent_bytes=None):
    """An all-reduce among each group of n: of the group's mean of x (kappa = 1) or of
    x - phi (kappa = 0), or of both."""
    del sent_bytes  # its exchanges are float32
    messages = 1 if self.hyper.consensus in (0.0, 1.0) else 2
    return clocks.SyncClock(
      cluster,
      self.hyper.num_workers,
      messages * model_bytes,
      seed,
      self.period,
      exchanges_after=self.exchanges_after,
      levels=(timing.Exchange(block=self.hyper.group_size),),
    )

  def groups(self, rng: jax.Array, step: jax.Array) -> jax.Array:
    """[P/n, n]: the groups of the outer step that ends step `step` (each row a group,
    its workers in the order of the permutation), from the run's key `rng`."""
    key = jax.random.fold_in(jax.random.fold_in(rng, GROUP_STREAM), step)
    count, size = self.hyper.num_workers, self.hyper.group_size
    return jax.random.permutation(key, count).reshape(count // size, size)

  def step(self, state, batch, loss_fn, tick):
    del tick
    updates, inner_state, _, loss, aux = local_update(
      self.inner, state.workers, state.worker_opt["inner"], batch, loss_fn
    )
    own = state.worker_opt

    def local_only():
      stepped = jax.tree.map(jnp.add, state.workers, updates)
      return stepped, state.center, own["outer_weights"], own["outer_opt"]

    def gossip():
      stepped = jax.tree.map(jnp.add, state.workers, updates)
      return self._outer_step(state, stepped)

    workers, center, outer_weights, outer_opt = lax.cond(
      self.exchanges_after(state.step), gossip, local_only
    )
    new_state = state.replace(
      step=state.step + 1,
      workers=workers,
      center=center,
      worker_opt={"inner": inner_state, "outer_weights": outer_weights, "outer_opt": outer_opt},
      worker_steps=state.worker_steps + 1,
    )
    learning_rate = self.learning_rate(state.worker_steps)
    return new_state, step_metrics(loss, aux, self.hyper, learning_rate)

  def _outer_step(self, state, stepped):
    """(x_i, x~, phi_i, outer state_i) after the outer step: the module docstring's."""
    count = state.worker_steps.shape[0]
    groups = self.groups(state.rng, state.step)
    # Each local worker's group, its members in the permutation's order.
    position = jnp.argsort(groups.reshape(-1))[local_workers(count)]
    members = groups[position // self.hyper.group_size]

    def group_mean(tree):
      """(1/n) sum_{j in G(i)} tree_j for each local worker i, summed in the group's order."""

      def leaf_mean(leaf):
        every = lax.all_gather(leaf, AXIS, tiled=True, to="invarying")  # [P, ...]
        total = every[members[:, 0]]
        for k in range(1, members.shape[1]):
          total = total + every[members[:, k]]
        return total / members.shape[1]

      return jax.tree.map(leaf_mean, tree)

    phi_tree = state.worker_opt["outer_weights"]
    x, phi = model_state.trainable(stepped), model_state.trainable(phi_tree)
    drift = group_mean(jax.tree.map(jnp.subtract, x, phi))
    spread = group_mean(phi)
    kappa = self.hyper.consensus
    pseudo_gradient = jax.tree.map(lambda d, p, m: -d + kappa * (p - m), drift, phi, spread)
    steps, outer_opt = jax.vmap(self.outer().update)(
      pseudo_gradient, state.worker_opt["outer_opt"], phi
    )
    moved = optax.apply_updates(phi, steps)
    outer_weights = model_state.with_trainable(phi_tree, moved)
    center = model_state.with_trainable(state.center, self._mean(moved))
    if model_state.has_stats(stepped):
      if self.hyper.average_stats:
        stats = group_mean(stepped[model_state.STATS])
        center = dict(center, **{model_state.STATS: self._mean(stats)})
      else:
        stats = stepped[model_state.STATS]
      outer_weights = dict(outer_weights, **{model_state.STATS: stats})
    return outer_weights, center, outer_weights, outer_opt

  def _mean(self, tree):
    """(1/P) sum_i tree_i over all workers: the center, for evaluation."""
    return mean_over_workers(tree, self.hyper.num_workers, self.hyper.deterministic_sums)

  def worker_params(self, state):
    return state.workers
