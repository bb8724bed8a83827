"""The optimizers of a rule: the workers' inner optimizer with its learning-rate
schedule, and the outer optimizer that moves the center (optax, both); and the
workers' local step with the inner one (`local_update`) and its metrics, the
steps the rules share.

Inner (`config.optimizer.*`), the workers' local step:
  sgd:    u = -eta_t * g'           g' = g + lambda*x (L2, coupled: optax's SGD convention)
          with momentum mu (optax's trace m <- mu*m + g'):
            classic   u = -eta_t * m
            Nesterov  u = -eta_t * (g' + mu*m)
          EAMSGD's look-ahead Nesterov (`look_ahead_sgd`, the MEASGD rules'), a step
          from the look-ahead point y = x + mu*v:
            g' = g(y) + lambda*y;  u = -eta_t*g';  v <- mu*v + u;  x <- y + u
  adamw:  optax.adamw: Adam's moments of g (b1, b2, eps), plus the decoupled
          decay lambda*x, both scaled by -eta_t (Loshchilov & Hutter 2019).

eta_t follows the schedule (`config.optimizer.schedule`) over T = run.total_steps:
  constant:       eta_t = eta
  warmup_cosine:  eta_t rises linearly from 0 over the first warmup_steps, then
                  follows a half cosine from eta down to 0 at step T
  warmup_step:    the same warm-up, then eta, multiplied by decay_factor at each
                  boundary b*T (boundaries are fractions of the run)
t is the worker's own count of local steps (optax's count in its state), not
the tick: a worker's schedule is where that worker's training is. Under the
synchronous rules every worker steps every tick, so t is the step; under the
parameter-server rules a slow worker takes fewer local steps and its
learning rate lags the fast ones' (it is still warming up, or decaying
later), exactly as if each worker ran its own optimizer, as they do.

Outer (`config.outer.*`), at an exchange of the center family
(easgd.rules.outer): optax SGD with learning rate eta_o and optional
(Nesterov) momentum, or Adam, applied to the pseudo-gradient
Delta = mean_i (x~ - x_i) as if it were a gradient. async_local_sgd's master
applies each worker's pseudo-gradient with `delayed_nesterov`.
"""

import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
import optax

from easgd.declare import FLAG, REQUIRED, Allowed, Field, Shapes, integer, number, one_of
from easgd.errors import is_number
from easgd.rules import model_state
from easgd.rules.spmd import map_workers, sum_over_workers
from easgd.rules.state import Batch, LossFn, Metrics, Params

INNER = ("sgd", "adamw")
OUTER = ("sgd", "adam")
SCHEDULES = ("constant", "warmup_cosine", "warmup_step")


def _increasing_fractions(value) -> bool:
  return (
    isinstance(value, (tuple, list))
    and len(value) >= 1
    and all(is_number(b) and 0 < b < 1 for b in value)
    and all(a < b for a, b in zip(value, value[1:], strict=False))
  )


# The inner optimizer and its schedule: config.optimizer.*.
NAME = Field(
  "optimizer.name",
  "sgd",
  one_of(INNER),
  "the workers' inner optimizer (optax): sgd or adamw",
  Shapes.IF_READ,
  setting="optimizer",
)
LEARNING_RATE = Field(
  "optimizer.learning_rate",
  0.1,
  number(0, low_open=True),
  "eta; the peak under a schedule",
  Shapes.IF_READ,
  formerly=("learning_rate",),
  setting="learning_rate",
  off=REQUIRED,
  mid_run=True,
)
MOMENTUM = Field(
  "optimizer.momentum",
  0.0,
  number(0, 1),
  "sgd's mu: 0 for adamw; required (in (0, 1)) by the rules defined by their momentum "
  "(docs/algorithms.md; async_msgd's is its master's)",
  Shapes.IF_READ,
  formerly=("momentum",),
  setting="momentum",
)
NESTEROV = Field(
  "optimizer.nesterov",
  False,
  FLAG,
  "sgd's momentum in Nesterov's form (docs/algorithms.md says whose)",
  Shapes.IF_READ,
  formerly=("nesterov",),
  setting="nesterov",
)
WEIGHT_DECAY = Field(
  "optimizer.weight_decay",
  0.0,
  number(0),
  "lambda: sgd adds lambda*x to every gradient (L2); adamw decays decoupled",
  Shapes.IF_READ,
  formerly=("weight_decay",),
  setting="weight_decay",
)
B1 = Field(
  "optimizer.b1",
  0.9,
  number(0, 1),
  "adamw's first moment's decay",
  Shapes.IF_READ,
  setting="b1",
)
B2 = Field(
  "optimizer.b2",
  0.999,
  number(0, 1),
  "adamw's second moment's decay",
  Shapes.IF_READ,
  setting="b2",
)
EPS = Field(
  "optimizer.eps",
  1e-8,
  number(0, low_open=True),
  "adamw's epsilon",
  Shapes.IF_READ,
  setting="eps",
)
SCHEDULE = Field(
  "optimizer.schedule",
  "constant",
  one_of(SCHEDULES),
  "constant; warmup_cosine (linear warm-up from 0, then a cosine to 0 at run.total_steps); "
  "warmup_step (warm-up, then x decay_factor at each boundary); over each worker's own "
  "local steps",
  Shapes.IF_READ,
  formerly=("schedule",),
  setting="schedule",
)
WARMUP_STEPS = Field(
  "optimizer.warmup_steps",
  0,
  integer(0),
  "the schedule's linear warm-up, in local steps",
  Shapes.IF_READ,
  formerly=("warmup_steps",),
  setting="warmup_steps",
)
BOUNDARIES = Field(
  "optimizer.boundaries",
  (0.5, 0.75),
  Allowed(
    _increasing_fractions,
    "must be increasing fractions of run.total_steps in (0, 1), e.g. (0.5, 0.75)",
  ),
  "warmup_step's decay points, fractions of run.total_steps",
  Shapes.IF_READ,
  setting="boundaries",
  convert=tuple,
)
DECAY_FACTOR = Field(
  "optimizer.decay_factor",
  0.1,
  number(
    0,
    1,
    low_open=True,
    high_open=False,
    note="the learning rate is multiplied by it at each boundary",
  ),
  "warmup_step's factor at each boundary",
  Shapes.IF_READ,
  setting="decay_factor",
)
FIELDS = (
  NAME,
  LEARNING_RATE,
  MOMENTUM,
  NESTEROV,
  WEIGHT_DECAY,
  B1,
  B2,
  EPS,
  SCHEDULE,
  WARMUP_STEPS,
  BOUNDARIES,
  DECAY_FACTOR,
)
# The schedule's horizon T: the run's length, in local steps.
TOTAL_STEPS = Field(
  "run.total_steps",
  600,
  integer(1),
  "steps (ticks) of the run; a schedule other than constant spans them",
  Shapes.IF_READ,
  formerly=("total_steps",),
  setting="total_steps",
  off=0,
)


# The optimizer group's fields that an optimizer or a schedule does not read.
_UNREAD_BY = {
  "sgd": ("b1", "b2", "eps"),
  "adamw": ("momentum", "nesterov"),
  "constant": ("warmup_steps", "boundaries", "decay_factor"),
  "warmup_cosine": ("boundaries", "decay_factor"),
  "warmup_step": (),
}


def unread_fields(name: str, schedule_name: str) -> tuple[str, ...]:
  """The `optimizer.*` fields (without the group) that optimizer `name` under schedule
  `schedule_name` does not read: they do not shape a run that uses them."""
  return _UNREAD_BY.get(name, ()) + _UNREAD_BY.get(schedule_name, ())


def schedule(hyper) -> optax.Schedule | float:
  """The learning rate of the inner optimizer: a float for `constant` (optax then keeps
  no count), else an optax schedule of the local step count."""
  eta, warmup, total = hyper.learning_rate, hyper.warmup_steps, hyper.total_steps
  if hyper.schedule == "constant":
    return eta
  if hyper.schedule == "warmup_cosine":
    return optax.warmup_cosine_decay_schedule(0.0, eta, warmup, max(total, warmup + 1), 0.0)
  if hyper.schedule == "warmup_step":
    decays = {}
    for boundary in hyper.boundaries:
      # Counted from the end of the warm-up (validation keeps them after it);
      # two fractions on one step multiply their factors.
      step = math.floor(boundary * total) - warmup
      decays[step] = decays.get(step, 1.0) * hyper.decay_factor
    stepped = optax.piecewise_constant_schedule(eta, decays)
    if not warmup:
      return stepped
    return optax.join_schedules([optax.linear_schedule(0.0, eta, warmup), stepped], [warmup])
  raise ValueError(f"unknown schedule {hyper.schedule!r}; valid: {', '.join(SCHEDULES)}")


def learning_rate_at(hyper, count):
  """eta_t at local step count `count` (an array of counts gives an array)."""
  rate = schedule(hyper)
  if callable(rate):
    return rate(count)
  return jnp.full(jnp.shape(count), rate, jnp.float32)


def inner(hyper) -> optax.GradientTransformation:
  """The workers' local optimizer, on the trainable parameters of one worker."""
  rate = schedule(hyper)
  if hyper.optimizer == "adamw":
    return optax.adamw(
      rate, b1=hyper.b1, b2=hyper.b2, eps=hyper.eps, weight_decay=hyper.weight_decay
    )
  if hyper.optimizer != "sgd":
    raise ValueError(f"unknown optimizer {hyper.optimizer!r}; valid: {', '.join(INNER)}")
  return _with_l2(hyper, optax.sgd(rate, momentum=hyper.momentum or None, nesterov=hyper.nesterov))


def _with_l2(hyper, sgd: optax.GradientTransformation) -> optax.GradientTransformation:
  """`sgd` on g + lambda*x (coupled L2: optax's SGD convention)."""
  if not hyper.weight_decay:
    # Left out rather than added as 0*x: the bits of plain SGD are those of -eta*g.
    return sgd
  return optax.chain(optax.add_decayed_weights(hyper.weight_decay), sgd)


class VelocityState(NamedTuple):
  """EAMSGD's velocity v (the paper's, in parameter units) and the local step count."""

  velocity: optax.Params
  count: jax.Array


def look_ahead_sgd(hyper) -> optax.GradientTransformation:
  """Nesterov momentum in EAMSGD's form (Zhang, Choromanska, LeCun 2015, Algorithm 2),
  whose gradient is taken at the look-ahead point y = x + mu*v (`look_ahead_shift`):
      g' = g(y) + lambda*y;   u = -eta_t*g';   v <- mu*v + u;   x <- y + u  (= x + v)
  Its update u is the step from y, not from x: the rule adds it to y. The L2
  term is part of the objective, so the caller passes y as the params and its
  gradient is taken at y too. At v = 0, y = x and u = -eta_t*g' is plain SGD's
  update in the same floating-point operations, so the first step is plain
  SGD's, bit for bit.
  """
  rate = schedule(hyper)

  def init(params):
    return VelocityState(jax.tree.map(jnp.zeros_like, params), jnp.zeros((), jnp.int32))

  def update(grads, state, params=None):
    del params
    eta = rate(state.count) if callable(rate) else rate
    # As optax scales by the learning rate: the bits of plain SGD's update.
    updates = jax.tree.map(lambda g: jnp.asarray(-eta, g.dtype) * g, grads)
    velocity = jax.tree.map(lambda v, u: hyper.momentum * v + u, state.velocity, updates)
    return updates, VelocityState(velocity, optax.safe_increment(state.count))

  return _with_l2(hyper, optax.GradientTransformation(init, update))


def look_ahead_shift(hyper, state):
  """mu*v: how far `look_ahead_sgd`'s look-ahead point is ahead of x (one worker's or stacked)."""
  velocity = optax.tree_utils.tree_get(state, "velocity")
  return jax.tree.map(lambda v: hyper.momentum * v, velocity)


def init_workers(optimizer: optax.GradientTransformation, workers):
  """The inner optimizer's state for each worker of a stacked tree."""
  return jax.vmap(optimizer.init)(model_state.trainable(workers))


def outer(
  name: str, learning_rate: float, momentum: float, nesterov: bool
) -> optax.GradientTransformation:
  """The center's optimizer on the pseudo-gradient: SGD with (Nesterov) momentum if
  mu_o > 0, or Adam (optax's defaults) at eta_o."""
  if name == "adam":
    return optax.adam(learning_rate)
  if name != "sgd":
    raise ValueError(f"unknown outer optimizer {name!r}; valid: {', '.join(OUTER)}")
  return optax.sgd(learning_rate, momentum=momentum or None, nesterov=nesterov)


class DelayedNesterovState(NamedTuple):
  """Delayed Nesterov's momentum m, its buffer of pseudo-gradients since m last
  moved, and the count of pseudo-gradients applied."""

  momentum: optax.Params
  buffer: optax.Params
  count: jax.Array


def delayed_nesterov(
  learning_rate: float, momentum: float, period: int, activation: float
) -> optax.GradientTransformation:
  """Delayed Nesterov (DN; Liu et al. 2024, "Asynchronous Local-SGD Training for
  Language Modeling", Algorithm 3): a master's outer optimizer that moves its
  momentum only every N = `period` pseudo-gradients g_t and applies each g_t
  alone in between. With eta_o = `learning_rate`, beta = `momentum` and the
  momentum activation c = `activation` in [0, 1/N], at the t-th g_t (t from 1):
      t mod N == 0:  m <- beta*m + (B + g_t)/N;  B <- 0
                     u = -eta_o*((1 - c*N + c)*beta*m + g_t/N)
      otherwise:     B <- B + g_t
                     u = -eta_o*(c*beta*m + g_t/N)
  Over N pseudo-gradients the momentum is applied once in all ((N - 1)*c + 1 -
  c*N + c = 1); with c = 0 the N updates add up to one Nesterov step on their
  mean. With N = 1 every push moves the momentum and c has no effect: it is
  optax's Nesterov SGD, m <- g + beta*m, u = -eta_o*(g + beta*m), in the same
  floating-point operations.
  """

  beta = momentum

  def init(params):
    zeros = jax.tree.map(jnp.zeros_like, params)
    return DelayedNesterovState(zeros, zeros, jnp.zeros((), jnp.int32))

  def update(grads, state, params=None):
    del params
    count = optax.safe_increment(state.count)
    moves = count % period == 0
    # The momentum's share of this step: 1 - c*N + c when it moves, c otherwise.
    share = jnp.where(moves, 1.0 - activation * period + activation, activation)
    moved = jax.tree.map(
      lambda m, b, g: jnp.where(moves, (b + g) / period + beta * m, m),
      state.momentum,
      state.buffer,
      grads,
    )
    buffer = jax.tree.map(
      lambda b, g: jnp.where(moves, jnp.zeros_like(b), b + g), state.buffer, grads
    )
    updates = jax.tree.map(
      lambda g, m: -learning_rate * (g / period + share * beta * m), grads, moved
    )
    return updates, DelayedNesterovState(moved, buffer, count)

  return optax.GradientTransformation(init, update)


def step_metrics(
  loss: jax.Array,
  aux: dict[str, jax.Array],
  hyper,
  learning_rate: jax.Array,
) -> Metrics:
  """Mean over all workers of each worker's loss, accuracy and learning rate in force."""
  values = {"loss": loss, "accuracy": aux["accuracy"], "learning_rate": learning_rate}
  totals = sum_over_workers(values, hyper.deterministic_sums)
  return {tag: total / hyper.num_workers for tag, total in totals.items()}


def decayed(hyper, grads: Params, at: Params) -> Params:
  """g + lambda*x on the parameters (L2 weight decay); BatchNorm statistics untouched."""
  if not hyper.weight_decay:
    return grads
  params = jax.tree.map(
    lambda g, x: g + hyper.weight_decay * x, model_state.trainable(grads), model_state.trainable(at)
  )
  return model_state.with_trainable(grads, params)


def shifted(tree: Params, shift: Params | None) -> Params:
  """`tree` with `shift` added to its parameters (`Rule.look_ahead_shift`; None: `tree`)."""
  if shift is None:
    return tree
  params = jax.tree.map(jnp.add, model_state.trainable(tree), shift)
  return model_state.with_trainable(tree, params)


def local_update(
  inner: optax.GradientTransformation,
  workers: Params,
  inner_state,
  batch: Batch,
  loss_fn: LossFn,
  at: Params | None = None,
):
  """The local step of the local workers with the inner optimizer.

  `at`: where the gradients are taken and whence the step goes, the workers
  themselves if None (EAMSGD's look-ahead point otherwise: `shifted`). The
  optimizer sees it as the parameters, so an L2 term is taken there too, and
  the loss and accuracy are those of its forward pass.

  Returns (u_i, new inner state, g_i, loss_i, aux_i): u_i is the optimizer's
  update of the parameters, to be added to `at`, with the BatchNorm
  statistics' part set to s'_i - s_i; g_i the raw gradient.
  """
  at = workers if at is None else at
  (loss, aux), grads = map_workers(jax.value_and_grad(loss_fn, has_aux=True), at, batch)
  updates, inner_state = jax.vmap(inner.update)(
    model_state.trainable(grads), inner_state, model_state.trainable(at)
  )
  updates = model_state.stats_step(model_state.with_trainable(grads, updates), workers, aux)
  return updates, inner_state, grads, loss, aux
