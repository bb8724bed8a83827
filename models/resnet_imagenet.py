"""ResNet-50 for ImageNet (He, Zhang, Ren, Sun, "Deep Residual Learning", 2016, Table 1)."""

import flax.linen as nn
import jax.numpy as jnp
from flax.typing import Dtype

from easgd.models.batch_norm import BatchNorm
from easgd.models.layers import materialize
from easgd.models.resnet import BATCH_NORM


class Bottleneck(nn.Module):
  """conv1x1 - BN - ReLU - conv3x3 - BN - ReLU - conv1x1 (4x the channels) - BN,
  plus the shortcut, then ReLU.

  The stride is on the 3x3 convolution (ResNet v1.5, as in torchvision and
  NVIDIA's reference), not on the first 1x1 as in the paper: the same
  parameters, about 0.5% better top-1 in those references. Where the shape
  changes, the shortcut is the paper's option B, a strided 1x1 convolution
  and BN. The last BN's scale starts at zero (Goyal et al. 2017), so that
  every block starts as the identity: the large-batch recipe of the configs
  (a linear warm-up to 0.1 per 256 images) relies on it.
  """

  channels: int  # of the 3x3 convolution; the block puts out 4x as many
  stride: int
  dtype: Dtype = jnp.float32

  @nn.compact
  def __call__(self, x: jnp.ndarray, train: bool) -> jnp.ndarray:
    def norm(name, **kwargs):
      return BatchNorm(
        use_running_average=not train, dtype=self.dtype, name=name, **BATCH_NORM, **kwargs
      )

    def conv(features, kernel, stride, name):
      return nn.Conv(
        features,
        (kernel, kernel),
        stride,
        padding=kernel // 2,
        use_bias=False,
        dtype=self.dtype,
        name=name,
      )

    out = 4 * self.channels
    y = materialize(nn.relu(norm("bn1")(conv(self.channels, 1, 1, "conv1")(x))))
    y = materialize(nn.relu(norm("bn2")(conv(self.channels, 3, self.stride, "conv2")(y))))
    y = norm("bn3", scale_init=nn.initializers.zeros)(conv(out, 1, 1, "conv3")(y))
    if self.stride != 1 or x.shape[-1] != out:
      x = norm("shortcut_bn")(conv(out, 1, self.stride, "shortcut_conv")(x))
    return materialize(nn.relu(x + y))


class ResNetImageNet(nn.Module):
  """The ImageNet ResNet of bottleneck blocks: conv 64@7x7/2 - BN - ReLU - max-pool
  3x3/2 - 4 stages (3x3 widths 64, 128, 256, 512; outputs 4x that, 256 to
  2048; the first block of stages 2-4 halves the side) - global average pool -
  logits.

  blocks_per_stage (3, 4, 6, 3) is ResNet-50: 25,557,032 parameters for 1000
  classes (the paper's 25.6M; 3.8 billion multiply-adds a 224x224 image, about
  4.1 for v1.5) and 53,120 BatchNorm statistics. Every convolution and the
  pool pad by half their kernel, as the reference implementations do, so
  each stride of 2 halves the side rounding up and any side gives logits:
  224x224 is 112 after the stem's convolution and 56, 28, 14, 7 in the
  stages; 32x32 is 16, then 8, 4, 2, 1.
  """

  num_classes: int = 1000
  blocks_per_stage: tuple[int, ...] = (3, 4, 6, 3)
  widths: tuple[int, ...] = (64, 128, 256, 512)
  dtype: Dtype = jnp.float32  # of the computation; the parameters are float32

  @nn.compact
  def __call__(self, images: jnp.ndarray, train: bool = False) -> jnp.ndarray:
    """Maps images [batch, height, width, channels] to logits [batch, classes]."""
    stem = nn.Conv(
      self.widths[0], (7, 7), 2, padding=3, use_bias=False, dtype=self.dtype, name="conv"
    )
    norm = BatchNorm(use_running_average=not train, dtype=self.dtype, name="bn", **BATCH_NORM)
    x = nn.relu(norm(stem(images)))
    # Each convolution's input is materialized, as in models/resnet.py (on XLA:CPU
    # this keeps the filter gradients from recomputing the residual stream).
    x = materialize(nn.max_pool(x, (3, 3), strides=(2, 2), padding=((1, 1), (1, 1))))
    for stage, (blocks, width) in enumerate(zip(self.blocks_per_stage, self.widths, strict=True)):
      for block in range(blocks):
        stride = 2 if stage > 0 and block == 0 else 1
        name = f"stage{stage + 1}_block{block + 1}"
        x = Bottleneck(width, stride, self.dtype, name=name)(x, train)
    x = x.mean(axis=(1, 2))
    return nn.Dense(self.num_classes, dtype=self.dtype, name="logits")(x)
