"""The AlexNet-style CIFAR network of the EASGD experiments: 5 conv + 3 dense."""

import flax.linen as nn
import jax.numpy as jnp
from flax.typing import Dtype

from easgd.models.layers import pad_to


class AlexNet(nn.Module):
  """conv 64@5x5 - pool - conv 192@5x5 - pool - conv 384@3x3 - conv 256@3x3 -
  conv 256@3x3 - pool - dense 384 - dense 192 - logits, with ReLU.

  The convolutions are AlexNet's (Krizhevsky et al. 2012) at CIFAR's 32x32,
  the dense layers those of the cuda-convnet CIFAR-10 network (4.1M
  parameters in all). Local response normalisation and dropout are left out,
  as in today's practice; inputs smaller than 32x32 are zero-padded to it.
  """

  num_classes: int = 10
  dtype: Dtype = jnp.float32  # of the computation; the parameters are float32

  @nn.compact
  def __call__(self, images: jnp.ndarray, train: bool = False) -> jnp.ndarray:
    """Maps images [batch, height, width, channels] to logits [batch, classes]."""
    del train  # no layer behaves differently in training
    x = pad_to(images, 32)
    for index, (features, kernel) in enumerate([(64, 5), (192, 5), (384, 3), (256, 3), (256, 3)]):
      conv = nn.Conv(
        features, (kernel, kernel), padding="SAME", dtype=self.dtype, name=f"conv{index + 1}"
      )
      x = nn.relu(conv(x))
      if index in (0, 1, 4):
        x = nn.max_pool(x, (3, 3), strides=(2, 2), padding="SAME")
    x = x.reshape((x.shape[0], -1))
    x = nn.relu(nn.Dense(384, dtype=self.dtype, name="fc1")(x))
    x = nn.relu(nn.Dense(192, dtype=self.dtype, name="fc2")(x))
    return nn.Dense(self.num_classes, dtype=self.dtype, name="logits")(x)
