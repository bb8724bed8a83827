"""Checkpoints: fingerprints, and a corrupt checkpoint set aside for the one before it."""

import logging
import os
import shutil

import jax.numpy as jnp
import numpy as np
import pytest

from easgd import trainer
from easgd.errors import ConfigError
from easgd.infra import checkpoint
from runs import read_state, small_config, steps_saved


def test_fingerprint_changes_with_any_word_and_with_a_swap():
  tree = {"a": jnp.arange(6, dtype=jnp.float32), "b": jnp.array([1, 2], jnp.int32)}
  base = np.asarray(checkpoint.fingerprint(tree))
  assert base.shape == (2,) and base.dtype == np.uint32
  flipped = {**tree, "a": tree["a"].at[3].set(np.nextafter(np.float32(3), np.float32(4)))}
  assert np.asarray(checkpoint.fingerprint(flipped))[0] != base[0]
  swapped = {**tree, "b": jnp.array([2, 1], jnp.int32)}
  assert np.asarray(checkpoint.fingerprint(swapped))[1] != base[1]
  assert np.array_equal(np.asarray(checkpoint.fingerprint(tree)), base)


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
