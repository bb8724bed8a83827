"""Checks of the optimizer and outer groups: the inner optimizer, its schedule, the
center family's outer optimizer and pull, and the exchange dtype.

Each failure is one ConfigError line naming the field and what is allowed
(easgd.config.validation runs these with the other checks).
"""

import math

import ml_collections

from easgd.errors import ConfigError
from easgd.rules import RULES, Momentum, exchange, optimizers
from easgd.rules.base import Pull

PULLS = ("", *Pull)


def require(ok: bool, field: str, value, allowed: str) -> None:
  if not ok:
    raise ConfigError(f"config.{field}={value!r} is invalid: {allowed}")


def is_int(value) -> bool:
  return isinstance(value, int) and not isinstance(value, bool)


def is_number(value) -> bool:
  return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _validate_sgd_group(group, prefix: str, name_field: str, names: tuple[str, ...]) -> None:
  """An optimizer's name, learning rate, momentum and Nesterov flag (the inner and outer)."""
  require(
    group[name_field] in names,
    f"{prefix}.{name_field}",
    group[name_field],
    f"valid: {', '.join(names)}",
  )
  require(
    is_number(group.learning_rate) and group.learning_rate > 0,
    f"{prefix}.learning_rate",
    group.learning_rate,
    "must be a finite number > 0",
  )
  require(
    is_number(group.momentum) and 0 <= group.momentum < 1,
    f"{prefix}.momentum",
    group.momentum,
    "must be in [0, 1)",
  )
  require(isinstance(group.nesterov, bool), f"{prefix}.nesterov", group.nesterov, "True or False")


def _require_momentum_for_nesterov(nesterov: bool, momenta, prefix: str) -> None:
  """SGD's Nesterov flag needs a momentum to act on (each model's, for the pipeline)."""
  require(
    not nesterov or all(m > 0 for m in momenta),
    f"{prefix}.nesterov",
    nesterov,
    f"Nesterov needs a momentum: {prefix}.momentum in (0, 1), or {prefix}.nesterov=False",
  )


def _require_no_sgd_momentum(group, prefix: str, allowed: str) -> None:
  """An Adam-family optimizer: SGD's momentum and Nesterov flag must be off."""
  for field in ("momentum", "nesterov"):
    require(not group[field], f"{prefix}.{field}", group[field], allowed)


def validate_optimizer(config: ml_collections.ConfigDict) -> None:
  """The inner optimizer and its schedule, for any algorithm."""
  optimizer, total = config.optimizer, config.run.total_steps
  _validate_sgd_group(optimizer, "optimizer", "name", optimizers.INNER)
  require(
    is_number(optimizer.weight_decay) and optimizer.weight_decay >= 0,
    "optimizer.weight_decay",
    optimizer.weight_decay,
    "must be a finite number >= 0",
  )
  if optimizer.name == "adamw":
    _require_no_sgd_momentum(
      optimizer,
      "optimizer",
      "adamw has no momentum of SGD's (its first moment is optimizer.b1); "
      "set it to 0/False or use optimizer.name='sgd'",
    )
  per_model = config.pipeline.per_model.momentum if config.algorithm == "pipeline" else ()
  _require_momentum_for_nesterov(
    optimizer.nesterov, per_model or (optimizer.momentum,), "optimizer"
  )
  for field in ("b1", "b2"):
    value = optimizer[field]
    require(is_number(value) and 0 <= value < 1, f"optimizer.{field}", value, "must be in [0, 1)")
  require(
    is_number(optimizer.eps) and optimizer.eps > 0,
    "optimizer.eps",
    optimizer.eps,
    "must be a finite number > 0",
  )
  _validate_schedule(optimizer, total)


def _validate_schedule(optimizer: ml_collections.ConfigDict, total) -> None:
  schedule, warmup = optimizer.schedule, optimizer.warmup_steps
  require(
    schedule in optimizers.SCHEDULES,
    "optimizer.schedule",
    schedule,
    f"valid: {', '.join(optimizers.SCHEDULES)}",
  )
  require(
    is_int(warmup) and warmup >= 0, "optimizer.warmup_steps", warmup, "must be an integer >= 0"
  )
  if schedule == "constant":
    require(
      warmup == 0,
      "optimizer.warmup_steps",
      warmup,
      "the constant schedule has no warm-up (0); use warmup_cosine or warmup_step",
    )
  elif is_int(total):
    require(
      warmup < total,
      "optimizer.warmup_steps",
      warmup,
      f"the warm-up must end before the run does: < run.total_steps={total}",
    )
  boundaries = optimizer.boundaries
  require(
    isinstance(boundaries, (tuple, list))
    and len(boundaries) >= 1
    and all(is_number(b) and 0 < b < 1 for b in boundaries)
    and all(a < b for a, b in zip(boundaries, boundaries[1:], strict=False)),
    "optimizer.boundaries",
    boundaries,
    "must be increasing fractions of run.total_steps in (0, 1), e.g. (0.5, 0.75)",
  )
  if schedule == "warmup_step" and is_int(total):
    first = math.floor(boundaries[0] * total)
    require(
      first > warmup,
      "optimizer.boundaries",
      boundaries,
      f"the first decay (step {first} of run.total_steps={total}) must come after the "
      f"warm-up's {warmup} steps",
    )
  factor = optimizer.decay_factor
  require(
    is_number(factor) and 0 < factor <= 1,
    "optimizer.decay_factor",
    factor,
    "must be in (0, 1] (the learning rate is multiplied by it at each boundary)",
  )


def pull_in_force(config: ml_collections.ConfigDict) -> str | None:
  """The pull of the configured rule, or None for one without a center to pull to."""
  rule = RULES.get(config.algorithm)
  if rule is None or not rule.pulls:
    return None
  return config.outer.pull or rule.pulls[0]


def validate_outer_optimizer(config: ml_collections.ConfigDict) -> None:
  """The center family's outer optimizer and pull, and the exchange dtype."""
  outer = config.outer
  rule = RULES.get(config.algorithm)
  reads = rule.reads if rule is not None else ()
  # A known name whoever reads it; a rule that does not read it has its own.
  require(
    outer.optimizer in optimizers.OUTER,
    "outer.optimizer",
    outer.optimizer,
    f"valid: {', '.join(optimizers.OUTER)}",
  )
  if rule is not None and "outer.optimizer" not in reads:
    takes = ", ".join(n for n, r in RULES.items() if "outer.optimizer" in r.reads)
    require(
      outer.optimizer == "sgd",
      "outer.optimizer",
      outer.optimizer,
      f"{rule.name} has no choice of outer optimizer (only sgd); rules with one: {takes}",
    )
  # Its values in range whoever reads them: a typo is caught before it matters.
  _validate_sgd_group(outer, "outer", "optimizer", optimizers.OUTER)
  if "outer.optimizer" in reads:
    if outer.optimizer == "sgd":
      _require_momentum_for_nesterov(outer.nesterov, (outer.momentum,), "outer")
    if outer.optimizer == "adam":
      _require_no_sgd_momentum(
        outer,
        "outer",
        "the adam outer optimizer has moments of its own: set outer.momentum=0 and "
        "outer.nesterov=False",
      )
  require(
    outer.pull in PULLS, "outer.pull", outer.pull, "valid: '' (the rule's own), elastic, reset"
  )
  if rule is not None and outer.pull:
    takes = [name for name, r in RULES.items() if outer.pull in r.pulls]
    own = (
      f"{rule.name} pulls {' or '.join(rule.pulls)}" if rule.pulls else f"{rule.name} has no pull"
    )
    require(
      outer.pull in rule.pulls,
      "outer.pull",
      outer.pull,
      f"{own}; rules that take {outer.pull}: {', '.join(takes)}",
    )
  dtypes = exchange.DTYPES if rule is not None else ("float32",)
  require(
    outer.exchange_dtype in dtypes,
    "outer.exchange_dtype",
    outer.exchange_dtype,
    f"valid for {config.algorithm}: {', '.join(dtypes)}"
    + ("" if rule is not None else " (its models move whole; nothing is exchanged)"),
  )


def validate_rule_optimizer(config: ml_collections.ConfigDict) -> None:
  """What the chosen rule's declarations ask of the inner optimizer."""
  rule = RULES[config.algorithm]
  optimizer = config.optimizer
  takes = ", ".join(n for n, r in RULES.items() if optimizer.name in r.inner_optimizers)
  require(
    optimizer.name in rule.inner_optimizers,
    "optimizer.name",
    optimizer.name,
    f"{rule.name} takes {', '.join(rule.inner_optimizers)} ({rule.inner_reason}); "
    f"rules that take {optimizer.name}: {takes}",
  )
  momentum = optimizer.momentum
  if rule.momentum == Momentum.REQUIRED:
    require(
      optimizer.name == "sgd",
      "optimizer.name",
      optimizer.name,
      f"{rule.name} is defined by its momentum SGD: use sgd with optimizer.momentum in (0, 1)",
    )
    require(
      0 < momentum < 1, "optimizer.momentum", momentum, f"{rule.name} needs a momentum in (0, 1)"
    )
  elif rule.momentum == Momentum.NONE:
    with_momentum = ", ".join(n for n, r in RULES.items() if r.momentum != Momentum.NONE)
    require(
      momentum == 0,
      "optimizer.momentum",
      momentum,
      f"{rule.name} takes no momentum (momentum 0); rules with momentum: {with_momentum}",
    )
  with_nesterov = ", ".join(n for n, r in RULES.items() if r.nesterov)
  require(
    not optimizer.nesterov or rule.nesterov,
    "optimizer.nesterov",
    optimizer.nesterov,
    f"{rule.name} has no Nesterov form; rules with one: {with_nesterov}",
  )
