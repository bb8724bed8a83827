"""AlexNet for ImageNet (Krizhevsky, Sutskever, Hinton 2012), in one tower: the
network of SC17's Sync EASGD experiments (You, Buluc, Demmel 2017)."""

import flax.linen as nn
import jax.numpy as jnp
from flax.typing import Dtype

from easgd.models.layers import pad_to

# The smallest side whose three 3x3/2 pools leave at least 1x1 (63 -> 15 after
# the first convolution, 7, 3, 1 after the pools); smaller images are
# zero-padded up to it.
MIN_SIDE = 63


class AlexNetImageNet(nn.Module):
  """conv 96@11x11/4 - pool 3x3/2 - conv 256@5x5 - pool - conv 384@3x3 -
  conv 384@3x3 - conv 256@3x3 - pool - dense 4096 - dense 4096 - logits, with ReLU.

  The paper's layer sizes with every convolution seeing all of its input's
  channels: one tower, not the paper's two GPUs' halves (whose grouped
  conv2, conv4 and conv5 make its 60,965,224 parameters, the "60 million").
  At 224x224 this is 62,378,344 parameters for 1000 classes, 249.5 MB of
  float32: the 249 MB AlexNet that SC17 timed. The first convolution pads by
  2 (as torchvision's does) so that a 224x224 image is 55x55 after it, as
  the paper's 227x227 was, and 6x6x256 = 9,216 features reach the dense
  layers; the pools are the paper's overlapping 3x3/2 without padding.
  Local response normalisation is left out: Simonyan and Zisserman (2015)
  found it does not improve ImageNet accuracy while it costs memory and time,
  and later AlexNets drop it. There is no dropout either: the training step
  gives the model no random key (easgd/steps.py), so the paper's dropout of
  0.5 before each dense layer is not reproduced. Images smaller than
  MIN_SIDE are zero-padded to it, which the dense layer's size then follows.
  """

  num_classes: int = 1000
  dtype: Dtype = jnp.float32  # of the computation; the parameters are float32

  @nn.compact
  def __call__(self, images: jnp.ndarray, train: bool = False) -> jnp.ndarray:
    """Maps images [batch, height, width, channels] to logits [batch, classes]."""
    del train  # no layer behaves differently in training
    x = pad_to(images, MIN_SIDE)
    layers = [(96, 11, 4, 2), (256, 5, 1, 2), (384, 3, 1, 1), (384, 3, 1, 1), (256, 3, 1, 1)]
    for index, (features, kernel, stride, padding) in enumerate(layers):
      conv = nn.Conv(
        features,
        (kernel, kernel),
        stride,
        padding=padding,
        dtype=self.dtype,
        name=f"conv{index + 1}",
      )
      x = nn.relu(conv(x))
      if index in (0, 1, 4):
        x = nn.max_pool(x, (3, 3), strides=(2, 2), padding="VALID")
    x = x.reshape((x.shape[0], -1))
    x = nn.relu(nn.Dense(4096, dtype=self.dtype, name="fc1")(x))
    x = nn.relu(nn.Dense(4096, dtype=self.dtype, name="fc2")(x))
    return nn.Dense(self.num_classes, dtype=self.dtype, name="logits")(x)
