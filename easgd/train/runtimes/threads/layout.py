"""The loop's state, split over the workers on the mesh, as one row per worker on its
device, and back (runtime=threads: each worker's thread works on its own row)."""

import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from easgd.rules import AXIS


class Layout:
  """Worker j's rows lie on device j // per_device, as the mesh splits them."""

  def __init__(self, mesh, num_workers: int):
    self.mesh = mesh
    self.devices = list(mesh.devices.flat)
    self.per_device = num_workers // len(self.devices)
    self.num_workers = num_workers

  def device_of(self, worker: int):
    return self.devices[worker // self.per_device]

  def row(self, leaf: jax.Array, worker: int) -> jax.Array:
    """Worker `worker`'s row [1, ...] of a leaf split over the workers, on its device."""
    device = self.device_of(worker)
    shard = next(s for s in leaf.addressable_shards if s.device == device)
    local = worker % self.per_device
    return shard.data[local : local + 1]

  def rows(self, tree) -> list:
    """Each worker's rows of a tree split over the workers."""
    workers = range(self.num_workers)
    return [jax.tree.map(lambda leaf, j=j: self.row(leaf, j), tree) for j in workers]

  @staticmethod
  def on(tree, device):
    """A replicated tree's copy on `device`."""
    return jax.tree.map(
      lambda leaf: next(s.data for s in leaf.addressable_shards if s.device == device), tree
    )

  def stacked(self, rows: list):
    """The tree split over the workers whose rows are `rows` (one tree a worker)."""
    split = NamedSharding(self.mesh, P(AXIS))
    per_device, count = self.per_device, len(self.devices)

    def leaf(*per_worker):
      parts = [
        jnp.concatenate(per_worker[d * per_device : (d + 1) * per_device]) for d in range(count)
      ]
      shape = (len(per_worker), *per_worker[0].shape[1:])
      return jax.make_array_from_single_device_arrays(shape, split, parts)

    return jax.tree.map(leaf, *rows)
