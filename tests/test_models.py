"""Every registered model maps any dataset's images to logits, and trains."""

import jax
import jax.numpy as jnp
import pytest

import models
from configs import default
from easgd import trainer


@pytest.mark.parametrize("name", sorted(models.MODELS))
@pytest.mark.parametrize("image_shape", [(28, 28, 1), (8, 8, 1), (32, 32, 3)])
def test_models_give_logits_for_every_dataset_shape(name, image_shape):
  model = models.get_model(name, 10)
  images = jnp.zeros((3, *image_shape))
  params = model.init(jax.random.PRNGKey(0), images)
  assert model.apply(params, images).shape == (3, 10)


def test_parameter_counts_are_the_architectures():
  def count(name):
    variables = jax.eval_shape(
      models.get_model(name, 10).init, jax.random.PRNGKey(0), jnp.zeros((1, 28, 28, 1))
    )
    return sum(leaf.size for leaf in jax.tree.leaves(variables))

  assert count("lenet5") == 61_706
  # 784*512 + 512, 512*256 + 256, 256*10 + 10.
  assert count("mlp") == 784 * 512 + 512 + 512 * 256 + 256 + 256 * 10 + 10


def test_mlp_trains_with_sync_easgd(tmp_path):
  config = default.get_config()
  config.model, config.workers, config.moving_rate = "mlp", 2, 0.45
  config.total_steps, config.eval_every, config.log_every, config.checkpoint_every = 60, 60, 60, 0
  result = trainer.train_and_evaluate(config, str(tmp_path))
  assert result.metrics["eval/center_accuracy"] > 0.8
