"""The registry of update rules: `config.algorithm` names one of these.

A new rule is one class (declaring what it accepts, see `easgd.rules.base.Rule`)
and its line in `RULES` here; a rule in a module of its own adds that module's
line to the import, one module a line.
"""

from easgd.declare import Field, unique
from easgd.rules import (
  async_local,
  hierarchical_easgd,
  hierarchical_local,
  noloco,
  outer,
  palsgd,
  parameter_server,
  post_local,
  streaming,
  sync,
)
from easgd.rules.base import Momentum, Rule
from easgd.sim.clocks import Policy

RULES: dict[str, type[Rule]] = {
  rule.name: rule
  for rule in (
    sync.SyncSGD,
    outer.SyncEASGD,
    outer.SyncMEASGD,
    parameter_server.OriginalEASGD,
    parameter_server.AsyncEASGD,
    parameter_server.AsyncMEASGD,
    parameter_server.HogwildEASGD,
    parameter_server.AsyncSGD,
    parameter_server.AsyncMSGD,
    parameter_server.HogwildSGD,
    parameter_server.Downpour,
    async_local.AsyncLocalSGD,
    outer.DiLoCo,
    outer.LocalSGD,
    outer.Lookahead,
    streaming.StreamingDiLoCo,
    streaming.StreamingEASGD,
    post_local.PostLocalSGD,
    hierarchical_local.HierarchicalLocalSGD,
    hierarchical_easgd.HierarchicalEASGD,
    noloco.NoLoCo,
    palsgd.PALSGD,
  )
}


def declared() -> tuple[Field, ...]:
  """Every config field the rules declare (`Rule.declared`), in registry order."""
  return unique(field for rule in RULES.values() for field in rule.declared())


def make_rule(name: str, hyper) -> Rule:
  """Returns the rule registered under `name`, with its `Hyper`."""
  if name not in RULES:
    raise KeyError(f"unknown algorithm {name!r}; valid: {', '.join(sorted(RULES))}")
  return RULES[name](hyper)


def names(*, parameter_server: bool | None = None, elastic: bool | None = None) -> list[str]:
  """Registered rule names, in registry order, optionally only those that are (or are not)
  parameter-server rules or elastic."""
  return [
    name
    for name, rule in RULES.items()
    if (parameter_server is None or rule.parameter_server() == parameter_server)
    and (elastic is None or rule.elastic == elastic)
  ]


def plain(*, policy: Policy | None, elastic: bool) -> str:
  """The first registered rule whose master serves with `policy` (None: synchronous)
  and that exchanges elastically or not, among those that do not require momentum:
  the plain member of that family (studies and benchmarks pick theirs so)."""
  return next(
    name
    for name in names(elastic=elastic)
    if RULES[name].policy == policy and RULES[name].momentum != Momentum.REQUIRED
  )
