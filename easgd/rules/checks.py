"""What a rule asks of the config across fields, from its class's declarations.

Each field's own type and range is checked before (easgd.config.fields);
these checks span fields and depend on the rule chosen: its optimizer's
momentum and Nesterov form, its pull and elastic moving rate, its outer
optimizer, its BatchNorm statistics, the simulated cluster's stragglers among
its workers, and no per-model values (the pipeline's alone). A refusal is one
ConfigError line naming the field, what is allowed, and the rules that would
take the value. `check` is the rules' `Algorithm.check` (easgd.registry).
"""

import ml_collections

from easgd.errors import require
from easgd.models import BATCH_NORM_MODELS
from easgd.rules import model_state, optimizer_checks, optimizers
from easgd.rules.async_local import MOMENTUM_ACTIVATION, MOMENTUM_PERIOD
from easgd.rules.base import DEFAULT_BETA, MOVING_RATE, Momentum, Pull, Rule
from easgd.rules.exchange import ERROR_FEEDBACK, EXCHANGE_DTYPE
from easgd.rules.outer import OUTER_NESTEROV, OUTER_OPTIMIZER, PULL
from easgd.rules.registry import RULES
from easgd.rules.streaming import FRAGMENTS, SYNC_DELAY
from easgd.sim import rounds, timing


def check(config: ml_collections.ConfigDict) -> None:
  """Raises ConfigError for the first value across fields that config.algorithm's rule
  does not accept."""
  rule = RULES[config.algorithm]
  _check_outer_optimizer(rule, config.outer)
  _check_inner_optimizer(rule, config.optimizer)
  _check_outer(rule, config)
  _check_exchange_dtype(rule, config.outer)
  _check_streaming(rule, config.outer)
  _check_async_local(rule, config.outer)
  _check_batch_stats(rule, config)
  timing.check_stragglers(config.cluster, config.workers)
  timing.check_groups(config.cluster, config.workers)
  if rule.missed:
    rounds.check(config, rule.missed, rule.missed_reason)
  _check_no_per_model(config.pipeline.per_model)
  rule.check_config(config)


def _pull_in_force(rule: type[Rule], outer: ml_collections.ConfigDict) -> str | None:
  """The rule's pull, or None for one without a center to pull to."""
  if not rule.pulls:
    return None
  return outer.pull or rule.pulls[0]


def _check_outer_optimizer(rule: type[Rule], outer: ml_collections.ConfigDict) -> None:
  """The center family's outer optimizer across its fields, where the rule reads it."""
  if OUTER_OPTIMIZER.path not in rule.reads:
    return
  if outer.optimizer == "sgd":
    optimizer_checks.require_momentum_for_nesterov(outer.nesterov, (outer.momentum,), "outer")
  if outer.optimizer == "adam":
    optimizer_checks.require_no_sgd_momentum(
      outer,
      "outer",
      "the adam outer optimizer has moments of its own: set outer.momentum=0 and "
      "outer.nesterov=False",
    )


def _check_inner_optimizer(rule: type[Rule], optimizer: ml_collections.ConfigDict) -> None:
  takes = ", ".join(n for n, r in RULES.items() if optimizer.name in r.inner_optimizers)
  require(
    optimizer.name in rule.inner_optimizers,
    optimizers.NAME,
    optimizer.name,
    f"{rule.name} takes {', '.join(rule.inner_optimizers)} ({rule.inner_reason}); "
    f"rules that take {optimizer.name}: {takes}",
  )
  momentum = optimizer.momentum
  if rule.momentum == Momentum.REQUIRED:
    require(
      optimizer.name == "sgd",
      optimizers.NAME,
      optimizer.name,
      f"{rule.name} is defined by its momentum SGD: use sgd with optimizer.momentum in (0, 1)",
    )
    require(
      0 < momentum < 1, optimizers.MOMENTUM, momentum, f"{rule.name} needs a momentum in (0, 1)"
    )
  elif rule.momentum == Momentum.NONE:
    with_momentum = ", ".join(n for n, r in RULES.items() if r.momentum != Momentum.NONE)
    require(
      momentum == 0,
      optimizers.MOMENTUM,
      momentum,
      f"{rule.name} takes no momentum (momentum 0); rules with momentum: {with_momentum}",
    )
  with_nesterov = ", ".join(n for n, r in RULES.items() if r.nesterov)
  require(
    not optimizer.nesterov or rule.nesterov,
    optimizers.NESTEROV,
    optimizer.nesterov,
    f"{rule.name} has no Nesterov form; rules with one: {with_nesterov}",
  )


def _check_outer(rule: type[Rule], config: ml_collections.ConfigDict) -> None:
  """Its outer optimizer, its pull, and the elastic pull's moving rate."""
  outer, workers = config.outer, config.workers
  if OUTER_OPTIMIZER.path not in rule.reads:
    takes = ", ".join(n for n, r in RULES.items() if OUTER_OPTIMIZER.path in r.reads)
    require(
      outer.optimizer == "sgd",
      OUTER_OPTIMIZER.path,
      outer.optimizer,
      f"{rule.name} has no choice of outer optimizer (only sgd); rules with one: {takes}",
    )
  if outer.pull:
    takes = [name for name, r in RULES.items() if outer.pull in r.pulls]
    own = (
      f"{rule.name} pulls {' or '.join(rule.pulls)}" if rule.pulls else f"{rule.name} has no pull"
    )
    require(
      outer.pull in rule.pulls,
      PULL,
      outer.pull,
      f"{own}; rules that take {outer.pull}: {', '.join(takes)}",
    )
  pull = _pull_in_force(rule, outer)
  if pull == Pull.RESET:
    require(
      outer.moving_rate == 0,
      MOVING_RATE,
      outer.moving_rate,
      f"{config.algorithm}'s reset pull has no alpha (leave it 0); "
      "outer.pull=elastic pulls with it (diloco)",
    )
  if pull == Pull.ELASTIC:
    members = rule.pull_members(config)
    alpha = outer.moving_rate or DEFAULT_BETA / members
    pullers = "workers" if members == workers else "group size"
    require(
      members * alpha < 1,
      MOVING_RATE,
      alpha,
      f"beta = {pullers}*moving_rate = {members * alpha:g} must be < 1, "
      f"i.e. moving_rate < {1 / members:g}",
    )


def _check_exchange_dtype(rule: type[Rule], outer: ml_collections.ConfigDict) -> None:
  takes = ", ".join(n for n, r in RULES.items() if outer.exchange_dtype in r.exchange_dtypes)
  require(
    outer.exchange_dtype in rule.exchange_dtypes,
    EXCHANGE_DTYPE,
    outer.exchange_dtype,
    f"{rule.name} sends {', '.join(rule.exchange_dtypes)}; rules that send "
    f"{outer.exchange_dtype}: {takes}",
  )
  # A rule that does not read it has left it off (easgd.config.validation).
  compressed = [dtype for dtype in rule.exchange_dtypes if dtype != "float32"]
  require(
    not outer.error_feedback or outer.exchange_dtype != "float32",
    ERROR_FEEDBACK,
    outer.error_feedback,
    "float32 exchanges drop nothing to feed back: set outer.exchange_dtype to one that "
    f"compresses ({', '.join(compressed)}) or leave it False",
  )


def _check_streaming(rule: type[Rule], outer: ml_collections.ConfigDict) -> None:
  """The fragments and delay of a streaming rule against its period (another rule
  leaves them off: easgd.config.validation)."""
  if FRAGMENTS.path not in rule.reads:
    return
  period = outer.comm_period
  require(
    period % outer.fragments == 0,
    FRAGMENTS,
    outer.fragments,
    f"must divide outer.comm_period = {period}: one fragment is sent every comm_period/"
    "fragments steps",
  )
  require(
    outer.sync_delay < period,
    SYNC_DELAY,
    outer.sync_delay,
    f"must be below outer.comm_period = {period}: a fragment's result is applied before "
    "it is sent again",
  )


def _check_async_local(rule: type[Rule], outer: ml_collections.ConfigDict) -> None:
  """Delayed Nesterov's form and its N and c together, where the rule has that master
  (another rule leaves them off: easgd.config.validation)."""
  if MOMENTUM_PERIOD.path not in rule.reads:
    return
  require(
    outer.nesterov,
    OUTER_NESTEROV,
    outer.nesterov,
    f"{rule.name}'s master is Delayed Nesterov, in Nesterov's form (leave it True)",
  )
  period = outer.momentum_period
  require(
    outer.momentum_activation <= 1 / period,
    MOMENTUM_ACTIVATION,
    outer.momentum_activation,
    f"must be in [0, 1/outer.momentum_period] = [0, {1 / period:g}]: the momentum's "
    "shares over N pushes add up to one",
  )


def _check_batch_stats(rule: type[Rule], config: ml_collections.ConfigDict) -> None:
  require(
    config.model not in BATCH_NORM_MODELS or config.outer.batch_stats in rule.batch_stats,
    model_state.BATCH_STATS,
    config.outer.batch_stats,
    f"{rule.name} supports {', '.join(rule.batch_stats)} for {config.model}'s BatchNorm "
    "statistics (sync_sgd's workers share one model, so its statistics are averaged; "
    "'local' needs a rule whose workers have models of their own)",
  )


def _check_no_per_model(per_model: ml_collections.ConfigDict) -> None:
  # The pipeline's per-model fields, whatever they are: the rules cannot name them.
  for field, values in per_model.items():
    require(
      not values,
      f"pipeline.per_model.{field}",
      values,
      "only the pipeline has per-model values (())",
    )
