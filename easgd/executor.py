"""Independent training runs, one after another or in parallel on Ray Tune.

A sweep's points and a study's runs are `Job`s: a name, the run's folder, its
steps, and what trains it: a train.py command (`command`), or a config trained in
the calling process (`config`, the studies'). `run(jobs, parallel)` runs them:

- without `Parallel`, one after another here, as they always ran: a train.py is
  this process's child and dies with it (easgd.ownership.die_with_parent), and a
  SIGTERM to this process is handed to the run that is training, which saves
  where it is; the jobs after it wait for the same command (`Stopped`);
- with `Parallel`, each job a trial of Ray Tune (easgd.tuning) with the resources
  it declares, on a Ray started here or a running cluster (`connected`).

The flags of a parallel run are checked here in one line each; what a job's
process is given, on any node, is easgd.jobs.forwarded_environment. On a cluster the jobs
write their folders on the nodes that run them: the workdir must be a folder every
node shares (NFS and the like); `check_shared` checks it before a job starts.
"""

import contextlib
import dataclasses
import math
import os
import secrets
import time

from easgd import arguments, ray_connection
from easgd.errors import ConfigError
from easgd.jobs import (
  LOG,
  Job,
  Outcome,
  Schedule,
  Stopped,
  preemption_notice,
  saved_step,
  train,
)

__all__ = [  # what the callers take from here, though easgd.jobs defines it
  "LOG",
  "Job",
  "Outcome",
  "Schedule",
  "Stopped",
]


# Ray counts a resource in steps of 1/10,000 of a unit.
_RAY_PRECISION = 10_000


def _ray_quantity(value: float) -> bool:
  return abs(value * _RAY_PRECISION - round(value * _RAY_PRECISION)) < 1e-6


@dataclasses.dataclass(frozen=True)
class Parallel:
  """How jobs run in parallel: at most `points` at once (None: as many as the cluster
  places), each with `cpus` CPUs and `gpus` GPUs (a fraction shares one), on a Ray
  at `address` ('' for one started on this machine), run again `retries` times when
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
    "--parallel", type=arguments.integer(1), default=None, help="runs at once, on Ray Tune"
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


# ---- Running jobs ----


def run(
  jobs: list[Job],
  parallel: Parallel | None,
  root: str,
  label: str = "run",
  say=print,
  schedule=None,
) -> list[Outcome]:
  """Runs `jobs`, whose folders lie under `root`; their outcomes, in their order.
  `label` begins every line said. With `parallel`, Ray is joined or started here
  (`connected`) unless the caller is inside `connected` already, and the jobs are
  Tune's trials (easgd.tuning; `schedule`: its scheduler, easgd.tuning.Schedule).
  A preemption notice (SIGTERM) stops the jobs where they are: Stopped."""
  if parallel is None:
    return _run_here(jobs, label, say)
  if not jobs:
    return []
  with connected(parallel):
    if parallel.address:
      say(f"{label}: on the Ray cluster at {parallel.address} ({parallel.address_from})")
      check_shared(root, parallel)
    from easgd import tuning  # noqa: PLC0415 (Ray Tune: only where jobs run on it)

    return tuning.run(jobs, parallel, root, label, say, schedule)


def _run_here(jobs: list[Job], label: str, say) -> list[Outcome]:
  """The jobs one after another; a SIGTERM is handed to the one training (a config
  job's run has its own handler), and the jobs after it are left: Stopped."""
  outcomes = []
  with preemption_notice() as notice:
    for job in jobs:
      if notice.is_set():
        raise Stopped(f"{job.name} and the runs after it have not started")
      say(f"{label}: {job.name}", flush=True)
      code = train(job, notice=notice)
      saved = saved_step(job.workdir)
      if notice.is_set() or (code == 0 and saved < job.total_steps):
        raise Stopped(f"{job.name} saved its step {saved}")
      outcomes.append(Outcome(code))
  return outcomes


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
    cpus = math.ceil((parallel.points or 1) * parallel.cpus)
    if not parallel.address:  # what the Ray it would start has, before it starts
      from easgd.train.runtimes.ray import runtime  # noqa: PLC0415 (Ray's count of GPUs)

      _check_resources(
        parallel, [{"Alive": True, "Resources": {"CPU": cpus, "GPU": runtime.local_gpus()}}]
      )
    try:
      if parallel.address:
        ray_connection.init(address=parallel.address, **options)
      else:
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
    if parallel.address:  # a cluster just started may not have registered its nodes yet
      waited = time.monotonic() + NODES_TIMEOUT
      while not any(_places(parallel, node) for node in ray.nodes()) and time.monotonic() < waited:
        time.sleep(1.0)
    _check_resources(parallel, ray.nodes())
    yield
  finally:
    if started:
      ray_connection.shutdown()


# Seconds a cluster has to show a node that can run a point, before the sweep is refused.
NODES_TIMEOUT = 60.0


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


# ---- The studies' runs ----


def config_jobs(runs: list[tuple[str, object, str]], cpu_devices: int) -> list[Job]:
  """(name, config, workdir) runs as jobs trained in their process, named "k/n name"."""
  return [
    Job(
      f"{number}/{len(runs)} {name}",
      workdir,
      config.run.total_steps,
      config=config,
      cpu_devices=cpu_devices,
    )
    for number, (name, config, workdir) in enumerate(runs, 1)
  ]


def maybe_connected(parallel: Parallel | None):
  """`connected(parallel)`, or nothing to do for runs one after another."""
  return connected(parallel) if parallel else contextlib.nullcontext()
