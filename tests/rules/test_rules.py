"""Each rule, run sharded over the mesh, against its equations in plain NumPy."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import tiers

import numpy_reference
from easgd import rules, steps
from easgd.infra import sharding
from least_squares import DIM, OUT, loss_fn, numpy_grad

BATCH, STEPS = 4, 7
ETA, ALPHA, MU = 0.1, 0.9 / 8, 0.9


def make_problem(num_workers, steps_count=STEPS, seed=0):
  rng = np.random.default_rng(seed)
  x0 = {"w": rng.normal(size=(DIM, OUT)), "b": rng.normal(size=OUT)}
  true_w = rng.normal(size=(DIM, OUT))
  batches = []
  for _ in range(steps_count):
    x = rng.normal(size=(num_workers, BATCH, DIM))
    batches.append({"x": x, "y": x @ true_w + 0.1 * rng.normal(size=(num_workers, BATCH, OUT))})
  return x0, batches


def run_rule(name, hyper, x0, batches, num_devices):
  """Runs the rule's compiled step on `num_devices`; returns the state after each step."""
  mesh = sharding.make_mesh(num_devices)
  rule = rules.make_rule(name, hyper)
  params = jax.tree.map(lambda a: jnp.asarray(a, jnp.float32), x0)
  state = steps.init_state(rule, params, jax.random.PRNGKey(0), mesh)
  step = steps.build_rule_step(rule, loss_fn, mesh, state)
  history = []
  for batch in batches:
    state, _ = step(state, jax.tree.map(lambda a: jnp.asarray(a, jnp.float32), batch), {})
    history.append(jax.device_get(state))
  return history


def per_worker(batch):
  """[P, b, ...] arrays -> a list of P per-worker batches."""
  return [{k: v[i] for k, v in batch.items()} for i in range(len(batch["x"]))]


def assert_close(actual, expected):
  for key in expected:
    np.testing.assert_allclose(np.asarray(actual[key]), expected[key], rtol=2e-5, atol=2e-6)


ELASTIC = [
  ("sync_easgd", None, False),
  ("sync_measgd", MU, False),
  ("sync_measgd", MU, True),
]


@pytest.mark.parametrize("num_devices", tiers.devices(8, 2, 1))
@pytest.mark.parametrize("tau", [1, 3])
@pytest.mark.parametrize("name,mu,nesterov", ELASTIC)
def test_elastic_rules_follow_their_equations(name, mu, nesterov, tau, num_devices):
  x0, batches = make_problem(num_workers=8)
  hyper = rules.Hyper(
    num_workers=8,
    learning_rate=ETA,
    momentum=mu or 0.0,
    nesterov=nesterov,
    comm_period=tau,
    moving_rate=ALPHA,
  )
  actual = run_rule(name, hyper, x0, batches, num_devices)
  expected = numpy_reference.sync_easgd(
    x0, [per_worker(b) for b in batches], numpy_grad, ETA, ALPHA, tau, mu=mu, nesterov=nesterov
  )
  for t, (state, (workers, center)) in enumerate(zip(actual, expected, strict=True)):
    assert int(state.step) == t + 1
    assert_close(state.center, center)
    for i, worker in enumerate(workers):
      assert_close(jax.tree.map(lambda a, i=i: a[i], state.workers), worker)
  # After the first step (where every x_i still equals the center), the
  # center moves exactly at the exchanges: on steps t with t % tau == 0.
  for t in range(2, STEPS + 1):
    moved = not np.array_equal(actual[t - 1].center["w"], actual[t - 2].center["w"])
    assert moved == (t % tau == 0), t


@pytest.mark.parametrize("num_devices", tiers.devices(8, 2, 1))
@pytest.mark.parametrize("mu,nesterov", [(0.0, False), (MU, False), (MU, True)])
def test_sync_sgd_follows_its_equations(mu, nesterov, num_devices):
  x0, batches = make_problem(num_workers=8)
  hyper = rules.Hyper(num_workers=8, learning_rate=ETA, momentum=mu, nesterov=nesterov)
  actual = run_rule("sync_sgd", hyper, x0, batches, num_devices)
  expected = numpy_reference.sync_sgd(
    x0, [per_worker(b) for b in batches], numpy_grad, ETA, mu=mu, nesterov=nesterov
  )
  for state, center in zip(actual, expected, strict=True):
    assert_close(state.center, center)


def test_sync_sgd_equals_one_worker_with_the_union_batch():
  x0, batches = make_problem(num_workers=8)
  hyper = rules.Hyper(num_workers=8, learning_rate=ETA, momentum=MU)
  many = run_rule("sync_sgd", hyper, x0, batches, 8)
  union = [{k: v.reshape(1, -1, v.shape[-1]) for k, v in b.items()} for b in batches]
  one = run_rule("sync_sgd", rules.Hyper(1, ETA, momentum=MU), x0, union, 1)
  for a, b in zip(many, one, strict=True):
    for key in x0:
      np.testing.assert_allclose(a.center[key], b.center[key], rtol=2e-5, atol=2e-6)


def test_tiny_moving_rate_and_huge_period_leave_the_center_alone():
  x0, batches = make_problem(num_workers=8, steps_count=10)
  hyper = rules.Hyper(8, ETA, comm_period=10**6, moving_rate=1e-9)
  history = run_rule("sync_easgd", hyper, x0, batches, 8)
  final = history[-1]
  for key in x0:
    np.testing.assert_array_equal(final.center[key], x0[key].astype(np.float32))
  # The workers learned: their loss on fresh data fell well below the start.
  x, y = batches[0]["x"].reshape(-1, DIM), batches[0]["y"].reshape(-1, OUT)

  def loss(p):
    return 0.5 * np.mean(np.sum((x @ p["w"] + p["b"] - y) ** 2, axis=-1))

  for i in range(8):
    worker = {k: v[i] for k, v in final.workers.items()}
    assert loss(worker) < 0.5 * loss(x0)


def test_make_rule_names_the_valid_rules():
  with pytest.raises(KeyError, match="sync_easgd, sync_measgd, sync_sgd"):
    rules.make_rule("easgd", rules.Hyper(8, 0.1))


@pytest.mark.parametrize("name", ["sync_sgd", "sync_easgd", "sync_measgd"])
def test_weight_decay_adds_lambda_x_to_every_gradient(name):
  """The equations with g_i(x) + lambda*x in place of g_i(x)."""
  decay = 0.3
  x0, batches = make_problem(num_workers=4)
  mu = MU if name == "sync_measgd" else 0.0
  hyper = rules.Hyper(4, ETA, momentum=mu, moving_rate=ALPHA, comm_period=2, weight_decay=decay)
  actual = run_rule(name, hyper, x0, batches, 2)

  def decayed_grad(params, batch):
    return {k: g + decay * params[k] for k, g in numpy_grad(params, batch).items()}

  worker_batches = [per_worker(b) for b in batches]
  if name == "sync_sgd":
    expected = numpy_reference.sync_sgd(x0, worker_batches, decayed_grad, ETA)
    centers = expected
  else:
    expected = numpy_reference.sync_easgd(
      x0, worker_batches, decayed_grad, ETA, ALPHA, 2, mu=mu or None
    )
    centers = [center for _, center in expected]
  for state, center in zip(actual, centers, strict=True):
    assert_close(state.center, center)


def test_the_gpu_tier_finds_every_rules_numpy_checks():
  """The GPU tier (tests/test_gpu.py, skipped without a GPU) runs each rule's checks
  against its NumPy reference: every rule of the registry has some there, from its table
  or from the GPU_CHECKS of a test module of tests/rules, so that a rule without them
  fails here and not first on a GPU."""
  import test_gpu  # noqa: PLC0415 (it imports this module)

  missing = [name for name in rules.RULES if not test_gpu.checks_of(name)]
  assert missing == [], f"no NumPy reference check in the GPU tier for {', '.join(missing)}"
