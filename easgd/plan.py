"""Sizes a run before it is started: python -m easgd.plan --config configs/X.py.

For the config's model, dataset, rule and `config.cluster` it answers:
  * the largest per-worker batch that fits in `device.memory`;
  * the number of workers from which communication takes most of the time,
    and for the parameter-server rules how many servers keep up;
  * the predicted time of a step and images/s.

Memory follows Zou et al.'s rule, per device, with every term read from
XLA's memory analysis of the compiled training step (this machine's backend):
  total(b) = data + S1(b) + S2 + S3
    data  the device's resident training partitions (arguments of the step)
    S1    samples and every layer's outputs and their gradients: s1 * b
    S2    the training state: parameters, center, optimizer state, counters
    S3    temporaries that do not grow with the batch (workspace, metrics)
S1 and S3 are the slope and intercept of the step's temporaries between two
compiled batch sizes where the batch dominates (2b and 4b, b the config's
batch, at least 32 and 64, at most the partition); the temporaries at batch
1 are a floor under that line. The largest batch is then found by compiling
around the rule's estimate.
Time comes from easgd/sim/sizing.py's steady state of the timing model, with
t_c = the step's FLOPs (XLA's cost analysis) / `device.flops`, or
`cluster.compute_time` where no FLOP rate is given.
"""

import dataclasses
import functools
import math

import jax
import jax.numpy as jnp
import ml_collections
from absl import app
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from easgd import assembly, cli, steps
from easgd.config import hyperparameters, validation
from easgd.data import datasets, stream
from easgd.errors import ConfigError
from easgd.infra import platform, sharding
from easgd.infra.compile import compile_program
from easgd.registry import ALGORITHMS
from easgd.rules import AXIS, exchange
from easgd.sim import sizing, ticks, timing
from easgd.train import trainer

# Worker counts of the scaling table in the report.
TABLE_WORKERS = (1, 2, 4, 8, 16, 32, 64)


def compiled_bytes(compiled) -> int:
  """Peak bytes of a compiled program on one device: its arguments, its
  temporaries and the outputs that do not reuse (donated) argument buffers."""
  stats = compiled.memory_analysis()
  return (
    stats.argument_size_in_bytes
    + stats.temp_size_in_bytes
    + stats.output_size_in_bytes
    - stats.alias_size_in_bytes
  )


def _abstract(tree, shardings):
  return jax.tree.map(
    lambda leaf, where: jax.ShapeDtypeStruct(leaf.shape, leaf.dtype, sharding=where),
    tree,
    shardings,
  )


class StepCompiler:
  """Compiles a config's training step for any batch size from shapes alone (no data)."""

  def __init__(self, config: ml_collections.ConfigDict, mesh):
    self.config = config
    self.mesh = mesh
    self.shape = datasets.shape_of(config.data.dataset, config.run.data_dir)
    self.partition = self.shape.train_examples // config.workers
    # Placed partitions are an argument of every step; streamed, one batch is.
    self.placement = stream.choose(
      config.data, self.shape.image_shape, self.shape.train_examples, config.workers, mesh.size
    )
    self.streamed = self.placement.source == stream.STREAM
    # Normalisation constants change neither shapes nor cost.
    normalization = assembly.Normalization.stand_in(self.shape.image_shape[-1])
    built = assembly.network(config, self.shape.num_classes, self.shape.image_shape, normalization)
    self.model, self.init_params = built.model, built.init_params
    params = jax.eval_shape(built.init_params, jax.random.PRNGKey(0))
    self.model_bytes = sum(leaf.size * leaf.dtype.itemsize for leaf in jax.tree.leaves(params))
    self.rule = assembly.rule(config)
    # One exchange's size, as train.py's clock takes it (easgd.rules.exchange.sizes).
    self.message_bytes, _ = exchange.sizes(
      params, config.outer.exchange_dtype, self.rule.hyper.average_stats
    )
    state = jax.eval_shape(self.rule.init, params, jax.random.PRNGKey(0))
    self.state = _abstract(state, sharding.named(mesh, sharding.state_specs(state)))
    split = NamedSharding(mesh, P(AXIS))
    example_shape = (config.workers, self.partition)
    self.images = jax.ShapeDtypeStruct(
      (*example_shape, *self.shape.image_shape), jnp.uint8, sharding=split
    )
    self.labels = jax.ShapeDtypeStruct(example_shape, jnp.int32, sharding=split)
    self.loss_fn = built.loss_fn
    self.tick = self.rule.tick_inputs(ticks.Tick.empty(config.workers))
    self._compiled = {}

  @property
  def data_bytes(self) -> int:
    """The resident partitions on one device (none when streamed)."""
    if self.streamed:
      return 0
    per_device = self.config.workers // self.mesh.size
    return sum(
      per_device * math.prod(x.shape[1:]) * x.dtype.itemsize for x in (self.images, self.labels)
    )

  def input_bytes(self, batch_size: int) -> int:
    """What the step's data arguments hold on one device: the partitions, or one
    step's batches when streamed."""
    if not self.streamed:
      return self.data_bytes
    per_device = self.config.workers // self.mesh.size
    return per_device * batch_size * stream.example_bytes(self.shape.image_shape)

  def compile(self, batch_size: int):
    """The compiled step for per-worker batches of `batch_size` (compiled once)."""
    if batch_size not in self._compiled:
      # The program train.py runs, compiled with the same options.
      if self.streamed:
        step = steps.build_batch_step(self.rule, self.loss_fn, self.mesh, self.state)
        split = self.images.sharding
        batch = (self.config.workers, batch_size)
        images = jax.ShapeDtypeStruct((*batch, *self.shape.image_shape), jnp.uint8, sharding=split)
        labels = jax.ShapeDtypeStruct(batch, jnp.int32, sharding=split)
        lowered = step.lower(self.state, images, labels, self.tick)
      else:
        step = steps.build_train_step(self.rule, self.loss_fn, self.mesh, self.state, batch_size)
        lowered = step.lower(self.state, self.images, self.labels, self.tick)
      self._compiled[batch_size] = compile_program(lowered, self.mesh.devices.flat[0].platform)
    return self._compiled[batch_size]


@dataclasses.dataclass(frozen=True)
class Memory:
  """Bytes per device of the training step at per-worker batch b (see the module doc)."""

  data: int
  state: int  # S2
  per_example: float  # S1 / b
  fixed: float  # S3
  # The temporaries at batch 1: below some batch XLA's largest buffers do not
  # depend on it, and the temporaries stop shrinking.
  floor: float = 0.0

  def activations(self, batch_size: int) -> float:
    """S1(b)."""
    return self.per_example * batch_size

  def total(self, batch_size: int) -> float:
    temporaries = max(self.fixed + self.activations(batch_size), self.floor)
    return self.data + self.state + temporaries

  def largest_batch(self, device_memory: float) -> int:
    """The largest b with total(b) <= device_memory (0 if none)."""
    if self.total(1) > device_memory:
      return 0
    room = device_memory - self.data - self.state - self.fixed
    return max(1, int(room // self.per_example)) if self.per_example > 0 else 2**62


def measure_memory(compiler: StepCompiler, batch_size: int) -> Memory:
  """The terms of the memory rule, fitted on the compiled step at two batches where
  the batch dominates: 2b and 4b, at least 32 and 64, at most the partition.

  XLA's temporaries grow linearly with the batch only past the batch where
  the activations outweigh the buffers that do not depend on it (LeNet-5's
  stop shrinking below batch 16 or so); the temporaries at batch 1 are kept
  as the floor under the straight line.
  """
  large = min(compiler.partition, max(4 * batch_size, 64))
  small = max(1, large // 2)
  stats = compiler.compile(large).memory_analysis()
  state = stats.argument_size_in_bytes - compiler.input_bytes(large)
  # Streamed, the step's batches are arguments that grow with b: they count
  # with the temporaries.
  variable = {
    b: compiled_bytes(compiler.compile(b)) - state - compiler.data_bytes
    for b in sorted({1, small, large})
  }
  per_example = (variable[large] - variable[small]) / (large - small) if large > small else 0.0
  fixed = variable[large] - per_example * large
  return Memory(
    data=compiler.data_bytes,
    state=state,
    per_example=per_example,
    fixed=fixed,
    floor=variable[1],
  )


def search_largest_batch(compiler: StepCompiler, memory: Memory, device_memory: float, limit: int):
  """(b, its compiled bytes): the largest batch up to `limit` whose compiled step fits,
  found by compiling from the rule's estimate (XLA's temporaries are close to
  linear in the batch, not exactly). (b, bytes) with bytes > device_memory if
  not even batch 1 fits."""

  def size(b: int) -> int:
    return compiled_bytes(compiler.compile(b))

  largest = max(1, min(memory.largest_batch(device_memory), limit))
  checked = size(largest)
  slope = max(memory.per_example, 1.0)
  while checked > device_memory and largest > 1:
    largest = max(1, largest - math.ceil((checked - device_memory) / slope))
    checked = size(largest)
  if checked > device_memory:
    return largest, checked
  # Upward: steps the rule's slope suggests, halved when they overshoot.
  step = max(1, int((device_memory - checked) // slope))
  while largest < limit:
    candidate = min(limit, largest + step)
    candidate_bytes = size(candidate)
    if candidate_bytes <= device_memory:
      largest, checked = candidate, candidate_bytes
    elif step == 1:
      break
    else:
      step = max(1, step // 2)
  return largest, checked


@dataclasses.dataclass(frozen=True)
class Plan:
  """What the planner found; `report()` writes it out."""

  config: ml_collections.ConfigDict
  devices: int
  partition: int  # examples per worker
  model_bytes: int
  memory: Memory
  memory_batch: int  # the largest batch the memory allows
  largest_batch: int  # and the partition too
  checked_bytes: int  # compiled peak at largest_batch
  step_flops: float  # per worker, at config.data.batch_size
  timing: sizing.Timing
  compute_source: str
  blocks: int  # the center's parameter blocks (leaves): runtime=ray's most servers

  def report(self) -> str:
    config, memory, timing = self.config, self.memory, self.timing
    b, mb = config.data.batch_size, 1e6
    per_device = config.workers // self.devices
    lines = [
      f"plan: {config.algorithm}, {config.model} on {config.data.dataset}, "
      f"{config.workers} workers on {self.devices} devices ({per_device} a device), "
      f"batch {b} a worker",
      f"model: {self.model_bytes / mb:.3f} MB of parameters",
      "",
      f"memory per device (XLA's analysis of the compiled step on "
      f"{jax.devices()[0].platform}), batch {b}:",
      f"  data (resident partitions)      {memory.data / mb:10.3f} MB"
      + (" (streamed: batches count with S1)" if memory.data == 0 else ""),
      f"  S1 activations {memory.per_example:9.0f} B/example {memory.activations(b) / mb:10.3f} MB",
      f"  S2 state (params, opt, center)  {memory.state / mb:10.3f} MB",
      f"  S3 batch-independent temporaries{memory.fixed / mb:10.3f} MB",
      f"  total                           {memory.total(b) / mb:10.3f} MB"
      f" of {config.device.memory / mb:.1f} MB",
      "  (XLA's own buffers: a runtime's allocations outside them need headroom; docs/scaling.md)",
    ]
    predicted = (
      f"predicted {memory.total(self.largest_batch) / mb:.3f} MB, "
      f"compiled {self.checked_bytes / mb:.3f} MB"
    )
    if self.largest_batch == self.partition:
      allowed = f"{self.memory_batch}" if self.memory_batch < 2**62 else "any batch"
      lines.append(
        f"largest batch: {self.largest_batch}, set by the partition of {self.partition} "
        f"examples a worker (the memory rule would allow {allowed}; {predicted})"
      )
    else:
      lines.append(f"largest batch: {self.largest_batch}, set by the memory ({predicted})")
    p = config.workers
    lines += [
      "",
      f"time ({timing.family}; equal workers, one a device):",
      f"  {self.step_flops / 1e9:.4g} GFLOP a local step; t_c = {timing.compute_time:.4g} s "
      f"({self.compute_source})",
      *(f"  {line}" for line in timing.derivation(p)),
      f"  step {timing.step_time(p):.4g} s, {timing.images_per_sec(p, b):.4g} images/s, "
      f"communication {100 * timing.comm_share(p):.1f}% of the time",
    ]
    critical = timing.critical_workers()
    lines.append(
      "  communication dominates from "
      + (f"P = {critical} workers" if critical else "no number of workers (it never reaches half)")
    )
    servers = timing.servers_needed(p)
    if servers is not None:
      lines.append(f"  parameter servers needed for {p} workers: {servers}")
      if servers <= self.blocks:
        lines.append(f"  run them with --config.runtime=ray --config.ray.servers={servers}")
      else:
        lines.append(
          f"  runtime=ray splits the center by its {self.blocks} parameter blocks: "
          f"at most --config.ray.servers={self.blocks}"
        )
    lines += ["", "   P   step s     images/s  comm %"]
    for workers in TABLE_WORKERS:
      lines.append(
        f"{workers:4d} {timing.step_time(workers):8.4g} {timing.images_per_sec(workers, b):12.5g}"
        f" {100 * timing.comm_share(workers):6.1f}"
      )
    return "\n".join(lines)


def levels_of(rule) -> tuple:
  """A synchronous rule's levels and their rates (easgd.sim.sizing), () for one level."""
  levels = rule.levels()
  if rule.parameter_server() or len(levels) == 1:
    return ()
  return tuple(zip(levels, rule.level_rates(), strict=True))


def check_plannable(config: ml_collections.ConfigDict) -> None:
  """What the planner needs beyond a valid config; raises ConfigError."""
  trainer.check(config)
  if not ALGORITHMS[config.algorithm].planned:
    planned = sorted(name for name, algorithm in ALGORITHMS.items() if algorithm.planned)
    raise ConfigError(
      f"config.algorithm={config.algorithm!r} is not planned: the planner sizes the update "
      f"rules ({', '.join(planned)})"
    )
  if not config.device.memory > 0:
    raise ConfigError(
      f"config.device.memory={config.device.memory!r} is invalid: the planner "
      "needs each device's memory in bytes (> 0), e.g. 16e9"
    )
  validation.validate_partition(
    config,
    datasets.shape_of(config.data.dataset, config.run.data_dir).train_examples,
    config.workers,
  )


def make_plan(config: ml_collections.ConfigDict) -> Plan:
  """Compiles the config's step and solves the memory rule and the timing model."""
  check_plannable(config)
  mesh = sharding.make_mesh(hyperparameters.resolve_devices(config, len(jax.devices())))
  compiler = StepCompiler(config, mesh)
  memory = measure_memory(compiler, config.data.batch_size)
  device_memory = config.device.memory
  memory_batch = memory.largest_batch(device_memory)
  if memory_batch < 1:
    raise ConfigError(
      f"no batch fits in config.device.memory={device_memory:.4g} bytes: at batch 1 "
      f"the step needs {memory.total(1):.4g} (data {memory.data:.4g}, state {memory.state:.4g}, "
      f"activations {memory.per_example:.4g}, fixed temporaries {memory.fixed:.4g}); "
      "use fewer workers a device, a smaller model or a larger device"
    )
  largest, checked = search_largest_batch(compiler, memory, device_memory, compiler.partition)
  if checked > device_memory:
    raise ConfigError(
      f"no batch fits in config.device.memory={device_memory:.4g} bytes: the step "
      f"compiled at batch 1 needs {checked:.4g}"
    )
  cost = compiler.compile(config.data.batch_size).cost_analysis()
  per_device = config.workers // mesh.size
  step_flops = float(cost["flops"]) / per_device
  timing_model = timing.Cluster.from_config(config.cluster)
  device_flops = config.device.flops
  if device_flops > 0:
    compute_time = step_flops / device_flops
    source = f"at device.flops = {device_flops:.4g} FLOP/s"
  else:
    compute_time = timing_model.compute_time
    source = "cluster.compute_time; set device.flops to derive it from the FLOPs"
  steady = sizing.Timing(
    cluster=timing_model,
    model_bytes=compiler.message_bytes,
    compute_time=compute_time,
    period=compiler.rule.period,
    family=sizing.family_of(compiler.rule.policy),
    levels=levels_of(compiler.rule),
    workers=config.workers,
    global_every=config.outer.global_every if compiler.rule.hyper.two_tier else 0,
  )
  return Plan(
    config=config,
    devices=mesh.size,
    partition=compiler.partition,
    model_bytes=compiler.model_bytes,
    memory=memory,
    memory_batch=memory_batch,
    largest_batch=largest,
    checked_bytes=checked,
    step_flops=step_flops,
    timing=steady,
    compute_source=source,
    blocks=len(jax.tree.leaves(compiler.state.center)),
  )


def main(argv, config_flag):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {' '.join(argv[1:])}")
  config = cli.with_rule_defaults(cli.config_value(config_flag))
  try:
    check_plannable(config)
    if platform.expected_backend() == "cpu":
      sharding.configure_cpu_devices(hyperparameters.resolve_devices(config))
    print(make_plan(config).report())
  except ConfigError as error:
    cli.fail(str(error))


if __name__ == "__main__":
  # The flag is defined here, not on import, so that tests can import this module.
  config_flag = cli.define_config(cli.packaged_config("default.py"))
  cli.run(functools.partial(main, config_flag=config_flag))
