"""A dataset as a folder of array_record files, read by index without loading it.

    python -m easgd.data.records --dataset cifar10 --data_dir TFDS_DIR --out DIR
    python -m easgd.data.records --folder IMAGES --side 160 --out DIR

The first converts any registered dataset (a TFDS one must be prepared in
TFDS_DIR); the second a folder of image files laid out as
IMAGES/{train,test}/CLASS/NAME.{png,jpg,jpeg} (classes in sorted order become
labels 0, 1, ...; images resized so that their shorter side is `side`, then
centre-cropped). Train with `--config.data.dataset=records
--config.run.data_dir=DIR`.

The folder holds `train.array_record` and `test.array_record`, one record an
example: the image's H*W*C uint8 pixels, row-major, then its label as a
little-endian int32. Pixels are stored raw, not PNG or JPEG: a streamed run
reads a record and reshapes it, with no decoding on the host's hot path
(ImageNet's JPEGs are decoded once, here). `dataset.json` gives the shape,
classes, counts and the training set's per-channel statistics. Records are
written with group_size 1, so that any one is read without its neighbours
(array_record's setting for random access). The folder is written under a
temporary name and renamed when complete: a stopped conversion leaves no
folder that a run could read half of.
"""

import json
import os
import shutil
import sys
import threading

import numpy as np

from easgd.errors import ConfigError

FORMAT = "easgd-records/1"
META = "dataset.json"
SPLITS = ("train", "test")
_LABEL_BYTES = 4
# Training sets up to this size are read whole once before a run, to check them.
FULL_CHECK_BYTES = 2**30
_IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg")


def _file(directory: str, split: str) -> str:
  return os.path.join(directory, f"{split}.array_record")


class LastRead:
  """The last rows a thread read, kept for the next call: images and labels of
  the same rows are asked for one after the other. One per thread, so that
  readers in several threads (easgd.data.stream) neither share nor evict it."""

  def __init__(self):
    self._local = threading.local()

  def get(self, indices: np.ndarray, read):
    """read(indices), or what this thread's last call with the same indices returned."""
    key = (indices.shape, indices.tobytes())
    last = getattr(self._local, "last", None)
    if last is None or last[0] != key:
      last = (key, read(indices))
      self._local.last = last
    return last[1]


def encode(image: np.ndarray, label: int) -> bytes:
  """One record: the uint8 pixels, then the label (int32, little-endian)."""
  return np.ascontiguousarray(image, np.uint8).tobytes() + np.int32(label).astype("<i4").tobytes()


class RecordSplit:
  """One split of a records folder, read by index (grain's ArrayRecordDataSource)."""

  def __init__(self, directory: str, split: str, meta: dict):
    import grain  # noqa: PLC0415 (only records folders need it)

    image_shape, count = meta["image_shape"], meta[f"{split}_examples"]
    self.num_classes = meta["num_classes"]

    self.path = _file(directory, split)
    self.image_shape = tuple(image_shape)
    self._image_bytes = int(np.prod(image_shape))
    try:
      self._source = grain.sources.ArrayRecordDataSource([self.path])
    except Exception as error:  # noqa: BLE001 (array_record raises several kinds)
      raise self._unreadable(error) from None
    self._last = LastRead()
    if len(self._source) != count:
      raise ConfigError(
        f"config.run.data_dir={directory!r}: {self.path} holds {len(self._source)} records, "
        f"{META} says {count}; convert the dataset again"
      )

  def __len__(self) -> int:
    return len(self._source)

  @property
  def record_bytes(self) -> int:
    return self._image_bytes + _LABEL_BYTES

  def read(self, indices) -> tuple[np.ndarray, np.ndarray]:
    """Images [len(indices), H, W, C] uint8 and labels [len(indices)] int32."""
    return self._last.get(np.asarray(indices, np.int64).ravel(), self._read)

  def _unreadable(self, error: Exception) -> ConfigError:
    return ConfigError(
      f"{self.path} cannot be read as array_record ({type(error).__name__}: "
      f"{str(error).splitlines()[0] if str(error) else 'no message'}); convert the dataset again"
    )

  def check(self, chunk: int = 4096) -> None:
    """Reads every record once: a malformed one is refused before training."""
    for start in range(0, len(self), chunk):
      self._read(np.arange(start, min(start + chunk, len(self))))

  def _read(self, indices: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    flat = indices.tolist()
    try:
      raw = self._source.__getitems__(flat)
    except Exception as error:  # noqa: BLE001 (array_record raises several kinds)
      raise self._unreadable(error) from None
    size = self.record_bytes
    for index, record in zip(flat, raw, strict=True):
      if len(record) != size:
        raise ConfigError(
          f"record {index} of {self.path} is malformed: {len(record)} bytes, "
          f"expected {size} (an image of {self.image_shape} and a label); convert the dataset again"
        )
    table = np.frombuffer(b"".join(raw), np.uint8).reshape(len(flat), size)
    images = table[:, : self._image_bytes].reshape(len(flat), *self.image_shape)
    labels = table[:, self._image_bytes :].copy().view("<i4").reshape(len(flat))
    wrong = np.flatnonzero((labels < 0) | (labels >= self.num_classes))
    if wrong.size:
      raise ConfigError(
        f"record {flat[wrong[0]]} of {self.path} is malformed: label {labels[wrong[0]]} is "
        f"outside [0, {self.num_classes}) ({META}'s num_classes); convert the dataset again"
      )
    return images, labels.astype(np.int32)


class RecordColumn:
  """One column of a records split as a read-only array: `column[indices]`
  (an integer array of any shape) reads only those records."""

  def __init__(self, split: RecordSplit, column: int):
    self._split = split
    self._column = column
    self.shape = (len(split), *split.image_shape) if column == 0 else (len(split),)
    self.dtype = np.dtype(np.uint8 if column == 0 else np.int32)

  def __len__(self) -> int:
    return self.shape[0]

  def __getitem__(self, indices) -> np.ndarray:
    indices = np.asarray(indices, np.int64)
    values = self._split.read(indices.ravel())[self._column]
    return values.reshape(indices.shape + values.shape[1:])


def read_meta(directory: str) -> dict:
  """The folder's metadata, checked; ConfigError naming what is missing or wrong."""
  where = f"config.run.data_dir={directory!r}"
  if not directory or not os.path.isdir(directory):
    raise ConfigError(
      f"{where} is not a folder of records; write one with "
      "`python -m easgd.data.records --dataset NAME --out DIR` (or --folder IMAGES)"
    )
  path = os.path.join(directory, META)
  try:
    with open(path) as f:
      meta = json.load(f)
  except FileNotFoundError:
    raise ConfigError(
      f"{where} has no {META}: it is not a folder written by `python -m easgd.data.records`"
    ) from None
  except (OSError, ValueError) as error:
    raise ConfigError(f"{where}: {META} cannot be read ({error})") from None
  if not isinstance(meta, dict) or meta.get("format") != FORMAT:
    raise ConfigError(f"{where}: {META} is not of format {FORMAT!r}; convert the dataset again")
  wrong = _wrong_meta(meta)
  if wrong:
    raise ConfigError(f"{where}: {META} {wrong}; convert the dataset again")
  for split in SPLITS:
    if not os.path.isfile(_file(directory, split)):
      raise ConfigError(f"{where} has no {split}.array_record; convert the dataset again")
  return meta


def _wrong_meta(meta: dict) -> str | None:
  """What is wrong with a metadata dict's values, or None."""

  def count(value, low=1):
    return isinstance(value, int) and not isinstance(value, bool) and value >= low

  def positive(value):
    return (
      isinstance(value, (int, float)) and not isinstance(value, bool) and 0 < value < float("inf")
    )

  shape = meta.get("image_shape")
  if not (isinstance(shape, list) and len(shape) == 3 and all(count(n) for n in shape)):
    return f"has image_shape={shape!r}: it must be [height, width, channels] of integers >= 1"
  for key in ("num_classes", "train_examples", "test_examples"):
    if not count(meta.get(key)):
      return f"has {key}={meta.get(key)!r}: it must be an integer >= 1"
  if not positive(meta.get("max_value")):
    return f"has max_value={meta.get('max_value')!r}: it must be a number > 0"
  for key, low in (("mean", 0.0), ("std", None)):
    values = meta.get(key)
    ok = isinstance(values, list) and len(values) == shape[2]
    ok = ok and all(
      positive(v) or (low is not None and isinstance(v, (int, float)) and v == low) for v in values
    )
    if not ok:
      kind = "numbers >= 0" if low is not None else "numbers > 0"
      return f"has {key}={values!r}: it must be {shape[2]} {kind}, one a channel"
  return None


def shape(directory: str):
  """The folder's easgd.data.datasets.Shape, from its metadata alone."""
  from easgd.data.datasets import Shape  # noqa: PLC0415 (datasets imports this module)

  meta = read_meta(directory)
  return Shape(meta["train_examples"], tuple(meta["image_shape"]), meta["num_classes"])


def load(directory: str):
  """The folder as an easgd.data.datasets.Dataset: the training set read lazily,
  the test set whole. A record that is not what the metadata says is refused."""
  from easgd.data.datasets import Dataset  # noqa: PLC0415 (datasets imports this module)

  meta = read_meta(directory)
  train = RecordSplit(directory, "train", meta)
  test = RecordSplit(directory, "test", meta)
  # Every record is checked before training where that reads at most
  # FULL_CHECK_BYTES; a larger set has its ends checked, and a malformed record
  # met while training stops the run with the same one line (exit 2).
  if len(train) * (train.record_bytes) <= FULL_CHECK_BYTES:
    train.check()
  else:
    train.read([0, len(train) - 1])
  test_images, test_labels = test.read(np.arange(len(test)))
  return Dataset(
    name="records",
    train_images=RecordColumn(train, 0),
    train_labels=RecordColumn(train, 1),
    test_images=test_images,
    test_labels=test_labels,
    num_classes=meta["num_classes"],
    max_value=float(meta["max_value"]),
    mean=tuple(meta["mean"]),
    std=tuple(meta["std"]),
  )


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
  except BaseException:
    shutil.rmtree(staging, ignore_errors=True)  # nothing half-written is left
    raise
  os.rename(staging, out)


def _write_splits(staging: str, splits: dict, num_classes: int, max_value: float, chunk: int):
  from array_record.python.array_record_module import ArrayRecordWriter  # noqa: PLC0415

  image_shape = tuple(int(n) for n in splits["train"][0].shape[1:])
  statistics = _Statistics(image_shape[-1], max_value)
  counts = {}
  for split in SPLITS:
    images, labels = splits[split]
    writer = ArrayRecordWriter(_file(staging, split), "group_size:1")
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
  source.add_argument("--folder", type=arguments.directory("--folder"), help="an image folder")
  parser.add_argument("--data_dir", default="", help="TFDS data_dir of a TFDS dataset")
  parser.add_argument("--side", type=arguments.integer(1), default=0, help="--folder's image side")
  parser.add_argument("--out", required=True, help="the folder to write; must not exist")
  args = parser.parse_args(argv)
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
