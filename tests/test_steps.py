"""The compiled steps: their results do not depend on D, the devices the workers are laid out on."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

from easgd import models, rules, steps
from easgd.data import batches, datasets
from easgd.infra import sharding
from easgd.rules import AXIS, spmd
from easgd.sim import timing


def _train(num_devices, algorithm, steps_count=2):
  dataset = datasets.load_dataset("mnist5k")
  # The MLP: layouts are the rule's business, and it compiles far faster than LeNet-5.
  model = models.get_model("mlp", dataset.num_classes)
  params = model.init(jax.random.PRNGKey(0), jnp.zeros((1, 28, 28, 1)))["params"]
  hyper = rules.Hyper(8, 0.05, momentum=0.9, comm_period=2, moving_rate=0.1)
  rule = rules.make_rule(algorithm, hyper)
  mesh = sharding.make_mesh(num_devices)
  state = steps.init_state(rule, params, jax.random.PRNGKey(1), mesh)
  images, labels = batches.partition(dataset.train_images, dataset.train_labels, 8, seed=0)
  images = sharding.place(mesh, images, P(AXIS))
  labels = sharding.place(mesh, labels, P(AXIS))
  loss_fn = steps.make_loss_fn(model, steps.make_normalize(dataset))
  train_step = steps.build_train_step(rule, loss_fn, mesh, state, batch_size=16)
  cluster = timing.Cluster(compute_time=1.0, speed_spread=1.0, jitter=0.3, master_time=0.5)
  clock = rule.make_clock(cluster, model_bytes=0, seed=0)
  for _ in range(steps_count):
    state, metrics = train_step(state, images, labels, rule.tick_inputs(clock.next_tick()))
  return jax.device_get(state), jax.device_get(metrics)


@pytest.mark.e2e
@pytest.mark.parametrize("algorithm,steps_count", [("sync_sgd", 1), ("async_measgd", 4)])
def test_eight_workers_give_the_same_result_on_8_2_and_1_devices(algorithm, steps_count):
  # Sums over workers are reassociated differently on each layout, so the
  # layouts agree to float rounding. (Over many steps a ReLU or max-pool
  # decision at an exact tie can flip under that rounding and the runs then
  # drift apart by more: sync_sgd, whose every gradient goes through the
  # all-reduce, shows that from its second step on LeNet-5. The rule tests
  # check each rule on several layouts, longer, on a smooth model; here the
  # training step's own part, each worker's batches drawn on its device, under a
  # synchronous rule and under a parameter-server one, whose workers draw by
  # their own step counts.) Tests 8 workers on the MLP.
  reference, reference_metrics = _train(8, algorithm, steps_count)
  for num_devices in (1,):  # 1 and 8 workers a device (test_rules covers 4 a device)
    state, metrics = _train(num_devices, algorithm, steps_count)
    for a, b in zip(jax.tree.leaves(reference), jax.tree.leaves(state), strict=True):
      np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(metrics["loss"], reference_metrics["loss"], rtol=1e-5)


@pytest.mark.parametrize("num_devices", [8, 4, 2, 1])
def test_a_sum_in_worker_order_is_the_same_bits_on_every_layout(num_devices):
  """config.deterministic_sums: x_0 + x_1 + ... + x_7 in that order, on any mesh, equal to
  NumPy's left-to-right float32 sum; the all-reduce's order is the layout's."""
  terms = np.random.default_rng(0).standard_normal((8, 1000)).astype(np.float32) * 1e3
  expected = terms[0]
  for row in terms[1:]:
    expected = expected + row
  mesh = sharding.make_mesh(num_devices)
  ordered = jax.jit(
    jax.shard_map(
      lambda x: spmd.sum_over_workers(x, in_worker_order=True),
      mesh=mesh,
      in_specs=P(AXIS),
      out_specs=P(),
    )
  )
  assert np.array_equal(np.asarray(ordered(sharding.place(mesh, terms, P(AXIS)))), expected)


@pytest.mark.e2e
def test_workers_see_different_batches():
  state, _ = _train(8, "sync_measgd", steps_count=1)
  first_layer = state.workers["fc1"]["kernel"]
  assert not np.allclose(first_layer[0], first_layer[1])


@pytest.mark.e2e
def test_the_gpus_worker_by_worker_local_step_equals_the_vmapped_one():
  """map_workers' GPU form (one call per worker) computes what vmap computes: LeNet-5's
  loss and gradients of 3 workers with weights of their own."""
  model = models.get_model("lenet5", 10)
  keys = jax.random.split(jax.random.PRNGKey(0), 3)
  # Compiled: run op by op, the vmapped initialisers took longer than both programs.
  init = jax.jit(jax.vmap(lambda key: model.init(key, jnp.zeros((1, 28, 28, 1)))["params"]))
  workers = init(keys)
  images = jax.random.uniform(jax.random.PRNGKey(1), (3, 8, 28, 28, 1))
  labels = jax.random.randint(jax.random.PRNGKey(2), (3, 8), 0, 10)

  def loss(params, images, labels):
    logits = model.apply({"params": params}, images)
    return -jnp.mean(jnp.take_along_axis(jax.nn.log_softmax(logits), labels[:, None], -1))

  gradient = jax.value_and_grad(loss)
  by_worker = jax.jit(lambda *a: spmd.map_unrolled(gradient, *a))(workers, images, labels)
  vmapped = jax.jit(jax.vmap(gradient))(workers, images, labels)
  for a, b in zip(jax.tree.leaves(by_worker), jax.tree.leaves(vmapped), strict=True):
    assert a.shape == b.shape
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
