"""Wrong usage of every command-line program, by class: one line on stderr
(`error: ...`) naming what is wrong, exit status 2, nothing written.

The classes: usage (a config given positionally or twice, a forgotten
--config, an unknown flag, a flag without its value, an option repeated), a
sweep file whose get_sweep() is not a list of dicts of config fields, the
launcher's coordinator port (in use, or no port), and output paths (empty,
the current folder or a parent of it, in or around what the program reads).

The absl programs (train.py, sweep.py, easgd.plan) run as processes of their
own (their flags are absl's global ones, defined on import), forked from a
starter that has imported their libraries (conftest.py's `starter`); the argparse
programs are called in-process.
"""

import contextlib
import importlib.util
import itertools
import os
import pathlib
import socket

import pytest

import runs
from easgd import arguments, launch
from easgd.data import convert

REPO = pathlib.Path(__file__).resolve().parent.parent
TRAIN, SWEEP = str(REPO / "train.py"), str(REPO / "sweep.py")
DEFAULT, SWEEP_EXAMPLE = (
  str(REPO / "configs" / "default.py"),
  str(REPO / "configs" / "sweep_example.py"),
)
# Appended to each train.py command: a run that the mistake let through fails
# its config check at once instead of training.
NO_RUN = "--config.run.total_steps=0"


@pytest.fixture
def program(starter):
  """program(cwd, *argv): runs `python *argv` in `cwd`; (exit status, stderr)."""

  def run(cwd, *argv) -> tuple[int, str]:
    code, out, err = starter.run(list(argv), cwd)
    assert out == "", out
    return code, err

  return run


def _in_process(capsys, main, *args) -> tuple[int, str]:
  """Calls main(*args), which must exit: (exit status, stderr)."""
  with pytest.raises(SystemExit) as exit_info:
    main(*args)
  captured = capsys.readouterr()
  assert captured.out == "", captured.out
  return exit_info.value.code, captured.err


def assert_refused(code: int, err: str, *named: str) -> None:
  """Exit status 2 and one line on stderr, `error: ...`, holding each of `named`."""
  assert code == 2, err[-2000:]
  assert err.count("\n") == 1 and err.startswith("error: "), err[-2000:]
  for text in named:
    assert text in err, (text, err)


def process_cases(names, in_a_process) -> list:
  """`names` as pytest parameters; those whose program runs as a process of its own
  (`in_a_process(name)`) are left to the whole suite (e2e), the rest run in the quick
  tier too."""
  return [
    pytest.param(name, marks=[pytest.mark.e2e] if in_a_process(name) else []) for name in names
  ]


@pytest.fixture
def places(tmp_path):
  """An empty current folder for the program, and a folder beside it for what it reads."""
  here, inputs = tmp_path / "here", tmp_path / "inputs"
  here.mkdir()
  inputs.mkdir()
  return here, inputs


# (the command, after `python`; what the line must name). Paths: WORK is a new
# workdir in the current folder, which must stay empty.
USAGE = {
  "train: config positional": (
    [TRAIN, DEFAULT, NO_RUN],
    [f"unexpected argument '{DEFAULT}'", f"--config {DEFAULT}"],
  ),
  "train: config twice": (
    [TRAIN, "--config", DEFAULT, "--config", DEFAULT, NO_RUN],
    ["--config is given twice"],
  ),
  "train: config twice, = form": (
    [TRAIN, f"--config={DEFAULT}", f"--config={SWEEP_EXAMPLE}", NO_RUN],
    ["--config is given twice", "sweep_example.py"],
  ),
  "train: misspelt flag": ([TRAIN, f"--confg={DEFAULT}", NO_RUN], ["'confg'"]),
  "train: misspelt flag, spaced value": ([TRAIN, "--confg", DEFAULT, NO_RUN], ["'confg'"]),
  "train: unknown flag": ([TRAIN, "--foo", NO_RUN], ["'foo'"]),
  "train: workdir without value, last": ([TRAIN, NO_RUN, "--workdir"], ["--workdir has no value"]),
  "train: workdir without value, a flag next": (
    [TRAIN, "--workdir", f"--config={DEFAULT}", NO_RUN],
    ["--workdir has no value"],
  ),
  "train: config without value": ([TRAIN, "--config", "--workdir=WORK"], ["--config has no value"]),
  "train: field without value": ([TRAIN, "--config.seed", "--workdir=WORK"], ["--config.seed"]),
  "train: arguments after --": ([TRAIN, NO_RUN, "--", "extra"], ["'extra'"]),
  "plan: config positional": (
    ["-m", "easgd.plan", DEFAULT],
    [f"unexpected argument '{DEFAULT}'", f"--config {DEFAULT}"],
  ),
  "plan: config twice": (
    ["-m", "easgd.plan", "--config", DEFAULT, f"--config={DEFAULT}"],
    ["twice"],
  ),
  "plan: unknown flag": (["-m", "easgd.plan", "--workdir=WORK"], ["'workdir'"]),
  "sweep: config positional": (
    [SWEEP, SWEEP_EXAMPLE, "--workdir=WORK"],
    [f"unexpected argument '{SWEEP_EXAMPLE}'", f"--config {SWEEP_EXAMPLE}"],
  ),
  "sweep: config forgotten": ([SWEEP, "--workdir=WORK"], ["--config is required"]),
  "sweep: config twice": (
    [SWEEP, f"--config={SWEEP_EXAMPLE}", f"--config={SWEEP_EXAMPLE}", "--workdir=WORK"],
    ["--config is given twice"],
  ),
  "sweep: workdir without value": (
    [SWEEP, f"--config={SWEEP_EXAMPLE}", "--workdir"],
    ["--workdir"],
  ),
}


def _launch(argv):
  return lambda: launch.main(argv)


def _convert(argv):
  return lambda: convert.main(argv)


def _faults(argv):
  """studies/faults.py's main with `argv` (a study reads sys.argv)."""

  def main():
    with pytest.MonkeyPatch.context() as patch:
      patch.setattr("sys.argv", ["faults.py", *argv])
      _study("faults").main()

  return main


# The argparse programs, in-process.
USAGE_IN_PROCESS = {
  "launch: config as the command": (
    _launch(["--processes", "2", DEFAULT]),
    [f"'{DEFAULT}' is a config file", "-- train.py --config"],
  ),
  "launch: option twice": (
    _launch(["--processes", "2", "--processes", "3", "--", TRAIN]),
    ["--processes is given twice"],
  ),
  "launch: a flag the launcher sets": (
    _launch(["--processes", "2", "--", TRAIN, "--num_processes=2"]),
    ["--num_processes"],
  ),
  "launch: option without value": (_launch(["--processes"]), ["--processes: expected one"]),
  "convert: config positional": (
    _convert(["--dataset", "mnist5k", "--out", "WORK", DEFAULT]),
    [f"unrecognized arguments: {DEFAULT}"],
  ),
  "convert: out twice": (
    _convert(["--dataset", "mnist5k", "--out", "WORK", "--out", "OTHER"]),
    ["--out is given twice ('WORK' and 'OTHER')"],
  ),
  "convert: unknown flag": (
    _convert(["--dataset", "mnist5k", "--out", "WORK", "--foo"]),
    ["unrecognized arguments: --foo"],
  ),
  "study: config positional": (_faults([DEFAULT]), [f"unrecognized arguments: {DEFAULT}"]),
  "study: option twice": (
    _faults(["--trials", "2", "--trials", "3"]),
    ["--trials is given twice (2 and 3)"],
  ),
  "study: option without value": (_faults(["--workdir"]), ["--workdir: expected one argument"]),
}


@pytest.mark.parametrize(
  "case", process_cases([*USAGE, *USAGE_IN_PROCESS], lambda case: case in USAGE)
)
def test_wrong_usage_is_one_line_and_writes_nothing(places, capsys, monkeypatch, program, case):
  here, _ = places
  if case in USAGE:
    argv, named = USAGE[case]
    code, err = program(here, *argv)
  else:
    main, named = USAGE_IN_PROCESS[case]
    monkeypatch.chdir(here)
    monkeypatch.setattr(launch.subprocess, "Popen", _no_process)
    code, err = _in_process(capsys, main)
  assert_refused(code, err, *named)
  assert os.listdir(here) == []


def _no_process(*args, **kwargs):
  raise AssertionError(f"a process was started: {args}")


def _study(name: str):
  spec = importlib.util.spec_from_file_location(name, REPO / "studies" / f"{name}.py")
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


SWEEP_FILE = """
from easgd.configs import default


def get_config():
  return default.get_config()

{sweep}
"""
BAD_SWEEPS = {
  "returns None": ("def get_sweep():\n  return None", "get_sweep() returned None"),
  "returns a dict": (
    'def get_sweep():\n  return {"seed": 1}',
    "get_sweep() returned a dict ({'seed': 1})",
  ),
  "a point that is not a dict": (
    'def get_sweep():\n  return [{"seed": 1}, "seed=2"]',
    "point 1 is a str ('seed=2'), not a dict",
  ),
  "a key that is not a string": ("def get_sweep():\n  return [{1: 0.1}]", "has the key 1"),
  "an unknown field": (
    'def get_sweep():\n  return [{"optimizer.learnig_rate": 0.1}]',
    "config.optimizer.learnig_rate does not exist",
  ),
  "a value of the wrong type": (
    'def get_sweep():\n  return [{"seed": "one"}]',
    "sweep point 0 (seed=one)",
  ),
  "an empty list": ("def get_sweep():\n  return []", "get_sweep() returned no points"),
  "an empty point": ("def get_sweep():\n  return [{}]", "point 0 is an empty dict"),
  "the same point twice": (
    'def get_sweep():\n  return [{"seed": 1}, {"seed": 2}, {"seed": 1}]',
    "sweep point 2 (seed=1) is point 0 again",
  ),
  "raises": (
    'def get_sweep():\n  raise KeyError("lr")',
    "get_sweep() raised KeyError: 'lr'",
  ),
  "not a function": ("get_sweep = [{'seed': 1}]", "get_sweep is a list"),
  "missing": ("", "defines no get_sweep()"),
}


@pytest.mark.parametrize("case", process_cases(BAD_SWEEPS, lambda case: True))  # sweep.py processes
def test_a_bad_sweep_file_is_one_line_naming_the_file(places, program, case):
  here, inputs = places
  sweep, said = BAD_SWEEPS[case]
  path = inputs / "swept.py"
  path.write_text(SWEEP_FILE.format(sweep=sweep))
  code, err = program(here, SWEEP, f"--config={path}", "--workdir=runs")
  # What is allowed, where the file's get_sweep() returned something else.
  allowed = (
    ""
    if case in ("a value of the wrong type", "the same point twice", "raises")
    else "list of dicts of config fields"
  )
  assert_refused(code, err, str(path), said, allowed)
  assert os.listdir(here) == []


# (the program, the port): a port held by a socket of this test, listening on
# 127.0.0.1 or on every interface or only bound (each without SO_REUSEADDR), or
# a port that is none.
PORTS = {
  "in use: listening on 127.0.0.1": ("launch", ("127.0.0.1", True)),
  "in use: listening on every interface": ("launch", ("0.0.0.0", True)),
  "in use: bound": ("launch", ("127.0.0.1", False)),
  # train.py's process 0 serves the coordinator: refused there too, without the launcher.
  "in use: train.py's process 0": ("train", ("127.0.0.1", True)),
  "no port: 70000": ("launch", "70000"),
  "no port: 65536": ("launch", "65536"),
  "no port: -1": ("launch", "-1"),
  "no port: x": ("launch", "x"),
  "no port: train.py's 70000": ("train", "70000"),
}


@pytest.mark.parametrize("case", process_cases(PORTS, lambda case: PORTS[case][0] == "train"))
def test_a_coordinator_port_that_cannot_be_served_is_refused_before_any_process_starts(
  places, capsys, monkeypatch, program, case
):
  here, _ = places
  monkeypatch.chdir(here)
  which, port = PORTS[case]
  with contextlib.ExitStack() as holding:
    if isinstance(port, tuple):
      host, listen = port
      holder = holding.enter_context(socket.socket(socket.AF_INET, socket.SOCK_STREAM))
      holder.bind((host, 0))
      if listen:
        holder.listen(1)
      port = str(holder.getsockname()[1])
      named = [f"{port} cannot", "in use"]
    else:
      named = [port]
    if which == "launch":
      monkeypatch.setattr(launch.subprocess, "Popen", _no_process)
      argv = ["--processes", "2", "--port", port, "--", TRAIN, "--workdir=run"]
      code, err = _in_process(capsys, launch.main, argv)
      named.append("--port")
    else:
      address = f"127.0.0.1:{port}"
      flags = ["--num_processes=2", "--process_id=0", "--config.run.devices=2"]
      code, err = program(here, TRAIN, "--workdir=run", f"--coordinator_address={address}", *flags)
      named.append(f"--coordinator_address={address!r}")
  assert_refused(code, err, *named)
  assert os.listdir(here) == []
  if isinstance(PORTS[case][1], tuple):
    assert arguments.port_problem(int(port)) is None  # free once the socket is closed


def test_the_launchers_ports_are_free_and_never_ones_the_kernel_hands_out():
  """The coordinator's port, chosen when no --port is given, is free until process 0
  binds it after its imports: outside the kernel's ephemeral range (bind to port 0,
  connections' local ends) and `ray start`'s worker ports; parallel choosers (shares)
  never meet; a port another program holds is passed over."""
  ephemeral = launch._ephemeral_start()
  size = (ephemeral - 20000) // 2
  ports = [list(itertools.islice(launch.free_ports(share, 2), 50)) for share in (0, 1)]
  for share, chosen in enumerate(ports):
    assert len(set(chosen)) == 50
    assert all(20000 + share * size <= port < 20000 + (share + 1) * size for port in chosen)
  assert 20000 <= launch.free_port() < ephemeral
  with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as holder:
    held = runs.free_port()  # this test's own: no other test chooses it
    holder.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # even in TIME_WAIT
    holder.bind(("127.0.0.1", held))
    holder.listen(1)
    assert held not in itertools.islice(launch.free_ports(start=held), 5)
  with pytest.raises(ValueError, match="share 2 is not one of 2 shares"):
    next(launch.free_ports(2, 2))


# Output paths: (the program, its arguments; what the line names). In the
# arguments, HERE is the current folder, INPUT a folder the program reads.
PATHS = {
  "convert: out empty": (
    "convert",
    ["--folder", "INPUT", "--side", "8", "--out", ""],
    "--out is empty",
  ),
  "convert: out the current folder": (
    "convert",
    ["--folder", "INPUT", "--side", "8", "--out", "."],
    "--out='.' is the current folder",
  ),
  "convert: out the current folder, absolute": (
    "convert",
    ["--folder", "INPUT", "--side", "8", "--out", "HERE"],
    "is the current folder",
  ),
  "convert: out a parent of the current folder": (
    "convert",
    ["--dataset", "mnist5k", "--out", ".."],
    "--out='..' is a parent of the current folder",
  ),
  "convert: out a parent of the input": (
    "convert",
    ["--folder", "INPUT/images", "--side", "8", "--out", "INPUT"],
    "is a parent of --folder=",
  ),
  "convert: out inside the input": (
    "convert",
    ["--folder", "INPUT/images", "--side", "8", "--out", "INPUT/images/train/records"],
    "lies inside --folder=",
  ),
  "convert: out the input": (
    "convert",
    ["--folder", "INPUT/images", "--side", "8", "--out", "INPUT/images"],
    "is --folder=",
  ),
  "convert: out inside the data_dir": (
    "convert",
    ["--dataset", "mnist5k", "--data_dir", "INPUT", "--out", "INPUT/records"],
    "lies inside --data_dir=",
  ),
  "faults: workdir empty": ("faults", ["--workdir", ""], "--workdir is empty"),
  "faults: workdir the current folder": ("faults", ["--workdir", "."], "is the current folder"),
  "faults: out empty": ("faults", ["--workdir", "runs", "--out", ""], "--out=''"),
  "train: workdir the current folder": (
    "train",
    [TRAIN, "--workdir=.", NO_RUN],
    "--workdir='.' is the current folder",
  ),
  "train: workdir the current folder, absolute": (
    "train",
    [TRAIN, "--workdir=HERE", NO_RUN],
    "is the current folder",
  ),
  "train: workdir a parent of the current folder": (
    "train",
    [TRAIN, "--workdir=..", NO_RUN],
    "is a parent of the current folder",
  ),
  "train: workdir empty": ("train", [TRAIN, "--workdir=", NO_RUN], "--workdir is empty"),
  "train: workdir inside the data_dir": (
    "train",
    [TRAIN, "--workdir=INPUT/run", "--config.run.data_dir=INPUT", NO_RUN],
    "lies inside config.run.data_dir=",
  ),
  "sweep: workdir the current folder": (
    "sweep",
    [SWEEP, f"--config={SWEEP_EXAMPLE}", "--workdir=."],
    "--workdir='.' is the current folder",
  ),
  "study: docs the current folder": (
    "study",
    [str(REPO / "studies" / "outer.py"), "--workdir=runs", "--docs=HERE"],
    "--docs=",
  ),
  "study: workdir the current folder": (
    "study",
    [str(REPO / "studies" / "outer.py"), "--workdir=."],
    "--workdir='.' is the current folder",
  ),
}


@pytest.mark.parametrize(
  "case", process_cases(PATHS, lambda case: PATHS[case][0] not in ("convert", "faults"))
)
def test_an_output_path_is_checked_before_anything_is_written(
  places, capsys, monkeypatch, program, case
):
  here, inputs = places
  for split in ("train", "test"):
    (inputs / "images" / split / "digit").mkdir(parents=True)
  before = sorted(str(path) for path in inputs.rglob("*"))
  which, argv, named = PATHS[case]
  argv = [arg.replace("INPUT", str(inputs)).replace("HERE", str(here)) for arg in argv]
  monkeypatch.chdir(here)
  if which == "convert":
    code, err = _in_process(capsys, convert.main, argv)
  elif which == "faults":
    monkeypatch.setattr("sys.argv", ["faults.py", *argv])
    code, err = _in_process(capsys, _study("faults").main)
  else:
    code, err = program(here, *argv)
  assert_refused(code, err, named)
  assert os.listdir(here) == [] and sorted(os.listdir(here.parent)) == ["here", "inputs"]
  assert sorted(str(path) for path in inputs.rglob("*")) == before


def test_a_failed_conversion_leaves_no_staging_folder(tmp_path, monkeypatch):
  """The rename that completes a conversion may fail too: its staging folder goes."""
  import numpy as np  # noqa: PLC0415

  def refuse(source, target):
    raise OSError(f"cannot rename {source} to {target}")

  monkeypatch.setattr(convert.os, "rename", refuse)
  images = np.zeros((2, 4, 4, 1), np.uint8)
  splits = {split: (images, np.zeros(2, np.int32)) for split in ("train", "test")}
  with pytest.raises(OSError, match="cannot rename"):
    convert.write(str(tmp_path / "records"), splits, num_classes=1, max_value=255.0)
  assert os.listdir(tmp_path) == []
