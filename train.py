"""Trains a CNN with a distributed SGD rule: python train.py --config configs/default.py.

Config fields are overridden with --config.FIELD=VALUE; runs are written to
--workdir (TensorBoard events and checkpoints) and resumed from it.
"""

import logging as std_logging

from absl import app, flags, logging

from easgd import cli, pipeline_trainer, sharding, trainer, validation
from easgd.errors import ConfigError, TrainingDiverged

_CONFIG = cli.define_config("configs/default.py")
_WORKDIR = flags.DEFINE_string("workdir", "runs/default", "Where events and checkpoints go.")


def _quiet_orbax(record) -> bool:
  """Keeps orbax's per-save INFO lines out of the training log."""
  return "orbax" not in record.pathname or record.levelno >= std_logging.WARNING


def main(argv):
  logging.get_absl_logger().addFilter(_quiet_orbax)
  logging.get_absl_handler().python_handler.addFilter(_quiet_orbax)
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {' '.join(argv[1:])}")
  config = _CONFIG.value
  try:
    validation.validate(config)
    # Virtual CPU devices must be asked for before JAX starts its backends;
    # they only matter where the platform is the CPU.
    sharding.configure_cpu_devices(config.devices or min(trainer.units(config), 8))
    if config.algorithm == validation.PIPELINE:
      result = pipeline_trainer.train_and_evaluate(config, _WORKDIR.value)
    else:
      result = trainer.train_and_evaluate(config, _WORKDIR.value)
  except ConfigError as error:
    cli.fail(str(error))
  except TrainingDiverged as error:
    cli.fail(str(error), code=1)
  logging.info(
    "done: %s",
    ", ".join(f"{tag} {value:.4g}" for tag, value in sorted(result.metrics.items())),
  )


if __name__ == "__main__":
  app.run(main, flags_parser=cli.parse_flags)
