"""Pieces the networks share."""

import functools

import flax.linen as nn
import jax
import jax.numpy as jnp
from jax import lax


def named_after_itself(function):
  """`function` with its ops under a named scope of its own name.

  Why: a lowering names each op after the Python functions on its call stack,
  except inside a custom VJP, whose backward pass (and at times forward pass)
  is traced where the custom function was called; a named scope stays in the
  op's name in either pass. The platform-dependent paths below, and
  BatchNorm's sums (models/batch_norm.py), carry one, so that a profile, or a
  look at an exported lowering (tests/test_lowering.py), finds which path a
  platform takes. It names ops and changes no value.
  """
  return jax.named_scope(function.__name__)(function)


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
  row-major order, added to zero. A custom VJP: reverse mode only.
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


# The functions below that the CPU alone runs, and those other platforms run in
# their place (the CPU runs _xla_conv too, for the shifted convolution's
# gradient): lowered for GPUs or TPUs, a program's ops carry no name of the
# first and, where the layer is used, the names of the second.
CPU_ONLY_PATHS = ("_shifted_conv", "_materialize_on_cpu")
ACCELERATOR_PATHS = ("_xla_conv",)

# Forward by shifted products up to this many input channels.
SHIFTED_CHANNELS = 3
_NHWC = ("NHWC", "HWIO", "NHWC")


def conv_general_dilated(
  lhs,
  rhs,
  window_strides,
  padding,
  lhs_dilation=None,
  rhs_dilation=None,
  dimension_numbers=None,
  feature_group_count=1,
  precision=None,
  **kwargs,
):
  """`lax.conv_general_dilated` (for `nn.Conv(..., conv_general_dilated=...)`), with
  the forward pass of a stride-1 NHWC convolution of at most SHIFTED_CHANNELS
  input channels computed as a sum of shifted products:
      y[b, h, w, :] = sum over (i, j, c) of x_padded[b, h + i, w + j, c] * W[i, j, c, :]

  Why: XLA:CPU's convolution kernels are slow when the input has a channel or
  three: LeNet-5's first convolution took 6.8 of a 16 ms step (bench/cpu/README.md).
  A few channels make few products, which XLA fuses into one loop. The
  gradients are XLA's own. The values equal XLA's convolution to float
  rounding (the same products, added in another order). Only float32 on the
  CPU takes this path; every other convolution is XLA's, bit for bit. It has
  a reverse-mode derivative only (a custom VJP), as jax.grad needs.
  """
  if (
    lhs.ndim == 4
    and rhs.ndim == 4
    and lhs.dtype == rhs.dtype == jnp.float32
    and lhs.shape[-1] <= SHIFTED_CHANNELS
    and tuple(window_strides) == (1, 1)
    and all(d == 1 for d in (lhs_dilation or ()))
    and all(d == 1 for d in (rhs_dilation or ()))
    and feature_group_count == 1
    and precision is None
    and not kwargs
    and dimension_numbers is not None
    and lax.conv_dimension_numbers(lhs.shape, rhs.shape, dimension_numbers)
    == lax.conv_dimension_numbers(lhs.shape, rhs.shape, _NHWC)
    and rhs.shape[2] == lhs.shape[3]
  ):
    if isinstance(padding, str):
      padding = lax.padtype_to_pads(lhs.shape[1:3], rhs.shape[:2], (1, 1), padding)
    pads = tuple((int(low), int(high)) for low, high in padding)
    if all(low >= 0 and high >= 0 for low, high in pads):
      return lax.platform_dependent(
        lhs,
        rhs,
        cpu=lambda x, kernel: _shifted_conv(x, kernel, pads),
        default=lambda x, kernel: _xla_conv(x, kernel, pads),
      )
  return lax.conv_general_dilated(
    lhs,
    rhs,
    window_strides,
    padding,
    lhs_dilation=lhs_dilation,
    rhs_dilation=rhs_dilation,
    dimension_numbers=dimension_numbers,
    feature_group_count=feature_group_count,
    precision=precision,
    **kwargs,
  )


@named_after_itself
def _xla_conv(x, kernel, pads):
  return lax.conv_general_dilated(x, kernel, (1, 1), pads, dimension_numbers=_NHWC)


@functools.partial(jax.custom_vjp, nondiff_argnums=(2,))
@named_after_itself
def _shifted_conv(x, kernel, pads):
  x = jnp.pad(x, ((0, 0), *pads, (0, 0)))
  rows, cols, channels, _ = kernel.shape
  height, width = x.shape[1] - rows + 1, x.shape[2] - cols + 1
  out = None
  for i in range(rows):
    for j in range(cols):
      for c in range(channels):
        # A broadcast product, not a dot: XLA fuses the whole sum into one loop.
        term = x[:, i : i + height, j : j + width, c : c + 1] * kernel[i, j, c]
        out = term if out is None else out + term
  return out


def _shifted_conv_forward(x, kernel, pads):
  return _shifted_conv(x, kernel, pads), (x, kernel)


def _shifted_conv_backward(pads, saved, grad):
  x, kernel = saved
  return jax.vjp(lambda x, kernel: _xla_conv(x, kernel, pads), x, kernel)[1](grad)


_shifted_conv.defvjp(_shifted_conv_forward, _shifted_conv_backward)


def materialize(x: jnp.ndarray) -> jnp.ndarray:
  """x, computed once into memory: on XLA:CPU no consumer recomputes it.

  Why: XLA:CPU's fusion copies a cheap elementwise producer into every
  consumer that can take it, and a ResNet's residual stream is a chain of
  such producers (BatchNorm, ReLU, additions) from one convolution to the
  next. Every filter gradient's transpose recomputed that chain back to the
  stage's first convolution, with a transposed memory access (bench/cpu/README.md).
  XLA does not copy a floating-point division into several consumers, so
  x / (1 + 0 * x) is computed once, and read by every consumer. It is x bit
  for bit where x is finite (and NaN where x is infinite, in a run that has
  diverged anyway). On other platforms x is returned as it is. The gradient
  passes through unchanged.
  """
  if not jnp.issubdtype(x.dtype, jnp.floating):
    return x  # a division would change the type; only floating chains are fused this way
  return _materialize(x)


@jax.custom_jvp
def _materialize(x):
  return lax.platform_dependent(x, cpu=_materialize_on_cpu, default=lambda x: x)


@named_after_itself
def _materialize_on_cpu(x):
  return x / (1 + 0 * x)


@_materialize.defjvp
def _materialize_jvp(primals, tangents):
  return _materialize(*primals), tangents[0]
