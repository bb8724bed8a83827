"""The pipeline's entry in the registry of algorithms (easgd.registry): what it reads,
what it has no use for, and what it asks of the config across fields (one
value a model in each per-model tuple, seeds that stay in range, whole models
moved, never compressed messages).

Each field's own type and range is checked before (easgd.config.fields).
"""

import ml_collections

from easgd.algorithm import Algorithm
from easgd.declare import Field, Shapes, integer, number, values
from easgd.errors import require
from easgd.infra import sharding
from easgd.pipeline.programs import PER_MODEL_FIELDS
from easgd.rules.exchange import EXCHANGE_DTYPE

# The config fields the pipeline's trajectory depends on, beyond the common
# ones (easgd.config.hyperparameters): its SGD and its own group; and the device
# count, since the data has one partition a device and the models move along a
# ring of devices. It has no workers and no simulated cluster.
_PER_MODEL = "a tuple of pipeline.models values, or () for the optimizer group's for every model"
# Its own group: how many models, how long on a partition, and each model's values.
FIELDS = (
  Field(
    "pipeline.models",
    4,
    integer(1),
    "M: models trained at once; the devices must divide it",
    Shapes.IF_READ,
    formerly=("models",),
  ),
  Field(
    "pipeline.stage_steps",
    25,
    integer(1, note="steps on one partition before the models move"),
    "steps on one partition before the models move",
    Shapes.IF_READ,
    formerly=("stage_steps",),
  ),
  Field(
    "pipeline.per_model.learning_rate",
    (),
    values(number(0, low_open=True), "> 0"),
    f"each model's learning rate: {_PER_MODEL}",
    Shapes.IF_READ,
    formerly=("per_model.learning_rate",),
  ),
  Field(
    "pipeline.per_model.momentum",
    (),
    values(number(0, 1), "in [0, 1)"),
    f"each model's momentum: {_PER_MODEL}",
    Shapes.IF_READ,
    formerly=("per_model.momentum",),
  ),
  Field(
    "pipeline.per_model.weight_decay",
    (),
    values(number(0), ">= 0"),
    f"each model's weight decay: {_PER_MODEL}",
    Shapes.IF_READ,
    formerly=("per_model.weight_decay",),
  ),
  Field(
    "pipeline.per_model.b1",
    (),
    values(number(0, 1), "in [0, 1)"),
    f"each model's adamw b1: {_PER_MODEL}",
    Shapes.IF_READ,
    formerly=("per_model.b1",),
  ),
  Field(
    "pipeline.per_model.b2",
    (),
    values(number(0, 1), "in [0, 1)"),
    f"each model's adamw b2: {_PER_MODEL}",
    Shapes.IF_READ,
    formerly=("per_model.b2",),
  ),
  Field(
    "pipeline.per_model.seed",
    (),
    values(integer(0, 2**32, words=""), "an integer in [0, 2**32)"),
    "each model's seed: a tuple of pipeline.models values, or () for seed + m",
    Shapes.IF_READ,
    formerly=("per_model.seed",),
  ),
)
MODELS, STAGE_STEPS = FIELDS[:2]
PER_MODEL = {field.name: field for field in FIELDS[2:]}
# The group of the per-model values (each model's own optimizer values and seed).
PER_MODEL_GROUP = FIELDS[2].path.rpartition(".")[0]
READS = ("optimizer", MODELS.path, STAGE_STEPS.path, PER_MODEL_GROUP)
LAYOUT_READS = (sharding.DEVICES.path,)
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
      PER_MODEL[field],
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
    PER_MODEL["momentum"],
    momenta,
    "adamw has no momentum of SGD's (each model's first moment is pipeline.per_model.b1)",
  )
  require(
    config.outer.exchange_dtype == "float32",
    EXCHANGE_DTYPE,
    config.outer.exchange_dtype,
    "valid for pipeline: float32 (its models move whole; nothing is exchanged)",
  )


PIPELINE = Algorithm(
  name="pipeline",
  reads=(*READS, *LAYOUT_READS),
  units=MODELS.path,
  partition_owner="device",
  check=check,
  declares=FIELDS,
  ignored_groups=IGNORED_GROUPS,
  momenta=momenta,
  planned=False,
)
