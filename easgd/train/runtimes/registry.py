"""The runtimes by name (`RUNTIMES`), and the one that runs a config (`select`).

Adding a runtime is one class (easgd.train.runtimes.base.Runtime) and one line
here; the fields only it reads are declared beside it and assembled with the
others (easgd.config.fields).
"""

import ml_collections

from easgd.errors import ConfigError
from easgd.train.runtimes.base import Runtime
from easgd.train.runtimes.pipeline import PipelineRuntime
from easgd.train.runtimes.ray.runtime import RayRuntime
from easgd.train.runtimes.simulated.runtime import SimulatedRuntime
from easgd.train.runtimes.threads.runtime import ThreadsRuntime

RUNTIMES: dict[str, type[Runtime]] = {
  runtime.name: runtime
  for runtime in (SimulatedRuntime, ThreadsRuntime, RayRuntime, PipelineRuntime)
}


def named() -> tuple[str, ...]:
  """The values config.runtime takes: the runtimes not chosen by their algorithm."""
  return tuple(name for name, runtime in RUNTIMES.items() if not runtime.chosen_by_algorithm)


def others(config: ml_collections.ConfigDict, chosen: type[Runtime]) -> list[type[Runtime]]:
  """The runtimes other than `chosen` that config.runtime may name for config.algorithm."""
  return [
    RUNTIMES[name]
    for name in named()
    if RUNTIMES[name] is not chosen and config.algorithm in RUNTIMES[name].algorithms()
  ]


def select(config: ml_collections.ConfigDict) -> type[Runtime]:
  """The runtime that runs `config`, its own checks passed; raises ConfigError."""
  for runtime in RUNTIMES.values():
    if runtime.chosen_by_algorithm and config.algorithm in runtime.algorithms():
      break
  else:
    if config.runtime not in named():
      raise ConfigError(
        f"config.runtime={config.runtime!r} is invalid: valid: {', '.join(named())}"
      )
    runtime = RUNTIMES[config.runtime]
    if config.algorithm not in runtime.algorithms():
      raise ConfigError(
        f"config.runtime={config.runtime!r} is invalid: {runtime.name} runs "
        f"{runtime.runs()}; {config.algorithm} runs on "
        f"{', '.join(name for name in named() if config.algorithm in RUNTIMES[name].algorithms())}"
      )
  runtime.check(config)
  _check_unread(config, runtime)
  return runtime


def _check_unread(config: ml_collections.ConfigDict, chosen: type[Runtime]) -> None:
  """A field only other runtimes read, set in a config that `chosen` runs, would be
  ignored: refused (e.g. ray.address, which the ray runtime alone reads)."""
  for runtime in RUNTIMES.values():
    for field in runtime.declares:
      value = field.of(config)
      if runtime is not chosen and field not in chosen.declares and value != field.default:
        readers = [other for other, kind in RUNTIMES.items() if field in kind.declares]
        who = f"{' and '.join(readers)} runtime{'s read' if len(readers) > 1 else ' reads'}"
        raise ConfigError(
          f"config.{field.path}={value!r} is invalid: only the {who} it, and "
          f"{config.algorithm} runs on {chosen.name} here: leave it {field.default!r}"
        )
