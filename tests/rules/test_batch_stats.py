"""BatchNorm statistics under every rule, against their equations in NumPy.

The model is BatchNorm on the input features followed by one dense layer, so
that the statistics a worker's forward pass produces depend on its batch
only, and the gradient is a few lines of NumPy (numpy_reference's BatchNorm
section). docs/algorithms.md ("BatchNorm statistics under exchanges") has the
equations of the two choices of config.outer.batch_stats.
"""

import math

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import tiers

import numpy_reference
from easgd import evaluation, rules, steps
from easgd.data.batches import batch_indices
from easgd.infra import sharding
from easgd.rules import AXIS, model_state
from easgd.rules.state import stack_workers
from easgd.sim import timing

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


# The equations are in numpy_reference; this file maps the Flax tree onto their
# flat models: parameters {"scale", "shift", "kernel", "bias"}, statistics {"mean", "var"}.


def flat(tree):
  """(parameters, statistics) of a Flax tree of the model, as float64 NumPy dicts."""
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
  """numpy_reference.batch_norm_dense_forward with this model's BatchNorm momentum and epsilon."""
  return numpy_reference.batch_norm_dense_forward(
    params, stats, batch, momentum=MOMENTUM, epsilon=EPSILON
  )


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
  rule = rules.make_rule(name, hyper)
  tree = jax.tree.map(lambda a: jnp.asarray(a, jnp.float32), initial_tree())
  state = steps.init_state(rule, tree, jax.random.PRNGKey(0), mesh)
  return rule, state, steps.build_rule_step(rule, LOSS_FN, mesh, state)


@pytest.mark.parametrize("average_stats", [True, False])
def test_sync_easgd_moves_statistics_as_the_chosen_equations_say(average_stats):
  workers, tau, count = 4, 2, 6
  hyper = rules.Hyper(workers, ETA, comm_period=tau, moving_rate=ALPHA, average_stats=average_stats)
  _, state, step = start("sync_easgd", hyper, num_devices=2)
  batches = make_batches(workers, count)
  expected = numpy_reference.batch_norm_sync_easgd(
    *flat(initial_tree()), batches, forward, ETA, ALPHA, tau, average_stats
  )
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
    batches,
    numpy_reference.batch_norm_sync_sgd(*flat(initial_tree()), batches, forward, ETA),
    strict=True,
  ):
    state, _ = step(state, as_device_batch(step_batches), {})
    assert_close(state.center, params, stats)


# Unequal speeds, so that the parameter-server rules' workers step at different ticks.
UNEQUAL = timing.Cluster(
  compute_time=1.0, speed_spread=1.0, jitter=0.3, latency=0.05, bandwidth=math.inf, master_time=0.4
)
WITH_WORKERS = sorted(set(rules.RULES) - {"sync_sgd"})


# Every rule with statistics kept local (checked exactly), and averaged for one
# rule of each kind of exchange (elastic, momentum, pushed gradients, unlocked,
# pushed pseudo-gradients); the quick tier's rules only under -m "not e2e".
AVERAGED = ("sync_measgd", "async_easgd", "downpour", "hogwild_sgd", "async_local_sgd")
CASES = tiers.cases([(name, False) for name in WITH_WORKERS] + [(name, True) for name in AVERAGED])


@pytest.mark.parametrize("name,average_stats", CASES)
def test_every_rule_keeps_or_averages_statistics(name, average_stats):
  keeps_or_averages_statistics(name, average_stats)


@pytest.mark.parametrize("average_stats", tiers.first_quick([False, True]))
@pytest.mark.parametrize("name", ["sync_measgd", "async_measgd"])
def test_eamsgds_look_ahead_moves_the_parameters_alone(name, average_stats):
  keeps_or_averages_statistics(name, average_stats, nesterov=True)


@pytest.mark.parametrize("average_stats", [False, True])
@pytest.mark.parametrize(
  "name,streaming",
  [
    ("streaming_diloco", dict(fragments=2, sync_delay=1, merge=0.5)),
    ("streaming_easgd", dict(fragments=2, sync_delay=1)),
  ],
)
def test_the_streaming_rules_move_statistics_with_their_layers_fragment(
  name, streaming, average_stats
):
  keeps_or_averages_statistics(name, average_stats, **streaming)


def keeps_or_averages_statistics(name, average_stats, nesterov=False, **streaming):
  """local: worker i's statistics are the running average over its own batches
  alone, whatever the rule exchanges; averaged: they reach the center."""
  workers, ticks = 4, 8
  momentum = 0.9 if rules.RULES[name].momentum == rules.Momentum.REQUIRED else 0.0
  hyper = rules.Hyper(
    workers,
    ETA,
    momentum=momentum,
    nesterov=nesterov,
    comm_period=2,
    moving_rate=ALPHA,
    n_sync=2,
    average_stats=average_stats,
    **streaming,
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
  assert np.all(np.isfinite(np.asarray(metrics["loss"])))
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
  workers = stack_workers(tree, 2)
  shifted = dict(
    workers, batch_stats=jax.tree.map(lambda leaf: leaf + 100.0, workers["batch_stats"])
  )
  assert float(evaluation.consensus_distance(shifted, tree)) == 0.0
  assert model_state.has_stats(tree) and not model_state.has_stats(tree["params"])


def test_pipeline_models_carry_their_statistics_and_decay_only_parameters():
  """One local step of each model: s <- s', x <- x - eta*(g + lambda*x) on the
  parameters only, on the batch the sampler drew."""
  from jax.sharding import PartitionSpec as P  # noqa: PLC0415

  from easgd.pipeline import programs  # noqa: PLC0415

  num_devices, partition, decay = 2, 16, 0.05
  mesh = sharding.make_mesh(num_devices)
  runner = programs.Pipeline(num_devices, num_devices, stage_steps=4)
  tree = jax.tree.map(lambda a: jnp.asarray(a, jnp.float32), initial_tree())
  seeds = np.arange(num_devices, dtype=np.int32)
  hypers = [seeds, np.full(num_devices, ETA, np.float32), np.zeros(num_devices, np.float32)]
  hypers.append(np.full(num_devices, decay, np.float32))
  hypers += [np.full(num_devices, 0.9, np.float32), np.full(num_devices, 0.999, np.float32)]
  state = programs.init_state(runner, lambda key: tree, hypers, mesh)
  rng = np.random.default_rng(2)
  images = (3 + 2 * rng.normal(size=(num_devices, partition, FEATURES))).astype(np.float32)
  labels = rng.integers(0, CLASSES, size=(num_devices, partition)).astype(np.int32)
  step = programs.build_step(runner, LOSS_FN, mesh, state, BATCH)
  before = jax.device_get(state)
  after, _ = step(
    state, sharding.place(mesh, images, P(AXIS)), sharding.place(mesh, labels, P(AXIS))
  )
  after = jax.device_get(after)
  for slot in range(num_devices):
    device = slot  # one model a device
    key = jax.random.fold_in(before.data_key[slot], 0)
    indices = np.asarray(batch_indices(key, 0, device, partition, BATCH))
    batch = {"image": images[device][indices], "label": labels[device][indices]}
    params, stats = flat(row(before.models, slot))
    grads, new_stats = forward(params, stats, batch)
    expected = {k: params[k] - ETA * (grads[k] + decay * params[k]) for k in params}
    assert_close(row(after.models, slot), expected, new_stats)


@pytest.mark.parametrize("name", ["diloco", "local_sgd", "lookahead"])
def test_reset_rules_average_the_statistics_and_reset_every_worker_to_them(name):
  """s~ <- mean_i s'_i at an exchange, whatever the outer optimizer; then s_i <- s~."""
  workers, tau = 4, 2
  hyper = rules.Hyper(
    workers, ETA, comm_period=tau, outer_learning_rate=0.7, outer_momentum=0.9, outer_nesterov=True
  )
  _, state, step = start(name, hyper, num_devices=2)
  for t, step_batches in enumerate(make_batches(workers, 2 * tau)):
    before = jax.device_get(state)
    state, _ = step(state, as_device_batch(step_batches), {})
    if (t + 1) % tau:
      continue
    own = [forward(*flat(row(before.workers, i)), step_batches[i])[1] for i in range(workers)]
    center_stats = flat(jax.device_get(state.center))[1]
    for key in center_stats:
      expected = np.mean([stats[key] for stats in own], axis=0)
      np.testing.assert_allclose(center_stats[key], expected, rtol=2e-5, atol=2e-6)
      for i in range(workers):
        np.testing.assert_array_equal(flat(row(state.workers, i))[1][key], center_stats[key])


def test_async_local_sgd_adds_each_pushed_change_of_the_statistics():
  """Averaged: a push adds s_j - a_j to s~ as it is, and the fetch sets s_j and the
  anchor a_j to the new s~ (the statistics move with the batches alone, so they are
  followed here in NumPy, tick by tick, through the same pushes)."""
  workers, ticks = 4, 12
  hyper = rules.Hyper(workers, ETA, comm_period=2, momentum_period=3, momentum_activation=0.1)
  rule, state, step = start("async_local_sgd", hyper, num_devices=2)
  clock = rule.make_clock(UNEQUAL, model_bytes=1000, seed=0)
  batches = make_batches(workers, ticks)
  params = flat(initial_tree())[0]
  center = flat(initial_tree())[1]
  own = [dict(center) for _ in range(workers)]
  anchors = [dict(center) for _ in range(workers)]
  taken, pushes = np.zeros(workers, int), 0
  for _ in range(ticks):
    tick = clock.next_tick()
    state, _ = step(
      state, as_device_batch([batches[taken[i]][i] for i in range(workers)]), rule.tick_inputs(tick)
    )
    for i in np.flatnonzero(tick.local):
      own[i] = forward(params, own[i], batches[taken[i]][i])[1]
    taken += tick.local
    for _, j in tick.ops:  # the master's pushes, in the order it served them
      center = {k: center[k] + own[j][k] - anchors[j][k] for k in center}
      own[j], anchors[j] = dict(center), dict(center)
      pushes += 1
    now = jax.device_get(state)
    np.testing.assert_allclose(flat(now.center)[1]["mean"], center["mean"], rtol=2e-5, atol=2e-5)
    np.testing.assert_allclose(flat(now.center)[1]["var"], center["var"], rtol=2e-5, atol=2e-5)
    for i in range(workers):
      for key, value in flat(row(now.workers, i))[1].items():
        np.testing.assert_allclose(value, own[i][key], rtol=2e-5, atol=2e-5)
      for key, value in flat(row(now.worker_opt["anchor"], i))[1].items():
        np.testing.assert_allclose(value, anchors[i][key], rtol=2e-5, atol=2e-5)
  assert pushes >= 6
