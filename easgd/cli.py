"""What the command-line programs share: the --config flag and one-line errors.

Bad input ends in one line on stderr and exit status 2.
"""

import difflib
import sys

from absl import flags
from ml_collections import config_flags

from easgd import schema


def _unknown_field(field: str) -> str:
  """One line for an unknown config field: its grouped name if it moved, or the
  closest known fields."""
  if schema.moved(field) is not None:
    return schema.hint(field)
  known = list(schema.flatten(schema.default_config().to_dict()))
  close = difflib.get_close_matches(field, known, n=3)
  suggestion = f"; did you mean {' or '.join(f'config.{c}' for c in close)}?" if close else ""
  return schema.hint(field) + suggestion


def _config_field_error(error: Exception):
  """One line for an unknown --config.FIELD override (exit 2)."""
  del error  # ml_collections' message escapes and wraps the name: find it in argv
  known = schema.flatten(schema.default_config().to_dict())
  for arg in sys.argv[1:]:
    if arg.startswith("--config."):
      field = arg.removeprefix("--config.").partition("=")[0]
      if field not in known and not any(k.startswith(field + ".") for k in known):
        fail(_unknown_field(field))
  overrides = " ".join(arg for arg in sys.argv[1:] if arg.startswith("--config."))
  fail(f"unknown config field in {overrides}")


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
