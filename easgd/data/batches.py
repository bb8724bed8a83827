"""Which examples worker j reads at step k: the training set's partitions, their
placement on the devices, and each worker's batches.

The examples are shuffled once with the run's seed and split into P equal,
disjoint partitions, one a worker (`partition_indices`); with the data on the
devices (config.data.source=device) partition i lives on the device that owns
row i of the mesh's `workers` axis (`place_partitions`). Worker j's batch at its
local step k is `batch_indices(rng, k, j, n, b)` of its partition: each epoch a
fresh permutation drawn from (rng, epoch, j), a pure function that needs no state
of its own. A streamed run (easgd.data.stream) reads the same examples on the
host; either way the step augments them with the key of (j, k)
(`augment_batches`).
"""

import jax
import numpy as np
from absl import logging
from jax import lax
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from easgd.data import augment as augment_lib
from easgd.declare import Field, integer
from easgd.rules.spmd import AXIS, local_workers

BATCH_SIZE = Field(
  "data.batch_size",
  32,
  integer(1, note="examples per worker per step"),
  "examples per worker per step (the pipeline: per model)",
  formerly=("batch_size",),
)


def partition_indices(num_examples: int, num_parts: int, seed: int) -> np.ndarray:
  """Example indices of equal, disjoint, shuffled partitions: [num_parts, N // num_parts].

  The examples are shuffled once with `seed` (so that class-sorted files give
  every part every class) and the remainder of N mod num_parts is dropped.
  """
  order = np.random.default_rng(seed).permutation(num_examples)
  per_part = num_examples // num_parts
  return order[: per_part * num_parts].reshape(num_parts, per_part)


def partition(images, labels, num_workers: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
  """The training set split by `partition_indices`, with a leading workers axis:
  images [P, N//P, H, W, C], labels [P, N//P].
  """
  indices = partition_indices(len(labels), num_workers, seed)
  return images[indices], labels[indices]


def place_partitions(mesh: Mesh, images, labels, parts: int, seed: int):
  """The training set split into `parts` partitions (`partition_indices`), placed
  once: partition i on the device that owns row i of the `workers` axis.

  Each process reads only the rows of the partitions its own devices hold, so
  a lazy (TFDS) training set is decoded only there.
  """
  indices = partition_indices(len(labels), parts, seed)
  sharding = NamedSharding(mesh, P(AXIS))
  reads = {}
  for index in sharding.addressable_devices_indices_map(indices.shape).values():
    start, stop, _ = index[0].indices(parts)
    reads[start, stop] = indices[start:stop]
  logging.info(
    "process %d reads %d of %d training partitions (%d examples)",
    jax.process_index(),
    sum(len(rows) for rows in reads.values()),
    parts,
    sum(rows.size for rows in reads.values()),
  )

  def rows(index):
    start, stop, _ = index[0].indices(parts)
    return reads[start, stop]

  return (
    jax.make_array_from_callback(
      (*indices.shape, *images.shape[1:]), sharding, lambda index: images[rows(index)]
    ),
    jax.make_array_from_callback(indices.shape, sharding, lambda index: labels[rows(index)]),
  )


def batch_indices(rng: jax.Array, step: jax.Array, worker: jax.Array, size: int, batch_size: int):
  """Indices into a worker's partition of `size` examples for step `step`.

  Each epoch (size // batch_size steps) visits a fresh permutation of the
  partition, drawn from (rng, epoch, worker); the tail of size mod
  batch_size examples is left out of that epoch.
  """
  steps_per_epoch = size // batch_size
  epoch, position = step // steps_per_epoch, step % steps_per_epoch
  key = jax.random.fold_in(jax.random.fold_in(rng, epoch), worker)
  permutation = jax.random.permutation(key, size)
  return lax.dynamic_slice_in_dim(permutation, position * batch_size, batch_size)


def sample_local_batches(
  images, labels, rng, worker_steps, batch_size: int, augment: augment_lib.Augment | None = None
):
  """Per device: one batch for each local worker from its own partition,
  augmented if `augment` is given.

  Args:
    images: this device's partitions, [P/D, n, H, W, C].
    labels: [P/D, n].
    rng: the state's key.
    worker_steps: the local workers' step counts, [P/D].
    batch_size: examples per worker.
    augment: (key, images) -> images, or None.
  """
  workers = local_workers(labels.shape[0])
  return sample_batches(images, labels, rng, workers, worker_steps, batch_size, augment)


def sample_batches(
  images,
  labels,
  rng,
  workers,
  worker_steps,
  batch_size: int,
  augment: augment_lib.Augment | None = None,
):
  """`sample_local_batches` for the workers of global indices `workers` [w], whose
  partitions are images [w, n, ...] and labels [w, n] (outside shard_map too)."""
  size = labels.shape[1]

  def one_worker(worker, step, worker_images, worker_labels):
    indices = batch_indices(rng, step, worker, size, batch_size)
    return worker_images[indices], worker_labels[indices]

  batch_images, batch_labels = jax.vmap(one_worker)(workers, worker_steps, images, labels)
  return augment_batches(batch_images, batch_labels, rng, workers, worker_steps, augment)


def augment_local_batches(
  images, labels, rng, worker_steps, augment: augment_lib.Augment | None = None
):
  """Per device: the local workers' batches [P/D, b, ...] as {"image", "label"},
  each augmented (if `augment` is given) with the key of its worker and step."""
  workers = local_workers(labels.shape[0])
  return augment_batches(images, labels, rng, workers, worker_steps, augment)


def augment_batches(images, labels, rng, workers, worker_steps, augment=None):
  """`augment_local_batches` for the workers of global indices `workers`."""

  def one_worker(worker, step, batch_images):
    return augment_lib.apply(augment, rng, worker, step, batch_images)

  return {"image": jax.vmap(one_worker)(workers, worker_steps, images), "label": labels}
