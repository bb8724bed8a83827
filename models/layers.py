"""Pieces the networks share."""

import jax.numpy as jnp


def pad_to(images: jnp.ndarray, side: int) -> jnp.ndarray:
  """Zero-pads images [batch, h, w, c] evenly on both sides up to side x side,
  so that a network designed for 32x32 is the same network on 28x28 MNIST
  and 8x8 digits; larger images are left as they are."""
  pad_h = max(0, side - images.shape[1])
  pad_w = max(0, side - images.shape[2])
  return jnp.pad(
    images,
    ((0, 0), (pad_h // 2, pad_h - pad_h // 2), (pad_w // 2, pad_w - pad_w // 2), (0, 0)),
  )
