"""A sweep over learning rate and moving rate of the default Sync EASGD run.

    python sweep.py --config configs/sweep_example.py --workdir runs/sweep_example

Six runs of 300 steps, one TensorBoard run each; `--config.FIELD=VALUE`
still sets any other field for all of them.
"""

from easgd import sweep
from easgd.configs import default


def get_config():
  config = default.get_config()
  config.run.total_steps = 300
  config.run.checkpoint_every = 100
  return config


def get_sweep():
  return sweep.product(
    {"optimizer.learning_rate": [0.05, 0.1, 0.2], "outer.moving_rate": [0.05, 0.1]}
  )
