"""The center family: local steps, a pseudo-gradient, an outer optimizer, a pull.

Every member keeps a center x~ and P workers x_i. Every step each worker takes
a local step u_i of its inner optimizer (easgd.rules.optimizers). On every
tau-th step ((t+1) mod tau == 0) there is also an exchange:

  1. each worker sends its difference from the center, Q(x_i - x~)
     (Q: the exchange dtype's compression, easgd.rules.exchange);
  2. one all-reduce forms the pseudo-gradient Delta = -mean_i Q(x_i - x~);
  3. the outer optimizer moves the center: x~ <- x~ + outer.update(Delta);
  4. the workers are pulled, one of two ways (`Rule.pulls`, `outer.pull`):
       elastic  x_i <- x_i + u_i - alpha*(x_i - x~)    with x_i, x~ from before
                the step: the local gradient and the elastic force act at the
                same point, as in EASGD's equations (Zhang et al. 2015);
       reset    x_i <- x~ (the new center), after the step's local update:
                tau inner steps, then the outer step (DiLoCo, Local SGD).
     Between exchanges x_i <- x_i + u_i.

Members (a class each; the family's general member is `diloco`, whose outer
optimizer and pull are the config's):
  sync_easgd   elastic; outer SGD at eta_o = P*alpha, without momentum, so
               x~ <- x~ + alpha * sum_i (x_i - x~)   (written so, as EASGD is)
  sync_measgd  sync_easgd whose inner optimizer must have momentum
  diloco       reset (or elastic); outer SGD with Nesterov momentum (eta_o,
               mu_o from outer.*; DiLoCo's 0.7 and 0.9 by default); AdamW inside
               in the paper (Douillard et al. 2023)
  local_sgd    reset; outer SGD at eta_o = 1: x~ <- mean_i x_i (periodic
               model averaging; Stich 2019, Lin et al. 2020)
  lookahead    reset; outer SGD at eta_o = alpha_LA (outer.learning_rate), no
               momentum: slow weights x~ <- x~ + alpha_LA*(mean_i x_i - x~),
               fast weights reset to them every k = tau steps; any P, and
               P = 1 is the paper's optimizer (Zhang et al. 2019)

BatchNorm statistics (easgd.rules.model_state) with `outer.batch_stats`
averaged are averaged, not optimized (an outer learning rate or momentum on
running statistics has no meaning): under the reset pull the center's become
the workers' mean s~ <- mean_i s_i and the reset sets every worker's to it;
under the elastic pull they move as EASGD moves them, s~ <- s~ + alpha *
sum_i (s_i - s~). With `local` they are in no exchange and no reset.
"""

import jax
import jax.numpy as jnp
import optax
from jax import lax

from easgd.declare import FLAG, Allowed, Field, Shapes, number, one_of
from easgd.rules import exchange, model_state, optimizers, quorum
from easgd.rules.base import (
  BASE_READS,
  COMM_PERIOD,
  ELASTIC_READS,
  MOMENTUM_DEFAULTS,
  Momentum,
  Pull,
  Rule,
)
from easgd.rules.optimizers import local_update, shifted, step_metrics
from easgd.rules.spmd import AXIS, exchange_key, local_workers, sum_over_workers
from easgd.rules.state import initial_state, stack_workers
from easgd.sim import rounds

# The center's outer optimizer and the choice of pull.
PULL = Field(
  "outer.pull",
  "",
  Allowed(lambda v: v in ("", *Pull), "valid: '' (the rule's own), elastic, reset"),
  "'' (the rule's own), elastic or reset: only diloco takes either",
  Shapes.IF_READ,
  setting="pull",
)
OUTER_OPTIMIZER = Field(
  "outer.optimizer",
  "sgd",
  one_of(optimizers.OUTER),
  "the center's optimizer on the pseudo-gradient (diloco's; the defaults are DiLoCo's)",
  Shapes.IF_READ,
  setting="outer_optimizer",
)
OUTER_LEARNING_RATE = Field(
  "outer.learning_rate",
  0.7,
  number(0, low_open=True),
  "eta_o; lookahead's slow-weight rate alpha",
  Shapes.IF_READ,
  setting="outer_learning_rate",
  off=1.0,
  mid_run=True,
)
OUTER_MOMENTUM = Field(
  "outer.momentum",
  0.9,
  number(0, 1),
  "mu_o, the outer sgd's momentum (async_local_sgd's: Delayed Nesterov's)",
  Shapes.IF_READ,
  setting="outer_momentum",
  off=0.0,
)
OUTER_NESTEROV = Field(
  "outer.nesterov",
  True,
  FLAG,
  "the outer sgd's momentum in Nesterov's form",
  Shapes.IF_READ,
  setting="outer_nesterov",
  off=False,
)
OUTER_FIELDS = (OUTER_OPTIMIZER, OUTER_LEARNING_RATE, OUTER_MOMENTUM, OUTER_NESTEROV)
OUTER_READS = tuple(field.path for field in OUTER_FIELDS)


class CenterRule(Rule):
  """The family: see the module docstring. Subclasses set `pulls` and the outer optimizer."""

  momentum = Momentum.OPTIONAL
  nesterov = True
  # int4 and int2 too: the low-bit outer exchanges (with or without error feedback).
  exchange_dtypes = exchange.DTYPES
  declares = (PULL, *OUTER_FIELDS, exchange.ERROR_FEEDBACK)

  @property
  def pull(self) -> Pull:
    # Only a rule that takes several pulls reads outer.pull (validation refuses
    # another value for the others).
    if len(self.pulls) == 1:
      return self.pulls[0]
    return Pull(self.hyper.pull or self.pulls[0])

  @property
  def period(self):
    return self.hyper.comm_period

  def outer_settings(self) -> tuple[str, float, float, bool] | None:
    """(optimizer, eta_o, mu_o, Nesterov) of the center; None for EASGD's own form of
    outer SGD at P*alpha."""
    hyper = self.hyper
    return (
      hyper.outer_optimizer,
      hyper.outer_learning_rate,
      hyper.outer_momentum,
      hyper.outer_nesterov,
    )

  def outer(self) -> optax.GradientTransformation | None:
    settings = self.outer_settings()
    return None if settings is None else optimizers.outer(*settings)

  def init(self, params, rng):
    workers = stack_workers(params, self.hyper.num_workers)
    outer = self.outer()
    center_opt = () if outer is None else outer.init(model_state.trainable(params))
    return initial_state(
      rng, params, center_opt, workers, self.worker_opt(workers), self.hyper.num_workers
    )

  def worker_opt(self, workers):
    """The workers' own state at the start: their inner optimizer's, and with error
    feedback (easgd.rules.exchange) the residual of their messages, 0."""
    worker_opt = {"inner": optimizers.init_workers(self.inner, workers)}
    if self.hyper.error_feedback:
      worker_opt["residual"] = jax.tree.map(jnp.zeros_like, workers)
    if self.holds_late():
      # The late workers' messages, held for the next round (easgd.rules.quorum).
      held = model_state.exchanged(workers, self.hyper.average_stats)
      worker_opt["held"] = jax.tree.map(jnp.zeros_like, held)
    return worker_opt

  def holds_late(self) -> bool:
    """Whether its rounds hold late workers' messages for the next round."""
    return self.round_policy is not None and self.round_policy.missed == "late"

  def compress(self, messages, residual, key, count: int):
    """(what this device's `count` workers send of their `messages`, their residuals
    after it): Q(messages) and None without error feedback; Q(messages + residual)
    and the new residual with it (easgd.rules.exchange)."""
    dtype, workers = self.hyper.exchange_dtype, local_workers(count)
    if residual is None:
      return exchange.compress_workers(messages, dtype, key, workers), None
    return exchange.with_feedback(messages, residual, dtype, key, workers)

  def local_step(self, state, start, updates, inner_state):
    """(u_i, the inner state after it): each local worker's step from `start` (x_i, or
    EAMSGD's look-ahead point) and its inner optimizer's state, given the inner
    optimizer's `updates` and `inner_state` for the step. The family's is the inner
    optimizer's own; a member whose workers step otherwise (palsgd's pulls) says so here."""
    del state, start
    return updates, inner_state

  def _move_center(self, center, center_opt, sent):
    """x~ and its optimizer state after an exchange whose messages are `sent` (x_i - x~)."""
    total = sum_over_workers(sent, self.hyper.deterministic_sums)
    return self._apply_total(center, center_opt, total, self.outer())

  def _apply_total(self, center, center_opt, total, outer):
    """x~ (or a fragment of it) and its optimizer state moved by `total` = sum_i Q(x_i - x~)
    through `outer` (None: EASGD's x~ + alpha*total)."""
    count = self.hyper.num_workers
    if outer is None:
      alpha = self.hyper.moving_rate
      return jax.tree.map(lambda c, s: c + alpha * s, center, total), center_opt
    mean = jax.tree.map(lambda s: s / count, total)
    delta = jax.tree.map(jnp.negative, model_state.trainable(mean))
    params = model_state.trainable(center)
    updates, center_opt = outer.update(delta, center_opt, params)
    moved = model_state.with_trainable(center, optax.apply_updates(params, updates))
    if model_state.has_stats(center):
      # Running statistics are averaged, not optimized: the reset pull sets the
      # center's to the workers' mean, the elastic pull moves them as EASGD does.
      rate = 1.0 if self.pull == Pull.RESET else count * self.hyper.moving_rate
      stats = jax.tree.map(
        lambda c, s: c + rate * s, center[model_state.STATS], mean[model_state.STATS]
      )
      moved = dict(moved, **{model_state.STATS: stats})
    return moved, center_opt

  def _reset(self, center, workers, count: int):
    """This device's `count` workers set to the center; BatchNorm statistics too unless
    they are local."""
    # The center is the same on every device; each device's rows of it are its own.
    reset = lax.pcast(stack_workers(center, count), AXIS, to="varying")
    if model_state.has_stats(center) and not self.hyper.average_stats:
      reset = dict(reset, **{model_state.STATS: workers[model_state.STATS]})
    return reset

  def step(self, state, batch, loss_fn, tick):
    # Where each local step starts: x_i, or EAMSGD's look-ahead point x_i + mu*v_i.
    start = shifted(state.workers, self.look_ahead_shift(state.worker_opt["inner"]))
    updates, inner_state, _, loss, aux = local_update(
      self.inner, state.workers, state.worker_opt["inner"], batch, loss_fn, at=start
    )
    updates, inner_state = self.local_step(state, start, updates, inner_state)
    count = state.worker_steps.shape[0]
    # The residuals of error feedback (None without it): changed by an exchange only.
    residual = state.worker_opt.get("residual")

    # Under a round policy (easgd.rules.quorum) the cond also returns the inner
    # state (a dropped worker takes a member's) and the held late messages;
    # without one it returns what it always has.
    in_rounds = self.round_policy is not None
    held = state.worker_opt.get("held")

    # x_i + u_i is formed inside each branch, not once before the cond: XLA
    # then compiles the step as it always has, and plain EASGD keeps its bits.
    def local_only():
      extra = (inner_state, held) if in_rounds else ()
      stepped = jax.tree.map(jnp.add, start, updates)
      return stepped, state.center, state.center_opt, residual, extra

    def with_exchange():
      stepped = jax.tree.map(jnp.add, start, updates)
      read = state.workers if self.pull == Pull.ELASTIC else stepped
      distance = model_state.exchanged(
        jax.tree.map(lambda x, c: x - c, read, state.center), self.hyper.average_stats
      )
      sent, left = self.compress(distance, residual, exchange_key(state), count)
      if in_rounds:
        total = quorum.total(sent, held, tick, count, self.hyper.deterministic_sums)
        center, center_opt = self._apply_total(state.center, state.center_opt, total, self.outer())
        left = quorum.keep_unsent(left, residual, tick, count)
      else:
        center, center_opt = self._move_center(state.center, state.center_opt, sent)
      if self.pull == Pull.RESET:
        workers = self._reset(center, stepped, count)
      else:
        # The worker pulls itself with its own exact difference; only what it
        # sends is compressed.
        alpha = self.hyper.moving_rate
        workers = jax.tree.map(lambda x, u, d: x + u - alpha * d, start, updates, distance)
      if not in_rounds:
        return workers, center, center_opt, left, ()
      reset = self._reset(center, workers, count)
      healed, healed_state = quorum.heal(workers, reset, inner_state, tick, count)
      next_held = quorum.hold(sent, tick, count) if held is not None else None
      return healed, center, center_opt, left, (healed_state, next_held)

    is_exchange = self.exchanges_after(state.step)
    workers, center, center_opt, residual, extra = lax.cond(is_exchange, with_exchange, local_only)
    worker_opt = {"inner": inner_state}
    if in_rounds:
      worker_opt["inner"], held = extra
      if held is not None:
        worker_opt["held"] = held
    if residual is not None:
      worker_opt["residual"] = residual
    new_state = state.replace(
      step=state.step + 1,
      workers=workers,
      center=center,
      center_opt=center_opt,
      worker_opt=worker_opt,
      worker_steps=state.worker_steps + 1,
    )
    learning_rate = self.learning_rate(state.worker_steps)
    return new_state, step_metrics(loss, aux, self.hyper, learning_rate)

  def worker_params(self, state):
    return state.workers


class SyncEASGD(CenterRule):
  """Synchronous elastic averaging SGD (Zhang, Choromanska, LeCun, NIPS 2015;
  You, Buluc, Demmel, SC17): the family with the elastic pull and outer SGD at
  eta_o = P*alpha. With d_i = x_i - x~ at step t, on every tau-th step
      x_i <- x_i + u_i - alpha*d_i
      x~  <- x~ + alpha * sum_i Q(d_i)      (= (1-beta)*x~ + beta*mean_i x_i, float32)
  and otherwise x_i <- x_i + u_i. With tau = 1 and inner SGD this is the
  paper's synchronous EASGD (its equations 5-6). The sum is one all-reduce.
  """

  name = "sync_easgd"
  elastic = True
  pulls = (Pull.ELASTIC,)
  missed = rounds.MISSED
  reads = (*BASE_READS, *ELASTIC_READS, exchange.ERROR_FEEDBACK.path, *rounds.READS)

  def outer_settings(self):
    return None


class SyncMEASGD(SyncEASGD):
  """Synchronous momentum EASGD: Sync EASGD whose inner SGD has momentum mu.
  Classic (MEASGD, You, Buluc, Demmel, SC17), with optax's trace m_i:
      m_i <- mu*m_i + g_i(x_i);  u_i = -eta_t*m_i
  Nesterov (EAMSGD, Zhang, Choromanska, LeCun, NIPS 2015, Algorithm 2), with
  the paper's velocity v_i and the gradient at the look-ahead point:
      v_i <- mu*v_i - eta_t*g_i(x_i + mu*v_i);  u_i = v_i
  and in both x_i <- x_i + u_i [- alpha*(x_i - x~) on exchange steps]. At
  v_i = 0 (the first step) EAMSGD's step is EASGD's, bit for bit.
  """

  name = "sync_measgd"
  momentum = Momentum.REQUIRED
  look_ahead = True
  defaults = MOMENTUM_DEFAULTS
  inner_optimizers = ("sgd",)
  inner_reason = "it is defined by its momentum SGD"


class DiLoCo(CenterRule):
  """DiLoCo (Douillard et al. 2023, "DiLoCo: Distributed Low-Communication Training
  of Language Models"): tau inner steps (AdamW in the paper), then outer SGD with
  Nesterov momentum on the pseudo-gradient (eta_o = 0.7, mu_o = 0.9), and every
  worker reset to the new center:
      Delta = -mean_i Q(x_i - x~);  m <- mu_o*m + Delta;
      x~ <- x~ - eta_o*(Delta + mu_o*m);  x_i <- x~
  The family's general member: `outer.pull=elastic` pulls with alpha instead.
  """

  name = "diloco"
  pulls = (Pull.RESET, Pull.ELASTIC)
  missed = rounds.MISSED
  reads = (
    *BASE_READS,
    *ELASTIC_READS,
    *OUTER_READS,
    PULL.path,
    exchange.ERROR_FEEDBACK.path,
    *rounds.READS,
  )


class LocalSGD(CenterRule):
  """Local SGD, periodic model averaging (Stich 2019; Lin et al. 2020): tau local
  steps, then x~ <- x~ + 1*mean_i Q(x_i - x~) = mean_i x_i (float32) and x_i <- x~."""

  name = "local_sgd"
  pulls = (Pull.RESET,)
  missed = rounds.MISSED
  reads = (
    *BASE_READS,
    COMM_PERIOD.path,
    model_state.BATCH_STATS.path,
    exchange.ERROR_FEEDBACK.path,
    *rounds.READS,
  )

  def outer_settings(self):
    return "sgd", 1.0, 0.0, False


class Lookahead(CenterRule):
  """Lookahead (Zhang, Lucas, Hinton, Ba 2019): fast weights take k = tau inner steps,
  then the slow weights move x~ <- x~ + alpha_LA*(mean_i x_i - x~) (outer SGD at
  eta_o = alpha_LA = outer.learning_rate, no momentum) and the fast weights are
  reset to them. With P = 1 this is the paper's optimizer; with P > 1 the fast
  weights are averaged first."""

  name = "lookahead"
  pulls = (Pull.RESET,)
  missed = rounds.MISSED
  reads = (
    *BASE_READS,
    COMM_PERIOD.path,
    model_state.BATCH_STATS.path,
    OUTER_LEARNING_RATE.path,
    exchange.ERROR_FEEDBACK.path,
    *rounds.READS,
  )

  def outer_settings(self):
    return "sgd", self.hyper.outer_learning_rate, 0.0, False
