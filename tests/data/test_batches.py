"""Which examples worker j reads at step k (easgd.data.batches): its own partition,
each epoch a fresh permutation of it."""

import jax
import numpy as np

from easgd.data import batches


def test_partition_is_disjoint_complete_and_mixes_classes():
  labels = np.repeat(np.arange(10), 41).astype(np.int32)  # class-sorted, 410 examples
  images = np.arange(410, dtype=np.uint8).reshape(410, 1, 1, 1)
  ids = np.arange(410)
  part_images, part_labels = batches.partition(images, labels, 8, seed=3)
  assert part_images.shape == (8, 51, 1, 1, 1) and part_labels.shape == (8, 51)
  part_ids, _ = batches.partition(ids.reshape(410, 1), labels, 8, seed=3)
  flat = part_ids.ravel()
  assert len(np.unique(flat)) == 8 * 51  # disjoint; 410 mod 8 = 2 dropped
  assert np.array_equal(labels[flat], part_labels.ravel())
  assert all(len(np.unique(worker)) >= 8 for worker in part_labels)
  assert np.array_equal(batches.partition(ids.reshape(410, 1), labels, 8, seed=3)[0], part_ids)


def test_batches_of_an_epoch_are_disjoint_and_reshuffled_each_epoch():
  rng = jax.random.PRNGKey(7)
  size, batch = 50, 8  # 6 steps an epoch, 2 examples left out
  epoch0 = np.concatenate([batches.batch_indices(rng, s, 3, size, batch) for s in range(6)])
  epoch1 = np.concatenate([batches.batch_indices(rng, s, 3, size, batch) for s in range(6, 12)])
  assert len(np.unique(epoch0)) == 48 and epoch0.max() < size
  assert not np.array_equal(epoch0, epoch1)
  other_worker = np.concatenate([batches.batch_indices(rng, s, 4, size, batch) for s in range(6)])
  assert not np.array_equal(epoch0, other_worker)
  assert np.array_equal(epoch0[:8], batches.batch_indices(rng, 0, 3, size, batch))
