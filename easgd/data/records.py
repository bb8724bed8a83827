"""A dataset as a folder of array_record files, read by index without loading it.

easgd.data.convert writes such folders from any registered dataset or from a
folder of image files (`python -m easgd.data.convert`); train with
`--config.data.dataset=records --config.run.data_dir=DIR`.

The folder holds `train.array_record` and `test.array_record`, one record an
example: the image's H*W*C uint8 pixels, row-major, then its label as a
little-endian int32. Pixels are stored raw, not PNG or JPEG: a streamed run
reads a record and reshapes it, with no decoding on the host's hot path
(ImageNet's JPEGs are decoded once, when converting). `dataset.json` gives
the shape, classes, counts and the training set's per-channel statistics.
Records are written with group_size 1, so that any one is read without its
neighbours (array_record's setting for random access).
"""

import json
import os
import threading

import numpy as np

from easgd.data.dataset import Dataset, Shape
from easgd.errors import ConfigError

FORMAT = "easgd-records/1"
META = "dataset.json"
SPLITS = ("train", "test")
_LABEL_BYTES = 4
# Training sets up to this size are read whole once before a run, to check them.
FULL_CHECK_BYTES = 2**30


def file_of(directory: str, split: str) -> str:
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
  """One split of a records folder, read by index."""

  def __init__(self, directory: str, split: str, meta: dict):
    image_shape, count = meta["image_shape"], meta[f"{split}_examples"]
    self.num_classes = meta["num_classes"]
    self.path = file_of(directory, split)
    self.image_shape = tuple(image_shape)
    self._image_bytes = int(np.prod(image_shape))
    self._last = LastRead()
    self._readers = threading.local()
    try:
      self._count = self._reader().num_records()
    except Exception as error:  # noqa: BLE001 (array_record raises several kinds)
      raise self._unreadable(error) from None
    if self._count != count:
      raise ConfigError(
        f"config.run.data_dir={directory!r}: {self.path} holds {self._count} records, "
        f"{META} says {count}; convert the dataset again"
      )

  def __len__(self) -> int:
    return self._count

  def _reader(self):
    """This thread's own array_record reader of the file (grain's threads read in
    parallel). grain's ArrayRecordDataSource starts a thread pool at every call,
    which cost more than reading a batch of small records: 2x the host's time."""
    reader = getattr(self._readers, "reader", None)
    if reader is None:
      from array_record.python.array_record_module import ArrayRecordReader  # noqa: PLC0415

      reader = self._readers.reader = ArrayRecordReader(self.path, "readahead_buffer_size:0")
    return reader

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
      raw = self._reader().read(flat)
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
      "`python -m easgd.data.convert --dataset NAME --out DIR` (or --folder IMAGES)"
    )
  path = os.path.join(directory, META)
  try:
    with open(path) as f:
      meta = json.load(f)
  except FileNotFoundError:
    raise ConfigError(
      f"{where} has no {META}: it is not a folder written by `python -m easgd.data.convert`"
    ) from None
  except (OSError, ValueError) as error:
    raise ConfigError(f"{where}: {META} cannot be read ({error})") from None
  if not isinstance(meta, dict) or meta.get("format") != FORMAT:
    raise ConfigError(f"{where}: {META} is not of format {FORMAT!r}; convert the dataset again")
  wrong = _wrong_meta(meta)
  if wrong:
    raise ConfigError(f"{where}: {META} {wrong}; convert the dataset again")
  for split in SPLITS:
    if not os.path.isfile(file_of(directory, split)):
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
  """The folder's Shape, from its metadata alone."""
  meta = read_meta(directory)
  return Shape(meta["train_examples"], tuple(meta["image_shape"]), meta["num_classes"])


def load(directory: str):
  """The folder as a Dataset: the training set read lazily, the test set whole. A
  record that is not what the metadata says is refused."""
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
