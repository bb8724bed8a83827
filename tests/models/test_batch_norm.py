"""models/batch_norm.py against a float64 NumPy BatchNorm (its equations, forward and
backward), against JAX's own derivative of those equations, and against Flax's
nn.BatchNorm, whose variables it shares."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from easgd.models.batch_norm import BatchNorm, batch_norm_train, channel_sums

EPSILON = 1e-5
MOMENTUM = 0.9


def _numpy_forward(x, scale, bias):
  """y, batch mean and (biased) variance over every axis but the last, in float64."""
  x = np.asarray(x, np.float64).reshape(-1, x.shape[-1])
  mean = x.mean(axis=0)
  var = np.maximum((x * x).mean(axis=0) - mean * mean, 0.0)
  x_hat = (x - mean) / np.sqrt(var + EPSILON)
  return scale * x_hat + bias, mean, var


def _numpy_backward(x, scale, dy):
  """dx, dscale, dbias of sum(dy * y), from the chain rule written out in float64."""
  shape = x.shape
  x = np.asarray(x, np.float64).reshape(-1, shape[-1])
  dy = np.asarray(dy, np.float64).reshape(-1, shape[-1])
  count = x.shape[0]
  mean = x.mean(axis=0)
  var = x.var(axis=0)
  std = np.sqrt(var + EPSILON)
  x_hat = (x - mean) / std
  dx_hat = dy * scale
  dvar = (dx_hat * (x - mean)).sum(axis=0) * -0.5 * std**-3
  dmean = -(dx_hat / std).sum(axis=0) + dvar * (-2.0 * (x - mean)).mean(axis=0)
  dx = dx_hat / std + dvar * 2.0 * (x - mean) / count + dmean / count
  return dx.reshape(shape), (dy * x_hat).sum(axis=0), dy.sum(axis=0)


def _inputs(shape, seed=0):
  rng = np.random.default_rng(seed)
  channels = shape[-1]
  x = rng.normal(1.0, 2.0, shape) * rng.uniform(0.5, 3.0, channels)
  scale = rng.uniform(0.5, 1.5, channels)
  bias = rng.normal(0.0, 0.3, channels)
  dy = rng.normal(0.0, 1.0, shape)
  return x, scale, bias, dy


def _close(ours, reference, tolerance):
  ours, reference = np.asarray(ours, np.float64), np.asarray(reference, np.float64)
  scale = np.abs(reference).max()
  np.testing.assert_allclose(ours, reference, rtol=0, atol=tolerance * scale)


def test_numpy_backward_is_the_derivative_of_the_numpy_forward():
  """The reference's gradient against central differences of its forward pass."""
  x, scale, bias, dy = _inputs((3, 2, 2, 2))
  dx, dscale, dbias = _numpy_backward(x, scale, dy)
  step = 1e-6
  for index in np.ndindex(x.shape):
    up, down = x.copy(), x.copy()
    up[index] += step
    down[index] -= step
    slope = (_numpy_forward(up, scale, bias)[0] - _numpy_forward(down, scale, bias)[0]) / (2 * step)
    assert abs((slope * dy.reshape(slope.shape)).sum() - dx[index]) < 1e-6
  y_hat = (_numpy_forward(x, scale, bias)[0] - bias) / scale
  np.testing.assert_allclose(dscale, (dy.reshape(y_hat.shape) * y_hat).sum(axis=0), atol=1e-9)
  np.testing.assert_allclose(dbias, dy.reshape(-1, 2).sum(axis=0), atol=1e-9)


@pytest.mark.parametrize("shape", [(128, 32, 32, 16), (16, 8, 8, 64), (5, 3, 7, 6)])
def test_training_step_matches_the_numpy_equations(shape):
  """float32, as the networks run it (the first shape is a ResNet-20 stage-1 layer)."""
  x, scale, bias, dy = _inputs(shape)
  args = [jnp.asarray(a, jnp.float32) for a in (x, scale, bias, dy)]

  @jax.jit
  def step(x, scale, bias, dy):
    outputs, backward = jax.vjp(lambda *a: batch_norm_train(*a, EPSILON), x, scale, bias)
    return outputs, backward((dy, jnp.zeros_like(scale), jnp.zeros_like(scale)))

  (y, mean, var), (dx, dscale, dbias) = step(*args)
  y_ref, mean_ref, var_ref = _numpy_forward(x, scale, bias)
  dx_ref, dscale_ref, dbias_ref = _numpy_backward(x, scale, dy)
  # Within 2e-6 of the largest entry: float32 rounding. A sum of all M entries
  # in one product drifts past it (bench/cpu/README.md), as Flax's module does.
  _close(y.reshape(y_ref.shape), y_ref, 2e-6)
  _close(mean, mean_ref, 2e-6)
  _close(var, var_ref, 2e-6)
  _close(dx, dx_ref, 2e-6)
  _close(dscale, dscale_ref, 2e-6)
  _close(dbias, dbias_ref, 2e-6)


def _plain(x, scale, bias):
  """The forward equations in jnp, for JAX's own derivative (no custom rule)."""
  axes = tuple(range(x.ndim - 1))
  mean = x.mean(axis=axes)
  var = jnp.maximum((x * x).mean(axis=axes) - mean * mean, 0.0)
  return (x - mean) * jax.lax.rsqrt(var + EPSILON) * scale + bias, mean, var


def test_gradient_through_every_output_matches_jax_autodiff_in_float64():
  """Cotangents on y, on the batch mean and on the variance (zero in training, where
  they only feed the running averages, but part of the rule) against jax.vjp of the
  plain equations, in float64."""
  with jax.enable_x64():
    x, scale, bias, dy = (jnp.asarray(a) for a in _inputs((6, 5, 4, 3), seed=1))
    rng = np.random.default_rng(2)
    dmean, dvar = jnp.asarray(rng.normal(size=3)), jnp.asarray(rng.normal(size=3))
    ours = jax.vjp(lambda *a: batch_norm_train(*a, EPSILON), x, scale, bias)
    plain = jax.vjp(_plain, x, scale, bias)
    for a, b in zip(ours[0], plain[0], strict=True):
      np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-12)
    for a, b in zip(ours[1]((dy, dmean, dvar)), plain[1]((dy, dmean, dvar)), strict=True):
      np.testing.assert_allclose(a, b, rtol=1e-10, atol=1e-10)


def test_a_channel_of_one_value_has_a_finite_gradient():
  """A constant channel: the variance is 0; y is the bias and the gradient is finite."""
  x, scale, bias, dy = _inputs((4, 3, 3, 2))
  x[..., 0] = 0.75
  with jax.enable_x64():
    args = [jnp.asarray(a) for a in (x, scale, bias)]
    outputs, backward = jax.vjp(lambda *a: batch_norm_train(*a, EPSILON)[0], *args)
    grads = backward(jnp.asarray(dy))
    _, plain_backward = jax.vjp(lambda *a: _plain(*a)[0], *args)
    plain_grads = plain_backward(jnp.asarray(dy))
  np.testing.assert_allclose(outputs[..., 0], bias[0], atol=1e-12)
  for ours, plain in zip(grads, plain_grads, strict=True):
    assert np.isfinite(ours).all()
    np.testing.assert_allclose(ours, plain, rtol=1e-9, atol=1e-9)


def test_a_variance_clipped_at_zero_depends_on_nothing():
  """A large mean and a tiny spread: in float32, E[x^2] - mean^2 rounds to 0 or below
  and is clipped. Then var is a constant: dx has no x^ term and the variance's
  cotangent does nothing, while the mean's still passes (dmean / M)."""
  rng = np.random.default_rng(3)
  x = np.stack([3000 + 1e-3 * rng.normal(size=(8, 4, 4)), rng.normal(size=(8, 4, 4))], -1)
  x, scale, bias = (jnp.asarray(a, jnp.float32) for a in (x, [1.3, 0.7], [0.2, -0.1]))
  dy = jnp.asarray(rng.normal(size=x.shape), jnp.float32)
  dmean, dvar = jnp.asarray([0.5, 0.25], jnp.float32), jnp.asarray([2.0, -1.0], jnp.float32)
  (_, _, var), backward = jax.vjp(lambda *a: batch_norm_train(*a, EPSILON), x, scale, bias)
  assert float(var[0]) == 0.0  # the clipped case is reached
  dx = backward((dy, dmean, dvar))[0][..., 0]
  count = x[..., 0].size
  inv = float(jax.lax.rsqrt(jnp.float32(EPSILON)))
  expected = 1.3 * inv * (dy[..., 0] - dy[..., 0].mean()) + 0.5 / count
  _close(dx, expected, 1e-5)
  without_dvar = backward((dy, dmean, jnp.zeros_like(dvar)))[0][..., 0]
  assert np.array_equal(np.asarray(dx), np.asarray(without_dvar))


@pytest.mark.parametrize("shape", [(128, 32, 32, 16), (3, 5, 5, 7), (1, 2, 2, 3)])
def test_channel_sums(shape):
  x = np.random.default_rng(0).normal(1.0, 2.0, shape)
  ours = jax.jit(channel_sums)(jnp.asarray(x, jnp.float32))
  _close(ours, x.reshape(-1, shape[-1]).sum(axis=0), 1e-6)


def _modules(**kwargs):
  return (
    BatchNorm(momentum=MOMENTUM, epsilon=EPSILON, **kwargs),
    nn.BatchNorm(momentum=MOMENTUM, epsilon=EPSILON, **kwargs),
  )


def test_the_module_shares_flax_variables_and_running_averages():
  x = jnp.asarray(_inputs((8, 6, 6, 5))[0], jnp.float32)
  ours, flax_bn = _modules(use_running_average=False)
  variables = ours.init(jax.random.PRNGKey(0), x)
  flax_variables = flax_bn.init(jax.random.PRNGKey(0), x)
  assert jax.tree.structure(variables) == jax.tree.structure(flax_variables)
  for a, b in zip(jax.tree.leaves(variables), jax.tree.leaves(flax_variables), strict=True):
    assert a.dtype == b.dtype == jnp.float32 and np.array_equal(a, b)
  # One training step: outputs and the running averages, as Flax moves them.
  variables = jax.tree.map(lambda v: v + 0.25, variables)
  y, updated = ours.apply(variables, x, mutable=["batch_stats"])
  y_flax, updated_flax = flax_bn.apply(variables, x, mutable=["batch_stats"])
  _close(y, y_flax, 1e-6)
  _, mean, var = _numpy_forward(np.asarray(x), 1.0, 0.0)
  for name, batch_value in (("mean", mean), ("var", var)):
    expected = MOMENTUM * (variables["batch_stats"][name]) + (1 - MOMENTUM) * batch_value
    _close(updated["batch_stats"][name], expected, 1e-6)
    _close(updated["batch_stats"][name], updated_flax["batch_stats"][name], 1e-6)
  # Evaluation normalizes with the running averages: Flax's values.
  ours_eval, flax_eval = _modules(use_running_average=True)
  _close(ours_eval.apply(variables, x), flax_eval.apply(variables, x), 1e-6)


def test_the_module_computes_in_float32_and_returns_its_dtype():
  x = jnp.asarray(_inputs((4, 4, 4, 3))[0], jnp.bfloat16)
  ours, flax_bn = _modules(use_running_average=False, dtype=jnp.bfloat16)
  variables = ours.init(jax.random.PRNGKey(0), x)
  y, updated = ours.apply(variables, x, mutable=["batch_stats"])
  y_flax, updated_flax = flax_bn.apply(variables, x, mutable=["batch_stats"])
  assert y.dtype == jnp.bfloat16
  assert updated["batch_stats"]["mean"].dtype == jnp.float32
  _close(y.astype(jnp.float32), y_flax.astype(jnp.float32), 1e-2)
  _close(updated["batch_stats"]["var"], updated_flax["batch_stats"]["var"], 1e-5)


@pytest.mark.parametrize("shape", [(16, 7), (6, 5, 5, 4)])
def test_a_training_loss_has_flax_gradients(shape):
  """jax.grad of a loss through the module, as a training step takes it (rank 2 is a
  BatchNorm after a dense layer), against the same loss through Flax's module."""
  x, _, _, target = (jnp.asarray(a, jnp.float32) for a in _inputs(shape, seed=4))
  ours, flax_bn = _modules(use_running_average=False)
  variables = jax.tree.map(lambda v: v * 1.1 + 0.05, ours.init(jax.random.PRNGKey(0), x))

  def loss(variables, x, module):
    y, updated = module.apply(variables, x, mutable=["batch_stats"])
    return jnp.sum(jnp.tanh(y) * target), updated

  results = [
    jax.jit(jax.grad(loss, argnums=(0, 1), has_aux=True), static_argnums=2)(variables, x, m)
    for m in (ours, flax_bn)
  ]
  (grads, stats), (flax_grads, flax_stats) = results
  ours_leaves = jax.tree.leaves((grads, stats))
  flax_leaves = jax.tree.leaves((flax_grads, flax_stats))
  assert len(ours_leaves) == 7  # d(scale, bias, mean, var), dx; the new mean and var
  for a, b in zip(ours_leaves, flax_leaves, strict=True):
    _close(a, b, 1e-5)
