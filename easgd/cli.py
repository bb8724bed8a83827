"""What the command-line programs share: the --config flag and one-line errors.

Bad input ends in one line on stderr and exit status 2.
"""

import importlib.util
import os
import sys

from absl import flags
from ml_collections import config_flags

from easgd import schema
from easgd.arguments import check_workdir, fail

__all__ = [
  "check_workdir",
  "config_value",
  "define_config",
  "fail",
  "packaged_config",
  "parse_flags",
]


def _config_field_error(error: Exception):
  """One line for an unknown --config.FIELD override (exit 2)."""
  del error  # ml_collections' message escapes and wraps the name: find it in argv
  known = schema.flatten(schema.default_config().to_dict())
  for arg in sys.argv[1:]:
    if arg.startswith("--config."):
      field = arg.removeprefix("--config.").partition("=")[0]
      if field not in known and not any(k.startswith(field + ".") for k in known):
        fail(schema.hint(field))
  overrides = " ".join(arg for arg in sys.argv[1:] if arg.startswith("--config."))
  fail(f"unknown config field in {overrides}")


def packaged_config(name: str) -> str:
  """The path of one of the installed configs (configs/<name>), wherever the command runs."""
  from easgd import configs  # noqa: PLC0415 (a path, not a config, is wanted here)

  return os.path.join(os.path.dirname(configs.__file__), name)


def config_value(holder):
  """The --config flag's config (its file was checked by parse_flags)."""
  return holder.value


def _config_path(argv: list[str]) -> str | None:
  """The path given with --config (--config=PATH, or --config PATH), if any."""
  for index, arg in enumerate(argv):
    if arg.startswith("--config="):
      return arg.removeprefix("--config=")
    if arg == "--config" and index + 1 < len(argv):
      return argv[index + 1]
  return None


def _check_config_file(path: str) -> None:
  """One line and exit 2 unless `path` is a Python file that loads and has get_config()."""
  file, _, _argument = path.partition(":")  # ml_collections' FILE:ARGUMENT form
  if not os.path.isfile(path) and os.path.isfile(file):
    path = file
  if not os.path.isfile(path):
    fail(f"--config {path!r} is not a file: give a config file (e.g. configs/default.py)")
  spec = importlib.util.spec_from_file_location("config_file_check", path)
  module = importlib.util.module_from_spec(spec)
  try:
    spec.loader.exec_module(module)
  except Exception as error:  # noqa: BLE001 (any failure of the user's file)
    fail(f"--config {path!r} does not load: {type(error).__name__}: {str(error).splitlines()[0]}")
  if not callable(getattr(module, "get_config", None)):
    fail(f"--config {path!r} defines no get_config(): a config file returns its config from it")


def define_config(default: str | None, help_text: str = "Config file."):
  """The --config flag (a config file with --config.FIELD=VALUE overrides)."""
  try:
    # ml_collections applies --config.FIELD overrides already here.
    return config_flags.DEFINE_config_file("config", default, help_text)
  except (AttributeError, KeyError) as error:
    _config_field_error(error)


def parse_flags(argv: list[str]) -> list[str]:
  """absl flag parsing, with a bad config file, flag or config field reported in one
  line (exit 2)."""
  path = _config_path(argv[1:])
  if path is not None:
    _check_config_file(path)
  try:
    return flags.FLAGS(argv)
  except (AttributeError, KeyError) as error:
    _config_field_error(error)
  except (flags.Error, ValueError, TypeError) as error:
    fail(str(error))
