"""The watchdog: limits by phase, and a hung process stopped and resumed.

The hang is injected by the test: a wrapper script replaces
Checkpointer.save with one that never returns at step 20, then runs
train.py; nothing in the package knows of it.
"""

import os
import re
import textwrap

import numpy as np
import pytest

from easgd.infra import watchdog
from runs import REPO, Process, read_state, small_flags, steps_saved, train


class FakeClock:
  def __init__(self):
    self.now = 0.0

  def __call__(self):
    return self.now


def _dog(timeout):
  clock, stopped = FakeClock(), []
  return watchdog.Watchdog(timeout, clock=clock, stop=stopped.append), clock, stopped


def test_an_explicit_limit_holds_after_the_first_occurrence_which_may_compile():
  dog, clock, stopped = _dog(5.0)
  assert dog.limit("evaluation") == 5.0 + watchdog.COMPILE_ALLOWANCE
  with dog.phase("evaluation", 10):
    clock.now += 100.0  # compiling
    dog.check()
  assert stopped == [] and dog.limit("evaluation") == 5.0
  with dog.phase("evaluation", 20):
    clock.now += 4.9
    dog.check()
    assert stopped == []
    clock.now += 0.2
    dog.check()
  assert len(stopped) == 1
  assert "no progress in the evaluation of step 20 for 5 s (limit 5 s" in stopped[0]
  assert "run the same command to resume" in stopped[0]


def test_the_derived_limit_grows_with_the_longest_occurrence_of_each_phase():
  dog, clock, stopped = _dog(0.0)
  with dog.phase("training step", 1):
    clock.now += 2.0
  assert dog.limit("training step") == watchdog.AUTO_FLOOR
  with dog.phase("checkpoint", 10):
    clock.now += 30.0
  with dog.phase("checkpoint", 20):
    clock.now += 30.0
  assert dog.limit("checkpoint") == watchdog.AUTO_FACTOR * 30.0
  assert dog.limit("evaluation") == watchdog.AUTO_FLOOR + watchdog.COMPILE_ALLOWANCE
  dog.check()  # between phases nothing is watched
  clock.now += 1e6
  dog.check()
  assert stopped == []


@pytest.mark.parametrize("value", [-1.0, float("nan"), float("inf")])
def test_a_bad_step_timeout_is_named(value):
  assert "--step_timeout=" in watchdog.check_timeout(value)
  assert watchdog.check_timeout(0.0) is None and watchdog.check_timeout(2.5) is None


HANG_AT_STEP_20 = textwrap.dedent(
  """
  import runpy, sys, threading

  import jax

  from easgd.infra import checkpoint

  original = checkpoint.Checkpointer.save

  def save(self, state, *args, **kwargs):
    if int(jax.device_get(state.step)) == 20:
      threading.Event().wait()  # never returns: a stuck write
    return original(self, state, *args, **kwargs)

  checkpoint.Checkpointer.save = save
  sys.argv = [sys.argv[1], *sys.argv[2:]]
  runpy.run_path(sys.argv[0], run_name="__main__")
  """
)


@pytest.mark.e2e
def test_a_hung_checkpoint_stops_the_process_and_the_same_command_resumes(tmp_path, small_run):
  script = tmp_path / "hang.py"
  script.write_text(HANG_AT_STEP_20)
  workdir = tmp_path / "run"
  # The run ends at step 20, whose checkpoint hangs; small_run's is the uninterrupted one
  # (in this process, whose thread pool train.py's has: tests/conftest.py).
  run = small_flags({"run.total_steps": 20}, algorithm="sync_easgd")
  # Every phase's limit after its first (which may compile and gets more): a busy
  # machine's evaluation or step results stay well inside it.
  flags = [f"--workdir={workdir}", *run, "--step_timeout=10"]
  hung = Process(str(script), os.path.join(REPO, "train.py"), *flags)
  assert hung.wait(timeout=240) == watchdog.EXIT_HUNG, hung.tail()
  # Checked every second: found 10 s or more after the phase began.
  message = r"no progress in the checkpoint of step 20 for (\d+) s \(limit 10 s"
  found = re.search(message, hung.output())
  assert found and int(found.group(1)) >= 10
  assert hung.output().count("no progress in") == 1  # one line
  assert steps_saved(workdir) == [10]
  resumed = train(workdir, *run)  # the default limits: no hang to catch
  assert resumed.wait(timeout=240) == 0, resumed.tail()
  assert "resumed from the checkpoint of step 10" in resumed.output()
  expected = read_state(small_run("sync_easgd") / "checkpoints" / "20" / "state")
  for a, b in zip(read_state(workdir / "checkpoints" / "20" / "state"), expected, strict=True):
    assert np.array_equal(a, b)
