"""The center family (diloco, local_sgd, lookahead, and EASGD as a member) and the inner
optimizers, run sharded over the mesh, against plain NumPy step by step."""

import dataclasses

import jax
import numpy as np
import pytest
import tiers
from test_rules import ALPHA, ETA, assert_close, make_problem, per_worker, run_rule

import numpy_optim
import numpy_reference
from easgd import rules
from easgd.rules import optimizers
from least_squares import numpy_grad

TAU = 3


def hyper(**values):
  base = dict(num_workers=8, learning_rate=ETA, comm_period=TAU, moving_rate=ALPHA)
  return rules.Hyper(**{**base, **values})


def worker(state, i):
  return jax.tree.map(lambda a: a[i], state.workers)


def assert_follows(actual, expected):
  for state, (workers, center) in zip(actual, expected, strict=True):
    assert_close(state.center, center)
    for i, values in enumerate(workers):
      assert_close(worker(state, i), values)


def run_reference(batches, x0, inner, pull, outer, alpha=0.0, tau=TAU):
  return numpy_optim.center_family(
    x0, [per_worker(b) for b in batches], numpy_grad, inner, tau, pull, outer, alpha=alpha
  )


ADAMW = dict(optimizer="adamw", learning_rate=0.01, weight_decay=0.1)


def numpy_adamw():
  return numpy_optim.Optimizer("adamw", numpy_optim.constant(0.01), wd=0.1)


@pytest.mark.parametrize("num_devices", tiers.devices(8, 2, 1))
def test_diloco_follows_its_equations(num_devices):
  """AdamW inside, outer SGD with Nesterov momentum (0.7, 0.9), workers reset."""
  x0, batches = make_problem(num_workers=8)
  settings = hyper(**ADAMW, outer_learning_rate=0.7, outer_momentum=0.9, outer_nesterov=True)
  actual = run_rule("diloco", settings, x0, batches, num_devices)
  outer = numpy_optim.sgd(0.7, mu=0.9, nesterov=True)
  assert_follows(actual, run_reference(batches, x0, numpy_adamw(), "reset", outer))


@pytest.mark.parametrize("num_devices", tiers.devices(8, 2, 1))
def test_local_sgd_follows_its_equations(num_devices):
  x0, batches = make_problem(num_workers=8)
  actual = run_rule("local_sgd", hyper(momentum=0.9), x0, batches, num_devices)
  inner = numpy_optim.sgd(ETA, mu=0.9)
  assert_follows(actual, run_reference(batches, x0, inner, "reset", numpy_optim.sgd(1.0)))


@pytest.mark.parametrize("num_workers,num_devices", [(8, 8), (8, 2), (1, 1)])
def test_lookahead_follows_its_equations(num_workers, num_devices):
  """Slow weights at rate alpha_LA = outer.learning_rate; P = 1 is the paper's optimizer."""
  x0, batches = make_problem(num_workers=num_workers)
  settings = hyper(num_workers=num_workers, outer_learning_rate=0.5, outer_momentum=0.9)
  actual = run_rule("lookahead", settings, x0, batches, num_devices)
  inner = numpy_optim.sgd(ETA)
  # Lookahead's outer SGD has no momentum, whatever outer.momentum says.
  assert_follows(actual, run_reference(batches, x0, inner, "reset", numpy_optim.sgd(0.5)))


def test_an_adam_outer_optimizer_follows_its_equations():
  x0, batches = make_problem(num_workers=4)
  settings = hyper(num_workers=4, outer_optimizer="adam", outer_learning_rate=0.05)
  actual = run_rule("diloco", settings, x0, batches, 2)
  outer = numpy_optim.Optimizer("adamw", numpy_optim.constant(0.05))
  assert_follows(actual, run_reference(batches, x0, numpy_optim.sgd(ETA), "reset", outer))


@pytest.mark.parametrize("num_devices", tiers.devices(8, 1))
def test_sync_easgd_is_the_family_with_outer_sgd_at_p_alpha_and_the_elastic_pull(num_devices):
  x0, batches = make_problem(num_workers=8)
  family = hyper(pull="elastic", outer_learning_rate=8 * ALPHA, outer_momentum=0.0)
  as_family = run_rule("diloco", family, x0, batches, num_devices)
  expected = numpy_reference.sync_easgd(
    x0, [per_worker(b) for b in batches], numpy_grad, ETA, ALPHA, TAU
  )
  assert_follows(as_family, expected)
  easgd = run_rule("sync_easgd", hyper(), x0, batches, num_devices)
  for a, b in zip(as_family, easgd, strict=True):
    for key in x0:
      np.testing.assert_allclose(a.center[key], b.center[key], rtol=2e-5, atol=2e-6)


@pytest.mark.parametrize("num_devices", tiers.devices(8, 2))
def test_local_sgd_with_tau_1_is_sync_sgd(num_devices):
  x0, batches = make_problem(num_workers=8)
  local = run_rule("local_sgd", hyper(comm_period=1), x0, batches, num_devices)
  sync = run_rule("sync_sgd", hyper(), x0, batches, num_devices)
  expected = numpy_reference.sync_sgd(x0, [per_worker(b) for b in batches], numpy_grad, ETA)
  for a, b, center in zip(local, sync, expected, strict=True):
    assert_close(a.center, center)
    assert_close(b.center, center)
    for i in range(8):
      assert_close(worker(a, i), center)


def test_diloco_with_outer_sgd_at_1_and_no_momentum_is_local_sgd():
  x0, batches = make_problem(num_workers=8)
  diloco = run_rule("diloco", hyper(outer_learning_rate=1.0, outer_momentum=0.0), x0, batches, 2)
  local = run_rule("local_sgd", hyper(), x0, batches, 2)
  for a, b in zip(diloco, local, strict=True):
    for key in x0:
      np.testing.assert_array_equal(a.center[key], b.center[key])
      np.testing.assert_array_equal(a.workers[key], b.workers[key])


@pytest.mark.parametrize("name", ["sync_easgd", "sync_sgd"])
def test_an_adamw_inner_optimizer_follows_its_equations(name):
  x0, batches = make_problem(num_workers=4)
  actual = run_rule(name, hyper(num_workers=4, comm_period=2, **ADAMW), x0, batches, 2)
  worker_batches = [per_worker(b) for b in batches]
  if name == "sync_sgd":
    # One shared model whose gradient is the workers' mean.
    inner, x = numpy_adamw(), dict(x0)
    state = inner.init(x0)
    for step_state, step_batches in zip(actual, worker_batches, strict=True):
      g = {k: np.mean([numpy_grad(x, b)[k] for b in step_batches], axis=0) for k in x}
      u, state = inner.update(g, state, x)
      x = {k: x[k] + u[k] for k in x}
      assert_close(step_state.center, x)
    return
  expected = numpy_optim.center_family(
    x0, worker_batches, numpy_grad, numpy_adamw(), 2, "elastic", numpy_optim.sgd(4 * ALPHA), ALPHA
  )
  assert_follows(actual, expected)


SCHEDULES = {
  "warmup_cosine": lambda: numpy_optim.warmup_cosine(ETA, 2, 7),
  "warmup_step": lambda: numpy_optim.warmup_step(ETA, 1, 7, (0.5, 0.75), 0.1),
}


@pytest.mark.parametrize("schedule", sorted(SCHEDULES))
def test_the_schedule_drives_every_worker_and_is_logged(schedule):
  x0, batches = make_problem(num_workers=4)
  warmup = 2 if schedule == "warmup_cosine" else 1
  settings = hyper(num_workers=4, momentum=0.9, nesterov=True, schedule=schedule)
  settings = dataclasses.replace(settings, warmup_steps=warmup, total_steps=7)
  actual = run_rule("sync_easgd", settings, x0, batches, 2)
  rate = SCHEDULES[schedule]()
  inner = numpy_optim.Optimizer("sgd", rate, mu=0.9, nesterov=True)
  expected = numpy_optim.center_family(
    x0, [per_worker(b) for b in batches], numpy_grad, inner, TAU, "elastic",
    numpy_optim.sgd(4 * ALPHA), ALPHA,
  )  # fmt: skip
  assert_follows(actual, expected)
  logged = [float(v) for v in optimizers.learning_rate_at(settings, np.arange(7))]
  np.testing.assert_allclose(logged, [rate(t) for t in range(7)], rtol=1e-6, atol=1e-9)


def test_schedules_match_their_equations_over_a_long_run():
  base = hyper(total_steps=1000, warmup_steps=100, boundaries=(0.5, 0.75, 0.9), decay_factor=0.2)
  counts = np.arange(0, 1001, 7)
  for schedule, expected in (
    ("constant", numpy_optim.constant(ETA)),
    ("warmup_cosine", numpy_optim.warmup_cosine(ETA, 100, 1000)),
    ("warmup_step", numpy_optim.warmup_step(ETA, 100, 1000, (0.5, 0.75, 0.9), 0.2)),
  ):
    warmup = 0 if schedule == "constant" else 100
    settings = dataclasses.replace(base, schedule=schedule, warmup_steps=warmup)
    actual = np.asarray(optimizers.learning_rate_at(settings, counts))
    np.testing.assert_allclose(actual, [expected(t) for t in counts], rtol=1e-5, atol=1e-8)
