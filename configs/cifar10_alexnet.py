"""Sync EASGD, 4 workers, the AlexNet-style network of the EASGD experiments
on CIFAR-10 with crop-and-flip augmentation.

Target: at least 75% center test accuracy by the last step (no BatchNorm,
so a smaller learning rate). Needs the prepared TFDS dataset:
--config.run.data_dir=DIR (docs/data.md, "Preparing CIFAR-10"). docs/cifar.md has what was run.
"""

from easgd.configs import cifar10_resnet20


def get_config():
  config = cifar10_resnet20.get_config()
  config.model = "alexnet"
  config.optimizer.learning_rate = 0.02
  config.run.total_steps = 15_000
  return config
