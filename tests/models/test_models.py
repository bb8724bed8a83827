"""Every registered model maps any dataset's images to logits, and trains."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import tensorflow_datasets as tfds
from jax.sharding import PartitionSpec as P

from easgd import models, rules, steps
from easgd.configs import default
from easgd.data import augment
from easgd.infra import sharding
from easgd.models.resnet_imagenet import ResNetImageNet
from easgd.rules import AXIS, model_state
from easgd.sim import timing
from easgd.train import trainer

# The small networks in the quick tier, ResNet-20 for its BatchNorm statistics; the
# large ones, which take up to seconds each to trace, with the whole suite.
NETWORKS = [
  pytest.param(name, marks=[] if name in ("mlp", "lenet5", "resnet20") else [pytest.mark.e2e])
  for name in sorted(models.MODELS)
]


@pytest.mark.parametrize("name", NETWORKS)
@pytest.mark.parametrize("image_shape", [(28, 28, 1), (8, 8, 1), (32, 32, 3), (64, 64, 3)])
def test_models_give_logits_for_every_dataset_shape(name, image_shape):
  model = models.get_model(name, 10)
  images = jnp.zeros((3, *image_shape))
  variables = jax.eval_shape(model.init, jax.random.PRNGKey(0), images)
  logits = jax.eval_shape(lambda v: model.apply(v, images), variables)
  assert logits.shape == (3, 10)


def count(name, image_shape=(32, 32, 3), num_classes=10):
  variables = jax.eval_shape(
    models.get_model(name, num_classes).init, jax.random.PRNGKey(0), jnp.zeros((1, *image_shape))
  )
  return {key: sum(leaf.size for leaf in jax.tree.leaves(tree)) for key, tree in variables.items()}


def test_parameter_counts_are_the_architectures():
  assert count("lenet5", (28, 28, 1)) == {"params": 61_706}
  # 784*512 + 512, 512*256 + 256, 256*10 + 10.
  assert count("mlp", (28, 28, 1)) == {"params": 784 * 512 + 512 + 512 * 256 + 256 + 256 * 10 + 10}
  # He et al. 2016: ResNet-20 has 0.27M parameters (option A shortcuts add none).
  assert count("resnet20")["params"] == 269_722
  assert count("alexnet")["params"] == 4_100_362
  assert count("vgg11")["params"] == 9_228_362


def test_the_batch_norm_models_are_those_with_statistics():
  with_stats = {name for name in models.MODELS if "batch_stats" in count(name)}
  assert with_stats == models.BATCH_NORM_MODELS == {"resnet20", "vgg11", "resnet50"}


def test_imagenet_networks_have_the_papers_parameter_counts_at_224():
  """1000 classes, 224x224 (shapes only: nothing is initialised)."""
  resnet50 = count("resnet50", (224, 224, 3), 1000)
  # He et al. 2016: 25.6M (torchvision's v1.5 has the same 25,557,032; the
  # stride's place adds no parameter). Statistics: a mean and a variance a channel.
  assert resnet50 == {"params": 25_557_032, "batch_stats": 53_120}
  assert resnet50["params"] == pytest.approx(25.6e6, rel=0.005)
  # One tower: SC17's 249 MB AlexNet (the paper's two towers' grouped
  # convolutions would make 60,965,224).
  alexnet = count("alexnet_imagenet", (224, 224, 3), 1000)["params"]
  assert alexnet == 62_378_344
  assert 4 * alexnet == pytest.approx(249e6, rel=0.005)
  for name in ("resnet50", "alexnet_imagenet"):
    model = models.get_model(name, 1000)
    images = jnp.zeros((2, 224, 224, 3))
    variables = jax.eval_shape(model.init, jax.random.PRNGKey(0), images)
    assert jax.eval_shape(model.apply, variables, images).shape == (2, 1000)


def _products(jaxpr):
  """The dtypes of the operands of every convolution and matrix product in `jaxpr`
  and the jaxprs inside it."""
  found = []
  for equation in jaxpr.eqns:
    if equation.primitive.name in ("conv_general_dilated", "dot_general"):
      found.append(tuple(str(var.aval.dtype) for var in equation.invars))
    for param in equation.params.values():
      for inner in param if isinstance(param, (tuple, list)) else [param]:
        if isinstance(inner, jax.extend.core.ClosedJaxpr):
          found += _products(inner.jaxpr)
        elif isinstance(inner, jax.extend.core.Jaxpr):
          found += _products(inner)
  return found


@pytest.mark.parametrize("name", NETWORKS)
def test_bfloat16_computes_the_products_in_bfloat16_and_keeps_float32_state(name):
  """Parameters and statistics float32; every convolution and matrix product in
  bfloat16; the loss and the gradients float32 (traced only)."""
  model = models.get_model(name, 10, "bfloat16")
  images = jnp.zeros((2, 32, 32, 3))
  tree = model_state.model_tree(jax.eval_shape(model.init, jax.random.PRNGKey(0), images))
  assert {str(leaf.dtype) for leaf in jax.tree.leaves(tree)} == {"float32"}
  variables = model_state.variables(tree)
  jaxpr = jax.make_jaxpr(lambda v: model.apply(v, images))(variables)
  products = _products(jaxpr.jaxpr)
  assert products and set(products) == {("bfloat16", "bfloat16")}, set(products)
  assert jaxpr.out_avals[0].dtype == jnp.bfloat16  # the logits, before the loss's cast
  loss_fn = steps.make_loss_fn(model, lambda x: x)
  batch = {"image": images, "label": jnp.zeros(2, jnp.int32)}
  (loss, _), grads = jax.eval_shape(jax.value_and_grad(loss_fn, has_aux=True), tree, batch)
  assert loss.dtype == jnp.float32
  assert {str(leaf.dtype) for leaf in jax.tree.leaves(grads)} == {"float32"}


@pytest.mark.e2e
def test_bfloat16_lenet5_gives_the_float32_logits_to_bfloat16_rounding():
  """The same parameters in both dtypes (its one-channel convolution then takes
  XLA's convolution, its pool the custom gradient in bfloat16)."""
  images = jax.random.uniform(jax.random.PRNGKey(1), (4, 28, 28, 1))
  float32 = models.get_model("lenet5", 10)
  bfloat16 = models.get_model("lenet5", 10, jnp.bfloat16)

  @jax.jit  # one program: a compile each would cost more than the test
  def both(key):
    params = float32.init(key, images)
    total = lambda p: bfloat16.apply(p, images).astype(jnp.float32).sum()  # noqa: E731
    return float32.apply(params, images), bfloat16.apply(params, images), jax.grad(total)(params)

  expected, got, grads = both(jax.random.PRNGKey(0))
  assert got.dtype == jnp.bfloat16
  scale = float(jnp.abs(expected).max())
  np.testing.assert_allclose(got.astype(jnp.float32), expected, atol=0.03 * scale)
  assert all(
    leaf.dtype == jnp.float32 and bool(jnp.isfinite(leaf).all()) for leaf in jax.tree.leaves(grads)
  )


def test_an_unknown_dtype_is_refused_by_the_registry():
  assert models.get_model("mlp", 10, "float32").dtype == jnp.float32
  with pytest.raises(ValueError, match="unsupported dtype 'float16'; valid: float32, bfloat16"):
    models.get_model("mlp", 10, "float16")


def _random_tree(model, rng):
  """The model's tree (parameters, statistics) of random values, without compiling its
  initialisers (VGG-11's take as long to compile as its training step):
  1/sqrt(fan-in) scale; BatchNorm's scales 1 (its variances too) keep a step's loss
  near log(10)."""
  shapes = jax.eval_shape(model.init, jax.random.PRNGKey(0), jnp.zeros((1, 32, 32, 3)))

  def leaf(path, shape):
    if path[-1].key in ("scale", "var"):
      return np.ones(shape.shape, np.float32)
    if path[-1].key in ("bias", "mean"):
      return np.zeros(shape.shape, np.float32)
    fan_in = np.prod(shape.shape[:-1])
    return (rng.standard_normal(shape.shape) / np.sqrt(fan_in)).astype(np.float32)

  return model_state.model_tree(jax.tree_util.tree_map_with_path(leaf, shapes))


def _model(name, dtype):
  if name == "resnet50":
    # resnet50's stem and blocks with one block a stage (each with its projection
    # shortcut): the same code at a quarter of the compile time.
    return ResNetImageNet(num_classes=10, blocks_per_stage=(1, 1, 1, 1), dtype=jnp.dtype(dtype))
  return models.get_model(name, 10, dtype)


@pytest.mark.e2e
@pytest.mark.parametrize(
  "name,algorithm,dtype",
  [
    # Each network under one rule of each family; one of them in bfloat16.
    ("resnet50", "sync_easgd", "bfloat16"),
    ("alexnet_imagenet", "async_easgd", "float32"),
  ],
)
def test_imagenet_networks_take_a_compiled_rule_step(name, algorithm, dtype):
  """2 workers of batch 2 on 32x32 images, 10 classes: a finite loss, workers that
  moved, and a state (center, workers, optimizer state, statistics) all float32."""
  model = _model(name, dtype)
  mesh = sharding.make_mesh(2)
  rng = np.random.default_rng(0)
  tree = _random_tree(model, rng)
  momentum = 0.9 if algorithm == "sync_easgd" else 0.0
  hyper = rules.Hyper(2, 0.01, momentum=momentum, comm_period=1, moving_rate=0.4)
  rule = rules.make_rule(algorithm, hyper)
  state = steps.init_state(rule, tree, jax.random.PRNGKey(1), mesh)
  before = jax.device_get(state.workers)
  images = sharding.place(mesh, rng.integers(0, 256, (2, 2, 32, 32, 3), np.uint8), P(AXIS))
  labels = sharding.place(mesh, rng.integers(0, 10, (2, 2), np.int32), P(AXIS))
  loss_fn = steps.make_loss_fn(model, lambda x: x.astype(jnp.float32) / 255.0 - 0.5)
  step = steps.build_train_step(rule, loss_fn, mesh, state, 2)
  clock = rule.make_clock(timing.Cluster(compute_time=1.0), model_bytes=0, seed=0)
  state, metrics = step(state, images, labels, rule.tick_inputs(clock.next_tick()))
  # async_easgd's step reports each worker's loss (both step in the first tick).
  losses = np.asarray(metrics["loss"]).reshape(-1)
  assert np.all(np.isfinite(losses)) and np.all((0 < losses) & (losses < 10)), losses
  floating = {
    str(leaf.dtype)
    for part in (state.center, state.center_opt, state.workers, state.worker_opt)
    for leaf in jax.tree.leaves(part)
    if jnp.issubdtype(leaf.dtype, jnp.floating)
  }
  assert floating == {"float32"}
  if momentum:  # sync_easgd's inner momentum trace, float32 too
    assert jax.tree.leaves(state.worker_opt)
  after = jax.tree.leaves(jax.device_get(state.workers))
  assert any(not np.array_equal(a, b) for a, b in zip(jax.tree.leaves(before), after, strict=True))


@pytest.mark.e2e
def test_mlp_trains_with_sync_easgd(tmp_path):
  config = default.get_config()
  config.model, config.workers, config.outer.moving_rate = "mlp", 2, 0.45
  (
    config.run.total_steps,
    config.run.eval_every,
    config.run.log_every,
    config.run.checkpoint_every,
  ) = 60, 60, 60, 0
  result = trainer.train_and_evaluate(config, str(tmp_path))
  assert result.metrics["eval/center_accuracy"] > 0.8


@pytest.mark.e2e
def test_resnet20_trains_end_to_end_on_mock_cifar10_with_local_statistics(tmp_path):
  """Augmented CIFAR batches, BatchNorm kept per worker, the center scored with
  each worker's statistics: the whole path of train.py."""
  config = default.get_config()
  config.model, config.data.dataset, config.data.augment, config.outer.batch_stats = (
    "resnet20",
    "cifar10",
    "crop_flip",
    "local",
  )
  config.workers, config.run.devices, config.data.batch_size, config.outer.moving_rate = (
    2,
    2,
    4,
    0.4,
  )
  config.outer.comm_period, config.run.total_steps = 1, 3
  config.run.eval_every, config.run.log_every, config.run.checkpoint_every = 0, 0, 0
  with tfds.testing.mock_data(num_examples=16):
    result = trainer.train_and_evaluate(config, str(tmp_path))
  assert result.metrics["sim/worker_steps_min"] == 3
  assert np.isfinite(result.metrics["train/loss"])
  assert 0 <= result.metrics["eval/center_accuracy"] <= 1
  # Each worker's statistics moved, apart from the other worker's (its batches differ).
  stats = jax.device_get(jax.tree.leaves(result.state.workers[model_state.STATS])[0])
  assert not np.allclose(stats[0], stats[1])


@pytest.mark.e2e  # compiling a whole large network takes about 10 s
@pytest.mark.parametrize("name", ["alexnet", "vgg11"])
def test_cifar_networks_take_sync_easgd_steps_and_lower_the_loss(name):
  """A few compiled steps on one fixed augmented batch of CIFAR-shaped images."""
  model = models.get_model(name, 10)
  mesh = sharding.make_mesh(1)
  rng = np.random.default_rng(0)
  tree = _random_tree(model, rng)
  rule = rules.make_rule("sync_easgd", rules.Hyper(1, 0.01, comm_period=2, moving_rate=0.5))
  state = steps.init_state(rule, tree, jax.random.PRNGKey(1), mesh)
  images = sharding.place(mesh, rng.integers(0, 256, (1, 8, 32, 32, 3), np.uint8), P(AXIS))
  labels = sharding.place(mesh, rng.integers(0, 10, (1, 8), np.int32), P(AXIS))
  loss_fn = steps.make_loss_fn(model, lambda x: x.astype(jnp.float32) / 255.0 - 0.5)
  step = steps.build_train_step(rule, loss_fn, mesh, state, 8, augment.get("crop_flip"))
  losses = []
  for _ in range(3):
    state, metrics = step(state, images, labels, {})
    losses.append(float(metrics["loss"]))
  assert all(np.isfinite(losses)) and losses[-1] < losses[0], losses


def test_an_unknown_network_or_dtype_is_refused_naming_the_valid_ones():
  with pytest.raises(KeyError, match="unknown model 'vgg'; valid: .*lenet5"):
    models.get_model("vgg", 10)
  with pytest.raises(ValueError, match="float16"):
    models.get_model("lenet5", 10, jnp.float16)
