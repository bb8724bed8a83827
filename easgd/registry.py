"""The registry of algorithms: `config.algorithm` names one of its entries, an update
rule (easgd.rules.RULES, whose classes declare what their entries say) or the
pipeline (easgd.pipeline.algorithm). The config layer reads the entry
(easgd.algorithm.Algorithm) and never which algorithm it is.
"""

import types
from collections.abc import Mapping

from easgd.algorithm import Algorithm
from easgd.pipeline.algorithm import PIPELINE
from easgd.rules import RULES, Rule
from easgd.rules import checks as rule_checks


def _of_rule(rule: type[Rule]) -> Algorithm:
  """A rule's entry: its workers spread over the devices, each with a partition."""
  return Algorithm(
    name=rule.name,
    reads=rule.reads,
    units="workers",
    partition_owner="worker",
    check=rule_checks.check,
    declares=rule.declared(),
    defaults=rule.defaults,
    changed_since=rule.changed_since,
  )


ALGORITHMS: Mapping[str, Algorithm] = types.MappingProxyType(
  {**{name: _of_rule(rule) for name, rule in RULES.items()}, PIPELINE.name: PIPELINE}
)
