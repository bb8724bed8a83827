"""A run killed at any moment and resumed has the TensorBoard history and the final state
of one never stopped."""

import json
import signal

import numpy as np
import pytest

from easgd.infra import scalars
from runs import read_state, small_flags, train

pytestmark = pytest.mark.e2e  # whole train.py runs, killed and resumed

# Logs every 5 steps and checkpoints every 10, so that a kill right after a
# checkpoint leaves logged steps past it that the resumed run logs again.
FLAGS = small_flags({"run.log_every": 5, "run.eval_every": 10})
CLOCK = "checkpoints/40/clock/metadata"  # the timing model's state at the end


def history(workdir) -> dict[str, list[tuple[int, float]]]:
  """Every scalar tag's (step, value) points as TensorBoard reads them, but the
  wall-clock time, which differs between any two runs."""
  return scalars.without_wall_clock(scalars.read(str(workdir)))


def kill_right_after_checkpoint(workdir, step: int) -> None:
  """Runs the run until it SIGKILLs itself the moment checkpoint `step` is on disk."""
  process = train(workdir, *FLAGS, signal_at=("checkpoint", step))
  assert process.wait(timeout=300) == -signal.SIGKILL, process.tail()


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
  """The run never stopped: its history, its final state and its clock."""
  workdir = tmp_path_factory.mktemp("uninterrupted")
  assert train(workdir, *FLAGS).wait(timeout=300) == 0
  final = read_state(workdir / "checkpoints" / "40" / "state")
  return history(workdir), final, (workdir / CLOCK).read_text()


def _assert_kept_up_to_the_checkpoint(workdir, uninterrupted, killed_after: int) -> None:
  """Nothing of a step up to the last checkpoint before `killed_after` was lost."""
  before = history(workdir)
  checkpoint = killed_after - killed_after % 10
  for tag, points in uninterrupted.items():
    kept = [point for point in points if point[0] <= checkpoint]
    assert before[tag][: len(kept)] == kept, tag


def _resume(workdir, killed_after: int, logged_then_killed: int | None = None) -> None:
  """The same command again: it resumes from the checkpoint the kill left, with steps
  still to train (and SIGKILLs itself once the points of step `logged_then_killed`,
  if given, are on disk: the next resumed run logs that step again)."""
  signal_at = () if logged_then_killed is None else ("event write", logged_then_killed)
  resumed = train(workdir, *FLAGS, signal_at=signal_at)
  checkpoint = killed_after - killed_after % 10
  line = resumed.wait_for(r"resumed from the checkpoint of step (\d+)", 120)
  assert checkpoint <= int(line.group(1)) < 40
  expected = 0 if logged_then_killed is None else -signal.SIGKILL
  assert resumed.wait(timeout=300) == expected, resumed.tail()


def test_history_is_whole_after_a_kill_at_a_checkpoint_then_one_after_a_logged_step(
  tmp_path, uninterrupted
):
  """SIGKILL the moment checkpoint 20 is on disk (the resumed run trains on from it),
  then, in the resumed run, once step 25 was logged and written past checkpoint
  20 (the next resumed run logs that step again): every step once, with the same
  value, and the state and clock of the run never stopped."""
  uninterrupted, final, clock = uninterrupted
  kill_right_after_checkpoint(tmp_path, 20)
  _assert_kept_up_to_the_checkpoint(tmp_path, uninterrupted, 20)
  _resume(tmp_path, 20, logged_then_killed=25)
  _assert_kept_up_to_the_checkpoint(tmp_path, uninterrupted, 25)
  _resume(tmp_path, 25)
  after = history(tmp_path)
  assert set(after) == set(uninterrupted)
  for tag, points in uninterrupted.items():
    assert after[tag] == points, tag  # every step once, with the same value
  # And the state: bit for bit the run never stopped.
  resumed_final = read_state(tmp_path / "checkpoints" / "40" / "state")
  assert len(resumed_final) == len(final) > 10
  for a, b in zip(resumed_final, final, strict=True):
    assert a.dtype == b.dtype and np.array_equal(a, b)
  # The timing model went on where it stopped (and had moved: its time is not 0).
  assert (tmp_path / CLOCK).read_text() == clock and json.loads(clock)["time"] > 0
