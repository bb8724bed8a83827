"""bench/gpu_check.py without a GPU, and its arguments: one line, exit 2, no report."""

import os
import subprocess
import sys

import pytest

import runs


@pytest.mark.parametrize(
  "args,message",
  [
    ((), "bench/gpu_check.py measures a GPU; JAX finds only cpu devices here"),
    (("--parts", "tier,vgg"), "--parts='tier,vgg' is invalid: valid: tier, resnet50, small"),
    (("--minutes", "0"), "0 is invalid: must be a finite number >= 1"),
    (("--wheels", "no_such_folder"), "--wheels='no_such_folder' is not a directory"),
    (("--wheels", "{empty}"), "holds no .whl file: give the folder of the wheels to install"),
  ],
)
@pytest.mark.e2e  # bench/gpu_check.py processes
def test_without_a_gpu_or_with_bad_arguments_it_refuses_in_one_line(tmp_path, args, message):
  report = tmp_path / "report.md"
  empty = tmp_path / "wheels"
  empty.mkdir()
  args = [arg.format(empty=empty) for arg in args]
  run = subprocess.run(
    [sys.executable, "bench/gpu_check.py", "--report", str(report), *args],
    cwd=runs.REPO,
    # The CPU tier's refusal, on a machine with a GPU too.
    env={**os.environ, "JAX_PLATFORMS": "cpu"},
    capture_output=True,
    text=True,
    timeout=120,
    check=False,
  )
  assert run.returncode == 2
  assert run.stdout == ""
  assert run.stderr.count("\n") == 1 and message in run.stderr, run.stderr
  assert sorted(p.name for p in tmp_path.iterdir()) == ["wheels"]  # no report written
