"""bench/ scripts refuse a bad argument in one line, exit 2, before they print or run
anything (bench/gpu.py, gpu_check.py and ray_replay.py have tests of their own)."""

import subprocess
import sys

import pytest

import runs


@pytest.mark.parametrize(
  "script,args,message",
  [
    ("rule_defaults.py", ("--steps", "-5"), "-5 is invalid: must be an integer >= 1"),
    ("rule_defaults.py", ("--rules", "sync_easgd,sgd"), "--rules='sync_easgd,sgd' is invalid"),
    ("throughput.py", ("--rounds", "0"), "0 is invalid: must be an integer >= 1"),
  ],
)
@pytest.mark.e2e  # bench scripts as processes
def test_a_bad_argument_is_refused_in_one_line(script, args, message):
  run = subprocess.run(
    [sys.executable, f"bench/{script}", *args],
    cwd=runs.REPO,
    capture_output=True,
    text=True,
    timeout=120,
    check=False,
  )
  assert run.returncode == 2
  assert run.stdout == ""
  assert run.stderr.count("\n") == 1 and message in run.stderr, run.stderr
