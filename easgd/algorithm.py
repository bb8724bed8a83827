"""What the config layer asks of an algorithm (`config.algorithm`): one entry each, for
every update rule (easgd.rules) and for the pipeline (easgd.pipeline), in one registry
(easgd.registry). Nothing above the algorithms branches on which one runs; they
read its entry.
"""

import dataclasses
import types
from collections.abc import Callable, Mapping
from typing import Any

import ml_collections

from easgd.declare import Field

Config = ml_collections.ConfigDict


def _unchanged(revision: int, optimizer) -> str:
  """An algorithm whose equations have not changed since any checkpoint's revision."""
  del revision, optimizer
  return ""


def _inner_momentum(config: Config) -> tuple[float, ...]:
  return (config.optimizer.momentum,)


@dataclasses.dataclass(frozen=True)
class Algorithm:
  """One algorithm, as the config layer sees it.

  Attributes:
    name: its `config.algorithm` value.
    reads: the fields read only by some algorithms (the optimizer, outer,
      downpour and pipeline groups, run.devices) that its trajectory depends
      on; a group's name stands for its fields.
    units: the config field that counts what it spreads over the devices
      (`workers`, or the pipeline's `pipeline.models`); run.devices divides it.
    partition_owner: what holds one partition of the training set ("worker",
      or "device" for the pipeline), as error messages name it.
    check: raises ConfigError for the first value across fields it does not
      accept (each field's own range is checked before).
    declares: the config fields it declares (easgd.declare.Field): a rule's
      classes' (`Rule.declared`), the pipeline's group.
    ignored_groups: the config groups it has no use for: their fields shape
      none of its trajectories.
    defaults: its own values of fields whose default config values would fail
      it (`easgd.config.hyperparameters.with_rule_defaults`).
    momenta: config -> the SGD momenta its inner optimizers train with (one
      each model for the pipeline), for the optimizer group's checks.
    changed_since: (checkpoint revision, optimizer group) -> why its
      equations changed since then ("" if they did not).
    planned: whether the planner (easgd.plan) sizes its programs.
  """

  name: str
  reads: tuple[str, ...]
  units: str
  partition_owner: str
  check: Callable[[Config], None]
  declares: tuple[Field, ...] = ()
  ignored_groups: tuple[str, ...] = ()
  defaults: Mapping[str, Any] = dataclasses.field(
    default_factory=lambda: types.MappingProxyType({})
  )
  momenta: Callable[[Config], tuple[float, ...]] = _inner_momentum
  changed_since: Callable[[int, Any], str] = _unchanged
  planned: bool = True
