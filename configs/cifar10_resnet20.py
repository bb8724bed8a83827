"""Sync EASGD, 4 workers, ResNet-20 (BatchNorm) on CIFAR-10 with crop-and-flip augmentation.

Target: at least 85% center test accuracy by the last step (He et al. report
91.25% for ResNet-20 with momentum SGD and a step schedule; this is plain
SGD local steps at one learning rate). Needs the prepared TFDS dataset:
--config.run.data_dir=DIR (README, "Datasets"). docs/cifar.md has what was run.
"""

from easgd.configs import default


def get_config():
  config = default.get_config()
  config.model = "resnet20"
  config.data.dataset = "cifar10"
  config.data.augment = "crop_flip"
  config.outer.batch_stats = "averaged"
  config.workers = 4
  config.data.batch_size = 128  # per worker
  config.optimizer.learning_rate = 0.2
  config.optimizer.weight_decay = 5e-4
  config.outer.comm_period = 4
  config.outer.moving_rate = 0.9 / 4
  config.run.total_steps = 20_000  # 205 passes over each worker's 12,500 images
  config.run.log_every = 100
  config.run.eval_every = 1000
  config.run.checkpoint_every = 1000
  return config
