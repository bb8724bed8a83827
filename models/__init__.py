"""Model registry: CNNs are chosen by name with `config.model`."""

from collections.abc import Callable

import flax.linen as nn

from models.lenet import LeNet5
from models.mlp import MLP

# name -> constructor taking the number of classes.
MODELS: dict[str, Callable[[int], nn.Module]] = {
  "lenet5": lambda num_classes: LeNet5(num_classes=num_classes),
  "mlp": lambda num_classes: MLP(num_classes=num_classes),
}


def get_model(name: str, num_classes: int) -> nn.Module:
  """Returns the model registered under `name`."""
  if name not in MODELS:
    raise KeyError(f"unknown model {name!r}; valid: {', '.join(sorted(MODELS))}")
  return MODELS[name](num_classes)
