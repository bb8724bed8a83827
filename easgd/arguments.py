"""Arguments of the command-line programs, checked before anything runs: one line each.

Light on purpose (no JAX): `python -m easgd.launch` and the studies use it too.
A bad argument ends in `error: ...` on stderr and exit status 2.
"""

import argparse
import math
import os
import sys


def fail(message: str, code: int = 2):
  """Prints `error: message` and exits with `code`."""
  print(f"error: {message}", file=sys.stderr)
  sys.exit(code)


def check_workdir(path: str, flag: str = "--workdir") -> None:
  """One line and exit 2 unless `path` is a directory this process can create or write.

  Checked before anything is compiled or written: an empty path, a path that
  is a file or lies under one, and one in a directory this process may not
  write to are refused.
  """
  if not path:
    fail(f"{flag} is empty: give a directory (a new one, or one to resume or extend)")
  absolute = os.path.abspath(path)
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


class ArgumentParser(argparse.ArgumentParser):
  """argparse, with a bad argument answered in one line (`error: ...`, exit 2), no usage text."""

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


def directory(flag: str):
  """An argparse type: a directory that can be created or written (see check_workdir)."""

  def parse(text: str) -> str:
    check_workdir(text, flag)
    return text

  parse.__name__ = "directory"
  return parse


def output_file(flag: str):
  """An argparse type: a file path whose directory can be created or written."""

  def parse(text: str) -> str:
    if not text or os.path.isdir(text):
      fail(f"{flag}={text!r} is invalid: give the path of the file to write")
    check_workdir(os.path.dirname(os.path.abspath(text)), flag)
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
