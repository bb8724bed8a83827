"""The device mesh and how the training state and data are laid out on it.

Workers are an array axis, not devices: P workers live on the 1-D mesh axis
`workers` over D devices (D divides P), so each device holds P/D workers.
The mesh is built from `jax.devices()`, the global device list, so that the
same code runs when several processes join with `jax.distributed`.
"""

import dataclasses

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from easgd.data import partition
from easgd.errors import ConfigError
from easgd.rules import AXIS, TrainState

# Fields of TrainState with a leading workers axis; the rest is replicated.
_WORKER_FIELDS = ("workers", "worker_opt", "worker_steps")


def configure_cpu_devices(count: int) -> None:
  """Asks for `count` virtual CPU devices; must run before JAX starts its backends."""
  jax.config.update("jax_num_cpu_devices", count)


def make_mesh(num_devices: int) -> Mesh:
  """A 1-D mesh with axis `workers` over the first `num_devices` global devices."""
  devices = jax.devices()
  if num_devices > len(devices):
    raise ConfigError(
      f"config.devices={num_devices} is invalid: only {len(devices)} "
      f"{devices[0].platform} devices are available"
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


def jit_shard_map(per_device, mesh: Mesh, in_specs, out_specs):
  """jit(shard_map(per_device)) with explicit shardings, the first argument (the
  training state) donated so that its buffers are updated in place.
  """
  mapped = jax.shard_map(per_device, mesh=mesh, in_specs=in_specs, out_specs=out_specs)
  return jax.jit(
    mapped,
    in_shardings=named(mesh, in_specs),
    out_shardings=named(mesh, out_specs),
    donate_argnums=0,
  )


def place_partitions(mesh: Mesh, images: np.ndarray, labels: np.ndarray, parts: int, seed: int):
  """The training set split into `parts` partitions (data.partition), placed once:
  partition i on the device that owns row i of the `workers` axis.
  """
  split_images, split_labels = partition(images, labels, parts, seed)
  return place(mesh, split_images, P(AXIS)), place(mesh, split_labels, P(AXIS))
