"""Several processes (jax.distributed over loopback, gloo collectives) against one.

Each test starts 2 processes x 2 CPU devices with easgd.launch and compares
their checkpoints with the same run in this process on a mesh of 4 devices.
"""

import os
import shutil
import signal

import numpy as np
import pytest

from easgd import launch as launcher
from easgd.errors import ConfigError
from easgd.infra import distributed
from runs import launch, own_pool, read_state, small_flags, steps_saved, train

# Whole runs, train.py or several processes: left out of the quick loop (-m 'not e2e').
pytestmark = pytest.mark.e2e

# Every wait is bounded: a hung collective must fail the test, not the suite.
RUN_SECONDS = 240


def _final_leaves(workdir):
  return read_state(workdir / "checkpoints" / "40" / "state")


def _each_process_read_half_the_data(output: str) -> None:
  for index in (0, 1):
    assert f"process {index} reads 2 of 4 training partitions (2000 examples)" in output


def test_pipeline_over_two_processes_equals_one_process_and_sets_a_bad_checkpoint_aside(
  tmp_path, small_run
):
  run = launch(tmp_path, *small_flags(algorithm="pipeline"))
  assert run.wait(RUN_SECONDS) == 0, run.tail()
  output = run.output()
  _each_process_read_half_the_data(output)
  expected = _final_leaves(small_run("pipeline"))
  got = _final_leaves(tmp_path)
  assert len(got) == len(expected) > 10
  # Models only move (ppermute): the same arithmetic on the same devices.
  for a, b in zip(got, expected, strict=True):
    assert a.dtype == b.dtype and np.array_equal(a, b)
  # Only process 0 writes TensorBoard events: one file a model.
  for m in range(4):
    assert len(os.listdir(tmp_path / f"model_{m}")) == 1

  # A checkpoint that the processes cannot read: together they set it aside and
  # stop at once (exit 1). (The next run resumes from the one before, as a single
  # process does: tests/infra/test_checkpoint.py.)
  state_dir = tmp_path / "checkpoints" / "40" / "state"
  files = [os.path.join(root, name) for root, _, names in os.walk(state_dir) for name in names]
  largest = max(files, key=os.path.getsize)
  with open(largest, "r+b") as f:
    f.truncate(os.path.getsize(largest) // 2)
  stopped = launch(tmp_path, *small_flags(algorithm="pipeline"))
  assert stopped.wait(RUN_SECONDS) != 0
  assert "could not read the checkpoint of step 40" in stopped.output()
  assert "run the same command again to resume from the one before" in stopped.output()
  assert os.path.isdir(tmp_path / "corrupt_checkpoints" / "40")
  assert steps_saved(tmp_path) == [20, 30]


def test_preempted_then_killed_over_two_processes_each_time_the_same_command_resumes(
  tmp_path, small_run
):
  """hogwild_easgd (the master's sequential operations, replicated), its batches
  streamed (each process reads its own workers'), over 2 processes x 2 devices:
  - SIGTERM to the launcher reaches both processes; they agree on a step,
    checkpoint it and exit 0;
  - the same command resumes; SIGKILL to process 1 after a checkpoint: process
    0 aborts when the heartbeats stop (--heartbeat_timeout 10 s);
  - the same command resumes to the end, to the bits of a run on one process
    whose data was placed on the devices;
  - a host lost for good: the oldest checkpoint kept goes on with one process of
    2 devices (two workers a device), restored into that layout's shardings.
  """
  flags = small_flags({"data.source": "stream"}, algorithm="hogwild_easgd")
  # Process 0 sends the launcher SIGTERM once step 10 is logged: at the same step
  # of the run whatever the machine's load.
  sigterm = ("event write", 10, "--process=0", "--signal=SIGTERM", "--to=parent")
  run = launch(tmp_path, *flags, signal_at=sigterm)
  assert run.wait(RUN_SECONDS) == 0, run.tail()
  output = run.output()
  for index in (0, 1):
    assert f"process {index} streams the batches of 2 of 4 workers" in output
  stops = {
    int(line.rsplit(" ", 1)[1])
    for line in output.splitlines()
    if "preemption notice (SIGTERM): stopping after step" in line
  }
  assert len(stops) == 1  # both processes stopped after the same step
  (stopped,) = stops
  assert stopped < 30 and steps_saved(tmp_path)[-1] == stopped
  assert output.count("run the same command to resume") == 2

  # Process 1 kills itself (SIGKILL) once the next checkpoint is on disk. Process 0
  # stops on its own once the heartbeats stop (10 s); the launcher would kill it
  # only after a grace that no busy machine reaches.
  after = stopped - stopped % 10 + 10  # the next checkpoint
  run = launch(tmp_path, *flags, grace=RUN_SECONDS, signal_at=("checkpoint", after, "--process=1"))
  pid = int(run.wait_for(r"process 1 \(pid (\d+)\) started", 60).group(1))
  run.wait_for(f"resumed from the checkpoint of step {stopped}", 60)
  assert run.wait(2 * RUN_SECONDS) != 0
  output = run.output()
  assert f"process 1 (pid {pid}) was lost: killed by SIGKILL" in output
  assert "still runs; killing it" not in output  # process 0 stopped on its own
  # JAX's coordination service names the lost task in process 0's log.
  assert "[process 0]" in output and "stopped sending heartbeats" in output
  last = steps_saved(tmp_path)[-1]
  assert after <= last < 40

  again = launch(tmp_path, *flags)
  assert again.wait(RUN_SECONDS) == 0, again.tail()
  assert f"resumed from the checkpoint of step {last}" in again.output()
  expected = _final_leaves(small_run("hogwild_easgd"))
  got = _final_leaves(tmp_path)
  assert len(got) == len(expected) > 10
  for a, b in zip(got, expected, strict=True):
    assert a.dtype == b.dtype and np.array_equal(a, b)

  # The oldest checkpoint on one process of 2 devices: the same arithmetic, in
  # another layout of the workers over the devices.
  oldest = steps_saved(tmp_path)[0]
  fewer = tmp_path / "fewer"
  shutil.copytree(tmp_path / "checkpoints" / str(oldest), fewer / "checkpoints" / str(oldest))
  alone = train(fewer, *flags, "--config.run.devices=2")
  assert alone.wait(RUN_SECONDS) == 0, alone.tail()
  assert f"resumed from the checkpoint of step {oldest}" in alone.output()
  for a, b in zip(_final_leaves(fewer), expected, strict=True):
    np.testing.assert_allclose(a, b, rtol=0, atol=1e-6)


def test_describe_names_signals_and_exit_codes():
  assert launcher.describe(-signal.SIGKILL) == "killed by SIGKILL"
  assert launcher.describe(134) == "exit status 134 (aborted)"
  assert launcher.describe(3) == "exit status 3"


def test_the_process_count_comes_from_flags_or_the_scheduler():
  assert distributed.process_count("", 0, -1, {}) == 1
  assert distributed.process_count("127.0.0.1:1234", 2, 1, {}) == 2
  assert distributed.process_count("", 0, -1, {"SLURM_NTASKS": "4"}) == 4
  assert distributed.process_count("", 0, -1, {"SLURM_NTASKS": "1"}) == 1
  assert distributed.process_count("", 0, -1, {"OMPI_COMM_WORLD_SIZE": "3"}) == 3
  with pytest.raises(ConfigError, match=r"--process_id=2 is invalid: must be in \[0, 2\)"):
    distributed.process_count("127.0.0.1:1234", 2, 2, {})
  with pytest.raises(ConfigError, match="--num_processes is needed"):
    distributed.process_count("", 0, -1, {"JAX_COORDINATOR_ADDRESS": "10.0.0.1:1234"})


def test_lenet5_from_one_process_resumes_on_two_bit_for_bit(tmp_path):
  """A run saved on 1 process x 4 devices resumes on 2 processes x 2 devices. With
  deterministic_sums every sum over workers is added in worker order and XLA:CPU's
  thread pool is sized by the run, not the process, so neither gloo nor a process
  of fewer devices moves a bit: it ends equal to the run never stopped, on LeNet-5,
  whose max-pool ties flip at the first changed bit. The checkpoint is restored
  into the new layout's shardings; the clock and the data order go on unchanged.
  """
  # 20 steps, the first 10 on 1 x 4. (Without the two measures, 1 x 4 and 2 x 2
  # differ by up to 1e-8 after 20 steps and by 1e-3 after 40.)
  overrides = {"deterministic_sums": True, "model": "lenet5", "run.total_steps": 20}
  flags = small_flags(overrides, algorithm="sync_easgd")
  reference = tmp_path / "reference"
  # Each process sizes its pool as train.py does for the run, not as the tests' are.
  straight = train(reference, *flags, env=own_pool())
  assert straight.wait(RUN_SECONDS) == 0, straight.tail()
  # Its checkpoint of step 10, saved by the one process of 4 devices, resumed on two.
  workdir = tmp_path / "run"
  shutil.copytree(reference / "checkpoints" / "10", workdir / "checkpoints" / "10")
  resumed = launch(workdir, *flags, env=own_pool())
  assert resumed.wait(RUN_SECONDS) == 0, resumed.tail()
  assert "resumed from the checkpoint of step 10" in resumed.output()
  final = "checkpoints/20"
  got, expected = read_state(workdir / final / "state"), read_state(reference / final / "state")
  for a, b in zip(got, expected, strict=True):
    assert a.dtype == b.dtype and np.array_equal(a, b)
  clock = f"{final}/clock/metadata"
  assert (workdir / clock).read_text() == (reference / clock).read_text()
