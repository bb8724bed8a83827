"""VGG-11 for CIFAR (Simonyan and Zisserman 2015, configuration A), with BatchNorm."""

import flax.linen as nn
import jax.numpy as jnp
from flax.typing import Dtype

from easgd.models.batch_norm import BatchNorm
from easgd.models.layers import max_pool_2x2, pad_to

# Output channels of each 3x3 convolution; "M" is a 2x2 max pool.
VGG11 = (64, "M", 128, "M", 256, 256, "M", 512, 512, "M", 512, 512, "M")


class VGG(nn.Module):
  """Configuration A's convolutions, each followed by BatchNorm and ReLU, then
  one dense layer on the 1x1x512 result: the usual CIFAR adaptation (9.2M
  parameters). Inputs smaller than 32x32 are zero-padded to it.
  """

  num_classes: int = 10
  layers: tuple = VGG11
  dtype: Dtype = jnp.float32  # of the computation; the parameters are float32

  @nn.compact
  def __call__(self, images: jnp.ndarray, train: bool = False) -> jnp.ndarray:
    """Maps images [batch, height, width, channels] to logits [batch, classes]."""
    x = pad_to(images, 32)
    convs = 0
    for layer in self.layers:
      if layer == "M":
        x = max_pool_2x2(x)
        continue
      convs += 1
      conv = nn.Conv(
        layer, (3, 3), padding=1, use_bias=False, dtype=self.dtype, name=f"conv{convs}"
      )
      x = conv(x)
      x = BatchNorm(
        use_running_average=not train,
        momentum=0.9,
        epsilon=1e-5,
        dtype=self.dtype,
        name=f"bn{convs}",
      )(x)
      x = nn.relu(x)
    x = x.reshape((x.shape[0], -1))
    return nn.Dense(self.num_classes, dtype=self.dtype, name="logits")(x)
