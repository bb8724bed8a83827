"""BatchNorm with its statistics and gradient written out: Flax's nn.BatchNorm, faster on CPUs.

Training mode, over the M = batch x height x width entries of each channel:
    mean = (1/M) sum x                var = max(0, (1/M) sum x^2 - mean^2)
    x^ = (x - mean) / sqrt(var + eps)  y = scale * x^ + bias
and the gradient, given dy (and the cotangents of the statistics, zero in a
training step, where they only feed the running averages):
    dbias = sum dy                    dscale = sum dy * x^
    dx = scale / sqrt(var + eps) * (dy - dbias / M - x^ * dscale / M)
         + dmean / M + dvar * 2 (x - mean) / M
(the last two terms, and the variance's part of the first, vanish where the
variance was clipped at 0). Evaluation normalizes with the running averages,
which move as Flax's do: r <- momentum * r + (1 - momentum) * batch value.

Why: XLA:CPU rewrites a sum over more than 32 entries of an axis into a
reduce-window of partial sums and then a reduce, and those reduce-windows, two
in the forward pass and three in the backward pass of every BatchNorm, took a
quarter of ResNet-20's step (bench/cpu/README.md). Here each sum is first a
matrix-vector product over the leading (batch) axis, ones[n] @ x[n, rest],
which XLA hands to its dot kernels, then a plain sum of the n-times shorter
result; every output of the product adds only n entries, so the rounding stays
near that of XLA's pairwise sums (tests/models/test_batch_norm.py). The gradient is
written out so that it takes the two sums above and one elementwise pass. The
parameters and statistics have Flax's names, shapes and dtypes (float32), so
either module reads the other's variables. The sums take this form on the CPU
only (channel_sums). The gradient is a custom VJP: reverse mode only, as
jax.grad needs.
"""

import functools
from collections.abc import Callable

import flax.linen as nn
import jax
import jax.numpy as jnp
from flax.typing import Dtype
from jax import lax

from easgd.models.layers import named_after_itself

# The sums the CPU alone computes, and those other platforms compute in their
# place (see channel_sums; tests/test_lowering.py checks the lowerings for both).
CPU_ONLY_PATHS = ("_sums_by_product",)
ACCELERATOR_PATHS = ("_sums_by_reduction",)


def channel_sums(x: jnp.ndarray) -> jnp.ndarray:
  """[n, ..., C] -> [C]: each channel's sum, in float32 (float64 for float64 x).

  On the CPU, over the leading axis by a matrix-vector product first (see the
  module docstring); elsewhere XLA's own reduction, since GPUs and TPUs would
  run the product at reduced precision (TF32, bfloat16) by default and their
  reductions are not slow.
  """
  return lax.platform_dependent(x, cpu=_sums_by_product, default=_sums_by_reduction)


@named_after_itself
def _sums_by_product(x):
  leading = x.shape[0]
  per_entry = jnp.matmul(
    jnp.ones((leading,), x.dtype),
    x.reshape(leading, -1),
    precision=lax.Precision.HIGHEST,
    preferred_element_type=_summed_type(x),
  )
  return per_entry.reshape(-1, x.shape[-1]).sum(axis=0)


@named_after_itself
def _sums_by_reduction(x):
  return x.astype(_summed_type(x)).sum(axis=tuple(range(x.ndim - 1)))


def _summed_type(x):
  return jnp.promote_types(x.dtype, jnp.float32)  # float32, or float64 where x is


def _statistics(x):
  count = x.size // x.shape[-1]
  mean = channel_sums(x) / count
  raw_var = channel_sums(x * x) / count - mean * mean
  return mean, raw_var


@functools.partial(jax.custom_vjp, nondiff_argnums=(3,))
def batch_norm_train(x, scale, bias, epsilon):
  """(y, mean, var) of a training step for x [n, ..., C] float32; see the module docstring."""
  return _train_forward(x, scale, bias, epsilon)[0]


def _train_forward(x, scale, bias, epsilon):
  mean, raw_var = _statistics(x)
  var = jnp.maximum(raw_var, 0.0)
  inv = lax.rsqrt(var + epsilon)
  y = (x - mean) * (inv * scale) + bias
  return (y, mean, var), (x, scale, mean, inv, raw_var > 0)


def _train_backward(epsilon, saved, cotangents):
  del epsilon  # in inv already
  x, scale, mean, inv, live = saved
  dy, dmean, dvar = cotangents
  count = x.size // x.shape[-1]
  centered = x - mean
  x_hat = centered * inv
  dbias = channel_sums(dy)
  dscale = channel_sums(dy * x_hat)
  # Where the variance was clipped at 0 it depends on nothing: no x^ term, no dvar.
  through_var = jnp.where(live, dscale / count, 0.0)
  dvar = jnp.where(live, dvar, 0.0)
  dx = (scale * inv) * (dy - dbias / count - x_hat * through_var)
  dx = dx + dmean / count + centered * (2 * dvar / count)
  return dx, dscale, dbias


batch_norm_train.defvjp(_train_forward, _train_backward)


class BatchNorm(nn.Module):
  """The subset of nn.BatchNorm the networks use: over every axis but the last,
  Flax's fast variance, computed in float32 with float32 parameters and
  statistics, output in `dtype` (by default x's, at least float32). Arguments
  nn.BatchNorm has and this does not (axis, axis_name, use_bias, ...) are
  refused as unknown."""

  use_running_average: bool
  momentum: float = 0.99
  epsilon: float = 1e-5
  dtype: Dtype | None = None
  scale_init: Callable = nn.initializers.ones
  bias_init: Callable = nn.initializers.zeros

  @nn.compact
  def __call__(self, x: jnp.ndarray) -> jnp.ndarray:
    channels = x.shape[-1]
    ra_mean = self.variable("batch_stats", "mean", jnp.zeros, (channels,), jnp.float32)
    ra_var = self.variable("batch_stats", "var", jnp.ones, (channels,), jnp.float32)
    scale = self.param("scale", self.scale_init, (channels,), jnp.float32)
    bias = self.param("bias", self.bias_init, (channels,), jnp.float32)
    dtype = self.dtype or jnp.result_type(x, jnp.float32)
    x32 = x.astype(jnp.float32)
    if self.use_running_average:
      inv = lax.rsqrt(ra_var.value + self.epsilon)
      return ((x32 - ra_mean.value) * (inv * scale) + bias).astype(dtype)
    y, mean, var = batch_norm_train(x32, scale, bias, self.epsilon)
    if not self.is_initializing():
      ra_mean.value = self.momentum * ra_mean.value + (1 - self.momentum) * mean
      ra_var.value = self.momentum * ra_var.value + (1 - self.momentum) * var
    return y.astype(dtype)
