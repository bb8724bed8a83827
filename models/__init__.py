"""Model registry: CNNs are chosen by name with `config.model`.

Every model is called as `model.apply(variables, images, train=...)`; those
with BatchNorm also return their updated statistics when `train` is True and
`mutable=["batch_stats"]` is asked for. Each computes in the dtype it is given
(`config.dtype`: float32, or bfloat16 for activations, matrix products and
convolutions) and keeps its parameters and BatchNorm statistics in float32.
"""

from collections.abc import Callable

import flax.linen as nn
import jax.numpy as jnp
from flax.typing import Dtype

from easgd.models.alexnet import AlexNet
from easgd.models.alexnet_imagenet import AlexNetImageNet
from easgd.models.lenet import LeNet5
from easgd.models.mlp import MLP
from easgd.models.resnet import ResNet
from easgd.models.resnet_imagenet import ResNetImageNet
from easgd.models.vgg import VGG

# name -> constructor taking the number of classes and the computation's dtype.
MODELS: dict[str, Callable[[int, Dtype], nn.Module]] = {
  "lenet5": lambda num_classes, dtype: LeNet5(num_classes=num_classes, dtype=dtype),
  "mlp": lambda num_classes, dtype: MLP(num_classes=num_classes, dtype=dtype),
  "alexnet": lambda num_classes, dtype: AlexNet(num_classes=num_classes, dtype=dtype),
  "resnet20": lambda num_classes, dtype: ResNet(
    num_classes=num_classes, blocks_per_stage=3, dtype=dtype
  ),
  "vgg11": lambda num_classes, dtype: VGG(num_classes=num_classes, dtype=dtype),
  # ImageNet's networks (any square side works; the papers' is 224).
  "resnet50": lambda num_classes, dtype: ResNetImageNet(
    num_classes=num_classes, blocks_per_stage=(3, 4, 6, 3), dtype=dtype
  ),
  "alexnet_imagenet": lambda num_classes, dtype: AlexNetImageNet(
    num_classes=num_classes, dtype=dtype
  ),
}

# Models with BatchNorm, whose trees carry running statistics (config.outer.batch_stats).
BATCH_NORM_MODELS = frozenset({"resnet20", "vgg11", "resnet50"})

# config.dtype: what the models compute in. Every model takes both: models/layers.py's
# pool and materialize work in either, and its shifted convolution, float32 only,
# leaves a bfloat16 one to XLA's convolution.
DTYPES = ("float32", "bfloat16")


def get_model(name: str, num_classes: int, dtype: Dtype = jnp.float32) -> nn.Module:
  """Returns the model registered under `name`, computing in `dtype` (a name of
  DTYPES or a JAX dtype); its parameters are float32 whatever `dtype` is."""
  if name not in MODELS:
    raise KeyError(f"unknown model {name!r}; valid: {', '.join(sorted(MODELS))}")
  if jnp.dtype(dtype).name not in DTYPES:
    raise ValueError(f"unsupported dtype {dtype!r}; valid: {', '.join(DTYPES)}")
  return MODELS[name](num_classes, jnp.dtype(dtype))
