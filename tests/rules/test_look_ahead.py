"""EAMSGD's look-ahead Nesterov momentum in the MEASGD rules (optimizers.look_ahead_sgd),
against its equations in plain NumPy and the identities they imply."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import tiers
from test_outer import assert_follows
from test_parameter_server import EQUAL, hyper_for, make_data, run_ticks
from test_rules import ALPHA, ETA, MU, make_problem, per_worker, run_rule

import numpy_optim
from easgd import rules, steps
from easgd.infra import sharding
from least_squares import loss_fn, numpy_grad

WORKERS = 4


def measgd(**values):
  base = dict(
    num_workers=WORKERS,
    learning_rate=ETA,
    momentum=MU,
    nesterov=True,
    comm_period=2,
    moving_rate=ALPHA,
  )
  return rules.Hyper(**{**base, **values})


@pytest.mark.parametrize(
  "settings,rate",
  [
    (dict(), numpy_optim.constant(ETA)),
    (
      dict(schedule="warmup_cosine", warmup_steps=2, total_steps=7, weight_decay=0.1),
      numpy_optim.warmup_cosine(ETA, 2, 7),
    ),
  ],
)
def test_sync_eamsgd_takes_the_gradient_and_the_l2_term_at_the_look_ahead_point(settings, rate):
  x0, batches = make_problem(num_workers=WORKERS)
  actual = run_rule("sync_measgd", measgd(**settings), x0, batches, 2)
  inner = numpy_optim.LookAheadSGD(rate, MU, wd=settings.get("weight_decay", 0.0))
  expected = numpy_optim.center_family(
    x0,
    [per_worker(b) for b in batches],
    numpy_grad,
    inner,
    2,
    "elastic",
    numpy_optim.sgd(WORKERS * ALPHA),
    ALPHA,
  )
  assert_follows(actual, expected)


@pytest.mark.parametrize("num_devices", tiers.devices(4, 2, 1))
def test_the_first_step_of_sync_eamsgd_is_sync_easgds_bit_for_bit(num_devices):
  """At v = 0 the look-ahead point is x and v <- -eta*g: EASGD's step (an exchange step
  whose elastic force is still 0, as every x_i starts at the center)."""
  x0, batches = make_problem(num_workers=WORKERS, steps_count=2)
  eamsgd = run_rule("sync_measgd", measgd(comm_period=1), x0, batches, num_devices)
  plain = measgd(comm_period=1, momentum=0.0, nesterov=False)
  easgd = run_rule("sync_easgd", plain, x0, batches, num_devices)
  for a, b in ((eamsgd[0].center, easgd[0].center), (eamsgd[0].workers, easgd[0].workers)):
    for key in x0:
      np.testing.assert_array_equal(a[key], b[key])
  # The workers moved, and the second steps differ: momentum acts.
  assert not np.array_equal(eamsgd[0].workers["w"][0], np.float32(x0["w"]))
  assert not np.array_equal(eamsgd[1].workers["w"], easgd[1].workers["w"])


def positions(state):
  """The center's and the workers' arrays."""
  return jax.tree.leaves((state.center, state.workers))


def test_the_first_step_of_each_async_eamsgd_worker_is_async_easgds_bit_for_bit():
  """Every tick before any worker's second local step, exchanges included."""
  x0, batches = make_data(WORKERS, steps_count=10)
  eamsgd = dataclasses.replace(hyper_for("async_measgd", WORKERS), comm_period=1)
  easgd = dataclasses.replace(eamsgd, momentum=0.0, nesterov=False)
  with_momentum, ticks = run_ticks("async_measgd", eamsgd, EQUAL, x0, batches, 8, 2)
  without, _ = run_ticks("async_easgd", easgd, EQUAL, x0, batches, 8, 2)
  compared = served = 0
  for a, b, tick in zip(with_momentum, without, ticks, strict=True):
    if int(np.max(a.worker_steps)) > 1:
      break
    served += len(tick.ops)
    for x, y in zip(positions(a), positions(b), strict=True):
      np.testing.assert_array_equal(x, y)
    compared += 1
  assert compared >= 1 and served >= 1


def test_the_step_reports_the_loss_of_the_look_ahead_forward_pass():
  """The step's loss is the mean over workers of L_i(x_i + mu*v_i), the pass its
  gradient came from."""
  x0, batches = make_problem(num_workers=WORKERS, steps_count=2)
  mesh = sharding.make_mesh(2)
  rule = rules.make_rule("sync_measgd", measgd())
  params = jax.tree.map(lambda a: jnp.asarray(a, jnp.float32), x0)
  state = steps.init_state(rule, params, jax.random.PRNGKey(0), mesh)
  step = steps.build_rule_step(rule, loss_fn, mesh, state)
  as_float32 = [jax.tree.map(lambda a: jnp.asarray(a, jnp.float32), b) for b in batches]
  state, _ = step(state, as_float32[0], {})
  before = jax.device_get(state)
  _, metrics = step(state, as_float32[1], {})
  velocity = before.worker_opt["inner"].velocity
  assert np.abs(velocity["w"]).max() > 0

  def loss(p, batch):
    residual = batch["x"] @ p["w"] + p["b"] - batch["y"]
    return 0.5 * np.mean(np.sum(residual**2, axis=-1))

  look_ahead = [
    loss({k: before.workers[k][i] + MU * velocity[k][i] for k in x0}, b)
    for i, b in enumerate(per_worker(batches[1]))
  ]
  at_x = [
    loss({k: before.workers[k][i] for k in x0}, b) for i, b in enumerate(per_worker(batches[1]))
  ]
  np.testing.assert_allclose(float(metrics["loss"]), np.mean(look_ahead), rtol=1e-5)
  assert abs(np.mean(look_ahead) - np.mean(at_x)) > 1e-3 * np.mean(at_x)
