"""The Runtime interface: one class for each way of running a configuration.

A runtime declares what it is (its name, the algorithms it runs, whether it
spans processes, whether its training data may stream from disk, the config
fields it reads), checks the fields that only it reads, names what JAX must
read as it starts for a run (`environment`), and, for one run, builds the
training state and the trainee that the loop (easgd.train.loop) drives.
`easgd.train.trainer.train_and_evaluate` asks the registry
(easgd.train.runtimes) for the run's runtime and names none itself: adding a
runtime is one class here and one line in the registry.
"""

import abc
from collections.abc import Callable
from typing import Any, ClassVar

import ml_collections

from easgd.config import hyperparameters
from easgd.declare import Field
from easgd.infra import sharding
from easgd.train import setup as setup_lib
from easgd.train.loop import Trainee


class Runtime(abc.ABC):
  """A way of running: the class declares it, an instance runs one configuration."""

  # The value of config.runtime that picks it, or, for a runtime that is its
  # algorithms' only one (`chosen_by_algorithm`), its name in messages.
  name: ClassVar[str]
  # Chosen by config.algorithm whatever config.runtime says (the pipeline, whose
  # models no other runtime runs); the others are chosen by config.runtime.
  chosen_by_algorithm: ClassVar[bool] = False
  # Whether a run may span several processes (jax.distributed).
  spans_processes: ClassVar[bool]
  # Whether its training data may stream from disk (data.source=stream); a runtime
  # that may not reads each unit's batches from partitions kept on the devices.
  streams: ClassVar[bool]
  # The config fields that only this runtime reads, declared beside it (its
  # fields.py): the registry refuses them set (away from their defaults) in a
  # config that another runtime runs.
  declares: ClassVar[tuple[Field, ...]] = ()

  @classmethod
  @abc.abstractmethod
  def algorithms(cls) -> tuple[str, ...]:
    """The values of config.algorithm it runs."""

  @classmethod
  def runs(cls) -> str:
    """What it runs, in words, for messages."""
    return ", ".join(cls.algorithms())

  @classmethod
  def check(cls, config: ml_collections.ConfigDict) -> None:
    """Checks what only this runtime needs of `config`; raises ConfigError.

    The registry has already checked that it runs config.algorithm.
    """
    del config

  @classmethod
  def check_model(cls, config: ml_collections.ConfigDict, shapes: Callable[[], Any]) -> None:
    """Checks what it needs of the model; `shapes()` traces the shapes of its tree
    (easgd.rules.model_state), for a check that asks. Raises ConfigError."""
    del config, shapes

  @classmethod
  def environment(cls, config: ml_collections.ConfigDict, backend: str) -> dict[str, str]:
    """Variables that JAX reads as it starts its backends and a run of `config` on
    `backend` ("cpu", "gpu" or "tpu") needs; train.py sets each one the user has
    not set, before JAX starts.

    Here: with config.deterministic_sums, XLA:CPU's thread pool sized by the
    run's devices (easgd.infra.sharding.cpu_threads_environment), so that every
    layout of the run, on any machine, rounds its convolutions alike.
    """
    if backend == "cpu" and config.deterministic_sums:
      return sharding.cpu_threads_environment(hyperparameters.resolve_devices(config))
    return {}

  @classmethod
  def partitions(cls, config: ml_collections.ConfigDict, num_devices: int) -> int:
    """How many partitions the training set is split into: one a worker."""
    del num_devices
    return config.workers

  def __init__(self, setup: setup_lib.Setup):
    self.setup = setup

  @abc.abstractmethod
  def describe(self) -> str:
    """What runs, for the run's first log line (e.g. "sync_easgd: 8 workers")."""

  @abc.abstractmethod
  def init_state(self) -> Any:
    """The training state at step 0, on the devices; a checkpoint restores into its shape.
    Called once, before `trainee`."""

  @abc.abstractmethod
  def trainee(self, state: Any, clock_state: dict | None, resumed_at: int | None) -> Trainee:
    """The loop's trainee for `state` (fresh or restored, with the clock's saved state;
    `resumed_at`: the restored checkpoint's step, or None)."""
