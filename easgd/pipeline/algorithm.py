"""The pipeline's entry in the registry of algorithms (easgd.registry): what it reads,
what it has no use for, and what it asks of the config across fields (one
value a model in each per-model tuple, seeds that stay in range, whole models
moved, never compressed messages).

Each field's own type and range is checked before (easgd.config.fields).
"""

import ml_collections

from easgd.algorithm import Algorithm
from easgd.errors import require
from easgd.pipeline.programs import PER_MODEL_FIELDS
from easgd.rules.async_local import ASYNC_LOCAL_OFF
from easgd.rules.streaming import STREAMING_OFF

# The config fields the pipeline's trajectory depends on, beyond the common
# ones (easgd.config.hyperparameters): its SGD and its own group; and the device
# count, since the data has one partition a device and the models move along a
# ring of devices. It has no workers and no simulated cluster.
READS = ("optimizer", "pipeline.models", "pipeline.stage_steps", "pipeline.per_model")
LAYOUT_READS = ("run.devices",)
IGNORED_GROUPS = ("workers", "cluster")


def momenta(config: ml_collections.ConfigDict) -> tuple[float, ...]:
  """Each model's SGD momentum (one shared by all where none is given per model)."""
  return tuple(config.pipeline.per_model.momentum) or (config.optimizer.momentum,)


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


PIPELINE = Algorithm(
  name="pipeline",
  reads=(*READS, *LAYOUT_READS),
  units="pipeline.models",
  partition_owner="device",
  check=check,
  ignored_groups=IGNORED_GROUPS,
  momenta=momenta,
  planned=False,
)
