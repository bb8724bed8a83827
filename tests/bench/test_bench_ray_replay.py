"""bench/ray_replay.py's arguments: a bad one is refused in one line, exit 2, before
any run starts."""

import pathlib
import subprocess
import sys

import pytest

import runs

REPO = pathlib.Path(runs.REPO)


@pytest.mark.parametrize(
  "args,message",
  [
    (("--kill_worker", "4", "--workers", "4"), "--kill_worker=4 is invalid: the workers are 0..3"),
    (("--algorithm", "sync_easgd"), "argument --algorithm: invalid choice: 'sync_easgd'"),
    (("--steps", "0"), "0 is invalid: must be an integer >= 1"),
    (("--worker_gpus", "-1"), "-1 is invalid: must be a finite number >= 0"),
  ],
)
def test_bad_arguments_are_refused_in_one_line(args, message):
  run = subprocess.run(
    [sys.executable, "bench/ray_replay.py", *args],
    cwd=REPO,
    capture_output=True,
    text=True,
    timeout=120,
    check=False,
  )
  assert run.returncode == 2
  assert run.stdout == ""
  assert run.stderr.count("\n") == 1 and message in run.stderr, run.stderr
