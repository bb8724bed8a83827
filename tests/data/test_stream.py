"""Streamed input (easgd.data.stream) and records folders (easgd.data.records):
the same batches as on the devices, bit for bit; bad input. (A streamed run killed
and resumed: tests/infra/test_distributed.py.)"""

import json
import logging
import os
import subprocess
import sys

import jax
import numpy as np
import pytest

from easgd.data import convert, datasets, records, stream
from easgd.errors import ConfigError
from easgd.train import trainer
from runs import REPO, small_config

# A generated dataset larger than the budget the tests set: 3,000 training
# images of 12x12x3 (4 workers: 750 each, 324 KB a partition).
SIDE, TRAIN, TEST, CLASSES = 12, 3000, 200, 10
BUDGET = 200_000  # bytes: a device's partition does not fit, a step's batches do


def _generated(seed: int = 0):
  """Images whose mean colour depends on their label, so that a model can learn them."""
  rng = np.random.default_rng(seed)

  def split(count):
    labels = rng.integers(0, CLASSES, count).astype(np.int32)
    noise = rng.integers(0, 24, (count, SIDE, SIDE, 3))
    images = (noise + 23 * labels[:, None, None, None]).astype(np.uint8)
    return images, labels

  return {"train": split(TRAIN), "test": split(TEST)}


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
  out = str(tmp_path_factory.mktemp("data") / "generated")
  convert.write(out, _generated(), CLASSES, 255.0)
  return out


def _records_config(folder, source, algorithm="sync_easgd", **overrides):
  return small_config(
    {
      "data.dataset": "records",
      "run.data_dir": folder,
      "data.source": source,
      "data.device_budget": BUDGET,
      "data.augment": "crop_flip",
      "run.total_steps": 40,
      **overrides,
    },
    algorithm=algorithm,
  )


def _leaves(result):
  return [np.asarray(leaf) for leaf in jax.tree.leaves(jax.device_get(result.state))]


def test_a_records_folder_reads_back_what_was_written(folder):
  written = _generated()
  dataset = datasets.load_dataset("records", folder)
  rows = np.array([[5, 0], [2999, 17]])
  assert np.array_equal(dataset.train_images[rows], written["train"][0][rows])
  assert np.array_equal(dataset.train_labels[rows], written["train"][1][rows])
  assert np.array_equal(dataset.test_images, written["test"][0])
  assert np.array_equal(dataset.test_labels, written["test"][1])
  assert datasets.shape_of("records", folder) == datasets.Shape(TRAIN, (SIDE, SIDE, 3), CLASSES)
  scaled = written["train"][0].astype(np.float64) / 255
  assert np.allclose(dataset.mean, scaled.mean(axis=(0, 1, 2)))
  assert np.allclose(dataset.std, scaled.std(axis=(0, 1, 2)))


def test_auto_places_what_fits_and_streams_what_does_not(folder):
  config = _records_config(folder, "auto")
  shape = (SIDE, SIDE, 3)
  # 4 workers on 4 devices: a partition of 750 examples of 436 bytes each.
  placed = stream.choose(config.data, shape, TRAIN, 4, 4)
  assert placed.source == "stream" and placed.device_bytes == 750 * (SIDE * SIDE * 3 + 4)
  assert "exceed data.device_budget" in placed.reason
  config.data.device_budget = placed.device_bytes
  assert stream.choose(config.data, shape, TRAIN, 4, 4).source == "device"
  config.data.device_budget = placed.batch_bytes - 1
  with pytest.raises(ConfigError, match=r"data.device_budget=.* is below one step's batches"):
    stream.choose(config.data, shape, TRAIN, 4, 4)


@pytest.mark.e2e
@pytest.mark.parametrize("algorithm", ["async_easgd"])
def test_streamed_and_placed_runs_end_bitwise_equal(folder, tmp_path, algorithm, caplog):
  """The same config read from disk as it trains, or placed on the devices first:
  the same batches, augmentation and state. async_easgd's workers sit out ticks,
  so a worker's batch must follow its own step count; two workers share each
  device (sync_easgd's streamed run is compared with a placed one below,
  through a kill and a resume)."""
  caplog.set_level(logging.INFO)
  streamed = trainer.train_and_evaluate(
    _records_config(folder, "auto", algorithm, **{"run.devices": 2}), str(tmp_path / "s")
  )
  assert "training data: stream (a device's partitions" in caplog.text  # auto chose it
  placed = trainer.train_and_evaluate(
    _records_config(folder, "device", algorithm, **{"run.devices": 2}), str(tmp_path / "d")
  )
  assert "training data: device (data.source=device)" in caplog.text
  a, b = _leaves(streamed), _leaves(placed)
  assert len(a) == len(b) > 5
  assert all(x.dtype == y.dtype and np.array_equal(x, y) for x, y in zip(a, b, strict=True))
  assert streamed.metrics["eval/center_accuracy"] > 0.2  # above chance (0.1): it learns


@pytest.mark.e2e
def _copy_with(folder, tmp_path, change):
  broken = tmp_path / "broken"
  subprocess.run(["cp", "-r", folder, str(broken)], check=True)
  change(str(broken))
  return str(broken)


def _rewrite_train(directory, records_list):
  from array_record.python.array_record_module import ArrayRecordWriter  # noqa: PLC0415

  writer = ArrayRecordWriter(os.path.join(directory, "train.array_record"), "group_size:1")
  for record in records_list:
    writer.write(record)
  writer.close()


def _bad_folders():
  good = records.encode(np.zeros((SIDE, SIDE, 3), np.uint8), 1)

  def no_files(directory):
    os.remove(os.path.join(directory, "train.array_record"))

  def no_meta(directory):
    os.remove(os.path.join(directory, "dataset.json"))

  def other_format(directory):
    path = os.path.join(directory, "dataset.json")
    with open(path) as f:
      meta = json.load(f)
    meta["format"] = "something/2"
    with open(path, "w") as f:
      json.dump(meta, f)

  def short_record(directory):
    _rewrite_train(directory, [good] * 1000 + [good[:-7]] + [good] * (TRAIN - 1001))

  def cut_file(directory):
    path = os.path.join(directory, "train.array_record")
    with open(path, "rb") as f:
      data = f.read()
    with open(path, "wb") as f:
      f.write(data[: len(data) // 2])

  def missing_records(directory):
    _rewrite_train(directory, [good] * 100)

  def edit_meta(key, value):
    def edit(directory):
      path = os.path.join(directory, "dataset.json")
      with open(path) as f:
        meta = json.load(f)
      if value is None:
        del meta[key]
      else:
        meta[key] = value
      with open(path, "w") as f:
        json.dump(meta, f)

    return edit

  def label_outside(directory):
    wrong = records.encode(np.zeros((SIDE, SIDE, 3), np.uint8), 57)
    _rewrite_train(directory, [good] * 10 + [wrong] + [good] * (TRAIN - 11))

  return {
    "label_outside": (label_outside, r"record 10 of .* label 57 is outside \[0, 10\)"),
    "no_mean": (edit_meta("mean", None), "has mean=None: it must be 3 numbers >= 0"),
    "short_std": (edit_meta("std", [0.1]), "has std=\\[0.1\\]: it must be 3 numbers > 0"),
    "classes_text": (edit_meta("num_classes", "ten"), "has num_classes='ten'"),
    "flat_shape": (edit_meta("image_shape", [12, 12]), "has image_shape=\\[12, 12\\]"),
    "no_max": (edit_meta("max_value", 0), "has max_value=0: it must be a number > 0"),
    "no_files": (no_files, "has no train.array_record"),
    "no_meta": (no_meta, "has no dataset.json"),
    "other_format": (other_format, "is not of format"),
    "short_record": (short_record, "record 1000 of .* is malformed: 429 bytes, expected 436"),
    # array_record finds no index at the end of a cut file: it reads as empty.
    "cut_file": (cut_file, "train.array_record holds 0 records, dataset.json says 3000"),
    "missing_records": (missing_records, "holds 100 records, dataset.json says 3000"),
  }


@pytest.mark.parametrize("case", sorted(_bad_folders()))
def test_a_broken_records_folder_is_refused_in_one_line_before_anything_is_written(
  folder, tmp_path, case
):
  change, message = _bad_folders()[case]
  broken = _copy_with(folder, tmp_path, change)
  workdir = tmp_path / "run"
  with pytest.raises(ConfigError, match=message) as error:
    trainer.train_and_evaluate(_records_config(broken, "stream"), str(workdir))
  assert "\n" not in str(error.value)
  assert not workdir.exists()


@pytest.mark.parametrize(
  "overrides,message",
  [
    ({"data.source": "disk"}, "config.data.source='disk' is invalid: valid: device, stream, auto"),
    ({"data.device_budget": 0}, "config.data.device_budget=0.0 is invalid"),
    ({"data.device_budget": 4000}, "is below one step's batches of a device"),
    (
      {"data.source": "stream", "algorithm": "pipeline"},
      "the pipeline runtime reads its batches from partitions kept on the devices and cannot",
    ),
    (
      {"data.source": "stream", "algorithm": "async_easgd", "runtime": "threads"},
      r"the threads runtime .* cannot stream .*; use data.source=device or runtime=simulated$",
    ),
  ],
)
def test_bad_stream_settings_are_refused_before_anything_is_written(tmp_path, overrides, message):
  workdir = tmp_path / "run"
  with pytest.raises(ConfigError, match=message):
    trainer.train_and_evaluate(small_config(overrides), str(workdir))
  assert not workdir.exists()


def test_an_empty_data_dir_is_no_records_folder(tmp_path):
  with pytest.raises(ConfigError, match="has no dataset.json"):
    datasets.load_dataset("records", str(tmp_path))


def _convert(*args):
  return subprocess.run(
    [sys.executable, "-m", "easgd.data.convert", *args],
    cwd=REPO,
    capture_output=True,
    text=True,
    timeout=120,
    check=False,
  )


def test_an_image_folder_converts_to_records(tmp_path):
  from PIL import Image  # noqa: PLC0415

  rng = np.random.default_rng(0)
  for split, count in (("train", 3), ("val", 2)):
    for name in ("cat", "dog"):
      os.makedirs(tmp_path / "images" / split / name)
      for i in range(count):
        size = (int(rng.integers(10, 30)), int(rng.integers(10, 30)))
        pixels = rng.integers(0, 256, (*size, 3), np.uint8)
        Image.fromarray(pixels).save(tmp_path / "images" / split / name / f"{i}.png")
  out = tmp_path / "out"
  result = _convert("--folder", str(tmp_path / "images"), "--side", "8", "--out", str(out))
  assert result.returncode == 0, result.stderr
  dataset = datasets.load_dataset("records", str(out))
  assert dataset.train_images.shape == (6, 8, 8, 3) and dataset.num_classes == 2
  assert dataset.train_labels[np.arange(6)].tolist() == [0, 0, 0, 1, 1, 1]
  assert dataset.test_labels.tolist() == [0, 0, 1, 1]
  # Bad input: one line, exit 2, nothing written.
  again = _convert("--folder", str(tmp_path / "images"), "--side", "8", "--out", str(out))
  assert again.returncode == 2 and "exists: give a new folder" in again.stderr
  empty = tmp_path / "empty"
  os.makedirs(empty / "train")
  os.makedirs(empty / "test")
  refused = _convert("--folder", str(empty), "--side", "8", "--out", str(tmp_path / "o2"))
  assert refused.returncode == 2 and "has no class subfolders" in refused.stderr
  assert not (tmp_path / "o2").exists()
  # A file that is no image: named in one line, and no folder, partial or whole, is left.
  (tmp_path / "images" / "train" / "dog" / "broken.png").write_bytes(b"not a png")
  broken = _convert(
    "--folder", str(tmp_path / "images"), "--side", "8", "--out", str(tmp_path / "o4/")
  )
  assert broken.returncode == 2 and "broken.png cannot be read as an image" in broken.stderr
  assert len(broken.stderr.strip().splitlines()) == 1
  assert sorted(os.listdir(tmp_path)) == ["empty", "images", "out"]
  assert (
    _convert("--folder", str(tmp_path / "images"), "--out", str(tmp_path / "o3")).returncode == 2
  )
