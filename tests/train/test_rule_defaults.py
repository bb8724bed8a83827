"""`--config.algorithm=X` alone trains each rule that has defaults of its own on the
default config.

Each such rule runs on a short schedule (the first STEPS of the default run's
600) with its own defaults (`Rule.defaults`) and nothing else changed. A rule
without defaults of its own runs the default config as it is but for the
algorithm: what this would show of it, the tests of its equations and of its
runtimes show already. Every rule's full-length figure is
`python bench/rule_defaults.py`'s (bench/README.md); that every rule starts
from train.py is tests/train/test_trainer_check.py's.
"""

import pytest

from easgd import rules
from easgd.config import hyperparameters
from easgd.configs import default
from easgd.train import trainer

STEPS = 100
# The default run ends at >= 0.95. A sixth of its schedule in, every rule is
# past AT_STEPS (measured 0.863 to 0.963), but for downpour: its master takes
# pushes of n_sync steps' gradients at the small learning rate that lets them
# converge, and starts slowest (0.605 at step 100, 0.961 at step 600).
AT_STEPS = 0.85
SLOW_STARTERS = {"downpour": 0.5}

pytestmark = pytest.mark.e2e


@pytest.mark.parametrize("name", [name for name, rule in rules.RULES.items() if rule.defaults])
def test_the_rule_alone_trains_the_default_config(tmp_path, name):
  config = default.get_config()
  config.algorithm = name
  hyperparameters.with_rule_defaults(config)  # as train.py applies them to --config.algorithm=X
  config.run.total_steps = STEPS
  config.run.log_every = config.run.eval_every = config.run.checkpoint_every = 0
  result = trainer.train_and_evaluate(config, str(tmp_path))
  assert result.metrics["eval/center_accuracy"] >= SLOW_STARTERS.get(name, AT_STEPS), name
  assert result.metrics["train/learning_rate"] == pytest.approx(config.optimizer.learning_rate)
