"""BatchNorm statistics under every rule, against their equations in NumPy.

The model is BatchNorm on the input features followed by one dense layer, so
that the statistics a worker's forward pass produces depend on its batch
only, and the gradient is a few lines of NumPy. easgd/model_state.py has the
equations of the two choices of config.batch_stats.
"""

import math

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from easgd import algorithms, cluster, evaluation, model_state, rules, sharding, steps
from easgd.rules import AXIS

FEATURES, CLASSES, BATCH = 6, 3, 8
MOMENTUM, EPSILON = 0.9, 1e-5  # the BatchNorm's
ETA, ALPHA = 0.1, 0.2


class NormalizedLinear(nn.Module):
  @nn.compact
  def __call__(self, images, train: bool = False):
    x = images.reshape((images.shape[0], -1))
    x = nn.BatchNorm(use_running_average=not train, momentum=MOMENTUM, epsilon=EPSILON, name="bn")(
      x
    )
    return nn.Dense(CLASSES, name="dense")(x)


LOSS_FN = steps.make_loss_fn(NormalizedLinear(), lambda images: images)


def initial_tree(seed=0):
  rng = np.random.default_rng(seed)
  return {
    "params": {
      "bn": {"scale": 1 + 0.1 * rng.normal(size=FEATURES), "bias": 0.1 * rng.normal(size=FEATURES)},
      "dense": {"kernel": rng.normal(size=(FEATURES, CLASSES)), "bias": np.zeros(CLASSES)},
    },
    "batch_stats": {"bn": {"mean": np.zeros(FEATURES), "var": np.ones(FEATURES)}},
  }


def make_batches(num_workers, count, seed=1):
  """batches[k][i]: worker i's k-th batch; features with a mean and scale of their own."""
  rng = np.random.default_rng(seed)
  shift, scale = rng.normal(size=FEATURES) * 2, rng.uniform(0.5, 3, size=FEATURES)
  return [
    [
      {
        "image": shift + scale * rng.normal(size=(BATCH, FEATURES)),
        "label": rng.integers(0, CLASSES, size=BATCH),
      }
      for _ in range(num_workers)
    ]
    for _ in range(count)
  ]


# The equations in NumPy. Flat models: {"scale", "shift", "kernel", "bias"}
# and statistics {"mean", "var"}.


def flat(tree):
  p, s = tree["params"], tree["batch_stats"]["bn"]
  params = {
    "scale": p["bn"]["scale"],
    "shift": p["bn"]["bias"],
    "kernel": p["dense"]["kernel"],
    "bias": p["dense"]["bias"],
  }
  return {k: np.asarray(v, np.float64) for k, v in params.items()}, {
    k: np.asarray(v, np.float64) for k, v in s.items()
  }


def forward(params, stats, batch):
  """Gradient of the mean cross-entropy in training mode, and the new statistics:
  z = (x - mean_B)/sqrt(var_B + eps), h = scale*z + shift, logits = h W + b;
  s' = m*s + (1 - m)*(mean_B, var_B) with the biased batch variance."""
  x, labels = batch["image"], batch["label"]
  mean, var = x.mean(axis=0), x.var(axis=0)
  z = (x - mean) / np.sqrt(var + EPSILON)
  h = params["scale"] * z + params["shift"]
  logits = h @ params["kernel"] + params["bias"]
  prob = np.exp(logits - logits.max(axis=1, keepdims=True))
  prob /= prob.sum(axis=1, keepdims=True)
  d_logits = (prob - np.eye(CLASSES)[labels]) / len(x)
  d_h = d_logits @ params["kernel"].T
  grads = {
    "kernel": h.T @ d_logits,
    "bias": d_logits.sum(axis=0),
    "scale": (d_h * z).sum(axis=0),
    "shift": d_h.sum(axis=0),
  }
  new_stats = {
    "mean": MOMENTUM * stats["mean"] + (1 - MOMENTUM) * mean,
    "var": MOMENTUM * stats["var"] + (1 - MOMENTUM) * var,
  }
  return grads, new_stats


def add(a, b, scale=1.0):
  return {k: a[k] + scale * b[k] for k in a}


def reference_sync_easgd(tree, batches, tau, average_stats):
  """x_i <- x_i + u_i - alpha*d_i and s_i <- s'_i - alpha*(s_i - s~) (averaged)
  or s'_i (local) at exchanges; x~ and s~ move by alpha*sum_i of the same d_i."""
  params, stats = flat(tree)
  num_workers = len(batches[0])
  workers = [(dict(params), dict(stats)) for _ in range(num_workers)]
  center = (dict(params), dict(stats))
  history = []
  for t, step_batches in enumerate(batches):
    stepped = []
    for (x, s), batch in zip(workers, step_batches, strict=True):
      g, s_new = forward(x, s, batch)
      stepped.append((add(x, g, -ETA), s_new))
    if (t + 1) % tau == 0:
      d = [add(x, center[0], -1) for x, _ in workers]
      ds = [add(s, center[1], -1) if average_stats else add(s, s, -1) for _, s in workers]
      workers = [
        (add(xn, di, -ALPHA), add(sn, dsi, -ALPHA))
        for (xn, sn), di, dsi in zip(stepped, d, ds, strict=True)
      ]
      center = (
        add(center[0], {k: sum(di[k] for di in d) for k in params}, ALPHA),
        add(center[1], {k: sum(dsi[k] for dsi in ds) for k in stats}, ALPHA),
      )
    else:
      workers = stepped
    history.append((list(workers), center))
  return history


def reference_sync_sgd(tree, batches):
  """x <- x - eta*(1/P) sum_i g_i(x);  s <- (1/P) sum_i s'_i."""
  params, stats = flat(tree)
  history = []
  for step_batches in batches:
    results = [forward(params, stats, batch) for batch in step_batches]
    mean = lambda trees: {k: np.mean([t[k] for t in trees], axis=0) for k in trees[0]}  # noqa: E731
    params = add(params, mean([g for g, _ in results]), -ETA)
    stats = mean([s for _, s in results])
    history.append((params, stats))
  return history


def assert_close(actual_tree, expected_params, expected_stats):
  params, stats = flat(actual_tree)
  for key in expected_params:
    np.testing.assert_allclose(params[key], expected_params[key], rtol=2e-5, atol=2e-5)
  for key in expected_stats:
    np.testing.assert_allclose(stats[key], expected_stats[key], rtol=2e-5, atol=2e-5)


def row(tree, i):
  return jax.tree.map(lambda leaf: leaf[i], tree)


def as_device_batch(step_batches):
  return {
    "image": jnp.asarray(np.stack([b["image"] for b in step_batches]), jnp.float32),
    "label": jnp.asarray(np.stack([b["label"] for b in step_batches]), jnp.int32),
  }


def start(name, hyper, num_devices):
  mesh = sharding.make_mesh(num_devices)
  rule = algorithms.make_rule(name, hyper)
  tree = jax.tree.map(lambda a: jnp.asarray(a, jnp.float32), initial_tree())
  state = steps.init_state(rule, tree, jax.random.PRNGKey(0), mesh)
  return rule, state, steps.build_rule_step(rule, LOSS_FN, mesh, state)


@pytest.mark.parametrize("average_stats", [True, False])
def test_sync_easgd_moves_statistics_as_the_chosen_equations_say(average_stats):
  workers, tau, count = 4, 2, 6
  hyper = rules.Hyper(workers, ETA, comm_period=tau, moving_rate=ALPHA, average_stats=average_stats)
  _, state, step = start("sync_easgd", hyper, num_devices=2)
  batches = make_batches(workers, count)
  expected = reference_sync_easgd(initial_tree(), batches, tau, average_stats)
  for step_batches, (expected_workers, expected_center) in zip(batches, expected, strict=True):
    state, _ = step(state, as_device_batch(step_batches), {})
    for i, (x, s) in enumerate(expected_workers):
      assert_close(row(state.workers, i), x, s)
    assert_close(state.center, *expected_center)
  center_stats = flat(jax.device_get(state.center))[1]
  initial_stats = flat(initial_tree())[1]
  # Averaged: the center's statistics moved; local: they never did.
  assert (not np.allclose(center_stats["mean"], initial_stats["mean"])) == average_stats


def test_sync_sgd_averages_the_workers_statistics():
  workers, count = 4, 4
  _, state, step = start("sync_sgd", rules.Hyper(workers, ETA), num_devices=4)
  batches = make_batches(workers, count)
  for step_batches, (params, stats) in zip(
    batches, reference_sync_sgd(initial_tree(), batches), strict=True
  ):
    state, _ = step(state, as_device_batch(step_batches), {})
    assert_close(state.center, params, stats)


# Unequal speeds, so that the parameter-server rules' workers step at different ticks.
UNEQUAL = cluster.Cluster(
  compute_time=1.0, speed_spread=1.0, jitter=0.3, latency=0.05, bandwidth=math.inf, master_time=0.4
)
WITH_WORKERS = sorted(set(algorithms.RULES) - {"sync_sgd"})


# Every rule with statistics kept local (checked exactly), and averaged for one
# rule of each kind of exchange (elastic, momentum, pushed gradients, unlocked).
CASES = [(name, False) for name in WITH_WORKERS] + [
  (name, True) for name in ("sync_measgd", "async_easgd", "downpour", "hogwild_sgd")
]


@pytest.mark.parametrize("name,average_stats", CASES)
def test_every_rule_keeps_or_averages_statistics(name, average_stats):
  """local: worker i's statistics are the running average over its own batches
  alone, whatever the rule exchanges; averaged: they reach the center."""
  workers, ticks = 4, 8
  momentum = 0.9 if name in algorithms.MOMENTUM_RULES else 0.0
  hyper = rules.Hyper(
    workers,
    ETA,
    momentum=momentum,
    comm_period=2,
    moving_rate=ALPHA,
    n_sync=2,
    average_stats=average_stats,
  )
  rule, state, step = start(name, hyper, num_devices=2)
  clock = rule.make_clock(UNEQUAL, model_bytes=1000, seed=0)
  batches = make_batches(workers, ticks)
  taken = np.zeros(workers, int)
  own_stats = [flat(initial_tree())[1] for _ in range(workers)]
  for _ in range(ticks):
    tick = clock.next_tick()
    state, metrics = step(
      state, as_device_batch([batches[taken[i]][i] for i in range(workers)]), rule.tick_inputs(tick)
    )
    for i in np.flatnonzero(tick.local):
      own_stats[i] = forward(flat(initial_tree())[0], own_stats[i], batches[taken[i]][i])[1]
    taken += tick.local
  assert np.isfinite(float(metrics["loss"]))
  assert taken.min() >= 1
  state = jax.device_get(state)
  initial_stats = flat(initial_tree())[1]
  center_stats = flat(state.center)[1]
  if average_stats:
    assert not np.allclose(center_stats["mean"], initial_stats["mean"]), "s~ never moved"
  else:
    np.testing.assert_array_equal(center_stats["mean"], initial_stats["mean"])
    for i in range(workers):
      _, stats = flat(row(state.workers, i))
      for key in stats:
        np.testing.assert_allclose(stats[key], own_stats[i][key], rtol=2e-5, atol=2e-5)


def test_statistics_are_left_out_of_the_consensus_distance():
  tree = jax.tree.map(lambda a: jnp.asarray(a, jnp.float32), initial_tree())
  workers = rules.stack_workers(tree, 2)
  shifted = dict(
    workers, batch_stats=jax.tree.map(lambda leaf: leaf + 100.0, workers["batch_stats"])
  )
  assert float(evaluation.consensus_distance(shifted, tree)) == 0.0
  assert model_state.has_stats(tree) and not model_state.has_stats(tree["params"])


def test_pipeline_models_carry_their_statistics_and_decay_only_parameters():
  """One local step of each model: s <- s', x <- x - eta*(g + lambda*x) on the
  parameters only, on the batch the sampler drew."""
  from jax.sharding import PartitionSpec as P  # noqa: PLC0415

  from easgd import pipeline  # noqa: PLC0415

  num_devices, partition, decay = 2, 16, 0.05
  mesh = sharding.make_mesh(num_devices)
  runner = pipeline.Pipeline(num_devices, num_devices, stage_steps=4)
  tree = jax.tree.map(lambda a: jnp.asarray(a, jnp.float32), initial_tree())
  seeds = np.arange(num_devices, dtype=np.int32)
  hypers = [seeds, np.full(num_devices, ETA, np.float32), np.zeros(num_devices, np.float32)]
  hypers.append(np.full(num_devices, decay, np.float32))
  state = pipeline.init_state(runner, lambda key: tree, hypers, mesh)
  rng = np.random.default_rng(2)
  images = (3 + 2 * rng.normal(size=(num_devices, partition, FEATURES))).astype(np.float32)
  labels = rng.integers(0, CLASSES, size=(num_devices, partition)).astype(np.int32)
  step = pipeline.build_step(runner, LOSS_FN, mesh, state, BATCH)
  before = jax.device_get(state)
  after, _ = step(
    state, sharding.place(mesh, images, P(AXIS)), sharding.place(mesh, labels, P(AXIS))
  )
  after = jax.device_get(after)
  for slot in range(num_devices):
    device = slot  # one model a device
    key = jax.random.fold_in(before.data_key[slot], 0)
    indices = np.asarray(steps.batch_indices(key, 0, device, partition, BATCH))
    batch = {"image": images[device][indices], "label": labels[device][indices]}
    params, stats = flat(row(before.models, slot))
    grads, new_stats = forward(params, stats, batch)
    expected = {k: params[k] - ETA * (grads[k] + decay * params[k]) for k in params}
    assert_close(row(after.models, slot), expected, new_stats)
