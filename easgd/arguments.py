"""Arguments of the command-line programs, checked before anything runs: one line each.

Light on purpose (no JAX): `python -m easgd.launch` and the studies use it too.
A bad argument ends in `error: ...` on stderr and exit status 2.
"""

import argparse
import errno
import importlib.machinery
import importlib.util
import math
import os
import socket
import sys


def load_file(path: str, name: str):
  """The module of the Python file `path`, not yet run (its loader runs it), whatever
  the file's name ends with, as ml_collections reads a config file."""
  loader = importlib.machinery.SourceFileLoader(name, path)
  return importlib.util.module_from_spec(importlib.util.spec_from_loader(name, loader))


def first_line(error: BaseException) -> str:
  """An exception as one line: its type and its message's first line (its type alone
  when it has no message)."""
  first = (str(error).strip().splitlines() or [""])[0]
  return f"{type(error).__name__}: {first}" if first else type(error).__name__


def fail(message: str, code: int = 2):
  """Prints `error: message` (one line, whatever `message` holds) and exits with `code`."""
  lines = [line.strip() for line in str(message).splitlines() if line.strip()]
  print(f"error: {'; '.join(lines)}", file=sys.stderr)
  sys.exit(code)


def _within(path: str, folder: str) -> bool:
  """Whether the real path `path` is the real path `folder` or lies inside it."""
  return path == folder or path.startswith(folder.rstrip(os.sep) + os.sep)


def check_workdir(
  path: str, flag: str = "--workdir", *, inputs: dict | None = None, shared: bool = False
) -> None:
  """One line and exit 2 unless `path` is a directory this process can create or write.

  Checked before anything is compiled or written: an empty path, a path that
  is a file or lies under one, and one in a directory this process may not
  write to are refused; so are the current folder and its parents (an output
  folder of its own is wanted: runs, checkpoints, tables and staging folders
  are made in it and next to it), unless `shared`: the folder of an output
  file, where the file is the output; and a path that is, lies inside or
  holds one of `inputs` ({"--flag": path} the program reads; empty ones are
  skipped).
  """
  if not path:
    fail(f"{flag} is empty: give the path of a directory")
  absolute = os.path.abspath(path)
  real = os.path.realpath(absolute)
  if not shared:
    try:
      here = os.path.realpath(os.getcwd())
    except OSError:  # the current folder was removed: nothing to protect
      here = None
    if here is not None and _within(here, real):
      where = "the current folder" if here == real else "a parent of the current folder"
      fail(f"{flag}={path!r} is {where}: give a folder of its own (e.g. runs/NAME)")
  for name, source in (inputs or {}).items():
    if not source:
      continue
    read = os.path.realpath(os.path.expanduser(source))
    if read == real:
      fail(f"{flag}={path!r} is {name}={source!r}, which is read: give another folder")
    if _within(real, read):
      fail(f"{flag}={path!r} lies inside {name}={source!r}, which is read: give another folder")
    if _within(read, real):
      fail(f"{flag}={path!r} is a parent of {name}={source!r}, which is read: give another folder")
  if os.path.exists(absolute) and not os.path.isdir(absolute):
    fail(f"{flag}={path!r} is not a directory")
  existing = absolute
  while not os.path.exists(existing):
    existing = os.path.dirname(existing)
  # The ancestor that decides, named as the user named the path (relative or not).
  shown = existing if os.path.isabs(path) else os.path.relpath(existing)
  if not os.path.isdir(existing):
    fail(f"{flag}={path!r} lies under {shown!r}, which is a file, not a directory")
  if not os.access(existing, os.W_OK | os.X_OK):
    fail(f"{flag}={path!r} cannot be written: {shown!r} is not writable by this user")


def _bind(family: int, host: str, port: int, reuse: bool) -> None:
  with socket.socket(family, socket.SOCK_STREAM) as probe:
    probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, int(reuse))
    probe.bind((host, port))


def port_problem(port: int) -> str | None:
  """Why a server could not listen on TCP `port` of this machine now (None: it can).

  The port is bound as jax.distributed's coordinator binds it, on every
  interface, first without SO_REUSEADDR: a port that another program listens
  on or holds is found. Where only that fails, the port is bound again with
  SO_REUSEADDR, as the coordinator's own socket is: connections of an earlier
  run still closing (TIME_WAIT) do not keep the coordinator from listening.
  """
  for family, host in ((socket.AF_INET, "0.0.0.0"), (socket.AF_INET6, "::")):
    try:
      _bind(family, host, port, reuse=False)
    except OSError as error:
      if family == socket.AF_INET6 and error.errno in (errno.EAFNOSUPPORT, errno.EADDRNOTAVAIL):
        continue  # no IPv6 on this machine
      if error.errno != errno.EADDRINUSE:
        return error.strerror or str(error)
      try:
        _bind(family, host, port, reuse=True)
      except OSError as again:
        return again.strerror or str(again)
  return None


def _once(base: type) -> type:
  """`base` (a store action) refusing a second value for its argument: argparse
  keeps the last silently, and `--out a --out b` is a slip, not a choice."""

  class Once(base):
    def __call__(self, parser, namespace, values, option_string=None):
      given = getattr(parser, "_given", None)
      if given is not None and self.option_strings:
        shown = "" if self.nargs == 0 else repr(values)  # a switch has no value
        if self.dest in given:
          both = f" ({given[self.dest]} and {shown})" if shown else ""
          parser.error(f"{option_string} is given twice{both}: give it once")
        given[self.dest] = shown
      super().__call__(parser, namespace, values, option_string)

  Once.__name__ = Once.__qualname__ = f"Once{base.__name__}"
  return Once


class ArgumentParser(argparse.ArgumentParser):
  """argparse, with a bad argument answered in one line (`error: ...`, exit 2), no usage
  text; an option given twice is refused too (append actions such as --set excepted)."""

  def __init__(self, *args, **kwargs):
    super().__init__(*args, **kwargs)
    # argparse's own store actions, each refusing a second value. The registry is
    # shared with argument groups, mutually exclusive ones too.
    store = _once(argparse._StoreAction)
    self.register("action", None, store)
    self.register("action", "store", store)
    self.register("action", "store_const", _once(argparse._StoreConstAction))
    self.register("action", "store_true", _once(argparse._StoreTrueAction))
    self.register("action", "store_false", _once(argparse._StoreFalseAction))

  def parse_known_args(self, args=None, namespace=None):
    self._given = {}
    try:
      return super().parse_known_args(args, namespace)
    finally:
      self._given = None

  def error(self, message: str):
    fail(f"{self.prog}: {message} (--help lists the arguments)")


def integer(low: int):
  """An argparse type: an integer >= `low`."""

  def parse(text: str) -> int:
    try:
      value = int(text)
    except ValueError:
      raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value < low:
      raise argparse.ArgumentTypeError(f"{value} is invalid: must be an integer >= {low}")
    return value

  parse.__name__ = f"integer >= {low}"
  return parse


def number(low: float, inclusive: bool = True):
  """An argparse type: a finite number >= `low` (> `low` if not `inclusive`)."""

  def parse(text: str) -> float:
    try:
      value = float(text)
    except ValueError:
      raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not math.isfinite(value) or value < low or (value == low and not inclusive):
      relation = ">=" if inclusive else ">"
      raise argparse.ArgumentTypeError(
        f"{text} is invalid: must be a finite number {relation} {low:g}"
      )
    return value

  parse.__name__ = "number"
  return parse


def some_of(allowed: tuple):
  """An argparse type: a comma-separated subset of `allowed` (one or more, in any order),
  returned in `allowed`'s order."""
  kind = type(allowed[0])

  def parse(text: str) -> tuple:
    try:
      chosen = {kind(part) for part in text.split(",")}
    except ValueError:
      chosen = set()
    if not chosen or not chosen <= set(allowed):
      raise argparse.ArgumentTypeError(
        f"{text!r} is invalid: choose some of {','.join(map(str, allowed))}"
      )
    return tuple(value for value in allowed if value in chosen)

  parse.__name__ = "list"
  return parse


def file_name(suffix: str):
  """An argparse type: a plain file name (no folder) that ends in `suffix`."""

  def parse(text: str) -> str:
    if not text.endswith(suffix) or text == suffix or os.path.basename(text) != text:
      raise argparse.ArgumentTypeError(
        f"{text!r} is invalid: must be a file name ending in {suffix}, without a folder"
      )
    return text

  parse.__name__ = "file name"
  return parse


def directory(flag: str):
  """An argparse type: an output directory that can be created or written (see
  check_workdir)."""

  def parse(text: str) -> str:
    check_workdir(text, flag)
    return text

  parse.__name__ = "directory"
  return parse


def existing_directory(flag: str):
  """An argparse type: a directory that exists (one the program reads)."""

  def parse(text: str) -> str:
    if not text or not os.path.isdir(text):
      fail(f"{flag}={text!r} is not a directory: give an existing folder to read")
    return text

  parse.__name__ = "directory"
  return parse


def output_file(flag: str):
  """An argparse type: a file path whose directory can be created or written."""

  def parse(text: str) -> str:
    if not text or os.path.isdir(text):
      fail(f"{flag}={text!r} is invalid: give the path of the file to write")
    check_workdir(os.path.dirname(os.path.abspath(text)), flag, shared=True)
    return text

  parse.__name__ = "file"
  return parse


def check_overwritable(path: str, made_by: bytes, at_start: bool = False) -> None:
  """One line and exit 2 if `path` exists and was not written by the tool that would
  overwrite it: its first 4 KiB must hold `made_by` (a study's table its "Made by
  `python studies/X.py" line, a PNG matplotlib's name), or begin with it
  (`at_start`: a sweep summary's header).

  Checked before the tool runs anything, so that a mistyped directory holding
  someone's files of the same name costs nothing.
  """
  if not os.path.exists(path):
    return
  if os.path.isdir(path):
    fail(f"{path!r} is a directory where this tool writes a file; move it or pick another place")
  with open(path, "rb") as existing:
    head = existing.read(4096)
  if not (head.startswith(made_by) if at_start else made_by in head):
    fail(
      f"{path!r} exists and was not written by this tool (no {made_by.decode()!r} in it); "
      "it is not overwritten: move it or pick another place"
    )
