"""PALSGD, pseudo-asynchronous Local SGD (Naganuma et al., TMLR 2025, arXiv 2504.18454;
reference code Hiroki11x/Pseudo-Asynchronous-LocalSGD): DiLoCo whose workers, between
the outer steps, sometimes pull themselves toward the last synchronised center instead
of taking a gradient step, without communicating: EASGD's elastic pull toward a stale
center, inside DiLoCo.

With x~ the center after the last outer step, p = outer.pull_probability, eta_pull =
outer.pull_rate, eta_t the learning rate in force at step t and b_i,t a coin of
worker i at step t, 1 with probability p (t the steps taken before this one):

  b_i,t = 1:  x_i <- x_i - (eta_t / p) * eta_pull * (x_i - x~)   a pull: no gradient,
                                                                  the inner state untouched
  b_i,t = 0:  x_i <- x_i + u_i / (1 - p)                          the inner optimizer's step
                                                                  at eta_t / (1 - p)

so that in expectation a step is eta_t's gradient step plus a pull of eta_t * eta_pull;
and every tau steps DiLoCo's outer step (easgd.rules.outer, reset pull): Delta =
-(1/P) sum_i Q(x_i - x~), x~ <- x~ + outer update of Delta, x_i <- x~.

The reference code (resnet_cifar10/algorithm/postadaptive_localsgd_decoupled.py): the
pull, lines 114-122 (param -= lr / prob_no_grad * eta * (param - cent_param), with
cent_param the outer model after the outer optimizer's step); the gradient step at the
learning rate scaled by 1/(1 - p), lines 147-150; the outer step on the mean of
phi - theta, lines 161-192. Its inner optimizer's update is linear in the learning
rate (SGD with momentum or Nesterov's, Adam and AdamW: the rate multiplies the whole
step and no state), and so are this project's (optax's SGD, with L2 inside the
gradient, and AdamW with its decoupled decay), so scaling u_i by 1/(1 - p) is the
step at eta_t / (1 - p). Its coin is the global NumPy generator's, seeded alike on
every rank (main_multinode.py line 49; the coin, lines 212-213), so its workers very
likely pull at the same steps; here each worker's coin is its own, drawn from (the
run's key, COIN_STREAM, t, i): the workers pull independently, as the method
describes them, and a run replays and resumes bit for bit with no random state of
its own. The code draws each coin after a step for the next one, and its first step
is a gradient step; here step t's coin is drawn at step t, and a pull right after
an outer step moves nothing (x_i = x~ then).

A pull step is still a step: the worker's batch of that step is drawn and its forward
and backward passes run (under vmap every worker computes its gradient), the loss
and accuracy logged are those of every worker's forward pass, and the clock charges
the step's compute, where the reference skips the computation of a pulling worker
(the timing model overstates its time by up to p). BatchNorm statistics move with a
gradient step only: a pulling worker's stay where they were, its parameters alone are
pulled (the code pulls `model.parameters()`, not the buffers). Under a schedule,
eta_t is the schedule at step t (the reference steps its scheduler every iteration),
while a gradient step's own rate follows its optimizer's count of gradient steps,
which a pull does not advance; under the default constant schedule both are eta.

With p = 0 no coin comes up and every step is u_i / 1 = u_i: diloco, bit for bit
(tests/rules/test_palsgd.py).
"""

import types

import jax
import jax.numpy as jnp

from easgd.declare import Field, Shapes, number
from easgd.errors import require
from easgd.rules import exchange, model_state
from easgd.rules.base import BASE_READS, COMM_PERIOD, Pull
from easgd.rules.optimizers import LEARNING_RATE
from easgd.rules.outer import OUTER_READS, CenterRule
from easgd.rules.spmd import local_workers

PULL_PROBABILITY = Field(
  "outer.pull_probability",
  0.0,
  number(0, 1),
  "p: palsgd's chance that a worker's step is a pull toward the last synchronised center "
  "instead of a gradient step (0: diloco)",
  Shapes.IF_READ,
  earlier=0.0,
  setting="pull_probability",
  exclusive="probabilistic pulls",
)
PULL_RATE = Field(
  "outer.pull_rate",
  0.5,
  number(0, low_open=True),
  "eta_pull: a palsgd pull moves a worker by learning_rate/pull_probability*pull_rate of "
  "its distance to the center (at most 1)",
  Shapes.IF_READ,
  earlier=0.5,
  setting="pull_rate",
  exclusive="probabilistic pulls",
)

# Keys of the coins are drawn apart from the data's, the exchanges' and the groups'.
COIN_STREAM = 2**31 - 3


class PALSGD(CenterRule):
  """PALSGD: see the module docstring."""

  name = "palsgd"
  pulls = (Pull.RESET,)
  declares = (PULL_PROBABILITY, PULL_RATE)
  reads = (
    *BASE_READS,
    COMM_PERIOD.path,
    model_state.BATCH_STATS.path,
    *OUTER_READS,
    exchange.ERROR_FEEDBACK.path,
    PULL_PROBABILITY.path,
    PULL_RATE.path,
  )
  # The reference code's p and eta (its defaults: prob_no_grad 0.2, eta 0.5); with
  # p = 0 it would be diloco.
  defaults = types.MappingProxyType({PULL_PROBABILITY.path: 0.2, PULL_RATE.path: 0.5})

  @classmethod
  def check_config(cls, config):
    p, rate = PULL_PROBABILITY.of(config), PULL_RATE.of(config)
    if p == 0:
      return
    eta = LEARNING_RATE.of(config)
    require(
      eta * rate / p <= 1,
      PULL_RATE,
      rate,
      f"a pull moves a worker by optimizer.learning_rate/pull_probability*pull_rate = "
      f"{eta * rate / p:g} of its distance to the center, which must be at most 1 (past "
      "the center beyond it)",
    )

  def coins(self, state, count: int) -> jax.Array:
    """[count] bool: whether each local worker pulls at this step (probability p)."""
    key = jax.random.fold_in(jax.random.fold_in(state.rng, COIN_STREAM), state.step)
    draws = jax.vmap(lambda w: jax.random.uniform(jax.random.fold_in(key, w)))(local_workers(count))
    return draws < self.hyper.pull_probability

  def local_step(self, state, start, updates, inner_state):
    """A pull toward the center (heads) or the inner step at eta_t/(1 - p) (tails)."""
    p, count = self.hyper.pull_probability, state.worker_steps.shape[0]
    heads = self.coins(state, count)

    def per_worker(value):  # a worker's coin, shaped to broadcast over its rows
      return heads.reshape((count,) + (1,) * (jnp.ndim(value) - 1))

    # eta_t/p * eta_pull, each worker's (0 without pulls: p = 0 never divides).
    rate = self.learning_rate(state.worker_steps)
    strength = rate * (self.hyper.pull_rate / p) if p > 0 else jnp.zeros_like(rate)

    def pulled(x, c):
      return -strength.reshape((count,) + (1,) * (x.ndim - 1)) * (x - c)

    params = model_state.trainable(updates)
    pull = jax.tree.map(pulled, model_state.trainable(start), model_state.trainable(state.center))
    scaled = jax.tree.map(lambda u: u / (1.0 - p), params)
    moved = jax.tree.map(lambda a, b: jnp.where(per_worker(a), a, b), pull, scaled)
    updates = model_state.with_trainable(updates, moved)
    if model_state.has_stats(updates):
      # A pulling worker's statistics stay where they were.
      stats = jax.tree.map(
        lambda u: jnp.where(per_worker(u), jnp.zeros_like(u), u), updates[model_state.STATS]
      )
      updates = dict(updates, **{model_state.STATS: stats})
    kept = jax.tree.map(
      lambda old, new: jnp.where(per_worker(new), old, new),
      state.worker_opt["inner"],
      inner_state,
    )
    return updates, kept
