"""Independent training runs, one after another or in parallel as Ray tasks.

A sweep's points and a study's runs are `Job`s: a name, the run's folder, its
steps, and a function that trains it (a train.py process, `train_py`, or the
run in the calling process, `train_config`) and returns train.py's exit
status (0 finished, 1 diverged, other failed). `run(jobs, parallel)` runs them:

- without `Parallel`, one after another in this process, as they always ran;
- with `Parallel`, each job a Ray task in a process of its own (`max_calls=1`:
  a fresh JAX each time) with the resources it declares, a CPU count and a GPU
  or a fraction of one, placed by Ray's scheduler on this machine (a Ray that
  `run` starts and ends) or on a running cluster (`address`). At most
  `Parallel.points` run at once. A job's output goes to <workdir>/train.log,
  its progress is read from there, and one line a job says how it ended.

A job whose process is lost (killed, its node gone) or stopped before its
last step (SIGTERM: train.py saves and exits 0) is retried by Ray, up to
`Parallel.retries` times, and resumes from its own checkpoint. A run resumed
ends as one that never stopped, so a job's bits do not depend on where or
how often it ran: a job's process is given this process's JAX_* and XLA_*
variables, and this machine's processor count for XLA:CPU's thread pool
(PJRT_NPROC), on any node. Ray gives a process with no GPU every GPU of its
node to see: a job that declares none is shown none (CUDA_VISIBLE_DEVICES="")
and trains on the CPU (JAX_PLATFORMS=cpu unless set), and one with a fraction
of a GPU does not preallocate most of its memory
(XLA_PYTHON_CLIENT_PREALLOCATE=false), as JAX would. In a job run one after
another, a preemption notice (Stopped) ends the sequence instead.

On a cluster the jobs write their folders on the nodes that run them: the
workdir must be a folder every node shares (NFS and the like). `run` checks it
on each node before it starts a job, and refuses one line otherwise.
"""

import contextlib
import dataclasses
import math
import os
import re
import secrets
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable

from easgd import arguments, ray_connection
from easgd.durations import duration
from easgd.errors import ConfigError

# Seconds between two progress lines of a parallel run.
PROGRESS_EVERY = 30.0
# The file, in a job's folder, that holds its output when it runs as a Ray task.
LOG = "train.log"
# The progress line of a run (easgd.train.loop.Progress): "step 100/300 (33%), ...".
_STEP = re.compile(rb"step (\d+)/(\d+) \(")


class Stopped(RuntimeError):
  """A job's process was lost or stopped before its last step: Ray retries it, and it
  resumes from its checkpoint."""


@dataclasses.dataclass(frozen=True)
class Job:
  """One run: `call(*args)` trains it into `workdir` and returns train.py's exit status.

  `call` and `args` are pickled into the Ray task of a parallel run: a
  module-level function, and values that pickle.
  """

  name: str
  workdir: str
  total_steps: int
  call: Callable[..., int]
  args: tuple = ()


# Ray counts a resource in steps of 1/10,000 of a unit.
_RAY_PRECISION = 10_000


def _ray_quantity(value: float) -> bool:
  return abs(value * _RAY_PRECISION - round(value * _RAY_PRECISION)) < 1e-6


@dataclasses.dataclass(frozen=True)
class Parallel:
  """How jobs run in parallel: at most `points` at once (None: as many as the cluster
  places), each with `cpus` CPUs and `gpus` GPUs (a fraction shares one), on a Ray
  at `address` ('' for one started on this machine), retried `retries` times when
  their process is lost. `address_from` names where the address came from, for
  the refusals."""

  points: int | None = None
  cpus: float = 1.0
  gpus: float = 0.0
  address: str = ""
  address_from: str = "--ray_address"
  retries: int = 3

  def check(self) -> None:
    """ConfigError (one line) for a value Ray could not place."""
    if self.points is not None and self.points < 1:
      raise ConfigError(f"--parallel={self.points} is invalid: give the most runs at once, >= 1")
    if not (math.isfinite(self.cpus) and self.cpus > 0 and _ray_quantity(self.cpus)):
      raise ConfigError(
        f"--point_cpus={self.cpus:g} is invalid: must be a number > 0 in steps of 0.0001"
      )
    fraction = 0 < self.gpus < 1 and _ray_quantity(self.gpus)
    whole = math.isfinite(self.gpus) and self.gpus >= 1 and self.gpus.is_integer()
    if not (self.gpus == 0 or fraction or whole):
      raise ConfigError(
        f"--point_gpus={self.gpus:g} is invalid: give 0, a fraction of one GPU in (0, 1) "
        "in steps of 0.0001, or a whole number of GPUs"
      )
    if self.retries < 0:
      raise ConfigError(f"--point_retries={self.retries} is invalid: must be an integer >= 0")
    ray_connection.check(self.address, self.address_from)


def parallel_of(
  points: int | None,
  cpus: float | None,
  gpus: float | None,
  address: str,
  retries: int | None,
) -> Parallel | None:
  """The Parallel of the command line's flags (--parallel, --point_cpus, --point_gpus,
  --ray_address, --point_retries; None: not given), None for one after another:
  given neither --parallel nor an address. With --parallel an empty --ray_address
  takes $RAY_ADDRESS, as Ray does. ConfigError (one line) for a bad value, or for a
  point's flag where the runs go one after another."""
  if points is not None:
    address, address_from = ray_connection.resolve(address, "--ray_address")
  else:
    address_from = "--ray_address"
  if points is None and not address:
    given = [
      f"--{name}"
      for name, value in (("point_cpus", cpus), ("point_gpus", gpus), ("point_retries", retries))
      if value is not None
    ]
    if given:
      raise ConfigError(
        f"{' and '.join(given)} set what a run asks of Ray, but the runs go one after "
        "another: give --parallel N (or --ray_address) too, or drop them"
      )
    return None
  defaults = Parallel()
  parallel = Parallel(
    points,
    defaults.cpus if cpus is None else cpus,
    defaults.gpus if gpus is None else gpus,
    address,
    address_from,
    defaults.retries if retries is None else retries,
  )
  parallel.check()
  return parallel


def add_arguments(parser) -> None:
  """The same flags for an argparse program (the studies)."""
  parser.add_argument(
    "--parallel", type=arguments.integer(1), default=None, help="runs at once, as Ray tasks"
  )
  parser.add_argument("--point_cpus", type=float, default=None, help="CPUs a run asks for (1)")
  parser.add_argument("--point_gpus", type=float, default=None, help="GPUs a run asks for (0)")
  parser.add_argument("--ray_address", default="", help="a running Ray cluster's HOST:PORT")
  parser.add_argument(
    "--point_retries", type=arguments.integer(0), default=None, help="reruns of a lost run (3)"
  )


def from_arguments(args) -> Parallel | None:
  return parallel_of(
    args.parallel, args.point_cpus, args.point_gpus, args.ray_address, args.point_retries
  )


# ---- What a job runs ----


# Whether this process is a job's Ray task (`_task`): a process of its own
# (max_calls=1), which its train.py must not outlive.
_IN_TASK = False


def _death_signal():
  """In a Ray task on Linux, what a train.py child runs before it starts: it is killed
  when the task's process ends, so that a sweep killed with its Ray leaves no run
  writing into a folder that the next sweep resumes. prctl is looked up here, in the
  parent: the child between fork and exec only calls it. None elsewhere (one after
  another, a train.py is the sweep's own child, as it always was)."""
  if not (_IN_TASK and sys.platform.startswith("linux")):
    return None
  import ctypes  # noqa: PLC0415

  prctl = ctypes.CDLL(None, use_errno=True).prctl
  prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]
  parent = os.getpid()

  def die_with_parent():
    prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG
    if os.getppid() != parent:  # the parent ended before the call
      os.kill(os.getpid(), signal.SIGKILL)

  return die_with_parent


def train_py(command: list[str], workdir: str, total_steps: int) -> int:
  """Runs the train.py `command`; returns its exit status. In a Ray task, Stopped
  (which Ray retries) when the process died of a signal or stopped (exit 0: a
  SIGTERM) before it saved step `total_steps` in `workdir`."""
  code = subprocess.run(command, check=False, preexec_fn=_death_signal()).returncode
  if not _IN_TASK:
    return code
  from easgd.infra import checkpoint  # noqa: PLC0415 (orbax: only where a job runs)

  if code < 0:
    raise Stopped(f"its train.py process died of signal {-code}")
  if code == 0 and (checkpoint.saved_step(workdir) or 0) < total_steps:
    raise Stopped("its train.py process stopped before its last step")
  return code


def train_config(config, workdir: str, cpu_devices: int) -> int:
  """Trains `config` into `workdir` in this process, as the studies do; 1 if it
  diverged. In a Ray task (a fresh process) JAX is given `cpu_devices` CPU devices
  first, as the study's own process has, and INFO lines go to the run's log."""
  from absl import logging  # noqa: PLC0415

  from easgd.errors import TrainingDiverged  # noqa: PLC0415

  if _IN_TASK:
    import jax  # noqa: PLC0415

    jax.config.update("jax_num_cpu_devices", cpu_devices)
    logging.set_verbosity(logging.INFO)  # the progress lines the sweep reads
  from easgd.train import trainer  # noqa: PLC0415

  try:
    result = trainer.train_and_evaluate(config, workdir)
  except TrainingDiverged as error:
    logging.error("%s", error)
    return 1
  if result.preempted:
    raise Stopped("it stopped before its last step")
  return 0


# ---- Running jobs ----


@dataclasses.dataclass
class Outcome:
  """How a job ended: its exit status (None if it never gave one) and, for a failure,
  one line saying what happened."""

  code: int | None
  error: str = ""

  @property
  def status(self) -> str:
    if self.code == 0:
      return "done"
    if self.code == 1:
      return "diverged"
    return f"failed ({self.error or f'exit {self.code}'})"

  @property
  def failed(self) -> bool:
    return self.code not in (0, 1)


def run(
  jobs: list[Job], parallel: Parallel | None, root: str, label: str = "run", say=print
) -> list[Outcome]:
  """Runs `jobs`, whose folders lie under `root`; their outcomes, in their order.
  `label` begins every line said. With `parallel`, Ray is joined or started here
  (`connected`) unless the caller is inside `connected` already; without, a job
  stopped by a preemption notice (Stopped) ends the run of the jobs there."""
  if parallel is None:
    return [_run_here(job, label, say) for job in jobs]
  if not jobs:
    return []
  with connected(parallel):
    if parallel.address:
      say(f"{label}: on the Ray cluster at {parallel.address} ({parallel.address_from})")
      check_shared(root, parallel)
    return _run_on_ray(jobs, parallel, label, say)


def _run_here(job: Job, label: str, say) -> Outcome:
  """The job, here; Stopped (a preemption notice) goes up: the runs after it wait
  for the same command to resume them."""
  say(f"{label}: {job.name}", flush=True)
  return Outcome(job.call(*job.args))


@contextlib.contextmanager
def connected(parallel: Parallel):
  """Ray for `parallel`: joined at its address, or started on this machine with CPUs for
  `parallel.points` jobs (and shut down on leaving); the Ray this process is
  connected to already, if it is. ConfigError (one line) where Ray cannot start or
  connect, or where no node has the resources a job declares."""
  import ray  # noqa: PLC0415 (only a parallel run imports Ray)

  started = not ray.is_initialized()
  if started:
    options = {"include_dashboard": False, "log_to_driver": False, "logging_level": "ERROR"}
    try:
      if parallel.address:
        ray_connection.init(address=parallel.address, **options)
      else:
        cpus = math.ceil((parallel.points or 1) * parallel.cpus)
        ray_connection.init(address="local", num_cpus=cpus, **options)
    except (ConnectionError, RuntimeError, ValueError) as error:
      if parallel.address:
        raise ConfigError(
          f"{parallel.address_from}={parallel.address!r}: Ray could not connect "
          f"({arguments.first_line(error)}); {ray_connection.ALLOWED}"
        ) from None
      why = arguments.first_line(error)
      raise ConfigError(f"a Ray on this machine did not start: {why}") from None
  try:
    _check_resources(parallel, ray.nodes())
    yield
  finally:
    if started:
      ray.shutdown()


def _places(parallel: Parallel, node: dict) -> bool:
  """Whether `node` (an entry of ray.nodes()) is alive and has what one job asks for."""
  resources = node.get("Resources", {})
  enough = resources.get("CPU", 0) >= parallel.cpus and resources.get("GPU", 0) >= parallel.gpus
  return bool(node.get("Alive")) and enough


def _check_resources(parallel: Parallel, nodes: list[dict]) -> None:
  """ConfigError unless some alive node has the CPUs and GPUs one job asks for."""
  if any(_places(parallel, node) for node in nodes):
    return
  alive = [node["Resources"] for node in nodes if node.get("Alive")]
  most = max(alive, key=lambda r: (r.get("GPU", 0), r.get("CPU", 0)), default={})
  raise ConfigError(
    f"a run asks for {parallel.cpus:g} CPUs and {parallel.gpus:g} GPUs (--point_cpus, "
    f"--point_gpus), more than any node of the Ray cluster has (the most: "
    f"{most.get('CPU', 0):g} CPUs, {most.get('GPU', 0):g} GPUs): ask for less"
  )


# Seconds the nodes have to answer whether they see the workdir.
SHARED_TIMEOUT = 120.0


def check_shared(workdir: str, parallel: Parallel) -> None:
  """ConfigError (one line) unless every alive node that can run a job sees `workdir`
  as this process does: a job writes its folder on the node that runs it. Writes a
  token file into `workdir` (made if missing) and removes it."""
  import ray  # noqa: PLC0415
  from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy  # noqa: PLC0415

  token = secrets.token_hex(8)
  made = not os.path.exists(workdir)
  os.makedirs(workdir, exist_ok=True)
  path = os.path.join(os.path.abspath(workdir), f".shared-{token}")
  with open(path, "w") as handle:
    handle.write(token)
  nodes = [node for node in ray.nodes() if _places(parallel, node)]
  problem = None
  try:
    probe = ray.remote(num_cpus=0, max_retries=0)(_reads_token)
    answers = ray.get(
      [
        probe.options(
          scheduling_strategy=NodeAffinitySchedulingStrategy(node["NodeID"], soft=False)
        ).remote(path, token)
        for node in nodes
      ],
      timeout=SHARED_TIMEOUT,
    )
    blind = [
      node["NodeManagerAddress"] for node, seen in zip(nodes, answers, strict=True) if not seen
    ]
    if blind:
      problem = (
        f"{os.path.abspath(workdir)!r} is not shared with the Ray node(s) at "
        f"{', '.join(blind)}: each run writes its folder on the node that runs it, so on a "
        "cluster the workdir must be a folder every node mounts at the same path"
      )
  except (ray.exceptions.RayError, TimeoutError) as error:
    problem = (
      f"the Ray nodes could not say whether they see {os.path.abspath(workdir)!r} "
      f"({arguments.first_line(error)}): each node needs this project at the same path, "
      "in the same Python environment"
    )
  finally:
    os.remove(path)
  if problem:
    if made:
      os.rmdir(workdir)
    raise ConfigError(problem)


def _reads_token(path: str, token: str) -> bool:
  try:
    with open(path) as handle:
      return handle.read() == token
  except OSError:
    return False


def _task(call, args: tuple, cwd: str, log: str, gpus: float) -> int:
  """A job in its Ray worker process (a fresh one, max_calls=1), in the folder `cwd`
  where the run was asked for (its paths are relative to it), its output to `log`.

  A job of no GPU is shown none (Ray leaves every GPU visible to it, and JAX would
  take the first) and trains on the CPU unless JAX_PLATFORMS says otherwise; one
  of a fraction of a GPU takes its memory as it needs it, as the other jobs on the
  GPU do (unless XLA_PYTHON_CLIENT_PREALLOCATE says otherwise)."""
  global _IN_TASK  # noqa: PLW0603 (the process is this task's alone: max_calls=1)
  _IN_TASK = True
  os.chdir(cwd)
  if gpus == 0:
    os.environ["CUDA_VISIBLE_DEVICES"] = ""
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
  elif gpus < 1:
    os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
  os.makedirs(os.path.dirname(log), exist_ok=True)
  descriptor = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
  sys.stdout.flush()
  sys.stderr.flush()
  os.dup2(descriptor, 1)
  os.dup2(descriptor, 2)
  print(f"==== started in process {os.getpid()} on {socket.gethostname()}", flush=True)
  return call(*args)


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


def _run_on_ray(jobs: list[Job], parallel: Parallel, label: str, say) -> list[Outcome]:
  def retried(left: int) -> None:
    say(
      f"{label}: a run's process was lost or stopped; Ray runs it again ({left} retries left)",
      flush=True,
    )

  with ray_connection.lost_processes_in_our_words(retried):
    return _run_tasks(jobs, parallel, label, say)


def _run_tasks(jobs: list[Job], parallel: Parallel, label: str, say) -> list[Outcome]:
  import ray  # noqa: PLC0415

  task = ray.remote(max_calls=1)(_task).options(
    num_cpus=parallel.cpus,
    num_gpus=parallel.gpus,
    max_retries=parallel.retries,
    retry_exceptions=[Stopped],
    # JAX's and XLA's settings reach a job on any node as they reach one here.
    runtime_env={"env_vars": forwarded_environment()},
  )
  gpus = ray.cluster_resources().get("GPU", 0)
  if gpus and not parallel.gpus:
    say(
      f"{label}: each run asks for no GPU (--point_gpus 0), so they train on CPUs "
      f"beside the cluster's {gpus:g} GPUs"
    )
  limit = parallel.points or len(jobs)
  queued = list(enumerate(jobs))
  running: dict = {}  # ObjectRef -> job number
  outcomes: dict[int, Outcome] = {}
  progress = Progress(jobs)
  next_line = time.monotonic() + PROGRESS_EVERY
  while queued or running:
    while queued and len(running) < limit:
      number, job = queued.pop(0)
      log = os.path.abspath(os.path.join(job.workdir, LOG))
      running[task.remote(job.call, job.args, os.getcwd(), log, parallel.gpus)] = number
      progress.start(number)
    if time.monotonic() >= next_line:
      say(f"{label}: {progress.line(len(queued), sorted(running.values()), outcomes)}", flush=True)
      next_line = time.monotonic() + PROGRESS_EVERY
    ready, _ = ray.wait(list(running), num_returns=1, timeout=PROGRESS_EVERY)
    for ref in ready:
      number = running.pop(ref)
      outcomes[number] = _outcome(ray, ref)
      progress.end(number)
      job = jobs[number]
      where = f"; its output: {os.path.join(job.workdir, LOG)}" if outcomes[number].failed else ""
      say(f"{label}: {job.name} {outcomes[number].status}{where}", flush=True)
  return [outcomes[number] for number in range(len(jobs))]


def _outcome(ray, ref) -> Outcome:
  try:
    return Outcome(ray.get(ref))
  except ray.exceptions.RayTaskError as error:
    cause = error.cause if error.cause is not None else error
    return Outcome(None, arguments.first_line(cause))
  except ray.exceptions.RayError as error:  # its process or node lost, past the retries
    return Outcome(None, f"lost: {arguments.first_line(error)}")


class Progress:
  """What a parallel run's progress line says: jobs queued, running (each one's step,
  read from its log), finished and failed, and the time left at the pace so far."""

  def __init__(self, jobs: list[Job]):
    self.jobs = jobs
    self.began = time.monotonic()
    self.first_step: dict[int, int] = {}
    self.done_steps = 0  # steps trained by the jobs ended, in this run

  def start(self, number: int) -> None:
    self.first_step[number] = self.step(number)

  def end(self, number: int) -> None:
    self.done_steps += max(self.step(number) - self.first_step[number], 0)

  def step(self, number: int) -> int:
    """The last step the job's log reports (0 before its first report)."""
    path = os.path.join(self.jobs[number].workdir, LOG)
    try:
      with open(path, "rb") as log:
        log.seek(max(os.path.getsize(path) - 65536, 0))
        found = _STEP.findall(log.read())
    except OSError:
      return 0
    return int(found[-1][0]) if found else 0

  def line(self, queued: int, running: list[int], outcomes: dict[int, Outcome]) -> str:
    failed = sum(outcome.failed for outcome in outcomes.values())
    steps = {number: self.step(number) for number in running}
    parts = [
      f"{queued} queued",
      f"{len(running)} running ("
      + ", ".join(f"{self.jobs[n].name} at {steps[n]}/{self.jobs[n].total_steps}" for n in running)
      + ")",
      f"{len(outcomes) - failed} finished",
      f"{failed} failed",
    ]
    trained = self.done_steps + sum(max(steps[n] - self.first_step[n], 0) for n in running)
    left = sum(self.jobs[n].total_steps - steps[n] for n in running) + sum(
      self.jobs[n].total_steps - self.first_step.get(n, 0)
      for n in range(len(self.jobs))
      if n not in outcomes and n not in running
    )
    if trained:
      seconds = (time.monotonic() - self.began) / trained * left
      parts.append(f"about {duration(seconds)} left")
    return ", ".join(parts)


# ---- The studies' runs ----


def config_jobs(runs: list[tuple[str, object, str]], cpu_devices: int) -> list[Job]:
  """(name, config, workdir) runs as jobs trained in their process (`train_config`),
  named "k/n name"."""
  return [
    Job(
      f"{number}/{len(runs)} {name}",
      workdir,
      config.run.total_steps,
      train_config,
      (config, workdir, cpu_devices),
    )
    for number, (name, config, workdir) in enumerate(runs, 1)
  ]


def maybe_connected(parallel: Parallel | None):
  """`connected(parallel)`, or nothing to do for runs one after another."""
  return connected(parallel) if parallel else contextlib.nullcontext()
