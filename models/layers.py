"""Pieces the networks share."""

import flax.linen as nn
import jax
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


def reduce_window_max_pool_2x2(x: jnp.ndarray) -> jnp.ndarray:
  """2x2 max pooling with stride 2 (VALID) through XLA's reduce_window."""
  return nn.max_pool(x, (2, 2), strides=(2, 2))


def _windows(x: jnp.ndarray) -> jnp.ndarray:
  """[b, h, w, c] -> [b, h//2, w//2, c, 4]: each 2x2 window's entries in row-major order
  (rows and columns past an even size are dropped, as VALID pooling does)."""
  batch, height, width, channels = x.shape
  rows, cols = height // 2, width // 2
  x = x[:, : 2 * rows, : 2 * cols, :].reshape(batch, rows, 2, cols, 2, channels)
  return x.transpose(0, 1, 3, 5, 2, 4).reshape(batch, rows, cols, channels, 4)


@jax.custom_vjp
def max_pool_2x2(x: jnp.ndarray) -> jnp.ndarray:
  """2x2 max pooling with stride 2 (VALID), the same values and gradient bits as
  `nn.max_pool(x, (2, 2), strides=(2, 2))`, ties included.

  Why: XLA:CPU runs reduce_window's gradient (select-and-scatter) several
  times slower than this reshape and max. The gradient goes, as
  select-and-scatter sends it, to the first maximum of each window in
  row-major order, added to zero.
  """
  return _windows(x).max(axis=-1)


def _max_pool_forward(x):
  pooled = max_pool_2x2(x)
  return pooled, (x, pooled)


def _max_pool_backward(saved, grad):
  x, pooled = saved
  batch, height, width, channels = x.shape
  rows, cols = height // 2, width // 2
  first = jnp.argmax(_windows(x) == pooled[..., None], axis=-1)
  chosen = jnp.arange(4) == first[..., None]
  # 0 + g: a -0.0 gradient lands as +0.0, as in select-and-scatter (XLA would
  # simplify an explicit + 0.0 away).
  grad = grad[..., None]
  windows = jnp.where(chosen & (grad != 0), grad, jnp.zeros((), grad.dtype))
  spread = windows.reshape(batch, rows, cols, channels, 2, 2).transpose(0, 1, 4, 2, 5, 3)
  spread = spread.reshape(batch, 2 * rows, 2 * cols, channels)
  return (jnp.pad(spread, ((0, 0), (0, height - 2 * rows), (0, width - 2 * cols), (0, 0))),)


max_pool_2x2.defvjp(_max_pool_forward, _max_pool_backward)
