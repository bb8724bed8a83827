"""What a dataset is to the rest of the package: its arrays (`Dataset`), and their
shape known without loading them (`Shape`). The loaders (easgd.data.datasets,
easgd.data.records) make them."""

import dataclasses

import numpy as np


@dataclasses.dataclass(frozen=True)
class Dataset:
  """A labelled image dataset.

  Attributes:
    name: registry name.
    train_images, test_images: uint8 [N, H, W, C]; the training images may be
      a lazy column (TFDS) that reads only the rows it is indexed with.
    train_labels, test_labels: int32 [N], the same.
    num_classes: number of labels.
    max_value: the value of a white pixel (255, or 16 for `digits`).
    mean, std: per-channel statistics of the training images scaled to [0, 1];
      inputs are normalised on the device as (image/max_value - mean)/std.
  """

  name: str
  train_images: np.ndarray
  train_labels: np.ndarray
  test_images: np.ndarray
  test_labels: np.ndarray
  num_classes: int
  max_value: float
  mean: tuple[float, ...]
  std: tuple[float, ...]


@dataclasses.dataclass(frozen=True)
class Shape:
  """What a dataset's arrays look like, known without loading it."""

  train_examples: int
  image_shape: tuple[int, int, int]
  num_classes: int
