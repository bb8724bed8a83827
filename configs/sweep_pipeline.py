"""Eight LeNet-5 models of different learning rate and seed, trained as one pipeline.

    python sweep.py --config configs/sweep_pipeline.py --workdir runs/sweep_pipeline --pipeline

Each model trains with its own SGD on one device at a time and moves to the
next device every 25 steps (easgd/pipeline/programs.py); without --pipeline the same
points run one after another as Sync EASGD runs.
"""

from easgd import sweep
from easgd.configs import default


def get_config():
  config = default.get_config()
  config.run.total_steps = 400
  config.pipeline.stage_steps = 25
  config.run.checkpoint_every = 200
  return config


def get_sweep():
  return sweep.product({"optimizer.learning_rate": [0.02, 0.05, 0.1, 0.2]}, seed=[0, 1])
