"""What the command-line programs share: the --config flag and one-line errors.

Bad input ends in one line on stderr and exit status 2.
"""

import sys

from absl import flags
from ml_collections import config_flags


def _config_field_error(error: Exception):
  """One line for an unknown --config.FIELD override (exit 2)."""
  overrides = " ".join(arg for arg in sys.argv[1:] if arg.startswith("--config."))
  field = str(error).strip("\"'")
  fail(f"unknown config field {field!r} in {overrides}")


def fail(message: str, code: int = 2):
  """Prints `error: message` and exits with `code`."""
  print(f"error: {message}", file=sys.stderr)
  sys.exit(code)


def define_config(default: str | None, help_text: str = "Config file."):
  """The --config flag (a config file with --config.FIELD=VALUE overrides)."""
  try:
    # ml_collections applies --config.FIELD overrides already here.
    return config_flags.DEFINE_config_file("config", default, help_text)
  except (AttributeError, KeyError) as error:
    _config_field_error(error)


def parse_flags(argv: list[str]) -> list[str]:
  """absl flag parsing, with a bad flag or config field reported in one line (exit 2)."""
  try:
    return flags.FLAGS(argv)
  except (AttributeError, KeyError) as error:
    _config_field_error(error)
  except (flags.Error, ValueError, TypeError) as error:
    fail(str(error))
