"""Delayed Nesterov (optimizers.delayed_nesterov), async_local_sgd's master, against
its equations in plain NumPy and the identities they imply."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import numpy_optim
from easgd.rules import optimizers

SHAPES = {"w": (3, 4), "b": (4,)}


def pushes(count, seed=0):
  rng = np.random.default_rng(seed)
  return [
    {k: rng.normal(size=shape).astype(np.float32) for k, shape in SHAPES.items()}
    for _ in range(count)
  ]


def steps_of(optimizer, grads):
  """The updates `optimizer` gives for each of `grads` in turn, jitted as a master is."""
  params = {k: jnp.zeros(shape, jnp.float32) for k, shape in SHAPES.items()}
  state = optimizer.init(params)
  update = jax.jit(optimizer.update)
  updates = []
  for g in grads:
    u, state = update(g, state, params)
    updates.append(jax.device_get(u))
  return updates


@pytest.mark.parametrize(
  "eta,beta,period,activation",
  [(0.7, 0.9, 3, 0.0), (0.5, 0.8, 3, 0.1), (0.7, 0.9, 4, 0.25), (0.3, 0.0, 2, 0.0)],
)
def test_it_follows_the_papers_algorithm(eta, beta, period, activation):
  grads = pushes(11)
  actual = steps_of(optimizers.delayed_nesterov(eta, beta, period, activation), grads)
  reference = numpy_optim.DelayedNesterov(eta, beta, period, activation)
  state = reference.init({k: np.zeros(shape) for k, shape in SHAPES.items()})
  for g, u in zip(grads, actual, strict=True):
    expected, state = reference.update({k: v.astype(np.float64) for k, v in g.items()}, state, None)
    for k in SHAPES:
      np.testing.assert_allclose(u[k], expected[k], rtol=1e-5, atol=1e-6)


def test_with_one_push_a_period_it_is_optaxs_nesterov_sgd_bitwise():
  grads = pushes(7)
  delayed = steps_of(optimizers.delayed_nesterov(0.7, 0.9, 1, 0.0), grads)
  nesterov = steps_of(optax.sgd(0.7, momentum=0.9, nesterov=True), grads)
  for a, b in zip(delayed, nesterov, strict=True):
    for k in SHAPES:
      assert a[k].tobytes() == b[k].tobytes()


def test_without_momentum_each_push_is_sgd_at_eta_over_n():
  grads = pushes(6)
  updates = steps_of(optimizers.delayed_nesterov(0.6, 0.0, 3, 0.0), grads)
  for g, u in zip(grads, updates, strict=True):
    for k in SHAPES:
      np.testing.assert_allclose(u[k], -0.2 * g[k], rtol=1e-6)


def test_without_activation_n_pushes_are_one_nesterov_step_on_their_mean():
  """c = 0: each push alone at eta_o/N, and the momentum's step at the N-th; their
  sum is optax's Nesterov SGD on the N pushes' mean, from the same momentum."""
  period = 4
  grads = pushes(3 * period)
  delayed = steps_of(optimizers.delayed_nesterov(0.7, 0.9, period, 0.0), grads)
  means = [
    {k: np.mean([g[k] for g in grads[n : n + period]], axis=0) for k in SHAPES}
    for n in range(0, len(grads), period)
  ]
  nesterov = steps_of(optax.sgd(0.7, momentum=0.9, nesterov=True), means)
  for n, expected in enumerate(nesterov):
    for k in SHAPES:
      total = sum(u[k] for u in delayed[n * period : (n + 1) * period])
      np.testing.assert_allclose(total, expected[k], rtol=1e-5, atol=1e-6)
