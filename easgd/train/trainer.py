"""train_and_evaluate: the whole run, from configuration to final accuracy, written
once for every runtime (easgd.train.runtimes)."""

import jax
import ml_collections
from absl import logging

from easgd.config import validation
from easgd.train import loop
from easgd.train import setup as setup_lib
from easgd.train.runtimes import registry as runtimes
from easgd.train.runtimes.base import Runtime


def check(config: ml_collections.ConfigDict) -> type[Runtime]:
  """Every check of `config` alone, its runtime's included (and what it asks of the
  model); returns the runtime that runs it. Raises ConfigError; writes nothing."""
  validation.validate(config)
  runtime = runtimes.select(config)
  runtime.check_model(config, lambda: setup_lib.model_shapes(config))
  return runtime


def train_and_evaluate(
  config: ml_collections.ConfigDict, workdir: str, runtime_class: type[Runtime] | None = None
) -> loop.TrainResult:
  """Trains `config` in `workdir`, resuming from its newest checkpoint.

  `runtime_class`: what `check(config)` returned, when the caller has checked
  it; else it is checked here. Either way it is checked once, and the run
  reads a frozen copy of it from then on.
  """
  if runtime_class is None:
    runtime_class = check(config)
  config = ml_collections.FrozenConfigDict(config)
  setup = setup_lib.setup(config, workdir, runtime_class, runtimes.others(config, runtime_class))
  runtime = runtime_class(setup)
  setup.log_run(runtime.describe())
  state = runtime.init_state()
  checkpointer = setup.checkpointer
  resumed = clock_state = None
  if checkpointer.latest_step() is not None:
    resumed, state, clock_state = checkpointer.restore(state)
    logging.info("resumed from the checkpoint of step %d", resumed)
  trainee = runtime.trainee(state, clock_state, resumed)
  if resumed is None:
    trainee.write_config()
  final, preempted = loop.run(config, trainee, int(jax.device_get(state.step)), checkpointer)
  return loop.TrainResult(state=trainee.state, metrics=final, preempted=preempted)
