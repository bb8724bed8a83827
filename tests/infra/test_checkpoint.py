"""Checkpoints: fingerprints, and a corrupt checkpoint set aside for the one before it."""

import json
import logging
import os
import shutil

import jax.numpy as jnp
import numpy as np
import pytest

from easgd.errors import ConfigError, TrainingDiverged
from easgd.infra import checkpoint
from easgd.rules import TrainState
from easgd.train import trainer
from runs import config_with, read_state, small_config, steps_saved


def test_fingerprint_changes_with_any_word_and_with_a_swap():
  tree = {"a": jnp.arange(6, dtype=jnp.float32), "b": jnp.array([1, 2], jnp.int32)}
  base = np.asarray(checkpoint.fingerprint(tree))
  assert base.shape == (2,) and base.dtype == np.uint32
  flipped = {**tree, "a": tree["a"].at[3].set(np.nextafter(np.float32(3), np.float32(4)))}
  assert np.asarray(checkpoint.fingerprint(flipped))[0] != base[0]
  swapped = {**tree, "b": jnp.array([2, 1], jnp.int32)}
  assert np.asarray(checkpoint.fingerprint(swapped))[1] != base[1]
  assert np.array_equal(np.asarray(checkpoint.fingerprint(tree)), base)


def _state(step, worker_value):
  return TrainState(
    step=jnp.array(step, jnp.int32),
    rng=jnp.zeros(2, jnp.uint32),
    center={"w": jnp.ones(3)},
    center_opt=(),
    workers={"w": jnp.array([[1.0, 2.0, 3.0], [1.0, worker_value, 3.0]])},
    worker_opt=(),
    worker_steps=jnp.zeros(2, jnp.int32),
  )


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_a_state_that_is_not_finite_is_never_saved(tmp_path, bad):
  checkpointer = checkpoint.Checkpointer(str(tmp_path))
  config = config_with()
  checkpointer.save(_state(3, 2.0), {}, config)
  refused = r"state after step 7 is not finite \(first in .*workers"
  with pytest.raises(TrainingDiverged, match=refused):
    checkpointer.save(_state(7, bad), {}, config)
  checkpointer.close()
  assert steps_saved(tmp_path) == [3]  # the last finite state stays the newest
  assert os.listdir(tmp_path / "checkpoints") == ["3"]  # nothing half-written either


def test_finite_slots_names_each_slot_that_is_not():
  models = {"w": jnp.array([[1.0, np.nan], [1.0, 2.0], [3.0, 4.0]])}
  tree = (models, jnp.array([[0.0], [1.0], [-np.inf]]))
  assert np.asarray(checkpoint.finite_slots(tree)).tolist() == [False, True, False]


# The tests below train and resume whole runs.
@pytest.fixture
def finished(small_run):
  """A finished sync_easgd run (checkpoints 20, 30, 40 kept) and its final state."""
  workdir = small_run("sync_easgd")
  assert steps_saved(workdir) == [20, 30, 40]
  return workdir, read_state(workdir / "checkpoints" / "40" / "state")


def _copy(source, target):
  shutil.copytree(source, target)
  return target


def _largest_file(directory):
  files = [os.path.join(root, name) for root, _, names in os.walk(directory) for name in names]
  return max(files, key=os.path.getsize)


def _truncate(path):
  with open(path, "r+b") as f:
    f.truncate(os.path.getsize(path) // 2)


def _flip_a_byte(path):
  with open(path, "r+b") as f:
    f.seek(os.path.getsize(path) // 2)
    byte = f.read(1)
    f.seek(-1, os.SEEK_CUR)
    f.write(bytes([byte[0] ^ 0x01]))


# Orbax leaves the reads of a failed restore un-awaited; Python reports them at exit.
@pytest.mark.e2e
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
@pytest.mark.parametrize(
  "damage,problem",
  [(_truncate, "it cannot be read"), (_flip_a_byte, "its arrays differ from the fingerprint")],
)
def test_a_corrupt_checkpoint_is_set_aside_and_the_one_before_resumed(
  tmp_path, caplog, finished, damage, problem
):
  caplog.set_level(logging.INFO, logger="absl")
  source, final = finished
  workdir = _copy(source, tmp_path / "run")
  damage(_largest_file(workdir / "checkpoints" / "40" / "state"))
  result = trainer.train_and_evaluate(small_config(algorithm="sync_easgd"), str(workdir))
  warnings = [r.getMessage() for r in caplog.records if "is corrupt" in r.getMessage()]
  assert len(warnings) == 1 and "the checkpoint of step 40 is corrupt: " + problem in warnings[0]
  assert os.path.isdir(workdir / "corrupt_checkpoints" / "40")
  assert any("resumed from the checkpoint of step 30" in r.getMessage() for r in caplog.records)
  # Steps 30 to 40 trained again: the same state as the run that was never damaged.
  assert result.metrics["eval/center_accuracy"] > 0
  again = read_state(workdir / "checkpoints" / "40" / "state")
  for x, y in zip(again, final, strict=True):
    assert np.array_equal(x, y)


@pytest.mark.e2e
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
def test_no_intact_checkpoint_is_one_clear_error(tmp_path, finished):
  source, _ = finished
  workdir = _copy(source, tmp_path / "run")
  for step in (20, 30, 40):
    _truncate(_largest_file(workdir / "checkpoints" / str(step) / "state"))
  with pytest.raises(ConfigError, match=r"no checkpoint in .* is intact \(steps 40, 30, 20"):
    trainer.train_and_evaluate(small_config(algorithm="sync_easgd"), str(workdir))
  assert sorted(os.listdir(workdir / "corrupt_checkpoints")) == ["20", "30", "40"]


def test_saved_revision_reads_the_newest_checkpoint_and_counts_none_as_the_first(tmp_path):
  assert checkpoint.saved_revision(str(tmp_path)) is None
  for step, revision in ((10, None), (20, 7)):
    folder = tmp_path / "checkpoints" / str(step)
    (folder / "config").mkdir(parents=True)
    (folder / "config" / "metadata").write_text(json.dumps({"algorithm": "sync_measgd"}))
    if revision is not None:
      (folder / "revision").mkdir()
      (folder / "revision" / "metadata").write_text(json.dumps({"revision": revision}))
    assert checkpoint.saved_revision(str(tmp_path)) == (revision or 1)


@pytest.mark.e2e
def test_a_checkpoint_records_this_versions_revision(finished):
  workdir, _ = finished
  assert checkpoint.saved_revision(str(workdir)) == checkpoint.REVISION
