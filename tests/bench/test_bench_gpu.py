"""bench/gpu.py on a machine without a GPU, and its arguments: one line and exit 2."""

import pathlib
import subprocess
import sys

import pytest

import runs

REPO = pathlib.Path(runs.REPO)


def _bench(*args):
  return subprocess.run(
    [sys.executable, "bench/gpu.py", *args],
    cwd=REPO,
    capture_output=True,
    text=True,
    timeout=120,
    check=False,
  )


@pytest.mark.parametrize(
  "args,message",
  [
    ((), "bench/gpu.py measures a GPU; JAX finds only cpu devices here"),
    (("--models", "vgg"), "--models 'vgg': valid: lenet5, resnet20, resnet50"),
    (("--batches", "resnet50=0"), "batch sizes are >= 1"),
    (("--steps", "0"), "0 is invalid: must be an integer >= 1"),
  ],
)
@pytest.mark.e2e  # bench/gpu.py processes
def test_without_a_gpu_or_with_bad_arguments_it_refuses_in_one_line(args, message):
  run = _bench(*args)
  assert run.returncode == 2
  assert run.stdout == ""
  assert run.stderr.count("\n") == 1 and message in run.stderr, run.stderr
