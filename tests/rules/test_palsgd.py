"""PALSGD, run sharded over the mesh, against its equations in plain NumPy; its identity
with DiLoCo, its check and its resume."""

import jax
import numpy as np
import pytest
import tiers
from test_rules import ETA, make_problem, per_worker, run_rule

import numpy_optim
from easgd import rules
from easgd.config import validation
from easgd.errors import ConfigError
from easgd.rules import palsgd
from least_squares import numpy_grad
from runs import assert_stopped_and_resumed_ends_as_never_stopped, config_with

WORKERS, TAU = 4, 3
OUTER = dict(outer_learning_rate=0.7, outer_momentum=0.9, outer_nesterov=True)


def coin(step, worker, p):
  """Whether worker `worker` pulls at step `step`: a uniform number of the run's key
  (jax.random.PRNGKey(0) in run_rule), palsgd's stream, the step and the worker, below p."""
  key = jax.random.fold_in(jax.random.fold_in(jax.random.PRNGKey(0), palsgd.COIN_STREAM), step)
  return float(jax.random.uniform(jax.random.fold_in(key, worker))) < p


def reference(x0, batches, inner, tau, outer, p, pull_rate, eta):
  """PALSGD as its reference code steps (resnet_cifar10/algorithm/
  postadaptive_localsgd_decoupled.py); [(workers, center)] after each step t.

  Step t, worker i: if its coin comes up, x_i <- x_i - eta/p*pull_rate*(x_i - x~) (no
  gradient, its optimizer untouched); otherwise its optimizer's step, run at eta/(1 - p)
  (`inner` is that optimizer, built at that rate). After a step with (t+1) % tau == 0:
  Delta = -mean_i (x_i - x~), x~ <- x~ + outer step of Delta, x_i <- x~."""
  workers = [dict(x0) for _ in batches[0]]
  states = [inner.init(x0) for _ in batches[0]]
  center, outer_state = dict(x0), outer.init(x0)
  history, flips = [], []
  for t, step_batches in enumerate(batches):
    for i, batch in enumerate(step_batches):
      x = workers[i]
      flips.append(coin(t, i, p))
      if flips[-1]:
        workers[i] = {k: x[k] - eta / p * pull_rate * (x[k] - center[k]) for k in x}
      else:
        u, states[i] = inner.update(numpy_grad(x, batch), states[i], x)
        workers[i] = {k: x[k] + u[k] for k in x}
    if (t + 1) % tau == 0:
      delta = {k: -np.mean([w[k] - center[k] for w in workers], axis=0) for k in x0}
      step, outer_state = outer.update(delta, outer_state, center)
      center = {k: center[k] + step[k] for k in x0}
      workers = [dict(center) for _ in workers]
    history.append(([dict(w) for w in workers], dict(center)))
  return history, flips


def assert_within(actual, expected, rtol=1e-5, atol=1e-6):
  """Every worker and the center after each step, within 1e-5 relative."""
  for state, (workers, center) in zip(actual, expected, strict=True):
    for key in center:
      np.testing.assert_allclose(np.asarray(state.center[key]), center[key], rtol, atol)
    for i, values in enumerate(workers):
      for key in values:
        np.testing.assert_allclose(np.asarray(state.workers[key][i]), values[key], rtol, atol)


def assert_follows(optimizer, num_devices, p=0.4, pull_rate=0.5):
  """4 workers, tau = 3, 7 steps; p = 0.4, so that about 11 of the 28 steps are pulls."""
  x0, batches = make_problem(num_workers=WORKERS)
  if optimizer == "sgd":
    eta, settings = ETA, dict(momentum=0.9, nesterov=True)
    inner = numpy_optim.sgd(eta / (1 - p), mu=0.9, nesterov=True)
  else:
    eta, settings = 0.01, dict(optimizer="adamw", weight_decay=0.1)
    inner = numpy_optim.Optimizer("adamw", numpy_optim.constant(eta / (1 - p)), wd=0.1)
  hyper = rules.Hyper(
    **{"num_workers": WORKERS, "learning_rate": eta, **settings, **OUTER},
    comm_period=TAU,
    pull_probability=p,
    pull_rate=pull_rate,
  )
  actual = run_rule("palsgd", hyper, x0, batches, num_devices)
  outer = numpy_optim.sgd(0.7, mu=0.9, nesterov=True)
  expected, flips = reference(
    x0, [per_worker(b) for b in batches], inner, TAU, outer, p, pull_rate, eta
  )
  assert_within(actual, expected)
  # Pulls and gradient steps both happened, and the workers' coins differ within a step.
  by_step = np.reshape(flips, (len(batches), WORKERS))
  assert 0 < by_step.sum() < by_step.size and any(len(set(row)) > 1 for row in by_step)


@pytest.mark.parametrize(
  "optimizer,num_devices", tiers.first_quick([("sgd", 4), ("sgd", 2), ("adamw", 2)])
)
def test_palsgd_follows_its_equations(optimizer, num_devices):
  """Nesterov momentum SGD inside (its trace untouched by a pull), and AdamW (its moments
  and their count untouched by a pull; its step at eta/(1 - p), decay included)."""
  assert_follows(optimizer, num_devices)


@pytest.mark.parametrize(
  "settings", tiers.first_quick([{}, dict(optimizer="adamw", learning_rate=0.01)])
)
def test_palsgd_without_pulls_is_diloco_bit_for_bit(settings):
  """p = 0: no coin comes up, and every step is u_i / (1 - 0) = u_i."""
  x0, batches = make_problem(num_workers=WORKERS)
  base = {"num_workers": WORKERS, "learning_rate": ETA, "comm_period": TAU, **OUTER, **settings}
  ours = run_rule("palsgd", rules.Hyper(**base, pull_probability=0.0), x0, batches, 2)
  diloco = run_rule("diloco", rules.Hyper(**base), x0, batches, 2)
  for a, b in zip(ours, diloco, strict=True):
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
      np.testing.assert_array_equal(x, y)


def test_a_pull_past_the_center_is_refused_in_one_line():
  """eta/p * eta_pull above 1 would move a worker past the center."""
  config = config_with({"outer.pull_probability": 0.1, "outer.pull_rate": 2.0}, algorithm="palsgd")
  with pytest.raises(ConfigError) as refused:
    validation.validate(config)
  said = str(refused.value)
  assert "\n" not in said and said.startswith("config.outer.pull_rate=2.0 is invalid: a pull")
  assert "= 2 of its distance to the center" in said
  validation.validate(config_with({"outer.pull_probability": 0.2}, algorithm="palsgd"))


@pytest.mark.e2e
def test_a_palsgd_run_resumes_bit_for_bit(tmp_path):
  """Stopped after step 22: the coins come from the key and the step alone."""
  overrides = {"outer.moving_rate": 0.0, "outer.pull_probability": 0.2}
  overrides |= {"run.checkpoint_every": 22}
  assert_stopped_and_resumed_ends_as_never_stopped(tmp_path, "palsgd", overrides, stop=22)


# The GPU tier's checks of this rule (tests/test_gpu.py), on its one device.
GPU_CHECKS = {
  "palsgd": [lambda: assert_follows("sgd", 1), lambda: assert_follows("adamw", 1)],
}
