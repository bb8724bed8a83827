"""CIFAR augmentation: every output is a crop of the padded image, flipped or
not, drawn from the key alone; checked by search in NumPy."""

import jax
import numpy as np

from easgd.data import augment


def placements(image, padding=augment.PADDING):
  """Every (row, col, flipped) whose crop of the zero-padded image is `image`-sized."""
  padded = np.pad(image, ((padding, padding), (padding, padding), (0, 0)))
  height, width = image.shape[:2]
  for row in range(2 * padding + 1):
    for col in range(2 * padding + 1):
      crop = padded[row : row + height, col : col + width]
      yield (row, col, False), crop
      yield (row, col, True), crop[:, ::-1]


def test_every_output_is_a_padded_crop_flipped_or_not():
  rng = np.random.default_rng(0)
  images = rng.integers(1, 256, size=(64, 8, 8, 3), dtype=np.uint8)  # no zero pixels
  out = np.asarray(augment.crop_flip(jax.random.PRNGKey(3), images))
  assert out.shape == images.shape and out.dtype == np.uint8
  drawn = []
  for image, result in zip(images, out, strict=True):
    matches = [where for where, crop in placements(image) if np.array_equal(crop, result)]
    assert matches, "an output is no crop of its padded image"
    drawn.append(matches[0])
  rows, cols, flips = (np.array(v) for v in zip(*drawn, strict=True))
  # The draws vary over the whole range and flip about half the images.
  assert len(set(rows)) >= 6 and len(set(cols)) >= 6
  assert 16 <= flips.sum() <= 48


def test_the_key_alone_decides():
  images = np.random.default_rng(1).integers(0, 256, size=(16, 32, 32, 3), dtype=np.uint8)
  key = augment.batch_key(jax.random.PRNGKey(0), worker=2, step=5)
  first = np.asarray(augment.crop_flip(key, images))
  np.testing.assert_array_equal(first, np.asarray(augment.crop_flip(key, images)))
  for other in (
    augment.batch_key(jax.random.PRNGKey(0), worker=3, step=5),
    augment.batch_key(jax.random.PRNGKey(0), worker=2, step=6),
    augment.batch_key(jax.random.PRNGKey(1), worker=2, step=5),
  ):
    assert not np.array_equal(first, np.asarray(augment.crop_flip(other, images)))


def test_none_means_no_augmentation():
  assert augment.get("none") is None and augment.get("crop_flip") is augment.crop_flip
