"""LeNet-5 (LeCun et al., 1998) in Flax linen."""

from collections.abc import Callable

import flax.linen as nn
import jax.numpy as jnp
from flax.typing import Dtype

from easgd.models.layers import conv_general_dilated, materialize, max_pool_2x2, pad_to

# LeNet-5 was designed for 32x32 inputs; smaller images are zero-padded up to
# it so that the network (and its 61,706 parameters on one channel) is the
# same for MNIST (28x28), scikit-learn's digits (8x8) and CIFAR (32x32).
_INPUT_SIDE = 32


class LeNet5(nn.Module):
  """conv(6@5x5) - pool - conv(16@5x5) - pool - dense 120 - dense 84 - logits.

  ReLU and max pooling replace the original tanh and subsampling layers,
  as in today's practice; the layer sizes are the paper's.
  """

  num_classes: int = 10
  # The 2x2 max-pool: reduce_window's values and gradient bits, faster on CPU
  # (bench/cpu/variants.py compares it with layers.reduce_window_max_pool_2x2).
  pool: Callable[[jnp.ndarray], jnp.ndarray] = max_pool_2x2
  dtype: Dtype = jnp.float32  # of the computation; the parameters are float32

  @nn.compact
  def __call__(self, images: jnp.ndarray, train: bool = False) -> jnp.ndarray:
    """Maps images [batch, height, width, channels] to logits [batch, classes]."""
    del train  # no layer behaves differently in training
    x = pad_to(images, _INPUT_SIDE)
    # One input channel: layers.conv_general_dilated computes this convolution
    # as XLA:CPU computes it fast, and materialize keeps the pool's gradient
    # from computing it again.
    conv1 = nn.Conv(
      6,
      (5, 5),
      padding="VALID",
      dtype=self.dtype,
      name="conv1",
      conv_general_dilated=conv_general_dilated,
    )
    x = self.pool(materialize(nn.relu(conv1(x))))
    x = nn.relu(nn.Conv(16, (5, 5), padding="VALID", dtype=self.dtype, name="conv2")(x))
    x = self.pool(x)
    x = x.reshape((x.shape[0], -1))
    x = nn.relu(nn.Dense(120, dtype=self.dtype, name="fc1")(x))
    x = nn.relu(nn.Dense(84, dtype=self.dtype, name="fc2")(x))
    return nn.Dense(self.num_classes, dtype=self.dtype, name="logits")(x)
