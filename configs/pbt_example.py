"""Sync EASGD's moving rate and period, as a grid and as a population (PBT).

    python sweep.py --config configs/pbt_example.py --workdir runs/pbt_grid --parallel 2
    python sweep.py --config configs/pbt_example.py --workdir runs/pbt_example --parallel 2 \\
      --scheduler=pbt --pbt_fields=outer.moving_rate,outer.comm_period

Six runs of 300 steps either way (equal compute): the grid trains each point to
its end; population-based training starts from the same six points and, at steps
100 and 200, has the worst of them copy one of the best and move its moving rate
and period to a neighbouring value of the grid's (docs/running.md,
"Population-based training").
"""

from easgd import sweep
from easgd.configs import default


def get_config():
  config = default.get_config()
  config.run.total_steps = 300
  config.run.checkpoint_every = 100
  return config


def get_sweep():
  return sweep.product({"outer.moving_rate": [0.025, 0.05, 0.1], "outer.comm_period": [4, 16]})
