"""runtime=ray: the parameter-server rules with every worker in a process of its own.

The workers and the servers are Ray actors (easgd.train.runtimes.ray.workers):
on one machine an embedded Ray that the run starts and ends
(`ray.init(address="local")`, its processes at the run's priority:
easgd.ray_connection.system_config),
on a cluster the one at config.ray.address ("auto": the cluster this node
joined with `ray start`; '' also reads RAY_ADDRESS). The loop's side is
runtime=threads' (the trainee below is its trainee with other workers): the
same consistent cuts at the loop's log, evaluation and checkpoint steps, the
same trace, which `cluster.replay` drives the simulated runtime through to
the same bits.

Ray is imported only by a run that uses it: other runs do not pay for its
import, and a missing Ray is refused in one line.
"""

import contextlib
import importlib.util
import os

import jax
import ml_collections
import numpy as np
from absl import logging

import easgd
from easgd import assembly, ray_connection
from easgd.errors import ConfigError, require
from easgd.infra import compile as compile_lib
from easgd.infra import platform, sharding
from easgd.rules import RULES, tiers
from easgd.train.runtimes.ray import fields
from easgd.train.runtimes.rule_runtime import parameter_server_rules
from easgd.train.runtimes.simulated.fields import REPLAY
from easgd.train.runtimes.threads.runtime import ThreadsRuntime, ThreadsTrainee, round_rules

# The root that holds the easgd package: the actors' processes import it from there.
PACKAGE_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(easgd.__file__)))


def ray_rules() -> tuple[str, ...]:
  """The rules runtime=ray runs: those whose lost worker can rejoin (`rejoins`)."""
  return tuple(name for name in parameter_server_rules() if RULES[name].rejoins)


def _numpy(tree):
  return jax.tree.map(np.asarray, tree)


def check_address(config: ml_collections.ConfigDict) -> str:
  """The address to connect to (config.ray.address, else RAY_ADDRESS; '' for an
  embedded Ray); ConfigError (one line naming where it came from) for one that
  cannot be reached."""
  address, named = ray_connection.resolve(config.ray.address, "config.ray.address")
  ray_connection.check(address, named)
  return address


def local_gpus() -> int:
  """The GPUs a Ray started on this machine would have: those Ray's NVIDIA manager
  finds, within CUDA_VISIBLE_DEVICES. (Ray's own detection, which has no public
  form before a Ray starts.)"""
  from ray._private import accelerators  # noqa: PLC0415 (module docstring)

  manager = accelerators.get_accelerator_manager_for_resource("GPU")
  count = manager.get_current_node_num_accelerators()
  visible = manager.get_current_process_visible_accelerator_ids()
  return count if visible is None else min(count, len(visible))


def check_gpus(config: ml_collections.ConfigDict) -> None:
  """ConfigError (one line) unless the workers' GPUs (workers x ray.worker_gpus) are
  within what the cluster has: a cluster the address names is joined now (the run
  keeps the connection: nothing is written or started there), a Ray this process
  has is asked; for a Ray the run would start, this machine's GPUs as Ray finds
  them (nothing is started). An address that cannot be reached or joined is
  refused too."""
  import ray  # noqa: PLC0415 (module docstring)

  address = check_address(config)
  wanted = config.workers * config.ray.worker_gpus
  if address or ray.is_initialized():
    connect(config)
    have, where = ray.cluster_resources().get("GPU", 0.0), "the Ray cluster has"
  elif wanted:
    have, where = local_gpus(), "this machine, whose Ray the run starts, has"
  else:
    return
  require(
    wanted <= have,
    fields.WORKER_GPUS,
    config.ray.worker_gpus,
    f"{config.workers} workers would take {wanted:g} GPUs; {where} {have:g}",
  )


# The CPU share each worker and server process asks Ray for: a token, so that a
# node of one CPU holds a hundred, and Ray's SPREAD alternates them over the nodes.
ACTOR_CPUS = 0.01


def connect(config: ml_collections.ConfigDict) -> bool:
  """Connects this process to Ray (config.ray.address), or starts an embedded one;
  True if it started one (which the run shuts down). ConfigError (one line) for an
  address that cannot be reached."""
  import ray  # noqa: PLC0415 (module docstring)

  if ray.is_initialized():
    return False
  address, named = ray_connection.resolve(config.ray.address, "config.ray.address")
  ray_connection.check(address, named)
  try:
    # "local": a new embedded Ray. None would join the cluster `ray start` (or
    # ray.cluster_utils) last started on this machine, running or not.
    ray_connection.init(
      address=address or "local",
      include_dashboard=False,
      log_to_driver=False,
      logging_level="ERROR",
    )
  except (ConnectionError, RuntimeError, ValueError) as error:
    first = str(error).splitlines()[0] if str(error) else type(error).__name__
    raise ConfigError(
      f"{named}={address!r}: Ray could not connect ({first}); {ray_connection.ALLOWED}"
    ) from None
  return not address


class RayTrainee(ThreadsTrainee):
  """runtime=threads' trainee, its workers and servers Ray actors."""

  def __init__(self, *args, started_ray: bool, **kwargs):
    self.started_ray = started_ray
    # A lost worker process is said in the run's own line (it rejoins, leaves or
    # stops the run): Ray's page about it is left out while the run lasts.
    self._quiet = contextlib.ExitStack()
    self._quiet.enter_context(ray_connection.lost_processes_in_our_words())
    super().__init__(*args, **kwargs)

  def _workers(self, rule, setup, rows, clock, trace, pacing):
    import ray  # noqa: PLC0415 (module docstring)

    from easgd.train.runtimes.ray import actors as ray_actors  # noqa: PLC0415 (they import ray)
    from easgd.train.runtimes.ray import workers as ray_workers  # noqa: PLC0415

    config = setup.config
    dataset = setup.dataset
    recipe = ray_actors.Recipe(
      config.to_dict(),
      dataset.num_classes,
      tuple(dataset.train_images.shape[1:]),
      assembly.Normalization.of(dataset),
    )
    gpus = config.ray.worker_gpus
    worker_platform = "gpu" if gpus else "cpu"
    # Spread over the nodes (Ray's SPREAD strategy): on a cluster with as many nodes
    # as workers each worker gets a node, and the servers are spread too. Actors that
    # asked for no resources were spread unevenly (3 of 4 on one node of two, on
    # ray.cluster_utils' two nodes); a token share of a CPU each alternates them.
    options = {"num_cpus": ACTOR_CPUS, "scheduling_strategy": "SPREAD"}
    center, center_opt = _numpy(rows.center), _numpy(rows.center_opt)
    fields = rule.request_fields()
    row = {"workers": _numpy(rows.workers[0]), **{f: _numpy(rows.worker_opt[0][f]) for f in fields}}
    row["worker_steps"] = np.zeros(1, np.int32)
    rng = np.asarray(jax.device_get(self.rng))
    # The servers run the master's operations on a CPU, whatever the workers run on.
    settings = {"max_restarts": 0, "runtime_env": {"env_vars": _actor_environment(0)}}
    global_server = None
    if rule.hyper.two_tier:
      # A process a group server, one for the global server: each whole (ray.servers 1).
      groups = center_opt["groups"]
      blocks = ray_actors.Blocks(groups[0]["center"], 1)
      group_class = ray.remote(ray_actors.GroupServerProcess).options(**settings, **options)
      like = (center, center_opt["global"])
      servers = [group_class.remote(recipe, group, like, row, rng, "cpu") for group in groups]
      global_class = ray.remote(ray_actors.GlobalServerProcess).options(**settings, **options)
      global_server = global_class.remote(recipe, center, center_opt["global"], groups[0], "cpu")
    else:
      blocks = ray_actors.Blocks(center, config.ray.servers)
      server_class = ray.remote(ray_actors.ServerProcess).options(**settings, **options)
      servers = [
        server_class.remote(
          recipe,
          blocks.part(center, s),
          blocks.opt_part(center_opt, s),
          blocks.row_part(row, s),
          rng,
          "cpu",
        )
        for s in range(config.ray.servers)
      ]
    fresh_opt = _numpy(jax.jit(rule.fresh_worker_opt)(rows.workers[0]))
    restarts = -1 if config.cluster.on_worker_loss == "rejoin" else 0
    worker_class = ray.remote(ray_actors.WorkerProcess).options(
      max_restarts=restarts,
      max_task_retries=0,
      num_gpus=gpus,
      runtime_env={"env_vars": _actor_environment(gpus)},
      **options,
    )
    # A restarted worker's process is built again from its constructor's arguments: they
    # are put in the object store here and held until the run ends, so that they outlive
    # the first construction.
    arguments = [
      None
      if j in clock.gone
      else [
        ray.put(argument)
        for argument in (
          j,
          recipe,
          (_numpy(rows.workers[j]), _numpy(rows.worker_opt[j])),
          _numpy(rows.images[j]),
          _numpy(rows.labels[j]),
          rng,
          fresh_opt,
          blocks,
          fields,
          worker_platform,
        )
      ]
      for j in range(config.workers)
    ]
    actors = [None if held is None else worker_class.remote(*held) for held in arguments]
    every_server = [*servers, *([global_server] if global_server is not None else [])]
    try:
      ray.get([server.where.remote() for server in every_server])
      places = ray.get([actor.where.remote() for actor in actors if actor is not None])
    except ray.exceptions.RayError as error:
      for handle in [*every_server, *actors]:
        if handle is not None:
          ray.kill(handle, no_restart=True)
      first = str(error).strip().splitlines()[-1] if str(error).strip() else ""
      raise RuntimeError(f"the worker and server processes did not start: {first}") from None
    live = [j for j, actor in enumerate(actors) if actor is not None]
    incarnations = [None] * config.workers
    for j, (pid, host, node, incarnation) in zip(live, places, strict=True):
      trace.process(j, pid, host)
      clock.events += 1
      incarnations[j] = incarnation
      logging.info("worker %d runs in process %d on %s (Ray node %s)", j, pid, host, node)
    pool = ray_workers.RayWorkers(
      actors,
      servers,
      blocks,
      fresh_opt,
      config.cluster.on_worker_loss,
      rule,
      rows,
      self.devices,
      (None, None),
      clock,
      trace,
      *pacing,
      global_server=global_server,
    )
    pool.held = arguments
    pool.incarnations = incarnations
    return pool

  def close(self):
    try:
      super().close()
    finally:
      self._quiet.close()
      if self.started_ray:
        ray_connection.shutdown()


# JAX's variable that, set to "false", has a GPU process take memory as it needs
# it rather than most of the device at start.
PREALLOCATE_VARIABLE = "XLA_PYTHON_CLIENT_PREALLOCATE"


def _actor_environment(gpus: float) -> dict[str, str]:
  """The environment of an actor's process: this package importable, one device a
  process (the CPU's, unless it has GPUs), and this process's persistent
  compilation cache (easgd.infra.compile.cache_environment).

  A CPU process sizes XLA:CPU's thread pool as the run's process does
  (easgd.infra.sharding.cpu_threads), whatever its node's processors: its
  convolutions then round as the replay's, which runs with the run's devices
  on the run's machine. A GPU process asks for XLA:GPU's deterministic ops, as
  train.py does on a GPU (easgd.infra.platform), also when the run's process
  has no GPU. A process with a share of a GPU (0 < gpus < 1) takes the GPU's
  memory as it needs it: the processes that share the GPU could not each take
  most of it at start, as JAX does by default.
  """
  flags = os.environ.get("XLA_FLAGS", "").split()
  flags = [f for f in flags if not f.startswith("--xla_force_host_platform_device_count")]
  if gpus and not any(platform.GPU_DETERMINISM in flag for flag in flags):
    flags.append(f"--{platform.GPU_DETERMINISM}=true")
  path = os.pathsep.join(p for p in (PACKAGE_ROOT, os.environ.get("PYTHONPATH", "")) if p)
  environment = {"XLA_FLAGS": " ".join(flags), "PYTHONPATH": path}
  environment.update(compile_lib.cache_environment())
  if gpus:
    if gpus < 1:
      environment[PREALLOCATE_VARIABLE] = "false"
  else:
    environment["JAX_PLATFORMS"] = "cpu"
    environment[sharding.CPU_THREADS_VARIABLE] = str(sharding.cpu_threads())
  return environment


class RayRuntime(ThreadsRuntime):
  """The parameter-server rules, each worker a Ray actor process, the center on
  config.ray.servers server actors."""

  name = "ray"
  spans_processes = False  # this process drives them; Ray spans the hosts
  streams = False
  declares = fields.FIELDS

  @classmethod
  def algorithms(cls) -> tuple[str, ...]:
    return ray_rules() + round_rules()

  @classmethod
  def runs(cls) -> str:
    return (
      f"the parameter-server rules ({', '.join(ray_rules())}) and the synchronous rules "
      f"with local steps ({', '.join(round_rules())})"
    )

  @classmethod
  def check(cls, config: ml_collections.ConfigDict) -> None:
    require(
      not config.cluster.replay,
      REPLAY.path,
      config.cluster.replay,
      "runtime=ray records a new one (a parameter-server rule's trace replays under "
      "runtime=simulated, a synchronous rule's under runtime=threads): leave it ''",
    )
    super().check(config)
    require(
      config.algorithm not in round_rules() or config.ray.servers == 1,
      fields.SERVERS,
      config.ray.servers,
      f"{config.algorithm}'s rounds run in the run's own process, on no servers: leave it 1",
    )
    require(
      not tiers.TWO_TIER.of(config) or config.ray.servers == 1,
      fields.SERVERS,
      config.ray.servers,
      "with two-tier servers (outer.two_tier) each group server and the global server is "
      "a process of its own, whole: leave it 1",
    )
    if importlib.util.find_spec("ray") is None:
      raise ConfigError(
        "config.runtime='ray' needs the package ray, which is not installed: "
        "pip install -r requirements.txt"
      )
    check_address(config)

  @classmethod
  def check_model(cls, config: ml_collections.ConfigDict, shapes) -> None:
    """What the run asks of the model and the cluster, before it writes anything: the
    servers split the center by parameter blocks, at most one a block (traced from
    the shapes alone), and the workers' GPUs are within what the cluster has."""
    tree = shapes()
    super().check_model(config, lambda: tree)
    rule = assembly.rule(config)
    key = jax.ShapeDtypeStruct((2,), np.uint32)
    blocks = len(jax.tree.leaves(jax.eval_shape(rule.init, tree, key).center))
    require(
      config.ray.servers <= blocks,
      fields.SERVERS,
      config.ray.servers,
      f"the center is split by parameter blocks, and {config.model} has {blocks}: "
      f"at most {blocks} servers",
    )
    check_gpus(config)

  @classmethod
  def environment(cls, config: ml_collections.ConfigDict, backend: str) -> dict[str, str]:
    """The runtimes' own, and on a GPU this process takes the GPU's memory as it
    needs it: the worker processes that Ray places on this node's GPUs could not
    start beside a driver holding most of each."""
    environment = super().environment(config, backend)
    if backend == "gpu":
      environment[PREALLOCATE_VARIABLE] = "false"
    return environment

  def describe(self) -> str:
    config = self.setup.config
    if config.algorithm in round_rules():
      return f"{config.algorithm}: {config.workers} worker processes (Ray), rounds in this one"
    servers = f"{config.ray.servers} server{'s' if config.ray.servers > 1 else ''}"
    return f"{config.algorithm}: {config.workers} worker processes, {servers} (Ray)"

  def trainee(self, state, clock_state, resumed_at):

    config = self.setup.config
    started = connect(config)
    try:
      # Checked before the run wrote anything (check_model); again with the Ray the
      # run has, which another run of this process may have started.
      check_gpus(config)
      arguments = self._trainee_arguments(state, clock_state, resumed_at)
      if config.algorithm in round_rules():
        from easgd.train.runtimes.ray.rounds import RayRoundsTrainee  # noqa: PLC0415 (imports ray)

        gpus = config.ray.worker_gpus
        options = {
          "num_cpus": ACTOR_CPUS,
          "num_gpus": gpus,
          "scheduling_strategy": "SPREAD",
          "runtime_env": {"env_vars": _actor_environment(gpus)},
        }
        return RayRoundsTrainee(*arguments, None, started_ray=started, actor_options=options)
      return RayTrainee(*arguments, model_bytes=self.model_bytes, started_ray=started)
    except BaseException:
      if started:
        ray_connection.shutdown()
      raise
