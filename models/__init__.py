"""Model registry: CNNs are chosen by name with `config.model`.

Every model is called as `model.apply(variables, images, train=...)`; those
with BatchNorm also return their updated statistics when `train` is True and
`mutable=["batch_stats"]` is asked for.
"""

from collections.abc import Callable

import flax.linen as nn

from easgd.models.alexnet import AlexNet
from easgd.models.lenet import LeNet5
from easgd.models.mlp import MLP
from easgd.models.resnet import ResNet
from easgd.models.vgg import VGG

# name -> constructor taking the number of classes.
MODELS: dict[str, Callable[[int], nn.Module]] = {
  "lenet5": lambda num_classes: LeNet5(num_classes=num_classes),
  "mlp": lambda num_classes: MLP(num_classes=num_classes),
  "alexnet": lambda num_classes: AlexNet(num_classes=num_classes),
  "resnet20": lambda num_classes: ResNet(num_classes=num_classes, blocks_per_stage=3),
  "vgg11": lambda num_classes: VGG(num_classes=num_classes),
}

# Models with BatchNorm, whose trees carry running statistics (config.outer.batch_stats).
BATCH_NORM_MODELS = frozenset({"resnet20", "vgg11"})


def get_model(name: str, num_classes: int) -> nn.Module:
  """Returns the model registered under `name`."""
  if name not in MODELS:
    raise KeyError(f"unknown model {name!r}; valid: {', '.join(sorted(MODELS))}")
  return MODELS[name](num_classes)
