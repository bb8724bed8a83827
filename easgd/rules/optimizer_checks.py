"""Checks across the fields of the inner optimizer group, whatever the algorithm: its
momentum and Nesterov flag, and its schedule against the run's length.

Each field's own range is declared with it (easgd.rules.optimizers); what a rule
asks of them is the rule's (easgd.rules.checks). Each failure is one
ConfigError line naming the field and what is allowed (easgd.config.validation
runs these with the other checks).
"""

import math

import ml_collections

from easgd.errors import require
from easgd.rules import optimizers


def require_momentum_for_nesterov(nesterov: bool, momenta, prefix: str) -> None:
  """SGD's Nesterov flag needs a momentum to act on (each model's, for the pipeline)."""
  require(
    not nesterov or all(m > 0 for m in momenta),
    f"{prefix}.nesterov",
    nesterov,
    f"Nesterov needs a momentum: {prefix}.momentum in (0, 1), or {prefix}.nesterov=False",
  )


def require_no_sgd_momentum(group, prefix: str, allowed: str) -> None:
  """An Adam-family optimizer: SGD's momentum and Nesterov flag must be off."""
  for field in ("momentum", "nesterov"):
    require(not group[field], f"{prefix}.{field}", group[field], allowed)


def check(config: ml_collections.ConfigDict, momenta: tuple[float, ...]) -> None:
  """The inner optimizer and its schedule, across their fields, for any algorithm;
  `momenta`: the SGD momenta it trains with (`Algorithm.momenta`)."""
  optimizer = config.optimizer
  if optimizer.name == "adamw":
    require_no_sgd_momentum(
      optimizer,
      "optimizer",
      "adamw has no momentum of SGD's (its first moment is optimizer.b1); "
      "set it to 0/False or use optimizer.name='sgd'",
    )
  require_momentum_for_nesterov(optimizer.nesterov, momenta, "optimizer")
  _validate_schedule(optimizer, config.run.total_steps)


def _validate_schedule(optimizer: ml_collections.ConfigDict, total: int) -> None:
  schedule, warmup, boundaries = optimizer.schedule, optimizer.warmup_steps, optimizer.boundaries
  if schedule == "constant":
    require(
      warmup == 0,
      optimizers.WARMUP_STEPS,
      warmup,
      "the constant schedule has no warm-up (0); use warmup_cosine or warmup_step",
    )
  else:
    require(
      warmup < total,
      optimizers.WARMUP_STEPS,
      warmup,
      f"the warm-up must end before the run does: < run.total_steps={total}",
    )
  if schedule == "warmup_step":
    first = math.floor(boundaries[0] * total)
    require(
      first > warmup,
      optimizers.BOUNDARIES,
      boundaries,
      f"the first decay (step {first} of run.total_steps={total}) must come after the "
      f"warm-up's {warmup} steps",
    )
