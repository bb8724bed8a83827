"""What the pipeline asks of the config across fields: one value a model in each
per-model tuple, seeds that stay in range, and whole models moved, never
compressed messages.

Each field's own type and range is checked before (easgd.config.fields).
"""

import ml_collections

from easgd.errors import require
from easgd.pipeline.programs import PER_MODEL_FIELDS
from easgd.rules.async_local import ASYNC_LOCAL_OFF
from easgd.rules.streaming import STREAMING_OFF


def check(config: ml_collections.ConfigDict) -> None:
  """Raises ConfigError for the first value across fields the pipeline does not accept."""
  pipeline = config.pipeline
  models = pipeline.models
  for field in PER_MODEL_FIELDS:
    values = pipeline.per_model[field]
    require(
      len(values) in (0, models),
      f"pipeline.per_model.{field}",
      values,
      f"must be () or a tuple of config.pipeline.models={models} values",
    )
  require(
    bool(pipeline.per_model.seed) or config.seed + models <= 2**32,
    "seed",
    config.seed,
    f"model m's seed is seed + m: must be < 2**32 - {models - 1} for {models} models "
    "(or give pipeline.per_model.seed)",
  )
  momenta = pipeline.per_model.momentum
  require(
    config.optimizer.name != "adamw" or not any(momenta),
    "pipeline.per_model.momentum",
    momenta,
    "adamw has no momentum of SGD's (each model's first moment is pipeline.per_model.b1)",
  )
  require(
    config.outer.exchange_dtype == "float32",
    "outer.exchange_dtype",
    config.outer.exchange_dtype,
    "valid for pipeline: float32 (its models move whole; nothing is exchanged)",
  )
  # The exchange fields of the rules, each with why the pipeline has no use for it.
  unused = [(STREAMING_OFF, "exchanges nothing to stream")]
  unused.append((ASYNC_LOCAL_OFF, "has no master and no local steps between pushes"))
  for fields, why in unused:
    for field, off in fields.items():
      require(
        config.outer[field] == off,
        f"outer.{field}",
        config.outer[field],
        f"the pipeline {why} (leave it {off!r})",
      )
