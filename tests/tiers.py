"""The quick tier's share of a test's cases.

`pytest -m "not e2e"` is the loop a developer runs after each change, and it
must take under two minutes on two cores once the compilation cache holds
the last run's programs (tests/conftest.py). A test parametrized over every
rule of the registry runs there for a few rules only (`cases`): one rule of
each family, and one of each discipline by which a master serves its
workers. Its other cases (the momentum rules, Downpour, the rules that
differ from a quick one by a setting) are marked e2e and run with the whole
suite. A test over other values (device counts, inner optimizers, sizes)
runs there for its first (`first_quick`, `devices`: the most devices, the
layout every collective crosses); the others, which repeat the check in
another setting, run with the whole suite.
"""

import pytest

# sync_easgd: the center family's elastic exchange; diloco: the center family's
# outer optimizer and reset; async_easgd: the parameter-server family, first come
# first served; original_easgd: round robin; hogwild_sgd: no lock, pushed gradients.
QUICK_RULES = ("sync_easgd", "diloco", "async_easgd", "original_easgd", "hogwild_sgd")


def _is_quick(value) -> bool:
  """Whether a case runs in the quick tier: its rule (a case's first value) is quick."""
  rule = value[0] if isinstance(value, tuple) else value
  return rule in QUICK_RULES


def cases(values) -> list:
  """`values` (one a case; a tuple for several arguments, the rule first) as pytest
  parameters, those of the rules outside QUICK_RULES marked e2e."""
  return [
    pytest.param(
      *(value if isinstance(value, tuple) else (value,)),
      marks=[] if _is_quick(value) else [pytest.mark.e2e],
    )
    for value in values
  ]


def first_quick(values, quick: int = 1) -> list:
  """`values` (one a case; a tuple for several arguments) as pytest parameters: the
  first `quick` in the quick tier, the others with the whole suite (e2e)."""
  return [
    pytest.param(
      *(value if isinstance(value, tuple) else (value,)),
      marks=[pytest.mark.e2e] if i >= quick else [],
    )
    for i, value in enumerate(values)
  ]


def devices(*counts: int) -> list:
  """Device counts for a test run on several layouts: the first (the most devices, the
  one every collective crosses) in the quick tier, the others, which check that the
  layout leaves the result alone, with the whole suite."""
  return first_quick(counts)
