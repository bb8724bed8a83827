"""On-device data augmentation, drawn from the run's key.

CIFAR's standard augmentation (He et al. 2016): each image is zero-padded by
4 pixels on every side, a random 32x32 window of it is kept, and it is
flipped left-right with probability 1/2. It runs on the uint8 batch inside
the compiled step, so the data never returns to the host, and its draws are
a pure function of (run key, worker, local step): a resumed run augments
exactly as one that never stopped.
"""

from collections.abc import Callable

import jax
import jax.numpy as jnp
from jax import lax

from easgd.declare import Field, one_of

CHOICES = ("none", "crop_flip")
AUGMENT = Field(
  "data.augment",
  "none",
  one_of(CHOICES),
  "none, or crop_flip: CIFAR's pad-4 random crop and horizontal flip, on the device",
  formerly=("augment",),
)
PADDING = 4
# Folded into the run key to give augmentation a stream apart from the data
# order's, whose fold-ins are epoch numbers (far below this).
_STREAM = 2**32 - 1


def crop_flip(key: jax.Array, images: jax.Array, padding: int = PADDING) -> jax.Array:
  """Random crop after zero padding, then random horizontal flip, per image.

  Args:
    key: PRNG key of this batch.
    images: [b, H, W, C], any dtype.
    padding: pixels added on each side before cropping back to H x W.
  """
  batch, height, width, channels = images.shape
  padded = jnp.pad(images, ((0, 0), (padding, padding), (padding, padding), (0, 0)))
  rows_key, cols_key, flip_key = jax.random.split(key, 3)
  rows = jax.random.randint(rows_key, (batch,), 0, 2 * padding + 1)
  cols = jax.random.randint(cols_key, (batch,), 0, 2 * padding + 1)
  crops = jax.vmap(
    lambda image, row, col: lax.dynamic_slice(image, (row, col, 0), (height, width, channels))
  )(padded, rows, cols)
  flip = jax.random.bernoulli(flip_key, 0.5, (batch,))
  return jnp.where(flip[:, None, None, None], crops[:, :, ::-1, :], crops)


def batch_key(rng: jax.Array, worker: jax.Array, step: jax.Array) -> jax.Array:
  """The augmentation key of one worker's batch at its local step `step`."""
  return jax.random.fold_in(jax.random.fold_in(jax.random.fold_in(rng, _STREAM), worker), step)


Augment = Callable[[jax.Array, jax.Array], jax.Array]  # (key, images) -> images


def apply(augment: Augment | None, rng: jax.Array, worker, step, images: jax.Array) -> jax.Array:
  """`images` of one worker's batch at its local step `step`, augmented if
  `augment` is given, with that batch's key."""
  return images if augment is None else augment(batch_key(rng, worker, step), images)


def get(name: str) -> Augment | None:
  """The augmentation called `name` (one of CHOICES); None for "none"."""
  if name not in CHOICES:
    raise KeyError(f"unknown augmentation {name!r}; valid: {', '.join(CHOICES)}")
  return crop_flip if name == "crop_flip" else None
