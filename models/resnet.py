"""ResNet-20 for CIFAR (He, Zhang, Ren, Sun, "Deep Residual Learning", 2016, Sec. 4.2)."""

import flax.linen as nn
import jax.numpy as jnp
from flax.typing import Dtype

from easgd.models.batch_norm import BatchNorm
from easgd.models.layers import materialize

# Running statistics move as in PyTorch's default (momentum 0.1 there), so that
# the evaluation statistics settle within a few hundred steps.
BATCH_NORM = {"momentum": 0.9, "epsilon": 1e-5}


class BasicBlock(nn.Module):
  """conv3x3 - BN - ReLU - conv3x3 - BN, plus the shortcut, then ReLU.

  Where the block halves the side and doubles the channels, the shortcut is
  the paper's option A: the input subsampled by 2 and zero-padded in the new
  channels, so that shortcuts add no parameters.
  """

  channels: int
  stride: int
  dtype: Dtype = jnp.float32

  @nn.compact
  def __call__(self, x: jnp.ndarray, train: bool) -> jnp.ndarray:
    norm = lambda name: BatchNorm(  # noqa: E731
      use_running_average=not train, dtype=self.dtype, name=name, **BATCH_NORM
    )
    conv = lambda stride, name: nn.Conv(  # noqa: E731
      self.channels, (3, 3), stride, padding=1, use_bias=False, dtype=self.dtype, name=name
    )
    y = conv(self.stride, "conv1")(x)
    y = materialize(nn.relu(norm("bn1")(y)))
    y = conv(1, "conv2")(y)
    y = norm("bn2")(y)
    if self.stride != 1 or x.shape[-1] != self.channels:
      x = x[:, :: self.stride, :: self.stride, :]
      extra = self.channels - x.shape[-1]
      x = jnp.pad(x, ((0, 0), (0, 0), (0, 0), (extra // 2, extra - extra // 2)))
    return materialize(nn.relu(x + y))


class ResNet(nn.Module):
  """The CIFAR ResNet of depth 6n + 2: conv 16 - 3 stages of n blocks
  (16, 32, 64 channels; sides 32, 16, 8) - global average pool - logits.

  n = 3 is ResNet-20: 0.27M parameters, 91.25% CIFAR-10 test accuracy in the
  paper (64k steps of batch 128, SGD momentum 0.9, weight decay 1e-4).
  """

  num_classes: int = 10
  blocks_per_stage: int = 3
  widths: tuple[int, ...] = (16, 32, 64)
  dtype: Dtype = jnp.float32  # of the computation; the parameters are float32

  @nn.compact
  def __call__(self, images: jnp.ndarray, train: bool = False) -> jnp.ndarray:
    """Maps images [batch, height, width, channels] to logits [batch, classes]."""
    # Each convolution's input is materialized (layers.materialize): on XLA:CPU
    # this keeps the filter gradients from recomputing the residual stream.
    conv = nn.Conv(self.widths[0], (3, 3), padding=1, use_bias=False, dtype=self.dtype, name="conv")
    norm = BatchNorm(use_running_average=not train, dtype=self.dtype, name="bn", **BATCH_NORM)
    x = nn.relu(norm(conv(images)))
    x = materialize(x)
    for stage, width in enumerate(self.widths):
      for block in range(self.blocks_per_stage):
        stride = 2 if stage > 0 and block == 0 else 1
        name = f"stage{stage + 1}_block{block + 1}"
        x = BasicBlock(width, stride, self.dtype, name=name)(x, train)
    x = x.mean(axis=(1, 2))
    return nn.Dense(self.num_classes, dtype=self.dtype, name="logits")(x)
