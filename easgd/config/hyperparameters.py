"""What the declared fields (easgd.config.fields) imply: the default config and a
rule's own defaults, which fields a run's trajectory depends on (its
hyper-parameters), which may change on resume, and where the old flat names went.

A field declares whether it shapes a trajectory (`fields.Shapes`): always,
never (run.*, device.*, where the data is read from: these may change on
resume), or only where the algorithm reads it (`Algorithm.reads` of its entry
in easgd.registry): the optimizer, outer, downpour and pipeline groups,
run.total_steps under a learning-rate schedule that spans it, and run.devices
for the pipeline (one partition a device). A group the algorithm has no use
for shapes nothing (`Algorithm.ignored_groups`: the pipeline has no workers
and no simulated cluster). A checkpoint resumes
under other values of the fields that do not change the trajectory, and only
the fields that do are hyper-parameters.
"""

import difflib
import functools
import json
import math
from collections.abc import Iterable

import ml_collections

from easgd.config import fields
from easgd.data import stream
from easgd.declare import Shapes
from easgd.errors import ConfigError
from easgd.pipeline import algorithm as pipeline
from easgd.registry import ALGORITHMS
from easgd.rules import optimizers

RUN_GROUPS = ("run", "device")
# The run field a learning-rate schedule spans (easgd.rules.optimizers).
SCHEDULE_HORIZON = optimizers.TOTAL_STEPS.path
ALGORITHM_GROUPS = ("optimizer", "outer", "downpour", "pipeline")

# Old names (the flat ones of earlier versions, and the flat spellings of a few
# newer fields) -> the grouped names, as the fields declare them.
MOVED = {
  # The pipeline's per-model group, whose fields each name their old spelling too.
  "per_model": pipeline.PER_MODEL_GROUP,
  **{old: field.path for field in fields.FIELDS_DECLARED for old in field.formerly},
}

# Fields added since, with the value that computes what the versions before them
# did: a checkpoint whose config lacks one was written under that value.
EARLIER_VALUES = {field.path: field.earlier for field in fields.FIELDS_DECLARED if field.added}


def hint(field: str) -> str:
  """One line for a config field that does not exist: its grouped name if it moved,
  else the closest fields there are."""
  new = moved(field)
  if new is not None:
    return f"config.{field} is now config.{new} (fields are grouped; docs/configuration.md)"
  close = difflib.get_close_matches(field, list(fields.FIELDS), n=3)
  suggestion = f"; did you mean {' or '.join(f'config.{c}' for c in close)}?" if close else ""
  return f"config.{field} does not exist{suggestion}"


def grouped(saved: dict) -> dict:
  """A flattened config of an earlier version under the grouped names, with the
  EARLIER_VALUES of the fields it lacks, as JSON holds them (a tuple a list), as `flatten`
  gives the current config's."""
  earlier = flatten(EARLIER_VALUES)
  return earlier | {moved(field) or field: value for field, value in flatten(saved).items()}


def moved(field: str) -> str | None:
  """The grouped name of an old flat field name (or of a field under it), or None."""
  for old, new in MOVED.items():
    if field == old or field.startswith(old + "."):
      return new + field[len(old) :]
  return None


def with_rule_defaults(
  config: ml_collections.ConfigDict, given: Iterable[str] = (), saved: dict | None = None
) -> dict[str, object]:
  """Sets, in place, the chosen algorithm's own defaults (`Algorithm.defaults`: a rule's
  `Rule.defaults`; the pipeline has none), all of them or
  none: none if the command line sets any of their fields (`given`, dotted) or
  the config file gives any another value than the default config's. Returns
  what was set.

  The default config's values suit the family (no momentum, learning rate
  0.1); a momentum rule brings its momentum and the learning rate that trains
  with it, so that `--config.algorithm=X` alone trains every rule. A rule's
  defaults go together: one of them given means the user chose the others too.

  saved: the config of a checkpoint being resumed (`checkpoint.saved_config`).
  Its values of these fields are taken instead, so that a run resumes with the
  values it started with, also one started before its rule had defaults.
  """
  # Before validation: an unknown algorithm has none here, and is named there.
  algorithm = ALGORITHMS.get(config.algorithm)
  own = algorithm.defaults if algorithm is not None else {}
  if not own:
    return {}
  defaults = default_config()
  untouched = all(
    path not in given and lookup(config, path) == lookup(defaults, path) for path in own
  )
  if not untouched:
    return {}
  resumed = {} if saved is None else grouped(saved)
  applied = {}
  for path, value in own.items():
    *groups, name = path.split(".")
    taken = resumed.get(path, value)
    if isinstance(value, tuple):  # a checkpoint's JSON holds a tuple (outer.levels) as lists
      taken = _as_tuples(taken)
    lookup(config, ".".join(groups))[name] = applied[path] = taken
  return applied


def _as_tuples(value):
  """Lists, nested, as tuples."""
  return tuple(_as_tuples(v) for v in value) if isinstance(value, (list, tuple)) else value


def default_config() -> ml_collections.ConfigDict:
  """The configuration every config file starts from (configs/default.py returns it)."""
  return fields.default_config()


def lookup(config, path: str):
  """config["a"]["b"] for path "a.b" (config itself for "")."""
  return functools.reduce(lambda group, key: group[key], path.split(".") if path else (), config)


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
  """The fields read only by some algorithms that `algorithm`'s trajectory depends on
  (the pipeline's layout included: one partition a device, a ring of devices)."""
  return ALGORITHMS[algorithm].reads


def shapes_trajectory(field: str, algorithm: str, optimizer=None) -> bool:
  """Whether the dotted `field` can change what `algorithm` trains, as the field
  declares it (`fields.Shapes`; see the module doc).

  optimizer: the run's `optimizer` group, if known. Then the fields its
  optimizer and schedule do not read (easgd.rules.optimizers.unread_fields)
  do not shape it, and a schedule other than constant spans run.total_steps,
  which then does. Without it, every optimizer field counts and the schedule
  is taken as constant.
  """
  group = field.split(".", maxsplit=1)[0]
  shapes = _declared_shapes(field)
  if shapes == Shapes.NEVER:
    return False
  if group in ALGORITHMS[algorithm].ignored_groups:
    return False
  if shapes == Shapes.ALWAYS:
    return True
  if field == SCHEDULE_HORIZON:
    return optimizer is not None and optimizer["schedule"] != "constant"
  if optimizer is not None and group == "optimizer":
    unread = optimizers.unread_fields(optimizer["name"], optimizer["schedule"])
    if field.split(".", maxsplit=1)[1] in unread:
      return False
  return _read_by(field, algorithm)


def _declared_shapes(field: str) -> Shapes:
  """The field's declaration; for one of an earlier version that is no field now, what
  its group's fields are."""
  if field in fields.FIELDS:
    return fields.FIELDS[field].shapes
  group = field.split(".", maxsplit=1)[0]
  if group in RUN_GROUPS or field in stream.PLACEMENT_FIELDS:
    return Shapes.NEVER
  return Shapes.IF_READ if group in ALGORITHM_GROUPS else Shapes.ALWAYS


def _read_by(field: str, algorithm: str) -> bool:
  """Whether `algorithm` declares that it reads `field` (or its group)."""
  return any(field == read or field.startswith(read + ".") for read in reads(algorithm))


def mid_run_fields() -> tuple[str, ...]:
  """The fields a run may change when it resumes (declared `mid_run`)."""
  return tuple(field.path for field in fields.FIELDS_DECLARED if field.mid_run)


def check_mid_run(changing: Iterable[str], named: str) -> None:
  """ConfigError (one line naming `named`, where they were given) unless every field of
  `changing` is one a run may change when it resumes."""
  allowed = mid_run_fields()
  for field in changing:
    if field not in fields.FIELDS:
      raise ConfigError(f"{named}: {hint(field)}")
    if field not in allowed:
      raise ConfigError(
        f"{named}: config.{field} cannot change in the middle of a run (the state it "
        f"resumes depends on it); fields that can: {', '.join(allowed)}"
      )


def units(config: ml_collections.ConfigDict) -> int:
  """How many of what the algorithm spreads over the devices there are (`Algorithm.units`:
  the rules' workers, the pipeline's models)."""
  return lookup(config, ALGORITHMS[config.algorithm].units)


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
