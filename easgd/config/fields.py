"""Every config field, declared once.

A field's declaration is its dotted path, its default, what values it allows
(type and range, with the words a refusal says), one line of what it means,
whether it shapes the run's trajectory, and, for fields that moved or were
added since an earlier version, their old names and the value that computes
what that version did. From these come:
  * the default config (`default_config`, which configs/default.py returns);
  * each field's own check (`easgd.config.validation`; checks that span
    fields live on the rule or the runtime that needs them);
  * which fields shape a trajectory, so are hyper-parameters and must match
    on resume (`easgd.config.hyperparameters.shapes_trajectory`);
  * the migration hints of old names (`hyperparameters.MOVED`, `hyperparameters.EARLIER_VALUES`);
  * docs/configuration.md (`easgd.config.reference`; a test keeps it equal).
"""

import dataclasses
import enum
import math
import os
from collections.abc import Callable
from typing import Any

import ml_collections

from easgd.data import augment, stream
from easgd.data.datasets import DATASETS
from easgd.errors import is_int, is_number
from easgd.models import DTYPES, MODELS
from easgd.registry import ALGORITHMS as REGISTRY
from easgd.rules import RULES, exchange, model_state, optimizers
from easgd.rules.base import Momentum, Pull
from easgd.rules.parameter_server import Downpour
from easgd.sim import timing

ALGORITHMS = tuple(REGISTRY)
PULLS = ("", *Pull)


class Shapes(enum.StrEnum):
  """Whether a field can change what a run trains (its trajectory)."""

  # For every algorithm but one that has no use for its group (the pipeline
  # has no workers and no simulated cluster: `Algorithm.ignored_groups`).
  ALWAYS = "always"
  # Only for an algorithm that declares it reads it (`Algorithm.reads`);
  # an optimizer field only where the optimizer and its
  # schedule read it; run.total_steps under a schedule that spans it.
  IF_READ = "if read"
  # May change when a run is resumed; not a hyper-parameter.
  NEVER = "never"


@dataclasses.dataclass(frozen=True)
class Allowed:
  """The values a field takes: `accepts(value)`, and `text`, what a refusal says."""

  accepts: Callable[[Any], bool]
  text: str


def integer(low: int, high: int | None = None, note: str = "", words: str | None = None) -> Allowed:
  """An integer >= low (and < high)."""
  if words is None:
    words = (
      f"must be an integer >= {low}" if high is None else f"must be an integer in [{low}, {high})"
    )
  return Allowed(
    lambda v: is_int(v) and v >= low and (high is None or v < high), words + _note(note)
  )


def number(
  low: float,
  high: float | None = None,
  *,
  low_open: bool = False,
  high_open: bool = True,
  infinite: bool = False,
  note: str = "",
  words: str | None = None,
) -> Allowed:
  """A number in [low, high) by default; `infinite` lets +inf through (never NaN)."""

  def accepts(value) -> bool:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or math.isnan(value):
      return False
    if not (infinite or math.isfinite(value)):
      return False
    above = value > low if low_open else value >= low
    below = high is None or (value < high if high_open else value <= high)
    return above and below

  if words is None:
    if high is None:
      words = f"must be a finite number {'>' if low_open else '>='} {low:g}"
    else:
      words = f"must be in {'(' if low_open else '['}{low:g}, {high:g}{')' if high_open else ']'}"
  return Allowed(accepts, words + _note(note))


def one_of(choices, note: str = "", *, sort: bool = False) -> Allowed:
  """One of `choices`, listed in their order, or sorted with `sort` (a registry's)."""
  listed = sorted(choices) if sort else list(choices)
  return Allowed(lambda v: v in tuple(choices), f"valid: {', '.join(listed)}" + _note(note))


FLAG = Allowed(lambda v: isinstance(v, bool), "True or False")


def text(words: str, accepts: Callable[[str], bool] = lambda v: True) -> Allowed:
  """A string that `accepts`."""
  return Allowed(lambda v: isinstance(v, str) and accepts(v), words)


def values(each: Allowed, every: str) -> Allowed:
  """A tuple (or list) whose every value `each` accepts: the pipeline's per-model
  values; `every` says what each value must be."""
  return Allowed(
    lambda v: isinstance(v, (tuple, list)) and all(each.accepts(x) for x in v),
    f"must be () or a tuple of one value a model, every one {every}",
  )


def _note(note: str) -> str:
  return f" ({note})" if note else ""


def _increasing_fractions(value) -> bool:
  return (
    isinstance(value, (tuple, list))
    and len(value) >= 1
    and all(is_number(b) and 0 < b < 1 for b in value)
    and all(a < b for a, b in zip(value, value[1:], strict=False))
  )


def _distinct_indices(value) -> bool:
  return (
    isinstance(value, (tuple, list))
    and all(is_int(i) and i >= 0 for i in value)
    and len(set(value)) == len(value)
  )


def _readable_folder(value: str) -> bool:
  # Read, never written: it must be there (TFDS prepares datasets into it
  # beforehand). A remote one (gs://...) is TFDS's to find.
  return not value or "://" in value or os.path.isdir(os.path.expanduser(value))


_NOT_ADDED = object()


@dataclasses.dataclass(frozen=True)
class Field:
  """One config field.

  path:     dotted, its group first (`optimizer.learning_rate`).
  default:  its value in the default config.
  allowed:  its type and range; values across fields are the rules' and
            runtimes' to check.
  doc:      one line: what it is.
  shapes:   whether it can change what a run trains (`Shapes`).
  formerly: its names in earlier versions (flat names before the groups).
  earlier:  for a field added since: the value that computes what the
            versions before it did (a checkpoint without it was written so).
  """

  path: str
  default: Any
  allowed: Allowed
  doc: str
  shapes: Shapes = Shapes.ALWAYS
  formerly: tuple[str, ...] = ()
  earlier: Any = _NOT_ADDED

  @property
  def group(self) -> str:
    """Its group ("" for the top-level fields)."""
    head, dot, _ = self.path.rpartition(".")
    return head.split(".", maxsplit=1)[0] if dot else ""

  @property
  def added(self) -> bool:
    """Whether it was added since the first grouped version (it has an earlier value)."""
    return self.earlier is not _NOT_ADDED


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

_PER_MODEL = "a tuple of pipeline.models values, or () for the optimizer group's for every model"

FIELDS_DECLARED = (
  # What is trained, by whom.
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
  Field("workers", 8, integer(1), "P: an array axis sharded over the devices"),
  Field(
    "seed",
    0,
    integer(0, 2**32, words="must be an integer in [0, 2**32)"),
    "initial parameters, data partition and data order",
  ),
  Field(
    "deterministic_sums",
    False,
    FLAG,
    "sums over workers added in worker order after an all-gather: the same bits on every "
    "process layout with the same workers a device (docs/distributed.md)",
    earlier=False,
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
  # The data and each worker's batches.
  Field(
    "data.dataset",
    "mnist5k",
    one_of(DATASETS, sort=True),
    "mnist5k (embedded), digits, TFDS mnist, fashion_mnist, cifar10, cifar100, imagenette, "
    "imagenet2012; records: a folder of python -m easgd.data.convert in run.data_dir",
    formerly=("dataset",),
  ),
  Field(
    "data.augment",
    "none",
    one_of(augment.CHOICES),
    "none, or crop_flip: CIFAR's pad-4 random crop and horizontal flip, on the device",
    formerly=("augment",),
  ),
  Field(
    "data.batch_size",
    32,
    integer(1, note="examples per worker per step"),
    "examples per worker per step (the pipeline: per model)",
    formerly=("batch_size",),
  ),
  Field(
    "data.source",
    "auto",
    one_of(stream.SOURCES, "easgd/data/stream.py"),
    "device: placed on the devices once; stream: read on the host as each worker trains "
    "(the same batches); auto: device if they fit in data.device_budget (docs/data.md)",
    Shapes.NEVER,
  ),
  Field(
    "data.device_budget",
    2e9,
    number(
      0,
      low_open=True,
      words="must be a finite number of bytes > 0 (what a device may hold of training data)",
    ),
    "bytes of training data a device may hold, which decides data.source=auto; at least "
    "one step's batches of a device (streamed, those of the steps queued ahead too)",
    Shapes.NEVER,
  ),
  # The local step.
  Field(
    "optimizer.name",
    "sgd",
    one_of(optimizers.INNER),
    "the workers' inner optimizer (optax): sgd or adamw",
    Shapes.IF_READ,
  ),
  Field(
    "optimizer.learning_rate",
    0.1,
    number(0, low_open=True),
    "eta; the peak under a schedule",
    Shapes.IF_READ,
    formerly=("learning_rate",),
  ),
  Field(
    "optimizer.momentum",
    0.0,
    number(0, 1),
    "sgd's mu: 0 for adamw; required (in (0, 1)) by "
    + ", ".join(name for name, rule in RULES.items() if rule.momentum == Momentum.REQUIRED)
    + " (async_msgd's is its master's)",
    Shapes.IF_READ,
    formerly=("momentum",),
  ),
  Field(
    "optimizer.nesterov",
    False,
    FLAG,
    "sgd's momentum in Nesterov's form (docs/algorithms.md says whose)",
    Shapes.IF_READ,
    formerly=("nesterov",),
  ),
  Field(
    "optimizer.weight_decay",
    0.0,
    number(0),
    "lambda: sgd adds lambda*x to every gradient (L2); adamw decays decoupled",
    Shapes.IF_READ,
    formerly=("weight_decay",),
  ),
  Field("optimizer.b1", 0.9, number(0, 1), "adamw's first moment's decay", Shapes.IF_READ),
  Field("optimizer.b2", 0.999, number(0, 1), "adamw's second moment's decay", Shapes.IF_READ),
  Field("optimizer.eps", 1e-8, number(0, low_open=True), "adamw's epsilon", Shapes.IF_READ),
  Field(
    "optimizer.schedule",
    "constant",
    one_of(optimizers.SCHEDULES),
    "constant; warmup_cosine (linear warm-up from 0, then a cosine to 0 at run.total_steps); "
    "warmup_step (warm-up, then x decay_factor at each boundary); over each worker's own "
    "local steps",
    Shapes.IF_READ,
    formerly=("schedule",),
  ),
  Field(
    "optimizer.warmup_steps",
    0,
    integer(0),
    "the schedule's linear warm-up, in local steps",
    Shapes.IF_READ,
    formerly=("warmup_steps",),
  ),
  Field(
    "optimizer.boundaries",
    (0.5, 0.75),
    Allowed(
      _increasing_fractions,
      "must be increasing fractions of run.total_steps in (0, 1), e.g. (0.5, 0.75)",
    ),
    "warmup_step's decay points, fractions of run.total_steps",
    Shapes.IF_READ,
  ),
  Field(
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
  ),
  # The center and the exchanges with it.
  Field(
    "outer.comm_period",
    4,
    integer(1),
    "tau: local steps between exchanges with the center (async_local_sgd's H)",
    Shapes.IF_READ,
    formerly=("comm_period",),
  ),
  Field(
    "outer.moving_rate",
    0.0,
    number(0, 1, words="must be in (0, 1), or 0 for beta = workers*moving_rate = 0.9"),
    "alpha of the elastic pull, beta = workers*alpha < 1; 0: beta = 0.9 (the EASGD "
    "authors'); a reset pull has none: 0",
    Shapes.IF_READ,
    formerly=("moving_rate",),
  ),
  Field(
    "outer.pull",
    "",
    Allowed(lambda v: v in PULLS, "valid: '' (the rule's own), elastic, reset"),
    "'' (the rule's own), elastic or reset: only diloco takes either",
    Shapes.IF_READ,
  ),
  Field(
    "outer.optimizer",
    "sgd",
    one_of(optimizers.OUTER),
    "the center's optimizer on the pseudo-gradient (diloco's; the defaults are DiLoCo's)",
    Shapes.IF_READ,
  ),
  Field(
    "outer.learning_rate",
    0.7,
    number(0, low_open=True),
    "eta_o; lookahead's slow-weight rate alpha",
    Shapes.IF_READ,
  ),
  Field(
    "outer.momentum",
    0.9,
    number(0, 1),
    "mu_o, the outer sgd's momentum (async_local_sgd's: Delayed Nesterov's)",
    Shapes.IF_READ,
  ),
  Field(
    "outer.nesterov", True, FLAG, "the outer sgd's momentum in Nesterov's form", Shapes.IF_READ
  ),
  Field(
    "outer.exchange_dtype",
    "float32",
    one_of(exchange.DTYPES),
    "what a worker's exchange message is sent as: float32, bfloat16, int8 or int4 (per-"
    "tensor scale, stochastic rounding; easgd/rules/exchange.py; int4: the streaming rules)",
    Shapes.IF_READ,
    formerly=("exchange_dtype",),
  ),
  Field(
    "outer.fragments",
    1,
    integer(1, note="at most the model's layers (parameter blocks)"),
    "F: the streaming rules' fragments of whole layers, one synced every comm_period/F "
    "steps (easgd/rules/streaming.py)",
    Shapes.IF_READ,
    earlier=1,
  ),
  Field(
    "outer.sync_delay",
    0,
    integer(0, note="below outer.comm_period"),
    "d: the streaming rules' inner steps between sending a fragment and applying its result",
    Shapes.IF_READ,
    earlier=0,
  ),
  Field(
    "outer.merge",
    1.0,
    number(0, 1, low_open=True, high_open=False),
    "streaming_diloco's merge on arrival: x_i <- merge*x~ + (1 - merge)*x_i (1: the reset)",
    Shapes.IF_READ,
    earlier=1.0,
  ),
  Field(
    "outer.momentum_period",
    1,
    integer(1),
    "N: async_local_sgd's Delayed Nesterov moves the master's momentum every N pushes and "
    "applies each push alone in between (1: Nesterov at every push)",
    Shapes.IF_READ,
    earlier=1,
  ),
  Field(
    "outer.momentum_activation",
    0.0,
    number(0, 1, high_open=False, words="must be in [0, 1/outer.momentum_period]"),
    "c: the share of Delayed Nesterov's momentum applied at each push between its moves "
    "(0: all of it when it moves)",
    Shapes.IF_READ,
    earlier=0.0,
  ),
  Field(
    "outer.dynamic_local_steps",
    False,
    FLAG,
    "async_local_sgd's DyLU: each worker's local steps between pushes scaled by its speed, "
    "floor(comm_period * its speed / the fastest's)",
    Shapes.IF_READ,
    earlier=False,
  ),
  Field(
    "outer.batch_stats",
    "averaged",
    one_of(
      model_state.BATCH_STATS_CHOICES,
      "BatchNorm statistics: averaged into the center like parameters, or kept by each worker",
    ),
    "BatchNorm statistics averaged into the center like the parameters, or local to each "
    "worker (docs/cifar.md)",
    Shapes.IF_READ,
    formerly=("batch_stats",),
  ),
  # Downpour's workers and master.
  Field(
    "downpour.n_sync",
    4,
    integer(1, note="downpour's local steps between push and fetch"),
    "local steps between push and fetch",
    Shapes.IF_READ,
    formerly=("n_sync",),
  ),
  Field(
    "downpour.server_optimizer",
    "sgd",
    one_of(Downpour.server_optimizers),
    "the master's optimizer: sgd or adagrad",
    Shapes.IF_READ,
    formerly=("server_optimizer",),
  ),
  # The pipeline.
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
  # The timing model.
  Field(
    "cluster.compute_time",
    0.01,
    number(0, low_open=True),
    "seconds: the mean local step of the fastest worker",
  ),
  Field(
    "cluster.speed_spread",
    0.5,
    number(0),
    "worker i is (1 + speed_spread * i / (P - 1)) times slower than worker 0",
  ),
  Field("cluster.jitter", 0.1, number(0), "the lognormal sigma of each step's time"),
  Field(
    "cluster.stragglers",
    (),
    Allowed(_distinct_indices, "must be distinct worker indices >= 0, e.g. (3,) or (0, 5)"),
    "worker indices that are stragglers, e.g. (3,)",
  ),
  Field(
    "cluster.straggler_slowdown",
    4.0,
    number(1, note="how many times slower a straggler is"),
    "how many times slower a straggler is",
  ),
  Field(
    "cluster.straggler_slowdowns",
    (),
    Allowed(
      lambda v: isinstance(v, (tuple, list)) and all(number(1).accepts(x) for x in v),
      "must be () or a tuple of finite numbers >= 1, one per straggler, e.g. (2.0, 4.0)",
    ),
    "each straggler's own slowdown, in the order of cluster.stragglers (then "
    "cluster.straggler_slowdown is not read); () gives every straggler "
    "cluster.straggler_slowdown",
    earlier=(),
  ),
  Field("cluster.latency", 5e-4, number(0), "seconds per message"),
  Field(
    "cluster.bandwidth",
    1.25e8,
    number(0, low_open=True, infinite=True, words="must be > 0 (bytes/second)"),
    "bytes/second of each worker's link",
  ),
  Field("cluster.master_time", 1e-3, number(0), "the master's service time per request"),
  Field(
    "cluster.servers",
    1,
    integer(1),
    "parameter servers the center is split over",
  ),
  Field(
    "cluster.server_bandwidth",
    float("inf"),
    number(
      0,
      low_open=True,
      infinite=True,
      words="must be > 0 (bytes/second; inf: the servers' links are not modelled)",
    ),
    "bytes/second of each server's link; inf: not modelled",
  ),
  Field(
    "cluster.allreduce",
    "ring",
    Allowed(
      lambda v: v in tuple(timing.Allreduce),
      f"must be one of {', '.join(timing.Allreduce)}",
    ),
    "the synchronous rules' all-reduce: ring or tree",
  ),
  Field(
    "cluster.replay",
    "",
    text("a trace.jsonl path, or '' (off)"),
    "a trace.jsonl of a runtime=threads or ray run, replayed instead of the timing model's "
    "order; '': off",
    earlier="",
  ),
  Field(
    "cluster.on_worker_loss",
    "rejoin",
    one_of(("rejoin", "continue", "stop")),
    "runtime=ray, a worker process that dies: rejoin (Ray restarts it; it starts from the "
    "center), continue (the others go on without it) or stop (the run stops)",
    Shapes.NEVER,
    earlier="rejoin",
  ),
  # runtime=ray.
  Field(
    "ray.address",
    "",
    text("HOST:PORT of a Ray head, 'auto', or '' (embedded)"),
    "the Ray cluster: HOST:PORT of its head, 'auto' (the one this node joined with ray start), "
    "or '' for RAY_ADDRESS or else an embedded one the run starts",
    Shapes.NEVER,
    earlier="",
  ),
  Field(
    "ray.servers",
    1,
    integer(1),
    "S: server actors the center is split over, by parameter blocks (at most the model's "
    "blocks; python -m easgd.plan says how many a model needs)",
    Shapes.NEVER,
    earlier=1,
  ),
  Field(
    "ray.worker_gpus",
    0.0,
    number(0, note="GPUs a worker process takes; 0: its CPU"),
    "GPUs each worker process takes (1 on a GPU cluster; a fraction shares one); 0: it "
    "runs on its CPU",
    Shapes.NEVER,
    earlier=0.0,
  ),
  # The device, for the planner.
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
  # How long, where, what is reported.
  Field(
    "run.total_steps",
    600,
    integer(1),
    "steps (ticks) of the run; a schedule other than constant spans them",
    Shapes.IF_READ,
    formerly=("total_steps",),
  ),
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
    "run.devices",
    0,
    integer(0, words="must be an integer >= 1, or 0 for the largest divisor that fits"),
    "D: devices the workers (the pipeline: models) are spread over, dividing them; 0: the "
    "largest divisor that is at most 8 and the devices there are; on a CPU train.py "
    "creates D virtual devices (the pipeline reads it)",
    Shapes.IF_READ,
    formerly=("devices",),
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
  Field(
    "run.profile",
    "",
    text("must be '' (off) or 'START:STEPS'"),
    "'START:STEPS': a jax.profiler trace of steps START+1 .. START+STEPS into WORKDIR/profile "
    "(docs/running.md); '': off",
    Shapes.NEVER,
    formerly=("profile",),
  ),
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
