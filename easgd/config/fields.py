"""Every config field, assembled from the parts that declare them.

Each part declares its own fields beside its code (easgd.declare.Field): the
rules theirs on their classes (`Rule.declares`; the registry gathers every
algorithm's, the pipeline's group too), the data its group, the timing model
the cluster's timings, each runtime the fields only it reads. What no single
part owns is declared here: what is trained and how it runs (the top-level
fields), where and how long the run goes (run.*), and the planner's device.
From the whole tree come:
  * the default config (`default_config`, which configs/default.py returns);
  * each field's own check (`easgd.config.validation`; checks that span
    fields live on the rule or the runtime that needs them);
  * which fields shape a trajectory, so are hyper-parameters and must match
    on resume (`easgd.config.hyperparameters.shapes_trajectory`);
  * the migration hints of old names (`hyperparameters.MOVED`, `hyperparameters.EARLIER_VALUES`);
  * docs/configuration.md (`easgd.config.reference`; a test keeps it equal).
"""

import os

import ml_collections

from easgd.data import augment, batches, stream
from easgd.data.datasets import DATASET
from easgd.declare import Field, Shapes, integer, number, one_of, text, unique
from easgd.infra import profiler, sharding
from easgd.models import DTYPES, MODELS
from easgd.registry import ALGORITHMS as REGISTRY
from easgd.sim import timing
from easgd.train.runtimes.ray import fields as ray_fields
from easgd.train.runtimes.simulated import fields as replay_fields

ALGORITHMS = tuple(REGISTRY)


def _readable_folder(value: str) -> bool:
  # Read, never written: it must be there (TFDS prepares datasets into it
  # beforehand). A remote one (gs://...) is TFDS's to find.
  return not value or "://" in value or os.path.isdir(os.path.expanduser(value))


# The groups, in order, with what they hold.
GROUPS = {
  "": "What is trained, by whom.",
  "data": "The data and each worker's batches.",
  "optimizer": "The workers' local step: an optax optimizer and its learning-rate schedule "
  "(easgd/rules/optimizers.py); sync_sgd's shared model takes it too.",
  "outer": "The center and the exchanges with it (easgd/rules/outer.py): every tau steps the "
  "pseudo-gradient Delta = mean_i (center - x_i) moves the center through the outer "
  "optimizer, and the workers are pulled back.",
  "downpour": "Downpour's workers and master.",
  "pipeline": "The pipeline: M models trained at once, each with the optimizer group's "
  "optimizer and schedule on one device at a time, moved along the ring of devices every "
  "stage_steps steps.",
  "cluster": "The timing model (easgd/sim/timing.py): it orders the parameter-server rules' "
  "requests and gives every rule a simulated clock (sim/time). Seconds, bytes. The default: "
  "CPU workers of 10 ms a step, the slowest 1.5x slower than the fastest, 10% jitter, on "
  "1 Gbit/s Ethernet; the master takes 1 ms a request. Under runtime=threads only the "
  "workers' relative speeds apply, as real delays.",
  "ray": "runtime=ray (easgd/train/runtimes/ray/runtime.py; docs/runtimes.md): each worker "
  "a Ray actor process, the center on server actors.",
  "device": "The device, for the planner only (python -m easgd.plan).",
  "run": "How long the run goes, where it runs and what it reports: these may change when a "
  "run is resumed.",
}

# What is trained, and how it runs.
_TOP = (
  Field(
    "algorithm",
    "sync_easgd",
    one_of(ALGORITHMS, sort=True),
    "a rule of the registry (easgd.rules.RULES; docs/algorithms.md), or pipeline",
  ),
  Field(
    "model",
    "lenet5",
    one_of(MODELS, sort=True),
    "lenet5, mlp, alexnet, resnet20, vgg11 (CIFAR-sized); resnet50, alexnet_imagenet "
    "(ImageNet; docs/networks.md)",
  ),
  Field(
    "seed",
    0,
    integer(0, 2**32, words="must be an integer in [0, 2**32)"),
    "initial parameters, data partition and data order",
  ),
  Field(
    "dtype",
    "float32",
    one_of(DTYPES, "what the models compute in; parameters stay float32"),
    "what the models compute in: float32, or bfloat16 for activations, matrix products and "
    "convolutions (docs/running.md, 'Computing in bfloat16')",
    earlier="float32",
  ),
  Field(
    "runtime",
    "simulated",
    text("the name of a runtime"),
    "how the rules run (easgd/train/runtimes/; docs/runtimes.md): simulated (the timing "
    "model's ticks), threads (a host thread a worker, recording WORKDIR/trace.jsonl) or ray "
    "(a process a worker, on Ray; the same trace)",
    earlier="simulated",
  ),
)

# The device, for the planner (easgd.plan).
_DEVICE = (
  Field(
    "device.memory",
    16e9,
    number(0, note="0: not given"),
    "a device's bytes",
    Shapes.NEVER,
    formerly=("cluster.device_memory",),
  ),
  Field(
    "device.flops",
    0.0,
    number(0, note="0: not given"),
    "the FLOP/s a training step sustains; 0: steps take cluster.compute_time",
    Shapes.NEVER,
    formerly=("cluster.device_flops",),
  ),
)

# How long, where, what is reported (run.total_steps is the rules' schedule's horizon).
_RUN = (
  Field(
    "run.log_every",
    50,
    integer(0, note="0: only at the end"),
    "steps between log lines; 0: at the end only",
    Shapes.NEVER,
    formerly=("log_every",),
  ),
  Field(
    "run.eval_every",
    100,
    integer(0, note="0: only at the end"),
    "steps between evaluations; 0: at the end only",
    Shapes.NEVER,
    formerly=("eval_every",),
  ),
  Field(
    "run.checkpoint_every",
    200,
    integer(0, note="0: only at the end"),
    "steps between checkpoints; 0: at the end only",
    Shapes.NEVER,
    formerly=("checkpoint_every",),
  ),
  Field(
    "run.data_dir",
    "",
    text(
      "must be a directory, the one TFDS prepared the dataset in (it is read, never "
      "written), or '' for TFDS's default",
      _readable_folder,
    ),
    "TFDS data directory ('' for TFDS's default), or a records folder",
    Shapes.NEVER,
    formerly=("data_dir",),
  ),
)


def _in_group_order(declared) -> tuple[Field, ...]:
  """Each field once, the groups in GROUPS' order, each group's in its declaration order."""
  order = list(GROUPS)
  return tuple(sorted(unique(declared), key=lambda field: order.index(field.group)))


FIELDS_DECLARED = _in_group_order(
  (
    *_TOP,
    DATASET,
    augment.AUGMENT,
    batches.BATCH_SIZE,
    *stream.FIELDS,
    *(field for algorithm in REGISTRY.values() for field in algorithm.declares),
    *timing.FIELDS,
    replay_fields.REPLAY,
    *ray_fields.FIELDS,
    *_DEVICE,
    *_RUN,
    sharding.DEVICES,
    profiler.PROFILE,
  )
)

FIELDS: dict[str, Field] = {field.path: field for field in FIELDS_DECLARED}


def default_config() -> ml_collections.ConfigDict:
  """The config every config file starts from: each field at its declared default."""
  config = ml_collections.ConfigDict()
  for field in FIELDS_DECLARED:
    *groups, name = field.path.split(".")
    holder = config
    for group in groups:
      if group not in holder:
        holder[group] = ml_collections.ConfigDict()
      holder = holder[group]
    holder[name] = field.default
  return config
