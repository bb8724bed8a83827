"""The networks' shared layers: a 2x2 max-pool with reduce_window's exact values and gradient."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from easgd.models.layers import max_pool_2x2


def _reference(x):
  return nn.max_pool(x, (2, 2), strides=(2, 2))


def _bits(array) -> np.ndarray:
  return np.asarray(array).view(np.uint32)


@pytest.mark.parametrize("shape", [(3, 8, 8, 2), (2, 7, 9, 3), (4, 28, 28, 6)])
def test_max_pool_2x2_equals_reduce_window_bit_for_bit_ties_included(shape):
  rng = np.random.default_rng(0)
  # Values from {0, 1, 2}: most windows hold ties. Cotangents include -0.0.
  x = jnp.asarray(rng.integers(0, 3, size=shape), jnp.float32)
  pooled_shape = (shape[0], shape[1] // 2, shape[2] // 2, shape[3])
  cotangent = jnp.asarray(rng.choice([-1.5, -0.0, 0.0, 2.5], size=pooled_shape), jnp.float32)

  def gradient(pool):
    return jax.jit(lambda x, g: jax.vjp(pool, x)[1](g)[0])(x, cotangent)

  assert np.array_equal(_bits(jax.jit(max_pool_2x2)(x)), _bits(_reference(x)))
  assert np.array_equal(_bits(gradient(max_pool_2x2)), _bits(gradient(_reference)))
  # Each window's gradient went to one entry: the first maximum.
  assert np.count_nonzero(gradient(max_pool_2x2)) == np.count_nonzero(cotangent)
