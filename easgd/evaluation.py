"""Test accuracy of the center and the workers, and how far apart they are.

Evaluation runs where the models live: each device scores its own workers on
the whole (replicated) test set, and the replicated center is scored with the
test set split over the devices and the counts all-reduced.
"""

import math

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.sharding import Mesh
from jax.sharding import PartitionSpec as P

from easgd.infra import sharding
from easgd.rules import AXIS, model_state

# At most this many test images go through a model at once.
_MAX_CHUNK = 1000


def programs(mesh: Mesh, apply_fn):
  """The counts of correct predictions, jitted over `mesh`: (workers, center).

  workers(models [P, ...], images, labels) -> [P], each device scoring its
  models on the whole test set (replicated); center(center, images, labels)
  -> the center's count, the test set split over the devices. The test set
  comes as chunks: images [k, chunk, ...] and labels [k, chunk].
  """

  def correct(params, images, labels):
    """Correct predictions of one model over chunks [k, chunk, ...]."""
    per_chunk = lax.map(
      lambda c: (apply_fn(params, c[0]).argmax(-1) == c[1]).sum(), (images, labels)
    )
    return per_chunk.sum()

  def per_device_workers(workers, images, labels):
    return lax.map(lambda params: correct(params, images, labels), workers)

  def per_device_center(center, images, labels):
    return lax.psum(correct(center, images, labels), AXIS)

  return (
    jax.jit(
      jax.shard_map(per_device_workers, mesh=mesh, in_specs=(P(AXIS), P(), P()), out_specs=P(AXIS))
    ),
    jax.jit(
      jax.shard_map(per_device_center, mesh=mesh, in_specs=(P(), P(AXIS), P(AXIS)), out_specs=P())
    ),
  )


class Evaluator:
  """Scores stacked models and a center on a test set placed once on the mesh."""

  def __init__(self, mesh: Mesh, apply_fn, images: np.ndarray, labels: np.ndarray):
    """
    Args:
      mesh: the training mesh.
      apply_fn: (params, uint8 images) -> logits, normalisation included.
      images, labels: the test set on the host.
    """
    devices = mesh.size
    self._count = len(labels)
    chunks_per_device = math.ceil(self._count / (devices * _MAX_CHUNK))
    chunk = math.ceil(self._count / (devices * chunks_per_device))
    padded = devices * chunks_per_device * chunk
    # Padding examples get label -1, which no prediction matches.
    images = np.concatenate(
      [images, np.zeros((padded - self._count, *images.shape[1:]), images.dtype)]
    )
    labels = np.concatenate([labels, np.full(padded - self._count, -1, labels.dtype)])
    images = images.reshape(devices * chunks_per_device, chunk, *images.shape[1:])
    labels = labels.reshape(devices * chunks_per_device, chunk)
    self._replicated = (sharding.place(mesh, images, P()), sharding.place(mesh, labels, P()))
    self._split = (
      sharding.place(mesh, images, P(AXIS)),
      sharding.place(mesh, labels, P(AXIS)),
    )
    self._workers_fn, self._center_fn = programs(mesh, apply_fn)

  def worker_accuracies(self, workers) -> np.ndarray:
    """Accuracy of each model in `workers` (leading axis of P models, sharded)."""
    return np.asarray(sharding.fetch(self._workers_fn(workers, *self._replicated))) / self._count

  def center_accuracy(self, center) -> float:
    return float(self._center_fn(center, *self._split)) / self._count


@jax.jit
def center_with_stats_of(center, workers):
  """P copies of the center's parameters, copy i with worker i's BatchNorm
  statistics: how the center is scored when statistics stay local."""
  count = jax.tree.leaves(workers)[0].shape[0]
  params = jax.tree.map(
    lambda leaf: jnp.broadcast_to(leaf, (count, *leaf.shape)), model_state.trainable(center)
  )
  return model_state.with_trainable(workers, params)


@jax.jit
def consensus_distance(workers, center) -> jax.Array:
  """mean_i ||x_i - x~|| / ||x~||, norms over all parameters of a model
  (BatchNorm statistics left out)."""
  workers, center = model_state.trainable(workers), model_state.trainable(center)
  squared = sum(
    jnp.sum((x - c) ** 2, axis=tuple(range(1, x.ndim)))
    for x, c in zip(jax.tree.leaves(workers), jax.tree.leaves(center), strict=True)
  )
  center_norm = jnp.sqrt(sum(jnp.sum(c**2) for c in jax.tree.leaves(center)))
  return jnp.mean(jnp.sqrt(squared)) / center_norm
