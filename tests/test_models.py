"""Every registered model maps any dataset's images to logits, and trains."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import tensorflow_datasets as tfds
from jax.sharding import PartitionSpec as P

from easgd import models, rules, steps, trainer
from easgd.configs import default
from easgd.data import augment
from easgd.infra import sharding
from easgd.rules import AXIS, model_state


@pytest.mark.parametrize("name", sorted(models.MODELS))
@pytest.mark.parametrize("image_shape", [(28, 28, 1), (8, 8, 1), (32, 32, 3)])
def test_models_give_logits_for_every_dataset_shape(name, image_shape):
  model = models.get_model(name, 10)
  images = jnp.zeros((3, *image_shape))
  variables = jax.eval_shape(model.init, jax.random.PRNGKey(0), images)
  logits = jax.eval_shape(lambda v: model.apply(v, images), variables)
  assert logits.shape == (3, 10)


def count(name, image_shape=(32, 32, 3)):
  variables = jax.eval_shape(
    models.get_model(name, 10).init, jax.random.PRNGKey(0), jnp.zeros((1, *image_shape))
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
  assert with_stats == models.BATCH_NORM_MODELS == {"resnet20", "vgg11"}


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
  tree = model_state.model_tree(
    jax.jit(model.init)(jax.random.PRNGKey(0), jnp.zeros((1, 32, 32, 3)))
  )
  rule = rules.make_rule("sync_easgd", rules.Hyper(1, 0.01, comm_period=2, moving_rate=0.5))
  state = steps.init_state(rule, tree, jax.random.PRNGKey(1), mesh)
  rng = np.random.default_rng(0)
  images = sharding.place(mesh, rng.integers(0, 256, (1, 8, 32, 32, 3), np.uint8), P(AXIS))
  labels = sharding.place(mesh, rng.integers(0, 10, (1, 8), np.int32), P(AXIS))
  loss_fn = steps.make_loss_fn(model, lambda x: x.astype(jnp.float32) / 255.0 - 0.5)
  step = steps.build_train_step(rule, loss_fn, mesh, state, 8, augment.get("crop_flip"))
  losses = []
  for _ in range(3):
    state, metrics = step(state, images, labels, {})
    losses.append(float(metrics["loss"]))
  assert all(np.isfinite(losses)) and losses[-1] < losses[0], losses
