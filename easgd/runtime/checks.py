"""Checks of config.runtime and config.cluster.replay (called by easgd.validation)."""

import ml_collections

from easgd import runtime
from easgd.optimizer_checks import require as _require
from easgd.rules import RULES


def validate_runtime(config: ml_collections.ConfigDict) -> None:
  """runtime=threads runs the parameter-server rules only; a replay drives the simulated one."""
  _require(
    config.runtime in runtime.RUNTIMES,
    "runtime",
    config.runtime,
    f"valid: {', '.join(runtime.RUNTIMES)}",
  )
  replay = config.cluster.replay
  _require(isinstance(replay, str), "cluster.replay", replay, "a trace.jsonl path, or '' (off)")
  asynchronous = config.algorithm in RULES and RULES[config.algorithm].parameter_server()
  server_rules = ", ".join(name for name, rule in RULES.items() if rule.parameter_server())
  if config.runtime == runtime.THREADS:
    _require(
      asynchronous,
      "runtime",
      config.runtime,
      f"threads runs the parameter-server rules ({server_rules}); {config.algorithm} "
      "keeps its workers in lock-step: use runtime=simulated",
    )
    _require(
      not replay,
      "cluster.replay",
      replay,
      "a replay drives runtime=simulated; runtime=threads records a new trace: leave it ''",
    )
    _require(
      not config.run.profile,
      "run.profile",
      config.run.profile,
      "profiles the simulated runtime's tick programs; with runtime=threads leave it ''",
    )
  if replay:
    _require(
      asynchronous,
      "cluster.replay",
      replay,
      f"replays a parameter-server rule's order of requests ({server_rules}); "
      f"{config.algorithm} has none",
    )
