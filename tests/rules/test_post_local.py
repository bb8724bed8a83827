"""Post-local SGD, run sharded over the mesh, against its equations in plain NumPy."""

import jax
import numpy as np
import pytest
import test_batch_stats as batch_stats
import tiers
from test_rules import ETA, assert_close, make_problem, per_worker, run_rule

import numpy_optim
from easgd import rules
from easgd.sim import timing
from least_squares import numpy_grad
from numpy_reference import warm_up_then_local


def post_local_sgd(x0, batches, inner, switch, period):
  """Lin et al. (2020) as PyTorch's post-local SGD runs it; [(workers, center)] after
  each step t (from 0): the warm-up and local steps of
  numpy_reference.warm_up_then_local, then, if (t - switch) % period == 0,
  x_i <- mean_j x_j, the center."""

  def average(since_switch, workers):
    if since_switch % period:
      return workers, None
    center = {k: np.mean([w[k] for w in workers], axis=0) for k in x0}
    return [dict(center) for _ in workers], center

  return warm_up_then_local(x0, batches, numpy_grad, inner, switch, average)


def assert_follows(switch, period, optimizer, num_devices):
  x0, batches = make_problem(num_workers=8)
  if optimizer == "nesterov":
    settings = dict(momentum=0.9, nesterov=True)
    inner = numpy_optim.sgd(ETA, mu=0.9, nesterov=True)
  else:
    settings = dict(optimizer="adamw", learning_rate=0.01, weight_decay=0.1)
    inner = numpy_optim.Optimizer("adamw", numpy_optim.constant(0.01), wd=0.1)
  hyper = rules.Hyper(
    **{"num_workers": 8, "learning_rate": ETA, **settings},
    comm_period=period,
    switch_step=switch,
  )
  actual = run_rule("post_local_sgd", hyper, x0, batches, num_devices)
  expected = post_local_sgd(x0, [per_worker(b) for b in batches], inner, switch, period)
  for state, (workers, center) in zip(actual, expected, strict=True):
    assert_close(state.center, center)
    for i, values in enumerate(workers):
      assert_close({k: v[i] for k, v in state.workers.items()}, values)


@pytest.mark.parametrize("num_devices", tiers.devices(8, 2))
def test_post_local_sgd_follows_its_equations_across_the_switch(num_devices):
  """Nesterov momentum crosses the switch at step 3; the averages follow at 3 and 5."""
  assert_follows(3, 2, "nesterov", num_devices)


def test_without_warm_up_it_averages_after_steps_0_3_and_6():
  """AdamW's moments are each worker's own from the start."""
  assert_follows(0, 3, "adamw", 2)


@pytest.mark.parametrize("average_stats", [False, True])
def test_batch_norm_statistics_follow_their_equations_across_the_switch(average_stats):
  """Running statistics s (the normalization comes first, so they follow the batches
  alone): averaged, every worker's and the center's are the workers' mean after each
  step before t0 = 3 and after the averages at 3 and 5; between, and always with
  `local`, each worker's are its own, and the center's move only with averages."""
  workers, switch, steps = 4, 3, 7
  hyper = rules.Hyper(workers, ETA, comm_period=2, switch_step=switch, average_stats=average_stats)
  _, state, step = batch_stats.start("post_local_sgd", hyper, num_devices=2)
  batches = batch_stats.make_batches(workers, steps)
  params, initial = batch_stats.flat(batch_stats.initial_tree())
  own, center = [dict(initial) for _ in range(workers)], dict(initial)
  for t, step_batches in enumerate(batches):
    state, _ = step(state, batch_stats.as_device_batch(step_batches), {})
    own = [batch_stats.forward(params, s, b)[1] for s, b in zip(own, step_batches, strict=True)]
    if average_stats and (t < switch or (t - switch) % 2 == 0):
      center = {k: np.mean([s[k] for s in own], axis=0) for k in initial}
      own = [dict(center) for _ in range(workers)]
    got = jax.device_get(state)
    np.testing.assert_allclose(batch_stats.flat(got.center)[1]["mean"], center["mean"], atol=2e-5)
    np.testing.assert_allclose(batch_stats.flat(got.center)[1]["var"], center["var"], rtol=2e-5)
    for i in range(workers):
      stats = batch_stats.flat(batch_stats.row(got.workers, i))[1]
      np.testing.assert_allclose(stats["mean"], own[i]["mean"], atol=2e-5)
      np.testing.assert_allclose(stats["var"], own[i]["var"], rtol=2e-5)


def test_its_clock_all_reduces_every_step_before_the_switch_then_every_period():
  rule = rules.make_rule("post_local_sgd", rules.Hyper(2, ETA, comm_period=3, switch_step=2))
  clock = rule.make_clock(timing.Cluster(compute_time=1.0), model_bytes=100.0, seed=0)
  all_reduced = [bool(clock.next_tick().requests.any()) for _ in range(9)]
  assert all_reduced == [True, True, True, False, False, True, False, False, True]


# The GPU tier's checks of this rule (tests/test_gpu.py), on its one device.
GPU_CHECKS = {
  "post_local_sgd": [
    lambda: assert_follows(3, 2, "nesterov", 1),
    lambda: assert_follows(0, 3, "adamw", 1),
  ]
}
