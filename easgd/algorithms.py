"""The registry of update rules: `config.algorithm` names one of these."""

from easgd import parameter_server, rules

RULES: dict[str, type[rules.Rule]] = {
  rule.name: rule
  for rule in (
    rules.SyncSGD,
    rules.SyncEASGD,
    rules.SyncMEASGD,
    *parameter_server.PARAMETER_SERVER_RULES,
  )
}
ASYNC_RULES = frozenset(rule.name for rule in parameter_server.PARAMETER_SERVER_RULES)

# Hyper-parameters each rule reads beyond learning_rate (for validation and docs).
ELASTIC_RULES = frozenset(
  {"sync_easgd", "sync_measgd", "original_easgd", "async_easgd", "async_measgd", "hogwild_easgd"}
)
# Momentum in the workers' local step (sync_measgd, async_measgd) or at the master (async_msgd).
MOMENTUM_RULES = frozenset({"sync_measgd", "async_measgd", "async_msgd"})
# Rules whose optimizer takes momentum or not, as the user chooses.
OPTIONAL_MOMENTUM_RULES = frozenset({"sync_sgd"})
SERVER_OPTIMIZERS = ("sgd", "adagrad")  # downpour's master


def make_rule(name: str, hyper: rules.Hyper) -> rules.Rule:
  """Returns the rule registered under `name`."""
  if name not in RULES:
    raise KeyError(f"unknown algorithm {name!r}; valid: {', '.join(sorted(RULES))}")
  return RULES[name](hyper)
