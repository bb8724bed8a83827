"""The errors train.py turns into one line and an exit status, and the one-line check."""

import math


class ConfigError(ValueError):
  """A configuration, dataset or workdir that the run cannot use.

  The message is one line naming what is wrong and what is allowed;
  train.py prints it and exits with status 2 before compiling or writing.
  """


class TrainingDiverged(RuntimeError):
  """The training loss stopped being finite; train.py exits with status 1."""


class CheckpointUnreadable(RuntimeError):
  """A process of a multi-process run could not read its part of a checkpoint and
  set the checkpoint aside; train.py exits with status 1 (rerun to resume)."""


class WorkerFailed(RuntimeError):
  """A worker thread of runtime=threads raised; the message names the worker, its
  step and the error. train.py exits with status 1."""


def require(ok: bool, field, value, allowed: str) -> None:
  """A ConfigError naming config.`field` (a dotted path, or a declared field:
  easgd.declare.Field), its `value` and what is `allowed`, unless `ok`."""
  if not ok:
    raise ConfigError(f"config.{getattr(field, 'path', field)}={value!r} is invalid: {allowed}")


def is_int(value) -> bool:
  """An int that is not a bool."""
  return isinstance(value, int) and not isinstance(value, bool)


def is_number(value) -> bool:
  """A finite int or float that is not a bool."""
  return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
