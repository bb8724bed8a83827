"""The center family's new rules train end to end and log the learning rate in force."""

import numpy as np
import pytest

import numpy_optim
from easgd.infra import scalars
from easgd.train import trainer
from runs import small_config

pytestmark = pytest.mark.e2e  # whole runs


def test_a_schedule_is_logged_as_it_runs(tmp_path):
  config = small_config(
    {
      "optimizer.name": "adamw",
      "optimizer.learning_rate": 0.01,
      "optimizer.schedule": "warmup_cosine",
      "optimizer.warmup_steps": 10,
      "outer.moving_rate": 0.0,  # the reset pull has no alpha
      "run.log_every": 1,
      "run.checkpoint_every": 0,
    },
    algorithm="diloco",
  )
  trainer.train_and_evaluate(config, str(tmp_path))
  logged = dict(scalars.read(str(tmp_path))["train/learning_rate"])
  rate = numpy_optim.warmup_cosine(0.01, 10, 40)
  # The value logged at step s is the one step s - 1 took (t = s - 1 local steps before it).
  assert sorted(logged) == list(range(1, 41))
  np.testing.assert_allclose(
    [logged[s] for s in range(1, 41)], [rate(s - 1) for s in range(1, 41)], rtol=1e-5, atol=1e-9
  )
