"""Trains a CNN with a distributed SGD rule: python train.py --config configs/default.py.

Config fields are overridden with --config.FIELD=VALUE; runs are written to
--workdir (TensorBoard events and checkpoints) and resumed from it.
"""

import logging as std_logging
import sys

from absl import app, flags, logging
from ml_collections import config_flags

from easgd import pipeline_trainer, sharding, trainer, validation
from easgd.errors import ConfigError, TrainingDiverged


def _config_field_error(error: Exception) -> None:
  """One line for an unknown --config.FIELD override (exit 2)."""
  overrides = " ".join(arg for arg in sys.argv[1:] if arg.startswith("--config."))
  field = str(error).strip("\"'")
  print(f"error: unknown config field {field!r} in {overrides}", file=sys.stderr)
  sys.exit(2)


try:
  # ml_collections applies --config.FIELD overrides already here.
  _CONFIG = config_flags.DEFINE_config_file("config", "configs/default.py", "Config file.")
except (AttributeError, KeyError) as error:
  _config_field_error(error)
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
    print(f"error: {error}", file=sys.stderr)
    sys.exit(2)
  except TrainingDiverged as error:
    print(f"error: {error}", file=sys.stderr)
    sys.exit(1)
  logging.info(
    "done: %s",
    ", ".join(f"{tag} {value:.4g}" for tag, value in sorted(result.metrics.items())),
  )


def parse_flags(argv: list[str]) -> list[str]:
  """absl flag parsing, with a bad flag or config field reported in one line (exit 2)."""
  try:
    return flags.FLAGS(argv)
  except (AttributeError, KeyError) as error:
    _config_field_error(error)
  except (flags.Error, ValueError, TypeError) as error:
    print(f"error: {error}", file=sys.stderr)
    sys.exit(2)


if __name__ == "__main__":
  app.run(main, flags_parser=parse_flags)
