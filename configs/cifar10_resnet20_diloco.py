"""DiLoCo, 4 workers, ResNet-20 (BatchNorm) on CIFAR-10: the counterpart of
configs/cifar10_resnet20.py with DiLoCo's optimizers.

DiLoCo (Douillard et al. 2023): each worker takes H = outer.comm_period
steps of AdamW, then the pseudo-gradient moves the center by SGD with
Nesterov momentum (0.7, 0.9) and every worker is reset to it. AdamW at
1e-3 with a linear warm-up and a cosine to 0 (the paper's inner schedule),
decoupled weight decay 0.05 (AdamW's decay is multiplied by the learning
rate, so it is larger than SGD's L2 1e-4). H = 50: 320 exchanges in the run,
12.5x fewer than Sync EASGD's every 4 steps.

Target: within a point or two of the Sync EASGD recipe's 91% at 12.5x less
communication; not measured here (no CIFAR-10 on this machine;
docs/cifar.md). Needs --config.run.data_dir=DIR (docs/data.md, "Preparing CIFAR-10").
"""

from easgd.configs import cifar10_resnet20


def get_config():
  config = cifar10_resnet20.get_config()
  config.algorithm = "diloco"
  config.optimizer.name = "adamw"
  config.optimizer.learning_rate = 1e-3
  config.optimizer.momentum = 0.0
  config.optimizer.weight_decay = 0.05
  config.optimizer.schedule = "warmup_cosine"
  config.optimizer.warmup_steps = 500
  config.outer.comm_period = 50
  config.outer.learning_rate = 0.7
  config.outer.momentum = 0.9
  config.outer.nesterov = True
  config.outer.moving_rate = 0.0  # the reset pull has no alpha
  return config
