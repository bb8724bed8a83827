"""Writes records folders (easgd.data.records) from a dataset or a folder of images.

    python -m easgd.data.convert --dataset cifar10 --data_dir TFDS_DIR --out DIR
    python -m easgd.data.convert --folder IMAGES --side 160 --out DIR

The first converts any registered dataset (a TFDS one must be prepared in
TFDS_DIR); the second a folder of image files laid out as
IMAGES/{train,test}/CLASS/NAME.{png,jpg,jpeg} (classes in sorted order become
labels 0, 1, ...; images resized so that their shorter side is `side`, then
centre-cropped). Train with `--config.data.dataset=records
--config.run.data_dir=DIR`. The folder is written under a temporary name and
renamed when complete: a stopped or failed conversion leaves no folder that
a run could read half of.
"""

import json
import os
import shutil
import sys

import numpy as np

from easgd.data.records import FORMAT, META, SPLITS, encode, file_of
from easgd.errors import ConfigError

_IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg")


class _Statistics:
  """Per-channel mean and standard deviation of images in [0, 1], accumulated."""

  def __init__(self, channels: int, max_value: float):
    self.total = np.zeros(channels)
    self.squares = np.zeros(channels)
    self.count = 0
    self.max_value = max_value

  def add(self, images: np.ndarray) -> None:
    scaled = images.reshape(-1, images.shape[-1]).astype(np.float64) / self.max_value
    self.total += scaled.sum(axis=0)
    self.squares += (scaled**2).sum(axis=0)
    self.count += len(scaled)

  def values(self) -> tuple[list[float], list[float]]:
    mean = self.total / self.count
    std = np.sqrt(np.maximum(self.squares / self.count - mean**2, 0.0))
    return mean.tolist(), std.tolist()


def write(out: str, splits: dict, num_classes: int, max_value: float, chunk: int = 1024) -> None:
  """Writes a records folder at `out` (which must not exist).

  Args:
    splits: {"train": (images, labels), "test": (images, labels)}, where images
      is an [N, H, W, C] uint8 array (or a column read by index arrays) and
      labels an [N] integer array.
  """
  out = os.path.normpath(os.path.abspath(out))
  staging = os.path.join(os.path.dirname(out), f".{os.path.basename(out)}.partial")
  shutil.rmtree(staging, ignore_errors=True)  # our own leftover of a stopped conversion
  os.makedirs(staging)
  try:
    _write_splits(staging, splits, num_classes, max_value, chunk)
    os.rename(staging, out)
  except BaseException:
    shutil.rmtree(staging, ignore_errors=True)  # nothing half-written is left
    raise


def _write_splits(staging: str, splits: dict, num_classes: int, max_value: float, chunk: int):
  from array_record.python.array_record_module import ArrayRecordWriter  # noqa: PLC0415

  image_shape = tuple(int(n) for n in splits["train"][0].shape[1:])
  statistics = _Statistics(image_shape[-1], max_value)
  counts = {}
  for split in SPLITS:
    images, labels = splits[split]
    writer = ArrayRecordWriter(file_of(staging, split), "group_size:1")
    for start in range(0, len(labels), chunk):
      rows = np.arange(start, min(start + chunk, len(labels)))
      batch_images = np.asarray(images[rows], np.uint8)
      batch_labels = np.asarray(labels[rows])
      if split == "train":
        statistics.add(batch_images)
      for image, label in zip(batch_images, batch_labels, strict=True):
        writer.write(encode(image, int(label)))
    writer.close()
    counts[split] = len(labels)
  mean, std = statistics.values()
  meta = {
    "format": FORMAT,
    "image_shape": list(image_shape),
    "num_classes": int(num_classes),
    "train_examples": counts["train"],
    "test_examples": counts["test"],
    "max_value": float(max_value),
    "mean": mean,
    "std": std,
  }
  with open(os.path.join(staging, META), "w") as f:
    json.dump(meta, f, indent=2)


def _read_image(path: str, side: int) -> np.ndarray:
  from PIL import Image  # noqa: PLC0415

  from easgd.data.datasets import resize_and_crop  # noqa: PLC0415

  try:
    with Image.open(path) as picture:
      image = np.asarray(picture.convert("RGB"), np.uint8)
  except (OSError, ValueError) as error:  # PIL's UnidentifiedImageError is an OSError
    raise ConfigError(f"{path} cannot be read as an image ({type(error).__name__})") from None
  return resize_and_crop(image, side)


class _FolderImages:
  """A split of an image folder as a column: decoded when its rows are read."""

  def __init__(self, paths: list[str], side: int):
    self._paths, self._side = paths, side
    self.shape = (len(paths), side, side, 3)

  def __len__(self) -> int:
    return len(self._paths)

  def __getitem__(self, rows) -> np.ndarray:
    return np.stack([_read_image(self._paths[int(i)], self._side) for i in rows])


def folder_splits(folder: str, side: int) -> tuple[dict, int]:
  """An image folder's splits ({"train": (images, labels), ...}) and its class count."""
  names = {"train": ("train",), "test": ("test", "val", "validation")}
  found = {}
  for split, candidates in names.items():
    directory = next(
      (os.path.join(folder, c) for c in candidates if os.path.isdir(os.path.join(folder, c))), None
    )
    if directory is None:
      raise ConfigError(f"--folder={folder!r} has no {'/'.join(candidates)} subfolder")
    found[split] = directory
  classes = sorted(
    entry
    for entry in os.listdir(found["train"])
    if os.path.isdir(os.path.join(found["train"], entry))
  )
  if not classes:
    raise ConfigError(f"--folder={folder!r}: {found['train']} has no class subfolders")
  splits = {}
  for split, directory in found.items():
    paths, labels = [], []
    for label, name in enumerate(classes):
      class_dir = os.path.join(directory, name)
      files = sorted(os.listdir(class_dir)) if os.path.isdir(class_dir) else []
      for file in files:
        if file.lower().endswith(_IMAGE_SUFFIXES):
          paths.append(os.path.join(class_dir, file))
          labels.append(label)
    if not paths:
      raise ConfigError(
        f"--folder={folder!r}: {directory} has no {', '.join(_IMAGE_SUFFIXES)} images "
        "in class subfolders"
      )
    splits[split] = (_FolderImages(paths, side), np.array(labels, np.int32))
  return splits, len(classes)


def main(argv=None) -> None:
  from easgd import arguments  # noqa: PLC0415

  parser = arguments.ArgumentParser(description=__doc__.split("\n")[0])
  source = parser.add_mutually_exclusive_group(required=True)
  source.add_argument("--dataset", help="a registered dataset (easgd.data.datasets.DATASETS)")
  source.add_argument(
    "--folder", type=arguments.existing_directory("--folder"), help="an image folder"
  )
  parser.add_argument("--data_dir", default="", help="TFDS data_dir of a TFDS dataset")
  parser.add_argument("--side", type=arguments.integer(1), default=0, help="--folder's image side")
  parser.add_argument("--out", required=True, help="the folder to write; must not exist")
  args = parser.parse_args(argv)
  # Not empty, not the current folder or a parent of it, not in or around what is read.
  arguments.check_workdir(
    args.out, "--out", inputs={"--folder": args.folder, "--data_dir": args.data_dir}
  )
  if os.path.lexists(args.out):
    arguments.fail(f"--out={args.out!r} exists: give a new folder")
  parent = os.path.dirname(os.path.abspath(args.out))
  if not os.path.isdir(parent) or not os.access(parent, os.W_OK):
    arguments.fail(f"--out={args.out!r}: its parent folder does not exist or is not writable")
  try:
    if args.folder:
      if not args.side:
        arguments.fail("--side is required with --folder (the side images are cropped to)")
      splits, num_classes = folder_splits(args.folder, args.side)
      max_value = 255.0
    else:
      from easgd.data import datasets  # noqa: PLC0415

      dataset = datasets.load_dataset(args.dataset, args.data_dir)
      splits = {
        "train": (dataset.train_images, dataset.train_labels),
        "test": (dataset.test_images, dataset.test_labels),
      }
      num_classes, max_value = dataset.num_classes, dataset.max_value
    write(args.out, splits, num_classes, max_value)
  except ConfigError as error:
    arguments.fail(str(error).replace("config.data.dataset", "--dataset"))
  except OSError as error:  # e.g. the disk filled up while writing
    arguments.fail(f"--out={args.out!r} could not be written: {error}")
  print(f"wrote {args.out}", file=sys.stderr)


if __name__ == "__main__":
  main()
