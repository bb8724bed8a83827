"""The networks' shared layers: a 2x2 max-pool with reduce_window's exact values and
gradient, a convolution of few input channels as shifted products, and materialize."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from easgd import steps
from easgd.models import layers, resnet
from easgd.models.layers import max_pool_2x2
from easgd.models.lenet import LeNet5
from easgd.rules import model_state


def _reference(x):
  return nn.max_pool(x, (2, 2), strides=(2, 2))


def _bits(array) -> np.ndarray:
  return np.asarray(array).view(np.uint32)


@pytest.mark.parametrize("shape", [(3, 8, 8, 2), (2, 7, 9, 3), (4, 28, 28, 6)])
def test_max_pool_2x2_equals_reduce_window_bit_for_bit_ties_included(shape):
  rng = np.random.default_rng(0)
  # Values from {-0.0, 0, 1, 2}: most windows hold ties, some of zeros of either
  # sign. Cotangents include -0.0.
  x = jnp.asarray(rng.choice([-0.0, 0.0, 1.0, 2.0], size=shape), jnp.float32)
  pooled_shape = (shape[0], shape[1] // 2, shape[2] // 2, shape[3])
  cotangent = jnp.asarray(rng.choice([-1.5, -0.0, 0.0, 2.5], size=pooled_shape), jnp.float32)

  def gradient(pool):
    return jax.jit(lambda x, g: jax.vjp(pool, x)[1](g)[0])(x, cotangent)

  assert np.array_equal(_bits(jax.jit(max_pool_2x2)(x)), _bits(_reference(x)))
  assert np.array_equal(_bits(gradient(max_pool_2x2)), _bits(gradient(_reference)))
  # Each window's gradient went to one entry: the first maximum.
  assert np.count_nonzero(gradient(max_pool_2x2)) == np.count_nonzero(cotangent)


@pytest.mark.e2e
def test_lenet5_gradient_is_the_same_with_either_max_pool():
  """LeNet-5's default pool leaves its whole gradient bit for bit as reduce_window's."""
  rng = np.random.default_rng(0)
  # Images of three grey levels: the pooled windows hold many ties.
  batch = {
    "image": jnp.asarray(rng.integers(0, 3, (16, 28, 28, 1)), jnp.uint8),
    "label": jnp.asarray(rng.integers(0, 10, 16), jnp.int32),
  }
  grads = []
  for pool in (max_pool_2x2, _reference):
    model = LeNet5(pool=pool)
    params = model.init(jax.random.PRNGKey(0), jnp.zeros((1, 28, 28, 1)))["params"]
    loss_fn = steps.make_loss_fn(model, lambda x: x.astype(jnp.float32) / 2.0)
    grads.append(jax.jit(jax.grad(lambda p, fn=loss_fn: fn(p, batch)[0]))(params))
  for ours, reference in zip(jax.tree.leaves(grads[0]), jax.tree.leaves(grads[1]), strict=True):
    assert np.array_equal(_bits(ours), _bits(reference))


def _numpy_conv(x, kernel, padding):
  """y[b, h, w, o] = sum over (i, j, c) of x_padded[b, h + i, w + j, c] kernel[i, j, c, o]."""
  x = np.pad(np.asarray(x, np.float64), ((0, 0), *padding, (0, 0)))
  kernel = np.asarray(kernel, np.float64)
  rows, cols = kernel.shape[:2]
  height, width = x.shape[1] - rows + 1, x.shape[2] - cols + 1
  out = np.zeros((x.shape[0], height, width, kernel.shape[3]))
  for i in range(rows):
    for j in range(cols):
      out += x[:, i : i + height, j : j + width, :] @ kernel[i, j]
  return out


@pytest.mark.parametrize(
  "x_shape,kernel_shape,padding",
  [
    ((4, 32, 32, 1), (5, 5, 1, 6), "VALID"),  # LeNet-5's first convolution
    ((3, 9, 9, 3), (3, 3, 3, 16), ((1, 1), (1, 1))),  # ResNet-20's first
    ((2, 7, 8, 2), (3, 3, 2, 4), "SAME"),
  ],
)
def test_shifted_convolution_matches_numpy_and_has_xlas_gradients(x_shape, kernel_shape, padding):
  rng = np.random.default_rng(0)
  x = jnp.asarray(rng.normal(size=x_shape), jnp.float32)
  kernel = jnp.asarray(rng.normal(size=kernel_shape), jnp.float32)
  numbers = jax.lax.conv_dimension_numbers(x_shape, kernel_shape, ("NHWC", "HWIO", "NHWC"))

  def conv(fn):
    return lambda x, k: fn(x, k, (1, 1), padding, dimension_numbers=numbers)

  ours, xla = conv(layers.conv_general_dilated), conv(jax.lax.conv_general_dilated)
  assert "custom_vjp_call" in str(jax.make_jaxpr(ours)(x, kernel))  # the shifted path
  pads = padding
  if isinstance(padding, str):
    pads = jax.lax.padtype_to_pads(x_shape[1:3], kernel_shape[:2], (1, 1), padding)
  y = jax.jit(ours)(x, kernel)
  np.testing.assert_allclose(y, _numpy_conv(x, kernel, pads), rtol=1e-5, atol=1e-4)
  cotangent = jnp.asarray(rng.normal(size=y.shape), jnp.float32)
  grads = jax.jit(lambda x, k, g: jax.vjp(ours, x, k)[1](g))(x, kernel, cotangent)
  expected = jax.jit(lambda x, k, g: jax.vjp(xla, x, k)[1](g))(x, kernel, cotangent)
  for got, want in zip(grads, expected, strict=True):
    assert np.array_equal(_bits(got), _bits(want))


def test_other_convolutions_are_xlas_bit_for_bit():
  rng = np.random.default_rng(1)
  # Strided, and with more input channels than SHIFTED_CHANNELS.
  for x_shape, strides in [((2, 9, 9, 2), (2, 2)), ((2, 9, 9, 4), (1, 1))]:
    x = jnp.asarray(rng.normal(size=x_shape), jnp.float32)
    kernel = jnp.asarray(rng.normal(size=(3, 3, x_shape[-1], 4)), jnp.float32)
    numbers = jax.lax.conv_dimension_numbers(x.shape, kernel.shape, ("NHWC", "HWIO", "NHWC"))
    args = (x, kernel, strides, "SAME")
    ours = layers.conv_general_dilated(*args, dimension_numbers=numbers)
    xla = jax.lax.conv_general_dilated(*args, dimension_numbers=numbers)
    assert np.array_equal(_bits(ours), _bits(xla))
  # lax's own default layout (NCHW, OIHW), where the last axis is not the channels.
  x = jnp.asarray(rng.normal(size=(2, 5, 6, 3)), jnp.float32)
  kernel = jnp.asarray(rng.normal(size=(1, 5, 3, 3)), jnp.float32)
  ours = layers.conv_general_dilated(x, kernel, (1, 1), "VALID")
  assert np.array_equal(
    _bits(ours), _bits(jax.lax.conv_general_dilated(x, kernel, (1, 1), "VALID"))
  )
  # Bad input is refused as lax refuses it: 3 input channels, a kernel for 1.
  numbers = jax.lax.conv_dimension_numbers((2, 8, 8, 3), (3, 3, 1, 4), ("NHWC", "HWIO", "NHWC"))
  with pytest.raises((ValueError, TypeError)):
    layers.conv_general_dilated(
      jnp.zeros((2, 8, 8, 3)), jnp.zeros((3, 3, 1, 4)), (1, 1), "SAME", dimension_numbers=numbers
    )


def test_materialize_is_the_identity_bit_for_bit_and_for_gradients():
  rng = np.random.default_rng(2)
  x = jnp.asarray(rng.choice([-0.0, 0.0, 1e-40, -3.5, 7e30], size=(4, 5)), jnp.float32)
  fn = jax.jit(lambda x: layers.materialize(jnp.sin(x) * x))
  assert np.array_equal(_bits(fn(x)), _bits(jax.jit(lambda x: jnp.sin(x) * x)(x)))
  cotangent = jnp.asarray(rng.normal(size=(4, 5)), jnp.float32)
  assert np.array_equal(_bits(jax.vjp(layers.materialize, x)[1](cotangent)[0]), _bits(cotangent))
  # On the CPU it is the one division that keeps XLA from copying x into its consumers.
  if jax.default_backend() == "cpu":
    assert "divide(" in jax.jit(layers.materialize).lower(x).compile().as_text()
  # Integers are left alone (a division would make them floats).
  assert layers.materialize(jnp.arange(3)).dtype == jnp.arange(3).dtype


@pytest.mark.e2e
def test_resnet_gradient_is_the_same_with_its_activations_materialized(monkeypatch):
  rng = np.random.default_rng(3)
  batch = {
    "image": jnp.asarray(rng.integers(0, 256, (4, 16, 16, 3)), jnp.uint8),
    "label": jnp.asarray(rng.integers(0, 10, 4), jnp.int32),
  }
  results = []
  for materialize in (layers.materialize, lambda x: x):
    monkeypatch.setattr(resnet, "materialize", materialize)
    model = resnet.ResNet(num_classes=10, blocks_per_stage=1)
    tree = model_state.model_tree(model.init(jax.random.PRNGKey(0), jnp.zeros((1, 16, 16, 3))))
    loss_fn = steps.make_loss_fn(model, lambda x: x.astype(jnp.float32) / 255.0)
    grad = jax.value_and_grad(lambda t, fn=loss_fn: fn(t, batch), has_aux=True)
    results.append(jax.jit(grad)(tree))
  for ours, reference in zip(jax.tree.leaves(results[0]), jax.tree.leaves(results[1]), strict=True):
    assert np.array_equal(_bits(ours), _bits(reference))
