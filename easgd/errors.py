"""The errors train.py turns into one line and an exit status."""


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
