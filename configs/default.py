"""Sync EASGD, 8 workers, LeNet-5 on the 5,000 embedded MNIST digits.

Reaches about 95% center test accuracy in well under a minute on a 2-core CPU.
"""

import ml_collections


def get_config() -> ml_collections.ConfigDict:
  config = ml_collections.ConfigDict()
  # What is trained, how.
  config.algorithm = "sync_easgd"  # sync_sgd | sync_easgd | sync_measgd
  config.model = "lenet5"
  config.dataset = "mnist5k"  # mnist5k | digits | mnist | fashion_mnist | cifar10
  config.data_dir = ""  # TFDS data_dir; "" for TFDS's default
  # Workers are an array axis sharded over devices; devices must divide workers.
  config.workers = 8  # P
  config.devices = 0  # D; 0: min(workers, 8) (virtual CPU devices are created)
  config.batch_size = 32  # per worker
  # Update rule.
  config.learning_rate = 0.1  # eta
  config.momentum = 0.0  # mu (or delta with nesterov); sync_sgd and sync_measgd
  config.nesterov = False
  config.comm_period = 4  # tau: local steps between elastic exchanges
  config.moving_rate = 0.9 / 8  # alpha; beta = workers * moving_rate must be < 1
  # Schedule.
  config.total_steps = 600
  config.log_every = 50
  config.eval_every = 100
  config.checkpoint_every = 200
  config.seed = 0
  return config
