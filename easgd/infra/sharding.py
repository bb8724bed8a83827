"""The device mesh and how the training state is laid out on it (the training data's
partitions: easgd.data.batches).

Workers are an array axis, not devices: P workers live on the 1-D mesh axis
`workers` over D devices (D divides P), so each device holds P/D workers.
The mesh is built from `jax.devices()`, the global device list, so that the
same code runs when several processes join with `jax.distributed`.
"""

import dataclasses
import os

import jax
import numpy as np
from jax.experimental import multihost_utils
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from easgd.declare import Field, Shapes, integer
from easgd.errors import ConfigError
from easgd.rules import AXIS, TrainState

# D: how many devices the run spreads its units over.
DEVICES = Field(
  "run.devices",
  0,
  integer(0, words="must be an integer >= 1, or 0 for the largest divisor that fits"),
  "D: devices the workers (the pipeline: models) are spread over, dividing them; 0: the "
  "largest divisor that is at most 8 and the devices there are; on a CPU train.py "
  "creates D virtual devices (the pipeline reads it)",
  Shapes.IF_READ,
  formerly=("devices",),
)

# Fields of TrainState with a leading workers axis; the rest is replicated.
_WORKER_FIELDS = ("workers", "worker_opt", "worker_steps")


def configure_cpu_devices(count: int) -> None:
  """Asks for `count` virtual CPU devices; must run before JAX starts its backends."""
  jax.config.update("jax_num_cpu_devices", count)


# The environment variable that sizes XLA:CPU's thread pool in place of the
# processor count (the CPU client reads it when it starts).
CPU_THREADS_VARIABLE = "PJRT_NPROC"


def cpu_threads_environment(run_devices: int) -> dict[str, str]:
  """The environment that sizes XLA:CPU's thread pool by the run, not by the
  machine; set before JAX starts (config.deterministic_sums).

  The pool has as many threads as the larger of the processor count (or
  PJRT_NPROC, which stands in for it) and the process's devices, and a
  convolution splits its sums by the pool's size: a process of 2 devices and
  one of 4, or the same program on a 2-core and a 16-core machine, compute a
  convolution's last bits differently. With the pool set to the run's device
  count D on every process, the layouts of a run with the same workers a
  device compute the same bits, on machines of any processor count.
  """
  return {CPU_THREADS_VARIABLE: str(run_devices)}


# Where XLA:CPU reads the processor count it sizes its pool by, in its order,
# before it asks the operating system (tsl's DefaultThreadPoolSize).
_PROCESSOR_VARIABLES = (CPU_THREADS_VARIABLE, "NPROC")


def cpu_threads() -> int:
  """The threads of XLA:CPU's pool in this process, once JAX has started: what
  another process of one device sets PJRT_NPROC to, so that its convolutions
  round as this process's do (runtime=ray's worker and server processes).

  As XLA:CPU sizes it: the processor count (the first of PJRT_NPROC and NPROC
  that is a positive integer, else the processors this process may run on),
  or the process's CPU devices if there are more. A process without a CPU
  backend (JAX_PLATFORMS=cuda) counts none.
  """
  count = processors()
  try:
    devices = len(jax.local_devices(backend="cpu"))
  except RuntimeError:  # JAX was told to start no CPU backend
    devices = 0
  return max(count, devices)


def processors() -> int:
  """The processor count XLA:CPU sizes its thread pool by (before the devices count):
  the first of PJRT_NPROC and NPROC that is a positive integer, else the processors
  this process may run on."""
  for variable in _PROCESSOR_VARIABLES:
    value = os.environ.get(variable, "")
    if value.isdigit() and int(value) > 0:
      return int(value)
  return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def make_mesh(num_devices: int) -> Mesh:
  """A 1-D mesh with axis `workers` over the first `num_devices` global devices."""
  devices = jax.devices()
  if num_devices > len(devices):
    raise ConfigError(
      f"config.run.devices={num_devices} is invalid: only {len(devices)} "
      f"{devices[0].platform} devices are available"
    )
  if jax.process_count() > 1 and num_devices != len(devices):
    # A process without a device in the mesh would hold nothing and run nothing.
    raise ConfigError(
      f"config.run.devices={num_devices} is invalid: a run over {jax.process_count()} processes "
      f"uses all their {len(devices)} devices (0 or {len(devices)})"
    )
  # Auto axes (not jax.make_mesh's Explicit default): shard_map and jit then
  # take the shardings we give them without sharding-in-types annotations.
  return Mesh(np.array(devices[:num_devices]), (AXIS,))


def state_specs(state: TrainState) -> TrainState:
  """PartitionSpecs mirroring `state`: worker fields split on `workers`, the rest replicated."""
  return TrainState(
    **{
      field.name: jax.tree.map(
        lambda _, f=field.name: P(AXIS) if f in _WORKER_FIELDS else P(),
        getattr(state, field.name),
      )
      for field in dataclasses.fields(state)
    }
  )


def named(mesh: Mesh, specs):
  """NamedShardings for a tree of PartitionSpecs."""
  return jax.tree.map(
    lambda spec: NamedSharding(mesh, spec), specs, is_leaf=lambda x: isinstance(x, P)
  )


def place(mesh: Mesh, host_array: np.ndarray, spec: P) -> jax.Array:
  """Places a host array on the mesh with `spec`: P(AXIS) splits a leading workers axis
  (each device gets its workers' rows), P() gives every device a full copy.

  Built from a callback per device shard, so each process only touches the
  rows of the devices it owns.
  """
  sharding = NamedSharding(mesh, spec)
  return jax.make_array_from_callback(host_array.shape, sharding, lambda index: host_array[index])


def jit_shard_map(per_device, mesh: Mesh, in_specs, out_specs, donate: bool = True):
  """jit(shard_map(per_device)) with explicit shardings, the first argument (the
  training state) donated so that its buffers are updated in place (`donate`).
  """
  mapped = jax.shard_map(per_device, mesh=mesh, in_specs=in_specs, out_specs=out_specs)
  return jax.jit(
    mapped,
    in_shardings=named(mesh, in_specs),
    out_shardings=named(mesh, out_specs),
    donate_argnums=0 if donate else (),
  )


def fetch(tree):
  """Host (NumPy) copies of arrays that may span several processes: every process
  gets the whole value. A collective when several processes run and an array is
  split over them: all must call it.
  """
  if jax.process_count() == 1:
    return jax.device_get(tree)

  def one(leaf):
    if isinstance(leaf, jax.Array) and leaf.is_fully_replicated:
      return np.asarray(leaf.addressable_data(0))  # every process holds all of it
    return multihost_utils.process_allgather(leaf, tiled=True)

  return jax.tree.map(one, tree)
