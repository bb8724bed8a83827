"""What a run trains, assembled from its config in one place: the network of
config.model in config.dtype (its initializer, and its loss and evaluation
functions over images normalised by the dataset's statistics), and the rule of
config.algorithm with its hyper-parameters. Training (easgd.train), the planner
(easgd.plan), runtime=ray's worker processes, bench/, studies/ and the tests
build them here.
"""

import dataclasses
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from easgd import models, steps
from easgd.rules import Hyper, LossFn, Rule, make_rule, model_state


@dataclasses.dataclass(frozen=True)
class Normalization:
  """What normalising a dataset's images reads: (image/max_value - mean)/std per
  channel (easgd.steps.make_normalize). Plain values, so that a runtime=ray worker
  process's recipe carries them; a Dataset reads the same."""

  max_value: float
  mean: tuple[float, ...]
  std: tuple[float, ...]

  @classmethod
  def of(cls, dataset) -> "Normalization":
    """A Dataset's, as Python floats (exact: float64 holds every float32)."""
    return cls(
      float(dataset.max_value),
      tuple(np.asarray(dataset.mean, np.float64).ravel().tolist()),
      tuple(np.asarray(dataset.std, np.float64).ravel().tolist()),
    )

  @classmethod
  def stand_in(cls, channels: int) -> "Normalization":
    """For shapes and costs alone (the planner, the checks): constants change neither."""
    return cls(255, (0.0,) * channels, (1.0,) * channels)


@dataclasses.dataclass(frozen=True)
class Network:
  """config.model, built for a dataset's classes and images."""

  model: Any
  init_params: Callable[[jax.Array], Any]  # key -> the tree the rules train (model_state)
  loss_fn: LossFn  # one worker's mean loss and accuracy on a batch, in training mode
  apply_fn: Callable  # (tree, uint8 images) -> logits, in evaluation mode


def network(
  config: ml_collections.ConfigDict, num_classes: int, image_shape, normalization
) -> Network:
  """config.model in config.dtype for `num_classes` classes and images of `image_shape`
  (H, W, C), normalised by `normalization` (a Normalization, or a Dataset)."""
  model = models.get_model(config.model, num_classes, config.dtype)
  normalize = steps.make_normalize(normalization)

  def init_params(key):
    return model_state.model_tree(model.init(key, jnp.zeros((1, *image_shape))))

  return Network(
    model=model,
    init_params=init_params,
    loss_fn=steps.make_loss_fn(model, normalize),
    apply_fn=steps.make_apply_fn(model, normalize),
  )


def for_dataset(config: ml_collections.ConfigDict, dataset) -> Network:
  """`network` for a loaded Dataset: its classes, its images' shape, its statistics."""
  return network(config, dataset.num_classes, dataset.train_images.shape[1:], dataset)


def rule(config: ml_collections.ConfigDict) -> Rule:
  """The rule of config.algorithm, with the hyper-parameters `config` gives it (the
  pipeline has none: easgd.pipeline.programs builds each of its models')."""
  return make_rule(config.algorithm, Hyper.from_config(config))
