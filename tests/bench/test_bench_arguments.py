"""bench/ scripts refuse a bad argument, and the GPU ones a machine without a GPU, in
one line (exit 2) before they print, run or write anything."""

import os
import subprocess
import sys

import pytest

import runs

# (script, its arguments, what its one line says); {tmp} is the test's own folder.
REFUSALS = [
  ("gpu.py", (), "bench/gpu.py measures a GPU; JAX finds only cpu devices here"),
  ("gpu.py", ("--models", "vgg"), "--models 'vgg': valid: lenet5, resnet20, resnet50"),
  ("gpu.py", ("--batches", "resnet50=0"), "batch sizes are >= 1"),
  ("gpu.py", ("--steps", "0"), "0 is invalid: must be an integer >= 1"),
  (
    "gpu_check.py",
    ("--report", "{tmp}/report.md"),
    "bench/gpu_check.py measures a GPU; JAX finds only cpu devices here",
  ),
  ("gpu_check.py", ("--parts", "tier,vgg"), "--parts='tier,vgg' is invalid: valid: tier, resnet50"),
  ("gpu_check.py", ("--minutes", "0"), "0 is invalid: must be a finite number >= 1"),
  ("gpu_check.py", ("--wheels", "no_such_folder"), "--wheels='no_such_folder' is not a directory"),
  ("gpu_check.py", ("--wheels", "{tmp}"), "holds no .whl file: give the folder of the wheels"),
  ("ray_replay.py", ("--kill_worker", "4", "--workers", "4"), "--kill_worker=4 is invalid"),
  ("ray_replay.py", ("--algorithm", "sync_easgd"), "invalid choice: 'sync_easgd'"),
  ("ray_replay.py", ("--steps", "0"), "0 is invalid: must be an integer >= 1"),
  ("ray_replay.py", ("--worker_gpus", "-1"), "-1 is invalid: must be a finite number >= 0"),
  ("rule_defaults.py", ("--steps", "-5"), "-5 is invalid: must be an integer >= 1"),
  ("rule_defaults.py", ("--rules", "sync_easgd,sgd"), "--rules='sync_easgd,sgd' is invalid"),
  ("throughput.py", ("--rounds", "0"), "0 is invalid: must be an integer >= 1"),
  ("throughput.py", ("--workers", "2"), "--workers=2 is invalid: must be a multiple of 8"),
  ("deterministic_sums.py", ("--workers", "12"), "--workers=12 is invalid: must be a multiple"),
  ("pipeline.py", ("--stage_steps", "0"), "0 is invalid: must be an integer >= 1"),
  ("plan_servers.py", ("--tau", "1"), "1 is invalid: must be an integer >= 2"),
  ("ray_vs_threads.py", ("--repeats", "0"), "0 is invalid: must be an integer >= 1"),
  ("plan_check.py", ("--steps", "x"), "argument --steps: 'x' is not an integer"),
  ("sweep_parallel.py", ("--parallel", "0"), "0 is invalid: must be an integer >= 1"),
  ("sweep_parallel.py", ("--config", "{tmp}/none.py"), "none.py' is not a file: give a config"),
]


@pytest.mark.parametrize("script,args,message", REFUSALS)
@pytest.mark.e2e  # bench scripts as processes
def test_a_bad_argument_or_no_gpu_is_refused_in_one_line(tmp_path, script, args, message):
  run = subprocess.run(
    [sys.executable, f"bench/{script}", *(arg.format(tmp=tmp_path) for arg in args)],
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
  assert not list(tmp_path.iterdir())  # nothing written (gpu_check's report among them)
