"""A job: one training run (a sweep's point, a study's run), what trains it, and how it
ended; what easgd.executor runs one after another here and easgd.tuning as Ray Tune's
trials.

A job trains by train.py (`Job.command`, a process of its own that dies with the one
that started it: easgd.ownership.die_with_parent) or by its config in the calling
process (`Job.config`, the studies'), to its end or to a step it is asked to stop
after (`train`). Its process is given, on any node, the variables that decide what
it computes (`forwarded_environment`), so that it ends with the bits it has here.
"""

import contextlib
import dataclasses
import json
import os
import signal
import subprocess
import threading
from typing import Any

from easgd import ownership

# The file, in a job's folder, that holds its output when it runs on Ray.
LOG = "train.log"
# Seconds between two looks at a train.py that may have to be told of a notice.
_POLL = 0.5


def checkpoints(workdir: str) -> str:
  """The folder of a run's checkpoints (easgd.infra.checkpoint.directory)."""
  return os.path.join(os.path.abspath(workdir), "checkpoints")


def saved_step(workdir: str) -> int:
  """The step of the newest checkpoint of the job's run (0 for none), read from the
  folders' names as easgd.infra.checkpoint.saved_steps reads them (orbax names a
  checkpoint by its step once it is whole): the process that asks imports neither
  JAX nor orbax (a trial's starts in seconds; a train.py it starts next is the fork
  of a process without JAX's threads)."""
  try:
    names = os.listdir(checkpoints(workdir))
  except FileNotFoundError:
    return 0
  return max((int(name) for name in names if name.isdigit()), default=0)


class Stopped(RuntimeError):
  """A preemption notice stopped the jobs: the runs that were training saved where
  they were, and the same command resumes them."""


@dataclasses.dataclass(frozen=True)
class Job:
  """One run: `command` (train.py's, whose --workdir is `workdir`) or `config` (trained
  in the process that runs the job, with JAX given `cpu_devices` CPU devices);
  `values`: the (field, value) pairs that make it a point of a sweep."""

  name: str
  workdir: str
  total_steps: int
  command: tuple[str, ...] = ()
  config: Any = None
  cpu_devices: int = 8
  values: tuple = ()


@dataclasses.dataclass(frozen=True)
class Schedule:
  """A scheduler of Ray Tune over parallel jobs (easgd.tuning): "asha" (early stopping)
  or "pbt" (population-based training), on the run's logged `metric` (to "max" or
  "min": `mode`). Each job stops to report at each of `steps` (ascending, the last its
  total). ASHA's rungs are `steps` but the last (`reduction_factor` apart); PBT
  perturbs at each, over `fields` ((field, the values it may take) pairs), its draws
  seeded by `seed`."""

  scheduler: str
  metric: str
  mode: str
  steps: tuple[int, ...]
  reduction_factor: int = 3
  fields: tuple[tuple[str, tuple], ...] = ()
  seed: int = 0

  def describe(self) -> dict:
    """As JSON holds it (what a rerun compares with the sweep it resumes)."""
    return json.loads(json.dumps(dataclasses.asdict(self)))


def train(
  job: Job,
  *,
  stop_after: int | None = None,
  values: dict | None = None,
  notice: threading.Event | None = None,
  environment: dict | None = None,
) -> int:
  """Trains `job` (to step `stop_after`, or to its end) and returns train.py's exit
  status (0 finished or stopped as asked or noticed, 1 diverged, other failed; a
  negative one: killed by that signal). `values`: config fields whose values differ
  from the checkpoint's on purpose (population-based training's), passed with
  --changed_fields. `notice`: set, a preemption notice for the run. A command's
  process gets `environment` (None: this process's) and this process's output."""
  if job.config is not None:
    return _train_here(job, stop_after, values or {}, notice)
  command = list(job.command)
  if values:
    command += [f"--config.{field}={value}" for field, value in values.items()]
    command.append(f"--changed_fields={','.join(values)}")
  if stop_after is not None:
    command.append(f"--stop_after={stop_after}")
  child = subprocess.Popen(
    command,
    env=environment,
    preexec_fn=ownership.die_with_parent(),  # noqa: PLW1509 (it calls prctl only)
  )
  while True:
    try:
      return child.wait(timeout=_POLL if notice is not None else None)
    except subprocess.TimeoutExpired:
      if notice.is_set() and child.returncode is None:
        child.send_signal(signal.SIGTERM)  # it saves where it is, and exits 0
        notice = None


def _train_here(job: Job, stop_after, values: dict, notice) -> int:
  """A config job in this process; 1 if it diverged."""
  from absl import logging  # noqa: PLC0415

  from easgd.errors import TrainingDiverged  # noqa: PLC0415
  from easgd.train import trainer  # noqa: PLC0415 (JAX: only where a job trains)

  config = job.config
  if values:
    config = config.copy_and_resolve_references()
    config.update_from_flattened_dict(values)
  try:
    trainer.train_and_evaluate(
      config, job.workdir, stop_after=stop_after, changing=tuple(values), notice=notice
    )
  except TrainingDiverged as error:
    logging.error("%s", error)
    return 1
  return 0


@dataclasses.dataclass
class Outcome:
  """How a job ended: its exit status (None if it never gave one), for a failure one
  line saying what happened, and the step a scheduler stopped it at (early stopping:
  not a failure)."""

  code: int | None
  error: str = ""
  stopped_at: int | None = None
  # Population-based training's last values of the fields it explores.
  values: dict = dataclasses.field(default_factory=dict)

  @property
  def status(self) -> str:
    if self.stopped_at is not None:
      return f"stopped early (step {self.stopped_at})"
    if self.code == 0:
      return "done"
    if self.code == 1:
      return "diverged"
    return f"failed ({self.error or f'exit {self.code}'})"

  @property
  def failed(self) -> bool:
    return self.stopped_at is None and self.code not in (0, 1)


@contextlib.contextmanager
def preemption_notice():
  """While inside: a SIGTERM to this process (from the main thread) sets the event
  yielded instead of ending the process (a second one ends it)."""
  notice = threading.Event()
  if threading.current_thread() is not threading.main_thread():
    yield notice
    return

  def noticed(signum, frame):
    del frame
    signal.signal(signal.SIGTERM, previous)
    notice.set()

  previous = signal.signal(signal.SIGTERM, noticed)
  try:
    yield notice
  finally:
    signal.signal(signal.SIGTERM, previous)


# The variables of this process that a job's process is given on any node: JAX's and
# XLA's settings (flags, the compilation cache), which decide what a run computes.
FORWARDED_PREFIXES = ("JAX_", "XLA_")


def forwarded_environment() -> dict[str, str]:
  """JAX's and XLA's variables, and the processor count XLA:CPU sizes its thread pool
  by (PJRT_NPROC): this machine's, so that a job's convolutions round on any node as
  they do here (easgd.infra.sharding.cpu_threads)."""
  from easgd.infra import sharding  # noqa: PLC0415 (JAX: only where jobs start)

  environment = {
    name: value for name, value in os.environ.items() if name.startswith(FORWARDED_PREFIXES)
  }
  environment[sharding.CPU_THREADS_VARIABLE] = str(sharding.processors())
  return environment
