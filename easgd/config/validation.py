"""Checks of a configuration before anything is compiled or written.

First every field on its own, as it is declared (easgd.config.fields: its
type and range); then what spans fields: the inner optimizer group whatever
the algorithm (easgd.rules.optimizer_checks), how the algorithm's units spread
over the devices, and what the algorithm asks (`Algorithm.check` of its entry
in easgd.registry: a rule's in easgd.rules.checks, the pipeline's in
easgd.pipeline.algorithm). What a runtime asks is the runtime's
(easgd.train.runtimes.registry.select). Which fields may change on resume comes from
easgd.config.hyperparameters.
"""

from collections.abc import Iterable

import ml_collections

from easgd.config import fields, hyperparameters
from easgd.data import batches
from easgd.errors import ConfigError, require
from easgd.infra import checkpoint, profiler, sharding
from easgd.registry import ALGORITHMS
from easgd.rules import optimizer_checks


def validate(config: ml_collections.ConfigDict) -> None:
  """Raises ConfigError naming the first field that is unknown or out of range."""
  # A config file may only set the fields there are: an old flat name or a
  # typo would otherwise be a field nothing reads.
  given = hyperparameters.flatten(config.to_dict())
  for field in given:
    if field not in fields.FIELDS:
      raise ConfigError(hyperparameters.hint(field))
  for field in fields.FIELDS_DECLARED:
    value = hyperparameters.lookup(config, field.path)
    require(field.allowed.accepts(value), field.path, value, field.allowed.text)
  why = profiler.refusal(config.run.profile, config.run.total_steps)
  require(why is None, profiler.PROFILE, config.run.profile, why)
  algorithm = ALGORITHMS[config.algorithm]
  optimizer_checks.check(config, algorithm.momenta(config))
  _require_spread(config, algorithm.units)
  _require_exclusive_off(config)
  algorithm.check(config)


def _require_exclusive_off(config: ml_collections.ConfigDict) -> None:
  """A field only some algorithms read (`Field.exclusive`) stays off for the others."""
  for field in fields.FIELDS_DECLARED:
    if not field.exclusive or field.path in hyperparameters.reads(config.algorithm):
      continue
    takes = ", ".join(name for name in ALGORITHMS if field.path in hyperparameters.reads(name))
    value = field.of(config)
    require(
      value == field.off,
      field.path,
      value,
      f"{config.algorithm} has no {field.exclusive} (leave it {field.off!r}); rules that "
      f"read it: {takes}",
    )


def _require_spread(config: ml_collections.ConfigDict, field: str) -> None:
  """run.devices divides config.<field> (workers or pipeline.models)."""
  count, devices = hyperparameters.lookup(config, field), config.run.devices
  require(
    devices == 0 or count % devices == 0,
    sharding.DEVICES,
    devices,
    f"must divide config.{field}={count} (each device holds {field}/devices of them)",
  )


def validate_partition(config: ml_collections.ConfigDict, train_examples: int, parts: int) -> None:
  """The batch must fit in each partition of the training set (a worker's or a device's)."""
  per_part = train_examples // parts
  owner = ALGORITHMS[config.algorithm].partition_owner
  require(
    config.data.batch_size <= per_part,
    batches.BATCH_SIZE,
    config.data.batch_size,
    f"must be <= {per_part}, the examples in each {owner}'s partition "
    f"({train_examples} {config.data.dataset} training examples over {parts} {owner}s)",
  )


def check_resumable(
  saved: dict,
  config: ml_collections.ConfigDict,
  workdir: str,
  revision: int,
  changing: Iterable[str] = (),
) -> None:
  """A workdir's checkpoint may only be resumed by a configuration that trains the same
  trajectory: only fields that do not shape it (easgd.config.hyperparameters) may differ,
  and its algorithm's equations must not have changed since the checkpoint's
  `revision` (easgd.infra.checkpoint.REVISION, `Algorithm.changed_since`). The fields
  of `changing` may differ too, a deliberate change (train.py --changed_fields), if
  each is one a run can change mid-run; an accidental change stays refused."""
  changing = set(changing)
  hyperparameters.check_mid_run(sorted(changing), "--changed_fields")
  # A checkpoint of an earlier version has flat names: compare under the grouped ones.
  saved = hyperparameters.grouped(saved)
  current = hyperparameters.flatten(config.to_dict())
  missing = [
    field
    for field in sorted(current)
    if field not in saved
    and hyperparameters.shapes_trajectory(field, config.algorithm, config.optimizer)
  ]
  if missing:
    # Its state has another structure too: nothing of it can be restored.
    raise ConfigError(
      f"workdir {workdir!r} holds a checkpoint written by an earlier version, whose config "
      f"has no config.{missing[0]}; this version cannot resume it: use another --workdir"
    )
  for field in sorted(set(saved) | set(current)):
    if field in changing:
      continue
    if not hyperparameters.shapes_trajectory(field, config.algorithm, config.optimizer):
      continue
    if saved.get(field) != current.get(field):
      raise ConfigError(
        f"workdir {workdir!r} holds a checkpoint of another configuration "
        f"(config.{field} is {saved.get(field)!r} there, {current.get(field)!r} here); "
        "use another --workdir or the same configuration"
      )
  # The same configuration: what may differ is what the rule's equations were then.
  changed = ALGORITHMS[config.algorithm].changed_since(revision, config.optimizer)
  if changed:
    raise ConfigError(
      f"workdir {workdir!r} holds a checkpoint of {config.algorithm} written by an earlier "
      f"version: {changed}; it cannot be resumed: use another --workdir"
    )


def check_checkpoint(
  config: ml_collections.ConfigDict, workdir: str, changing: Iterable[str] = ()
) -> dict | None:
  """`check_resumable` for the checkpoint in `workdir`, if there is one; returns its
  configuration (None: no checkpoint). Writes nothing."""
  saved = checkpoint.saved_config(workdir)
  if saved is not None:
    check_resumable(saved, config, workdir, checkpoint.saved_revision(workdir), changing)
  return saved
