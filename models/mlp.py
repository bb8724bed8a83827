"""A two-hidden-layer perceptron: the no-convolution baseline."""

import flax.linen as nn
import jax.numpy as jnp
from flax.typing import Dtype


class MLP(nn.Module):
  """flatten - dense 512 - dense 256 - logits, with ReLU.

  Its cost is all matrix products, unlike LeNet-5's convolutions, which makes
  it the contrast case for the planner's memory and time predictions.
  """

  num_classes: int = 10
  hidden: tuple[int, ...] = (512, 256)
  dtype: Dtype = jnp.float32  # of the computation; the parameters are float32

  @nn.compact
  def __call__(self, images: jnp.ndarray, train: bool = False) -> jnp.ndarray:
    """Maps images [batch, height, width, channels] to logits [batch, classes]."""
    del train  # no layer behaves differently in training
    x = images.reshape((images.shape[0], -1))
    for index, width in enumerate(self.hidden):
      x = nn.relu(nn.Dense(width, dtype=self.dtype, name=f"fc{index + 1}")(x))
    return nn.Dense(self.num_classes, dtype=self.dtype, name="logits")(x)
