"""What the command-line programs share: the --config flag and one-line errors.

Bad input ends in one line on stderr and exit status 2, absl's usage text
never: every absl program starts with `run(main)`, whose flag parsing
(`parse_flags`) refuses wrong usage in one line before main runs (a config
given positionally or twice, a flag without its value, an unknown flag or
config field, a required flag left out), and a UsageError from main is
answered in one line too.
"""

import os
import re
import socket
import sys

from absl import app, flags, logging
from ml_collections import config_flags

from easgd.arguments import check_workdir, fail, first_line, load_file, port_problem
from easgd.config import hyperparameters
from easgd.infra import checkpoint

__all__ = [
  "check_coordinator",
  "check_workdir",
  "config_value",
  "define_config",
  "fail",
  "given_fields",
  "packaged_config",
  "with_rule_defaults",
  "parse_flags",
  "run",
]


def _config_field_error(error: Exception):
  """One line for an unknown --config.FIELD override (exit 2)."""
  del error  # ml_collections' message escapes and wraps the name: find it in argv
  known = hyperparameters.flatten(hyperparameters.default_config().to_dict())
  for arg in sys.argv[1:]:
    if arg.startswith("--config."):
      field = arg.removeprefix("--config.").partition("=")[0]
      if field not in known and not any(k.startswith(field + ".") for k in known):
        fail(hyperparameters.hint(field))
  overrides = " ".join(arg for arg in sys.argv[1:] if arg.startswith("--config."))
  fail(f"unknown config field in {overrides}")


def packaged_config(name: str) -> str:
  """The path of one of the installed configs (configs/<name>), wherever the command runs."""
  from easgd import configs  # noqa: PLC0415 (a path, not a config, is wanted here)

  return os.path.join(os.path.dirname(configs.__file__), name)


def config_value(holder):
  """The --config flag's config (its file was checked by parse_flags)."""
  return holder.value


def with_rule_defaults(config, workdir: str | None = None):
  """`config` with the chosen rule's own defaults where neither the command line nor
  the config file chose those fields (easgd.config.hyperparameters.with_rule_defaults),
  as the checkpoint in `workdir` has them if there is one; a log line names them."""
  saved = checkpoint.saved_config(workdir) if workdir is not None else None
  applied = hyperparameters.with_rule_defaults(config, given_fields(sys.argv[1:]), saved)
  if applied:
    values = ", ".join(f"config.{path}={value!r}" for path, value in applied.items())
    if saved is not None:
      logging.info("%s resumes with its checkpoint's values: %s", config.algorithm, values)
    else:
      logging.info(
        "%s's own defaults: %s (set any of them with --config.FIELD to choose them all)",
        config.algorithm,
        values,
      )
  return config


def given_fields(argv: list[str]) -> set[str]:
  """The config fields a command line sets (--config.FIELD=V, --config.FIELD V,
  --noconfig.FIELD)."""
  given = set()
  for arg in argv:
    for prefix in ("--config.", "--noconfig."):
      if arg.startswith(prefix):
        given.add(arg.removeprefix(prefix).partition("=")[0])
  return given


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
  file, colon, argument = path.partition(":")  # ml_collections' FILE:ARGUMENT form
  given = ()
  if colon and not os.path.isfile(path) and os.path.isfile(file):
    path, given = file, (argument,)
  if not os.path.isfile(path):
    fail(f"--config {path!r} is not a file: give a config file (e.g. configs/default.py)")
  module = load_file(path, "config_file_check")
  try:
    module.__loader__.exec_module(module)
  except Exception as error:  # noqa: BLE001 (any failure of the user's file)
    fail(f"--config {path!r} does not load: {first_line(error)}")
  if not callable(getattr(module, "get_config", None)):
    fail(f"--config {path!r} defines no get_config(): a config file returns its config from it")
  try:
    module.get_config(*given)  # as ml_collections will call it
  except Exception as error:  # noqa: BLE001 (any failure of the user's function)
    called = f"get_config({argument!r})" if given else "get_config()"
    fail(f"--config {path!r}: {called} raised {first_line(error)}")


def define_config(default: str | None, help_text: str = "Config file."):
  """The --config flag (a config file with --config.FIELD=VALUE overrides)."""
  try:
    # ml_collections applies --config.FIELD overrides already here.
    return config_flags.DEFINE_config_file("config", default, help_text)
  except (AttributeError, KeyError) as error:
    _config_field_error(error)


_NO_FIELD = object()


def takes_value(name: str, flag_values: flags.FlagValues) -> bool | None:
  """Whether the flag written `--name` reads the next argument as its value (None:
  absl knows no such flag). A config field's flag exists once --config is parsed:
  its type is the default config's."""
  if name in flag_values:
    return not flag_values[name].boolean
  if name.startswith(("config.", "noconfig.")):
    fields = hyperparameters.flatten(hyperparameters.default_config().to_dict())
    value = fields.get(name.partition(".")[2], _NO_FIELD)
    if value is _NO_FIELD:
      return None  # an unknown field: named by _config_field_error
    return not isinstance(value, bool) and not name.startswith("no")
  if name.startswith("no") and name[2:] in flag_values and flag_values[name[2:]].boolean:
    return False
  return None


def _unexpected(arguments: list[str], configs: list[str], flag_values) -> str:
  """The line for arguments that are not flags (absl's usage text said it in 13-22)."""
  shown = ", ".join(repr(argument) for argument in arguments)
  line = f"unexpected argument{'s' if len(arguments) > 1 else ''} {shown}"
  config = next((a for a in arguments if a.partition(":")[0].endswith(".py")), None)
  if config is not None and "config" in flag_values:
    if configs:
      return f"{line}: the config is --config {configs[0]}; give one config file"
    return f"{line}: give the config as --config {config}"
  program = os.path.basename(sys.argv[0] if sys.argv and sys.argv[0] else "this program")
  return f"{line}: {program} takes flags only (--helpshort lists them)"


def _check_usage(argv: list[str], flag_values: flags.FlagValues) -> str | None:
  """One line and exit 2 for what absl would answer with its usage text or take
  silently: a flag without its value (absl takes the next flag for it), a config
  file given twice (ml_collections reads the first's fields, absl keeps the last),
  an argument that is not a flag. A flag absl does not know is left to absl, whose
  line names it and the nearest known one. Returns the --config path, if given.

  Other flags may repeat, the last one counting, as absl has it: callers add
  overrides after a command's own (--config.FIELD=VALUE, --workdir).
  """
  configs, positional, unknown = [], [], False
  index = 1
  while index < len(argv):
    token = argv[index]
    index += 1
    if token == "--":  # absl: the rest are arguments, not flags
      positional += argv[index:]
      break
    if not token.startswith("-") or token == "-":
      positional.append(token)
      continue
    name, equals, value = token.lstrip("-").partition("=")
    value_follows = takes_value(name, flag_values)
    if value_follows is None:
      unknown = True
      continue
    if value_follows and not equals:
      if index == len(argv) or argv[index].startswith("--"):
        example = "FILE" if name == "config" else "VALUE"
        fail(f"--{name} has no value: give --{name}={example}")
      value = argv[index]
      index += 1
    if name == "config":
      configs.append(value)
  if unknown:
    return None  # absl's own line names the unknown flag
  if len(configs) > 1:
    given = ", ".join(repr(config) for config in configs)
    times = "twice" if len(configs) == 2 else f"{len(configs)} times"
    fail(
      f"--config is given {times} ({given}): give one config file, "
      "and change its fields with --config.FIELD=VALUE"
    )
  if positional:
    fail(_unexpected(positional, configs, flag_values))
  return configs[0] if configs else None


def _required_error(error: flags.Error) -> str | None:
  """absl's lines for required flags left out, as one."""
  missing = re.findall(r"Flag --(\S+) must have a value other than None", str(error))
  if not missing:
    return None
  names = " and ".join(f"--{name}" for name in missing)
  verb = "is" if len(missing) == 1 else "are"
  wanted = " and ".join(
    f"--{name} {'FILE' if name == 'config' else 'VALUE'} ({flags.FLAGS[name].help.rstrip('.')})"
    for name in missing
  )
  return f"{names} {verb} required: give {wanted}"


def parse_flags(argv: list[str]) -> list[str]:
  """absl flag parsing, with wrong usage, a bad config file, flag or config field
  reported in one line (exit 2)."""
  path = _check_usage(argv, flags.FLAGS)
  if path is None:
    path = _config_path(argv[1:])
  if path is not None:
    _check_config_file(path)
  try:
    remaining = flags.FLAGS(argv)
  except (AttributeError, KeyError) as error:
    _config_field_error(error)
  except flags.IllegalFlagValueError as error:
    fail(_required_error(error) or str(error))
  except (flags.Error, ValueError, TypeError) as error:
    fail(str(error))
  if len(remaining) > 1:  # e.g. from a --flagfile
    fail(_unexpected(remaining[1:], [path] if path else [], flags.FLAGS))
  return remaining


def run(main) -> None:
  """absl's app.run(main) for a program with the --config flag: flags parsed by
  parse_flags, and a UsageError that main raises answered in one line (exit 2)
  instead of absl's usage text."""

  def main_in_one_line(argv):
    try:
      return main(argv)
    except app.UsageError as error:
      fail(str(error))

  app.run(main_in_one_line, flags_parser=parse_flags)


def _this_machine(host: str) -> bool:
  """Whether `host` names this machine (by its loopback or own name; no DNS)."""
  if host in ("", "localhost", "0.0.0.0", "::", "::1") or host.startswith("127."):
    return True
  try:
    return host in (socket.gethostname(), socket.getfqdn())
  except OSError:
    return False


def check_coordinator(address: str, process_id: int) -> None:
  """One line and exit 2 when process 0 is to serve a run's coordinator at `address`
  (--coordinator_address, host:PORT) on a port of this machine that it cannot
  listen on: jax.distributed.initialize crashes on a port in use (a segfault
  after its timeout). Other hosts and processes are not checked."""
  if not address or process_id != 0:
    return
  host, _, port = address.rpartition(":")
  if not port.isdigit() or not 1 <= int(port) <= 65535:
    fail(f"--coordinator_address={address!r} is invalid: give host:PORT, a port in [1, 65535]")
  if _this_machine(host.strip("[]")):
    problem = port_problem(int(port))
    if problem:
      fail(
        f"--coordinator_address={address!r}: port {port} cannot be served on this machine "
        f"({problem.lower()}); pick another port"
      )
