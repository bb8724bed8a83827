"""`--config.algorithm=X` alone trains each rule that has defaults of its own on the
default config.

Each such rule runs on a short schedule (the first steps of the default run's 600)
with its own defaults (`Rule.defaults`) and nothing else changed. A rule without
defaults of its own runs the default config as it is but for the algorithm: what
this would show of it, the tests of its equations and of its runtimes show
already. So does a rule that inherits its defaults from the rule it differs from
by a setting: hogwild_sgd, async_sgd without the master's lock, which without
the master's service time is async_sgd (tests/rules/test_parameter_server.py);
the default config's master serves in a tenth of a worker's step. Every rule's
full-length figure is `python bench/rule_defaults.py`'s (bench/README.md); that
every rule starts from train.py is tests/train/test_trainer_check.py's.
"""

import pytest

from easgd import rules
from easgd.config import hyperparameters
from easgd.configs import default
from easgd.train import trainer

# The default run ends at >= 0.95. At step 50 every rule but those below is past
# AT_STEPS (measured 0.785 to 0.918; with config.seed=1, 0.821 to 0.936).
STEPS, AT_STEPS = 50, 0.7
# name -> (steps, accuracy after them). The rules whose masters take pushed
# gradients start unevenly (async_msgd: 0.27 at step 50, 0.863 at step 100;
# with config.seed=1 async_sgd: 0.457 at step 50): 100 steps (measured 0.863
# to 0.944), but for downpour, whose master takes pushes of n_sync steps'
# gradients at the small learning rate that lets them converge, and starts
# slowest (0.585 at step 100, 0.961 at step 600). post_local_sgd's defaults
# switch it to local steps at step 50: 20 steps past it (0.901).
LONGER = {
  "async_sgd": (100, 0.85),
  "async_msgd": (100, 0.85),
  "downpour": (100, 0.5),
  "post_local_sgd": (70, 0.8),
}

pytestmark = pytest.mark.e2e


def own_defaults(rule) -> bool:
  """Whether `rule` has defaults, declared by its own class rather than inherited."""
  return bool(rule.defaults) and "defaults" in vars(rule)


@pytest.mark.parametrize("name", [name for name, rule in rules.RULES.items() if own_defaults(rule)])
def test_the_rule_alone_trains_the_default_config(tmp_path, name):
  steps, accuracy = LONGER.get(name, (STEPS, AT_STEPS))
  config = default.get_config()
  config.algorithm = name
  hyperparameters.with_rule_defaults(config)  # as train.py applies them to --config.algorithm=X
  config.run.total_steps = steps
  config.run.log_every = config.run.eval_every = config.run.checkpoint_every = 0
  result = trainer.train_and_evaluate(config, str(tmp_path))
  assert result.metrics["eval/center_accuracy"] >= accuracy, name
  assert result.metrics["train/learning_rate"] == pytest.approx(config.optimizer.learning_rate)


def test_only_hogwild_sgd_inherits_its_defaults():
  """The one rule left out above (the module's doc says why its parent's run stands
  for it): a new rule that inherits another's defaults fails here until it is named,
  with its reason."""
  inherited = [name for name, rule in rules.RULES.items() if rule.defaults]
  assert [name for name in inherited if not own_defaults(rules.RULES[name])] == ["hogwild_sgd"]
