"""Jobs (easgd.jobs) in parallel on Ray Tune: each job a trial, Tune's schedulers
over a sweep's points, and a killed or stopped sweep resumed by Tuner.restore.

Each job is a trial (`Point`, a class trainable) in a process of its own with the
resources it declares (tune.with_resources: --point_cpus, --point_gpus), at most
`Parallel.points` at once (TuneConfig.max_concurrent_trials). A trial runs the job's
train.py (or, for a study's job, its config in the trial's process) with the
environment of the serial run (forwarded_environment), its output in
<job's workdir>/train.log, so that it ends with the bits the job has one after
another. A trial whose process is lost, or whose run stops short without being
asked, is run again by Tune (FailureConfig.max_failures: --point_retries) and
resumes from its own checkpoint. Tune's experiment is <root>/tune: a sweep killed
and run again is `Tuner.restore`d, its finished points skipped, the others resumed.

Without a scheduler a trial trains its run in one go. A schedule (Schedule) makes Tune's
scheduler decide between segments: the trial trains to the next of
`Schedule.steps` (train.py --stop_after, a checkpoint there) and reports the run's
logged metric at that step.

- ASHA (AsyncHyperBandScheduler) stops the points whose metric is below the
  rung's quantile; a stopped point keeps its checkpoint of that step, and its
  outcome says so (Tune's ResultGrid shows it as finished: a point's last step
  tells them apart).
- Population-based training (PopulationBasedTraining, synchronous) pauses every
  point at each perturbation step; the lower quantile's points copy an upper one's
  checkpoint (`Point.save_checkpoint`/`load_checkpoint` carry the run's checkpoint
  of that step) and explore: its named fields move to a neighbouring value of the
  sweep's, or to another one at random. The run resumes with them as a deliberate,
  recorded change (train.py --changed_fields). Tune's PBT draws from Python's
  `random`: `SeededPBT` seeds it from the schedule's seed and the step before each
  round, so that a PBT sweep is reproducible from its seed (its runs' bits are).

Tune's output is kept to one line every 30 s (`OneLine`) and one line a point as it
ends (`Lines`); Tune's own loggers are quiet and its per-trial result files are not
written (TensorBoard would list them as runs beside the points').

A preemption notice (SIGTERM to the sweep) is handed to every trial (`Notice`, an
actor): each running train.py saves where it is, then Tune is interrupted (as by
Ctrl-C: its state saved) and the sweep ends with Stopped.
"""

import dataclasses
import json
import logging
import math
import os
import random
import shutil
import signal
import socket
import sys
import threading
import time

# Tune's import of Ray Train takes Train's new engine, which needs pydantic; Tune's
# own needs none of it. Tune's newer console output ignores the reporter given.
os.environ.setdefault("RAY_TRAIN_V2_ENABLED", "0")
os.environ.setdefault("RAY_AIR_NEW_OUTPUT", "0")
os.environ.setdefault("TUNE_DISABLE_AUTO_CALLBACK_LOGGERS", "1")
os.environ.setdefault("RAY_TRAIN_ENABLE_V2_MIGRATION_WARNINGS", "0")

import ray  # noqa: E402
from ray import tune  # noqa: E402
from ray.tune.experiment import Trial  # noqa: E402
from ray.tune.schedulers import AsyncHyperBandScheduler, PopulationBasedTraining  # noqa: E402

from easgd import arguments, ray_connection  # noqa: E402
from easgd.durations import duration  # noqa: E402
from easgd.errors import ConfigError  # noqa: E402
from easgd.infra import scalars  # noqa: E402
from easgd.jobs import (  # noqa: E402
  LOG,
  Outcome,
  Schedule,
  Stopped,
  checkpoints,
  forwarded_environment,
  preemption_notice,
  saved_step,
  train,
)

# A run's record of its deliberate changes (easgd.train.trainer.CHANGES_FILE, which
# imports JAX): PBT's exploits are recorded there too.
CHANGES_FILE = "config_changes.jsonl"
# The experiment's folder under the root, and what it holds of the sweep it runs.
TUNE_DIR = "tune"
_DESCRIPTION = "sweep.json"
# Seconds between two progress lines.
PROGRESS_EVERY = 30.0
# A trial's name: its job's number.
_PREFIX = "point_"


def tune_scheduler(schedule: Schedule):
  """Tune's scheduler of `schedule`: ASHA with its rungs at the schedule's steps but
  the last, or PBT perturbing at each of them."""
  total = schedule.steps[-1]
  if schedule.scheduler == "asha":
    return AsyncHyperBandScheduler(
      time_attr="step",
      max_t=total,
      grace_period=schedule.steps[0],
      reduction_factor=schedule.reduction_factor,
      brackets=1,
    )
  return SeededPBT(
    schedule.seed,
    time_attr="step",
    perturbation_interval=schedule.steps[0],
    hyperparam_mutations={"point": {"fields": {f: list(v) for f, v in schedule.fields}}},
    synch=True,
  )


class SeededPBT(PopulationBasedTraining):
  """Tune's PopulationBasedTraining, its draws (which upper point a lower one copies,
  how each field moves) seeded from `seed` and the step before each round: Tune's
  takes no seed and draws from Python's global `random`, which other code of this
  process may draw from too."""

  def __init__(self, seed: int, **options):
    super().__init__(**options)
    self._seed = seed

  def on_trial_result(self, tune_controller, trial, result):
    random.seed(f"{self._seed}:{result.get(self._time_attr)}")
    return super().on_trial_result(tune_controller, trial, result)


@ray.remote(num_cpus=0)
class Notice:
  """A preemption notice for the trials: `wait` returns once `notify` was called;
  each trial whose run has saved says so (`saved`)."""

  def __init__(self):
    import asyncio  # noqa: PLC0415 (in the actor)

    self._given = asyncio.Event()
    self._saved = set()

  async def notify(self):
    self._given.set()

  async def wait(self):
    await self._given.wait()
    return True

  async def saved(self, number: int):
    self._saved.add(number)

  async def saved_points(self):
    return sorted(self._saved)


def _trial_name(trial) -> str:
  """A trial's name and folder: its job's number, made from the configuration it starts
  with; it keeps it when PBT gives it another point's configuration."""
  return f"{_PREFIX}{trial.config['point']['index']}"


def _number(trial) -> int:
  """A trial's job's number, by its name (not by its configuration: PBT copies that)."""
  return int(str(trial).removeprefix(_PREFIX))


class Point(tune.Trainable):
  """One job as Tune's trial; its step trains to the schedule's next stop."""

  def setup(self, config, jobs=(), environment=None, gpus=0.0, cwd=".", notice=None, schedule=None):
    del config
    self.number = int(self.trial_name.removeprefix(_PREFIX))
    self.jobs = jobs
    self.job = jobs[self.number]
    self.schedule = schedule
    self.noticed = threading.Event()
    self.notice = notice
    os.chdir(cwd)  # where the sweep was started: its paths are relative to it
    _this_process_is_the_jobs(self.job, environment or {}, gpus)
    if notice is not None:
      threading.Thread(target=self._wait_for_notice, daemon=True).start()

  def _wait_for_notice(self):
    ray.get(self.notice.wait.remote())
    self.noticed.set()

  def step(self):
    job = self.job
    start = saved_step(job.workdir)
    if start >= job.total_steps:
      return self._result(job.total_steps, "done")
    if self.noticed.is_set():
      self._saved()
    steps = self.schedule.steps if self.schedule else ()
    stop = next((s for s in steps if s > start), None)
    stop = stop if stop is not None and stop < job.total_steps else None
    values = self.config["point"]["fields"]
    code = train(
      job, stop_after=stop, values=values or None, notice=self.noticed, environment=os.environ
    )
    saved = saved_step(job.workdir)
    if self.noticed.is_set():
      self._saved()
    if code == 1:
      return self._result(saved, "diverged")
    if code < 0:
      raise RuntimeError(f"its train.py died of signal {-code}")
    if code != 0:
      return self._result(saved, f"failed (exit {code})")
    if saved >= job.total_steps:
      return self._result(saved, "done")
    if stop is None or saved < stop:
      raise RuntimeError("its train.py stopped before its last step")
    return self._result(saved, "segment")

  def _saved(self):
    """After a notice: this trial's run has saved (or never started); it waits for the
    sweep to end it."""
    ray.get(self.notice.saved.remote(self.number))
    threading.Event().wait()

  def _result(self, step: int, outcome: str) -> dict:
    """What Tune is told at `step`: the outcome, and the run's logged values there (the
    scheduler's metric among them; a run without it, one that diverged, scores the
    worst)."""
    logged = scalars.read(self.job.workdir)
    values = {tag: dict(points)[step] for tag, points in logged.items() if step in dict(points)}
    if self.schedule is not None:
      metric = self.schedule.metric
      if outcome == "diverged" or not math.isfinite(values.get(metric, math.nan)):
        values[metric] = -math.inf if self.schedule.mode == "max" else math.inf
    return {**values, "step": step, "outcome": outcome, "done": outcome != "segment"}

  def save_checkpoint(self, checkpoint_dir):
    """The run's checkpoint of the step it reported: what PBT copies to another point."""
    step = saved_step(self.job.workdir)
    source = os.path.join(checkpoints(self.job.workdir), str(step))
    shutil.copytree(source, os.path.join(checkpoint_dir, "state"))
    with open(os.path.join(checkpoint_dir, "point.json"), "w") as handle:
      json.dump({"number": self.number, "step": step}, handle)
    return checkpoint_dir

  def load_checkpoint(self, checkpoint_dir):
    """Another point's checkpoint (PBT's exploit) replaces this run's of that step and
    later, and the run's config_changes.jsonl says so: which point's, at which step,
    and how the explored fields' values differ from the run's own (its explore, when
    it resumes, is recorded by train.py). This run's own checkpoint is where it is
    already (its folder is newer or the same)."""
    with open(os.path.join(checkpoint_dir, "point.json")) as handle:
      saved = json.load(handle)
    if saved["number"] == self.number:
      return
    step, folder = saved["step"], checkpoints(self.job.workdir)
    own = _config_of(folder, max((int(n) for n in os.listdir(folder) if n.isdigit()), default=0))
    copied = _config_of(checkpoint_dir, "state")
    for name in os.listdir(folder):
      if name.isdigit() and int(name) >= step:
        shutil.rmtree(os.path.join(folder, name))
    shutil.copytree(os.path.join(checkpoint_dir, "state"), os.path.join(folder, str(step)))
    source = os.path.basename(os.path.normpath(self.jobs[saved["number"]].workdir))
    fields = {
      field: [_value(own, field), _value(copied, field)]
      for field, _ in (self.schedule.fields if self.schedule else ())
      if _value(own, field) != _value(copied, field)
    }
    with open(os.path.join(self.job.workdir, CHANGES_FILE), "a") as handle:
      handle.write(json.dumps({"step": step, "copied": source, "fields": fields}) + "\n")
    print(
      f"==== point {self.number} copied point {saved['number']}'s checkpoint of step "
      f"{step} (population-based training's exploit)",
      flush=True,
    )


def _config_of(folder: str, step) -> dict:
  """The configuration saved with the checkpoint `folder`/`step` ({} if none)."""
  try:
    with open(os.path.join(folder, str(step), "config", "metadata")) as handle:
      return json.load(handle)
  except (OSError, ValueError):
    return {}


def _value(config: dict, field: str):
  """config["a"]["b"] for the field "a.b" (None if it has none)."""
  for key in field.split("."):
    config = config.get(key, {}) if isinstance(config, dict) else {}
  return None if config == {} else config


def _this_process_is_the_jobs(job, environment: dict, gpus: float) -> None:
  """The trial's process as a job's run needs it: the serial run's JAX and XLA
  settings (`environment`), its output in the job's log, and its devices. A job of
  no GPU is shown none (Ray leaves every GPU visible to it, and JAX would take the
  first) and trains on the CPU unless JAX_PLATFORMS says otherwise; one of a
  fraction of a GPU takes its memory as it needs it, as the other jobs on the GPU
  do (unless XLA_PYTHON_CLIENT_PREALLOCATE says otherwise). A runtime=ray job
  starts a Ray of its own, as its train.py does (RAY_ADDRESS is the sweep's)."""
  os.environ.update(environment)
  os.environ.pop("RAY_ADDRESS", None)
  if gpus == 0:
    os.environ["CUDA_VISIBLE_DEVICES"] = ""
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
  elif gpus < 1:
    os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
  log = os.path.abspath(os.path.join(job.workdir, LOG))
  os.makedirs(os.path.dirname(log), exist_ok=True)
  descriptor = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
  sys.stdout.flush()
  sys.stderr.flush()
  os.dup2(descriptor, 1)
  os.dup2(descriptor, 2)
  os.close(descriptor)
  print(f"==== started in process {os.getpid()} on {socket.gethostname()}", flush=True)
  if job.config is not None:
    import jax  # noqa: PLC0415 (a study's job: its config trains in this process)
    from absl import logging as absl_logging  # noqa: PLC0415

    jax.config.update("jax_num_cpu_devices", job.cpu_devices)
    absl_logging.set_verbosity(absl_logging.INFO)


# ---- What the sweep says ----


def _outcome(trial) -> Outcome:
  """How a trial ended, as the jobs' outcomes say it."""
  if trial.status == Trial.ERROR:
    return Outcome(None, _error_line(trial))
  return _outcome_of(trial.last_result or {})


def _outcome_of(result: dict) -> Outcome:
  """How a trial that did not fail ended, by its last result."""
  outcome = result.get("outcome", "")
  if outcome == "segment":
    return Outcome(0, stopped_at=result["step"])
  if outcome == "done":
    return Outcome(0)
  if outcome == "diverged":
    return Outcome(1)
  code = outcome.removeprefix("failed (exit ").removesuffix(")")
  if code.lstrip("-").isdigit():
    return Outcome(int(code))
  return Outcome(None, outcome.removeprefix("failed (").removesuffix(")"))


def _error_line(trial) -> str:
  text = (trial.error_msg or "").strip().splitlines()
  last = next((line for line in reversed(text) if line.strip()), "")
  return f"lost: {last[:200]}" if last else "lost"


@dataclasses.dataclass
class _Live:
  """What this sweep's reporter and callback use: Tune keeps them, pickled, with its
  experiment (a restored one brings its own), so they read this instead."""

  jobs: list
  label: str
  say: object
  notice: object
  noticed: threading.Event
  began: float = dataclasses.field(default_factory=time.monotonic)
  last_line: float = dataclasses.field(default_factory=time.monotonic)
  handed: bool = False
  interrupted: bool = False


_LIVE: _Live | None = None


class OneLine(tune.ProgressReporter):
  """Tune's progress report as one line every PROGRESS_EVERY seconds: how many points
  of how many have ended (done, stopped early, diverged, failed), are running and
  wait, and the time so far."""

  def should_report(self, trials, done=False):
    return not done and time.monotonic() - _LIVE.last_line >= PROGRESS_EVERY

  def report(self, trials, done, *sys_info):
    del done, sys_info
    _LIVE.last_line = time.monotonic()
    so_far = duration(_LIVE.last_line - _LIVE.began)
    line = progress(trials, len(_LIVE.jobs))
    _LIVE.say(f"{_LIVE.label}: {line}, {so_far} so far", flush=True)


def progress(trials, points: int) -> str:
  """The progress line's counts, of `points` in all (Tune makes trials as they start)."""
  ended = [t for t in trials if t.status in (Trial.TERMINATED, Trial.ERROR)]
  kinds = {}
  for trial in ended:
    status = _outcome(trial).status
    kind = status.split(" (")[0] if not status.startswith("stopped early") else "stopped early"
    kinds[kind] = kinds.get(kind, 0) + 1
  parts = ", ".join(f"{count} {kind}" for kind, count in kinds.items())
  running = sum(t.status == Trial.RUNNING for t in trials)
  waiting = points - len(ended) - running
  line = f"{len(ended)} of {points} points ended"
  return f"{line}{f' ({parts})' if parts else ''}, {running} running, {waiting} waiting"


class Lines(tune.Callback):
  """One line a point as it ends, and one as Tune runs a lost one again; and, after a
  preemption notice, the notice handed to the trials and Tune interrupted once every
  running one has saved."""

  @staticmethod
  def _say(trial, what: str) -> None:
    _LIVE.say(f"{_LIVE.label}: {_LIVE.jobs[_number(trial)].name} {what}", flush=True)

  def on_trial_complete(self, iteration, trials, trial, **info):
    self._say(trial, _outcome(trial).status)

  def on_trial_error(self, iteration, trials, trial, **info):
    log = os.path.join(_LIVE.jobs[_number(trial)].workdir, LOG)
    self._say(trial, f"{_outcome(trial).status}; its output: {log}")

  def on_trial_recover(self, iteration, trials, trial, **info):
    self._say(trial, "lost its process or stopped short; Tune runs it again, from its checkpoint")

  def on_step_begin(self, iteration, trials, **info):
    live = _LIVE
    if not live.noticed.is_set() or live.interrupted:
      return
    if not live.handed:
      live.notice.notify.remote()
      live.handed = True
    running = {_number(t) for t in trials if t.status == Trial.RUNNING}
    if running <= set(ray.get(live.notice.saved_points.remote())):
      live.interrupted = True
      signal.raise_signal(signal.SIGINT)  # Tune's own stop: its state saved, for a rerun


# ---- Running the jobs ----


def run(jobs, parallel, root: str, label: str, say, schedule: Schedule | None):
  """The jobs as Tune's trials on the Ray this process is connected to; their
  outcomes, in their order. Stopped after a preemption notice."""
  global _LIVE  # noqa: PLW0603 (one sweep a process at a time)
  logging.getLogger("ray.tune").setLevel(logging.CRITICAL)  # what ends how is said here
  logging.getLogger("ray.train").setLevel(logging.CRITICAL)
  path = os.path.join(os.path.abspath(root), TUNE_DIR)
  notice = Notice.remote()
  trainable = tune.with_resources(
    tune.with_parameters(
      Point,
      jobs=list(jobs),
      environment=forwarded_environment(),
      gpus=parallel.gpus,
      cwd=os.getcwd(),
      notice=notice,
      schedule=schedule,
    ),
    {"cpu": parallel.cpus, "gpu": parallel.gpus},
  )
  gpus = ray.cluster_resources().get("GPU", 0)
  if gpus and not parallel.gpus:
    say(
      f"{label}: each run asks for no GPU (--point_gpus 0), so they train on CPUs "
      f"beside the cluster's {gpus:g} GPUs"
    )
  with preemption_notice() as noticed:
    _LIVE = _Live(list(jobs), label, say, notice, noticed)
    tuner = _tuner(jobs, parallel, path, schedule, trainable, label, say)
    with ray_connection.lost_processes_in_our_words():
      grid = tuner.fit()
  trials = {int(os.path.basename(result.path).removeprefix(_PREFIX)): result for result in grid}
  if noticed.is_set():
    saved = ray.get(notice.saved_points.remote())
    raise Stopped(f"{len(saved)} running points saved where they were")
  outcomes = []
  for number in range(len(jobs)):
    result = trials.get(number)
    outcomes.append(_result_outcome(result))
  return outcomes


def _result_outcome(result) -> Outcome:
  """A ResultGrid entry's outcome, with PBT's last values of its fields."""
  if result is None:
    return Outcome(None, "not run")
  if result.error is not None:
    cause = getattr(result.error, "cause", None) or result.error
    return Outcome(None, f"lost: {arguments.first_line(cause)}")
  outcome = _outcome_of(result.metrics or {})
  outcome.values = dict((result.config or {}).get("point", {}).get("fields", {}))
  return outcome


def _tuner(jobs, parallel, path, schedule, trainable, label, say):
  """Tune's Tuner: the experiment at `path` restored when it is this sweep's (its
  finished points skipped, the others resumed from their checkpoints), else a new
  one. ConfigError where `path` holds another sweep's scheduled experiment."""
  description = {
    "points": [job.name for job in jobs],
    "schedule": schedule.describe() if schedule else None,
  }
  stored = None
  if tune.Tuner.can_restore(path):
    try:
      with open(os.path.join(path, _DESCRIPTION)) as handle:
        stored = json.load(handle)
    except (OSError, ValueError):
      stored = {}
    if stored == description:
      say(f"{label}: resuming the sweep's Tune experiment in {path}", flush=True)
      for job in jobs:
        if (saved_step(job.workdir)) >= job.total_steps:
          say(f"{label}: {job.name} is finished", flush=True)
      return tune.Tuner.restore(path, trainable, resume_unfinished=True, resume_errored=True)
    if schedule is not None or (stored or {}).get("schedule") is not None:
      raise ConfigError(
        f"{path} holds the Tune experiment of a sweep with other points or another "
        "scheduler, which a rerun resumes: run the same command, or use another --workdir"
      )
    shutil.rmtree(path)
  points = [
    {"index": number, "fields": _initial_values(job, schedule)} for number, job in enumerate(jobs)
  ]
  pbt = schedule is not None and schedule.scheduler == "pbt"
  tuner = tune.Tuner(
    trainable,
    param_space={"point": tune.grid_search(points)},
    tune_config=tune.TuneConfig(
      metric=schedule.metric if schedule else None,
      mode=schedule.mode if schedule else None,
      scheduler=tune_scheduler(schedule) if schedule else None,
      # PBT pauses each point until every point reached the round's step: a point
      # waiting must not hold back one not yet started (resources alone decide).
      max_concurrent_trials=None if pbt else parallel.points,
      reuse_actors=False,
      trial_name_creator=_trial_name,
      trial_dirname_creator=_trial_name,
    ),
    run_config=tune.RunConfig(
      name=TUNE_DIR,
      storage_path=os.path.dirname(path),
      verbose=1,
      progress_reporter=OneLine(),
      callbacks=[Lines()],
      failure_config=tune.FailureConfig(max_failures=parallel.retries),
      # A point's own checkpoints are in its folder: Tune keeps copies only for PBT.
      checkpoint_config=tune.CheckpointConfig(num_to_keep=3 if pbt else 1, checkpoint_at_end=False),
    ),
  )
  with open(os.path.join(path, _DESCRIPTION), "w") as handle:
    json.dump(description, handle)
  return tuner


def _initial_values(job, schedule: Schedule | None) -> dict:
  """The point's values of the fields PBT explores (from its own config)."""
  if schedule is None or schedule.scheduler != "pbt":
    return {}
  values = dict(job.values)
  return {field: values[field] for field, _ in schedule.fields}
