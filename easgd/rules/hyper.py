"""The rules' hyper-parameters (static: baked into the program), read from the config."""

import dataclasses
import functools
from collections.abc import Callable
from typing import Any

from easgd.rules import model_state

# beta = P*alpha of the elastic pull when outer.moving_rate is 0 (Zhang et al. 2015).
DEFAULT_BETA = 0.9


def _config(path: str, convert: Callable[[Any], Any] | None = None, **default) -> Any:
  """A Hyper field read from the config field `path` (dotted), through `convert`."""
  return dataclasses.field(metadata={"config": path, "convert": convert}, **default)


@dataclasses.dataclass(frozen=True)
class Hyper:
  """Hyper-parameters shared by the rules (static: baked into the program).

  Each field names the config field it comes from (`Hyper.from_config`).
  """

  num_workers: int = _config("workers")
  learning_rate: float = _config("optimizer.learning_rate")  # eta (peak, under a schedule)
  momentum: float = _config("optimizer.momentum", default=0.0)  # mu (sgd)
  nesterov: bool = _config("optimizer.nesterov", default=False)
  comm_period: int = _config("outer.comm_period", default=1)  # tau
  moving_rate: float = _config("outer.moving_rate", default=0.0)  # alpha; 0: DEFAULT_BETA / P
  n_sync: int = _config("downpour.n_sync", default=1)
  server_optimizer: str = _config("downpour.server_optimizer", default="sgd")
  # lambda: L2 (g + lambda*x) for sgd, decoupled for adamw
  weight_decay: float = _config("optimizer.weight_decay", default=0.0)
  # BatchNorm statistics: averaged into the center, or local to each worker.
  average_stats: bool = _config(
    "outer.batch_stats", lambda mode: mode == model_state.AVERAGED, default=True
  )
  # The inner optimizer and its schedule (easgd.rules.optimizers).
  optimizer: str = _config("optimizer.name", default="sgd")
  schedule: str = _config("optimizer.schedule", default="constant")
  warmup_steps: int = _config("optimizer.warmup_steps", default=0)
  boundaries: tuple[float, ...] = _config("optimizer.boundaries", tuple, default=(0.5, 0.75))
  decay_factor: float = _config("optimizer.decay_factor", default=0.1)
  b1: float = _config("optimizer.b1", default=0.9)
  b2: float = _config("optimizer.b2", default=0.999)
  eps: float = _config("optimizer.eps", default=1e-8)
  # The schedule's horizon T, in local steps.
  total_steps: int = _config("run.total_steps", default=0)
  # The center family's outer optimizer and pull (easgd.rules.outer).
  outer_optimizer: str = _config("outer.optimizer", default="sgd")
  outer_learning_rate: float = _config("outer.learning_rate", default=1.0)  # eta_o
  outer_momentum: float = _config("outer.momentum", default=0.0)
  outer_nesterov: bool = _config("outer.nesterov", default=False)
  pull: str = _config("outer.pull", default="")  # "": the rule's own
  # What a worker's exchange message is sent as (easgd.rules.exchange).
  exchange_dtype: str = _config("outer.exchange_dtype", default="float32")
  # The streaming rules' fragments, overlap and merge (easgd.rules.streaming).
  fragments: int = _config("outer.fragments", default=1)
  sync_delay: int = _config("outer.sync_delay", default=0)
  merge: float = _config("outer.merge", default=1.0)
  # async_local_sgd's master and workers (easgd.rules.async_local).
  momentum_period: int = _config("outer.momentum_period", default=1)  # N of Delayed Nesterov
  momentum_activation: float = _config("outer.momentum_activation", default=0.0)  # its c
  dynamic_local_steps: bool = _config("outer.dynamic_local_steps", default=False)  # DyLU
  # Sums over workers added in worker order: no layout reassociates them.
  deterministic_sums: bool = _config("deterministic_sums", default=False)

  @classmethod
  def from_config(cls, config) -> "Hyper":
    """The rule's hyper-parameters from a (grouped) config."""
    values = {}
    for field in dataclasses.fields(cls):
      value = functools.reduce(
        lambda group, key: group[key], field.metadata["config"].split("."), config
      )
      convert = field.metadata["convert"]
      values[field.name] = convert(value) if convert else value
    hyper = cls(**values)
    if not hyper.moving_rate and hyper.num_workers > 0:
      # 0 asks for the EASGD authors' beta = P*alpha = 0.9.
      hyper = dataclasses.replace(hyper, moving_rate=DEFAULT_BETA / hyper.num_workers)
    return hyper
