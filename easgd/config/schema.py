"""The grouped configuration: which fields a run's trajectory
depends on, which may change on resume, which are hyper-parameters, and
where the old flat names went.

Groups (configs/default.py; docs/configuration.md):
  algorithm, model, workers, seed   what is trained, by whom
  data.*                            the dataset and each worker's batches
  optimizer.*                       the local step
  outer.*                           the center and the exchanges with it
  downpour.*                        Downpour's workers and master
  pipeline.*                        the pipeline's models and stages
  cluster.*                         the timing model (easgd.sim.timing)
  device.*                          the device, for the planner only
  run.*                             how long, where, what is reported

Nothing here is a list of fields kept by hand: a field's role follows from
its group and from what the algorithm declares it reads (`Rule.reads`, the
pipeline's `READS`, `LAYOUT_READS` and `IGNORED_GROUPS`):
  * `run.*`, `device.*` and where the data is read from (data.source,
    data.device_budget) never change the trajectory (but the pipeline's
    data is split one partition a device: `run.devices` shapes it; and a
    learning-rate schedule spans `run.total_steps`, which then shapes it);
  * the algorithm groups (optimizer, outer, downpour, pipeline) change it
    only where the algorithm reads them;
  * every other field always does.
A checkpoint resumes under other values of the fields that do not change
the trajectory, and only the fields that do are hyper-parameters.
"""

import difflib
import functools
import json
import math

import ml_collections

from easgd.data import stream
from easgd.pipeline import programs as pipeline_programs
from easgd.rules import RULES, optimizers

PIPELINE = "pipeline"
ALGORITHMS = (*RULES, PIPELINE)
RUN_GROUPS = ("run", "device")
# The run field a learning-rate schedule spans (easgd.rules.optimizers).
SCHEDULE_HORIZON = "run.total_steps"
ALGORITHM_GROUPS = ("optimizer", "outer", "downpour", "pipeline")

# Flat names (of earlier versions, and the flat spellings of a few newer fields)
# -> their grouped names.
MOVED = {
  "dataset": "data.dataset",
  "data_dir": "run.data_dir",
  "augment": "data.augment",
  "batch_size": "data.batch_size",
  "devices": "run.devices",
  "learning_rate": "optimizer.learning_rate",
  "momentum": "optimizer.momentum",
  "nesterov": "optimizer.nesterov",
  "weight_decay": "optimizer.weight_decay",
  "comm_period": "outer.comm_period",
  "moving_rate": "outer.moving_rate",
  "batch_stats": "outer.batch_stats",
  "exchange_dtype": "outer.exchange_dtype",
  "schedule": "optimizer.schedule",
  "warmup_steps": "optimizer.warmup_steps",
  "n_sync": "downpour.n_sync",
  "server_optimizer": "downpour.server_optimizer",
  "models": "pipeline.models",
  "stage_steps": "pipeline.stage_steps",
  "per_model": "pipeline.per_model",
  "cluster.device_memory": "device.memory",
  "cluster.device_flops": "device.flops",
  "total_steps": "run.total_steps",
  "log_every": "run.log_every",
  "eval_every": "run.eval_every",
  "checkpoint_every": "run.checkpoint_every",
  "profile": "run.profile",
}


# Fields added since, with the value that computes what the versions before them
# did: a checkpoint whose config lacks one was written under that value.
EARLIER_VALUES = {
  "deterministic_sums": False,
  "dtype": "float32",
  "runtime": "simulated",
  "cluster.replay": "",
}


def hint(field: str) -> str:
  """One line for a config field that does not exist: its grouped name if it moved,
  else the closest fields there are."""
  new = moved(field)
  if new is not None:
    return f"config.{field} is now config.{new} (fields are grouped; docs/configuration.md)"
  close = difflib.get_close_matches(field, list(flatten(default_config().to_dict())), n=3)
  suggestion = f"; did you mean {' or '.join(f'config.{c}' for c in close)}?" if close else ""
  return f"config.{field} does not exist{suggestion}"


def grouped(saved: dict) -> dict:
  """A flattened config of an earlier version under the grouped names, with the
  EARLIER_VALUES of the fields it lacks."""
  return EARLIER_VALUES | {moved(field) or field: value for field, value in flatten(saved).items()}


def moved(field: str) -> str | None:
  """The grouped name of an old flat field name (or of a field under it), or None."""
  for old, new in MOVED.items():
    if field == old or field.startswith(old + "."):
      return new + field[len(old) :]
  return None


def default_config() -> ml_collections.ConfigDict:
  """The configuration every config file starts from (configs/default.py)."""
  from easgd.configs import default  # noqa: PLC0415 (configs import the package)

  return default.get_config()


def lookup(config, path: str):
  """config["a"]["b"] for path "a.b"."""
  return functools.reduce(lambda group, key: group[key], path.split("."), config)


def flatten(values: dict, prefix: str = "") -> dict:
  """{"cluster": {"latency": 1}} -> {"cluster.latency": 1}, through JSON (tuples become lists)."""
  flat = {}
  for key, value in json.loads(json.dumps(values)).items():
    if isinstance(value, dict):
      flat.update(flatten(value, f"{prefix}{key}."))
    else:
      flat[prefix + key] = value
  return flat


def reads(algorithm: str) -> tuple[str, ...]:
  """The algorithm-group fields that `algorithm`'s trajectory depends on."""
  return pipeline_programs.READS if algorithm == PIPELINE else RULES[algorithm].reads


def shapes_trajectory(field: str, algorithm: str, optimizer=None) -> bool:
  """Whether the dotted `field` can change what `algorithm` trains (see the module doc).

  optimizer: the run's `optimizer` group, if known. Then the fields its
  optimizer and schedule do not read (easgd.rules.optimizers.unread_fields)
  do not shape it, and a schedule other than constant spans run.total_steps,
  which then does. Without it, every optimizer field counts and the schedule
  is taken as constant.
  """
  group = field.split(".", maxsplit=1)[0]
  if field == SCHEDULE_HORIZON:
    return optimizer is not None and optimizer["schedule"] != "constant"
  if optimizer is not None and group == "optimizer":
    unread = optimizers.unread_fields(optimizer["name"], optimizer["schedule"])
    return field.split(".", maxsplit=1)[1] not in unread and _read_by(field, algorithm)
  if algorithm == PIPELINE:
    # One partition a device and a ring of devices: the device count shapes the
    # pipeline; it has no workers and no simulated cluster.
    if field in pipeline_programs.LAYOUT_READS:
      return True
    if group in pipeline_programs.IGNORED_GROUPS:
      return False
  # Placed or streamed, the workers get the same batches.
  if group in RUN_GROUPS or field in stream.PLACEMENT_FIELDS:
    return False
  return group not in ALGORITHM_GROUPS or _read_by(field, algorithm)


def _read_by(field: str, algorithm: str) -> bool:
  """Whether `algorithm` declares that it reads `field` (or its group)."""
  return any(field == read or field.startswith(read + ".") for read in reads(algorithm))


def units(config: ml_collections.ConfigDict) -> int:
  """What is spread over the devices: the pipeline's models, or the rules' workers."""
  return config.pipeline.models if config.algorithm == PIPELINE else config.workers


def resolve_devices(config: ml_collections.ConfigDict, available: int = 8) -> int:
  """config.run.devices, or for 0 the largest divisor of the units <= min(units, 8, available).

  train.py creates that many virtual CPU devices (available = 8) before JAX
  starts; the trainers pass the devices there are, which gives the same
  number on a CPU.
  """
  if config.run.devices:
    return config.run.devices
  count = units(config)
  limit = min(count, 8, available)
  return max(d for d in range(1, limit + 1) if count % d == 0)


def _hparam(value):
  """A value the HParams dashboard shows: tuples and infinities as strings."""
  if isinstance(value, float) and not math.isfinite(value):
    return str(value)
  return value if isinstance(value, (str, bool, int, float)) else str(tuple(value))


def hparams_of(config: ml_collections.ConfigDict) -> dict:
  """The fields that shape the run's trajectory, for TensorBoard's HParams dashboard."""
  return {
    field: _hparam(value)
    for field, value in flatten(config.to_dict()).items()
    if shapes_trajectory(field, config.algorithm, config.optimizer)
  }
