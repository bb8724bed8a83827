"""Post-local SGD (Lin, Stich, Patel, Jaggi, "Don't Use Large Mini-Batches, Use Local
SGD", ICLR 2020): mini-batch SGD for the first t0 steps, then Local SGD.

With t counting the steps taken before this one (`state.step`, from 0), g_i the
gradient of worker i at its own x_i on its own batch, and inner(g, s, x) the
inner optimizer's update and new state (easgd.rules.optimizers):

  t < t0   one all-reduce of the gradients; every worker takes the same step
             g = (1/P) sum_i g_i;  u, s <- inner(g, s, x);  x_i <- x  <- x + u
           (x~ holds x; each worker's optimizer state s_i is the shared s)
  t >= t0  each worker alone:  u_i, s_i <- inner(g_i, s_i, x_i);  x_i <- x_i + u_i
           and after step t with (t - t0) mod H = 0, one all-reduce of the models:
             x~ <- (1/P) sum_i x_i;  x_i <- x~
           (H = outer.comm_period; the optimizer states s_i are never averaged)

so steps t0, t0 + H, t0 + 2H, ... end with an average, as PyTorch's
PeriodicModelAverager(period=H, warmup_steps=t0) averages them: step t0 itself
averages, after the first local step (the paper's rounds of H local steps
would average first after step t0 + H - 1). The momentum buffers cross the
switch as they are: equal on every worker at t0 (they saw the same
gradients), apart after it. BatchNorm statistics (outer.batch_stats averaged)
are averaged whenever the models are, and before t0 at every step, like
sync_sgd's; with `local` each worker keeps its own. With t0 = 0 the averages
fall one step earlier than local_sgd's (after steps 0, H, 2H, ... where
local_sgd's follow steps H - 1, 2H - 1, ...). t0 must be below run.total_steps:
a run that never switches would be sync_sgd.

PyTorch's post_localSGD_hook all-reduces the gradients within a subgroup after
the switch (by default the processes of one machine); here every worker steps
alone, as in the paper and as PyTorch does without post-local gradient
all-reduces.
"""

import types

import jax
import jax.numpy as jnp
import optax
from jax import lax

from easgd.declare import Field, Shapes, integer
from easgd.errors import require
from easgd.rules import model_state, optimizers, quorum
from easgd.rules.base import BASE_READS, COMM_PERIOD, Momentum, Pull, Rule
from easgd.rules.optimizers import step_metrics
from easgd.rules.spmd import AXIS, map_workers, mean_over_workers
from easgd.rules.state import initial_state, stack_workers
from easgd.sim import rounds

SWITCH_STEP = Field(
  "outer.switch_step",
  0,
  integer(0, 2**31, words="must be an integer in [0, 2**31)"),
  "t0: post_local_sgd's steps of mini-batch SGD (one all-reduce of gradients a step) "
  "before its workers step alone and average every comm_period steps",
  Shapes.IF_READ,
  earlier=0,
  setting="switch_step",
  exclusive="switch to local steps",
)


class PostLocalSGD(Rule):
  """Post-local SGD: see the module docstring."""

  name = "post_local_sgd"
  momentum = Momentum.OPTIONAL
  nesterov = True
  # The paper's and PyTorch's exchanges are float32.
  exchange_dtypes = ("float32",)
  declares = (SWITCH_STEP,)
  reads = (
    *BASE_READS,
    COMM_PERIOD.path,
    model_state.BATCH_STATS.path,
    SWITCH_STEP.path,
    *rounds.READS,
  )
  # Averaging resets the workers to the center.
  pulls = (Pull.RESET,)
  # Its rounds at a quorum: before t0 sync_sgd's (a gradient cannot be late on the
  # shared x), then local_sgd's without late messages.
  missed = ("drop",)
  missed_reason = (
    "before t0 its workers share one x, on which a gradient taken in later is a stale one"
  )
  # With t0 = 0 it would be Local SGD from the start: a switch inside every run of
  # 100 steps or more (the paper switches at its first learning-rate decay; the
  # default schedule is constant, so where is a choice).
  defaults = types.MappingProxyType({SWITCH_STEP.path: 50})

  @classmethod
  def check_config(cls, config):
    total = config.run.total_steps
    require(
      SWITCH_STEP.of(config) < total,
      SWITCH_STEP,
      SWITCH_STEP.of(config),
      f"must be below run.total_steps={total}: a run that never switches is sync_sgd "
      "(its mini-batch SGD on P copies of the model)",
    )
    require(
      rounds.WORLD_SIZE.of(config) == "dynamic",
      rounds.WORLD_SIZE,
      rounds.WORLD_SIZE.of(config),
      "post_local_sgd takes dynamic: after t0 it averages the models themselves, which an "
      "absent worker counted as zero would shrink",
    )

  @property
  def period(self):
    return self.hyper.comm_period

  def exchanges_after(self, step):
    """Every step before t0 (its gradients), then t0, t0 + H, ... (the models)."""
    switch = self.hyper.switch_step
    return (step < switch) | ((step - switch) % self.period == 0)

  def init(self, params, rng):
    workers = stack_workers(params, self.hyper.num_workers)
    # The shared optimizer state of the steps before t0, beside each worker's own.
    center_opt = self.inner.init(model_state.trainable(params))
    worker_opt = {"inner": optimizers.init_workers(self.inner, workers)}
    return initial_state(rng, params, center_opt, workers, worker_opt, self.hyper.num_workers)

  def _mean(self, tree, tick):
    """(1/P) sum_i tree_i: one all-reduce; at a quorum the mean over the round's
    members (easgd.rules.quorum)."""
    if self.round_policy is None:
      return mean_over_workers(tree, self.hyper.num_workers, self.hyper.deterministic_sums)
    return quorum.mean(tree, tick, self.hyper.num_workers, self.hyper.deterministic_sums)

  def step(self, state, batch, loss_fn, tick):
    count = state.worker_steps.shape[0]
    (loss, aux), grads = map_workers(
      jax.value_and_grad(loss_fn, has_aux=True), state.workers, batch
    )
    average_stats = self.hyper.average_stats and model_state.has_stats(state.center)

    def as_workers(tree):
      # This device's rows of a value that is the same on every device.
      return lax.pcast(stack_workers(tree, count), AXIS, to="varying")

    def mini_batch():
      mean = self._mean(model_state.trainable(grads), tick)
      params = model_state.trainable(state.center)
      updates, center_opt = self.inner.update(mean, state.center_opt, params)
      center = model_state.with_trainable(state.center, optax.apply_updates(params, updates))
      workers = as_workers(center)
      if model_state.has_stats(center):
        if average_stats:
          stats = self._mean(aux[model_state.STATS], tick)
          center = dict(center, **{model_state.STATS: stats})
          workers = as_workers(center)
        else:
          workers = dict(workers, **{model_state.STATS: aux[model_state.STATS]})
      return workers, as_workers(center_opt), center, center_opt

    def local():
      updates, inner = jax.vmap(self.inner.update)(
        model_state.trainable(grads),
        state.worker_opt["inner"],
        model_state.trainable(state.workers),
      )
      updates = model_state.stats_step(
        model_state.with_trainable(grads, updates), state.workers, aux
      )
      stepped = jax.tree.map(jnp.add, state.workers, updates)

      def averaged():
        workers, center = self._averaged(
          state.step, stepped, state.center, as_workers, average_stats, tick
        )
        if self.round_policy is None:
          return workers, center, inner
        # A dropped worker takes a member's optimizer state; its model is the
        # average, as every worker's.
        _, healed = quorum.heal(workers, workers, inner, tick, count)
        return workers, center, healed

      workers, center, inner = lax.cond(
        self.exchanges_after(state.step), averaged, lambda: (stepped, state.center, inner)
      )
      return workers, inner, center, state.center_opt

    workers, inner, center, center_opt = lax.cond(
      state.step < self.hyper.switch_step, mini_batch, local
    )
    new_state = state.replace(
      step=state.step + 1,
      workers=workers,
      center=center,
      center_opt=center_opt,
      worker_opt={"inner": inner},
      worker_steps=state.worker_steps + 1,
    )
    learning_rate = self.learning_rate(state.worker_steps)
    return new_state, step_metrics(loss, aux, self.hyper, learning_rate)

  def _averaged(self, step, stepped, center, as_workers, average_stats, tick):
    """(workers, center) after the average that ends step `step` of the local phase:
    every worker's model (with its statistics, if averaged) set to the mean of all (at
    a quorum, of the round's members: `tick`), which the center becomes. `as_workers`:
    this device's rows of a replicated value."""
    del step  # one level: every average is over all the workers
    mean = self._mean(stepped if average_stats else model_state.trainable(stepped), tick)
    center = mean if average_stats else model_state.with_trainable(center, mean)
    workers = as_workers(center)
    if model_state.has_stats(center) and not average_stats:
      workers = dict(workers, **{model_state.STATS: stepped[model_state.STATS]})
    return workers, center

  def worker_params(self, state):
    return state.workers
