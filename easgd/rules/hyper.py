"""The rules' hyper-parameters (static: baked into the program), read from the config.

`Hyper` holds one attribute for every config field a rule class declares
(`Rule.declares`: the field's `setting`), so a rule that declares a field of its
own finds it here without an edit. Given no value, an attribute takes its
field's `off` value, the one at which it changes nothing (`Hyper(8, 0.1)` is
plain SGD, exchanging every step); `Hyper.from_config` reads them all.
"""

import dataclasses

from easgd.declare import read, settings
from easgd.rules.base import DEFAULT_BETA
from easgd.rules.registry import RULES, declared


@settings(declared())
class Hyper:
  """Hyper-parameters of the rules (static: baked into the program); the first two,
  num_workers (P) and learning_rate (eta), are required."""

  @classmethod
  def from_config(cls, config) -> "Hyper":
    """The rule's hyper-parameters from a (grouped) config."""
    hyper = read(cls, config)
    if not hyper.moving_rate and hyper.num_workers > 0:
      # 0 asks for the EASGD authors' beta = P*alpha = 0.9, P the workers that pull
      # one center (a hierarchical rule's group).
      rule = RULES.get(config.algorithm)
      members = rule.pull_members(config) if rule is not None else hyper.num_workers
      hyper = dataclasses.replace(hyper, moving_rate=DEFAULT_BETA / members)
    return hyper
