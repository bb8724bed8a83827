"""ResNet-20 for CIFAR (He, Zhang, Ren, Sun, "Deep Residual Learning", 2016, Sec. 4.2)."""

import flax.linen as nn
import jax.numpy as jnp

from easgd.models.layers import materialize

# Running statistics move as in PyTorch's default (momentum 0.1 there), so that
# the evaluation statistics settle within a few hundred steps.
_BATCH_NORM = {"momentum": 0.9, "epsilon": 1e-5}


class BasicBlock(nn.Module):
  """conv3x3 - BN - ReLU - conv3x3 - BN, plus the shortcut, then ReLU.

  Where the block halves the side and doubles the channels, the shortcut is
  the paper's option A: the input subsampled by 2 and zero-padded in the new
  channels, so that shortcuts add no parameters.
  """

  channels: int
  stride: int

  @nn.compact
  def __call__(self, x: jnp.ndarray, train: bool) -> jnp.ndarray:
    norm = lambda name: nn.BatchNorm(use_running_average=not train, name=name, **_BATCH_NORM)  # noqa: E731
    y = nn.Conv(self.channels, (3, 3), self.stride, padding=1, use_bias=False, name="conv1")(x)
    y = materialize(nn.relu(norm("bn1")(y)))
    y = nn.Conv(self.channels, (3, 3), padding=1, use_bias=False, name="conv2")(y)
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

  @nn.compact
  def __call__(self, images: jnp.ndarray, train: bool = False) -> jnp.ndarray:
    """Maps images [batch, height, width, channels] to logits [batch, classes]."""
    # Each convolution's input is materialized (layers.materialize): on XLA:CPU
    # this keeps the filter gradients from recomputing the residual stream.
    x = nn.Conv(self.widths[0], (3, 3), padding=1, use_bias=False, name="conv")(images)
    x = nn.relu(nn.BatchNorm(use_running_average=not train, name="bn", **_BATCH_NORM)(x))
    x = materialize(x)
    for stage, width in enumerate(self.widths):
      for block in range(self.blocks_per_stage):
        stride = 2 if stage > 0 and block == 0 else 1
        x = BasicBlock(width, stride, name=f"stage{stage + 1}_block{block + 1}")(x, train)
    x = x.mean(axis=(1, 2))
    return nn.Dense(self.num_classes, name="logits")(x)
