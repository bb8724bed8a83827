"""Datasets load offline with fixed splits; TFDS works under its mock and fails fast when absent."""

import socket

import numpy as np
import pytest
import tensorflow_datasets as tfds

from easgd.data import datasets
from easgd.errors import ConfigError


def test_mnist5k_has_the_documented_fixed_split():
  ds = datasets.load_dataset("mnist5k")
  assert ds.train_images.shape == (4000, 28, 28, 1) and ds.train_images.dtype == np.uint8
  assert ds.test_images.shape == (1000, 28, 28, 1)
  assert np.array_equal(np.bincount(ds.train_labels), [400] * 10)
  assert np.array_equal(np.bincount(ds.test_labels), [100] * 10)
  assert ds.train_images.max() == 255 and ds.max_value == 255
  assert 0.1 < ds.mean[0] < 0.2 and 0.25 < ds.std[0] < 0.4
  # The same images every time.
  again = datasets.load_dataset("mnist5k")
  assert np.array_equal(ds.test_images, again.test_images)


def test_digits_is_scaled_by_16():
  ds = datasets.load_dataset("digits")
  assert ds.train_images.shape == (1497, 8, 8, 1) and ds.test_images.shape == (300, 8, 8, 1)
  assert ds.max_value == 16 and ds.train_images.max() == 16


def test_tfds_dataset_loads_under_mock_data():
  with tfds.testing.mock_data(num_examples=48):
    ds = datasets.load_dataset("fashion_mnist")
  assert ds.train_images.shape == (48, 28, 28, 1) and ds.num_classes == 10
  assert ds.test_labels.shape == (48,) and ds.train_labels.dtype == np.int32


@pytest.mark.parametrize("name", ["mnist5k", "digits"])
def test_known_shapes_match_the_loaded_dataset(name):
  ds, shape = datasets.load_dataset(name), datasets.SHAPES[name]
  assert len(ds.train_labels) == shape.train_examples
  assert ds.train_images.shape[1:] == shape.image_shape and ds.num_classes == shape.num_classes


@pytest.mark.parametrize(
  "name", ["mnist", "fashion_mnist", "cifar10", "cifar100", "imagenette", "imagenet2012"]
)
def test_known_shapes_match_tfds(name):
  with tfds.testing.mock_data(num_examples=4):
    ds = datasets.load_dataset(name)
    # ImageNet's images, of varying sizes, are resized and cropped to the known side.
    assert ds.train_images[np.arange(2)].shape[1:] == datasets.SHAPES[name].image_shape
  shape = datasets.SHAPES[name]
  assert ds.train_images.shape[1:] == shape.image_shape and ds.num_classes == shape.num_classes
  assert ds.test_images.shape[1:] == shape.image_shape
  # A records folder carries its own shape (datasets.shape_of reads it).
  assert set(datasets.SHAPES) | {"records"} == set(datasets.DATASETS)


def test_a_varying_image_is_resized_on_its_shorter_side_and_centre_cropped():
  image = np.zeros((40, 80, 3), np.uint8)
  image[:, 20:60] = 255  # the middle half of the width
  out = datasets.resize_and_crop(image, 20)
  # 40x80 -> 20x40, whose middle 20 columns are the white band (its edges
  # blended with the black by the antialiased resize).
  assert out.shape == (20, 20, 3) and out[:, 1:-1].min() == 255 and out.min() > 128
  assert datasets.resize_and_crop(out, 20) is out
  gray = datasets.resize_and_crop(np.full((30, 10, 1), 7, np.uint8), 5)
  assert gray.shape == (5, 5, 1) and np.all(gray == 7)


def test_absent_tfds_dataset_fails_fast_and_says_how_to_get_it(tmp_path, monkeypatch):
  # Fast: it asks nothing of the network (where a download would begin).
  asked = []

  def offline(*args, **kwargs):
    asked.append(args)
    raise OSError("this test has no network")

  monkeypatch.setattr(socket, "getaddrinfo", offline)
  monkeypatch.setattr(socket.socket, "connect", offline)
  with pytest.raises(ConfigError, match=r"not prepared .*tfds build cifar10"):
    datasets.load_dataset("cifar10", str(tmp_path))
  assert asked == []


def test_unknown_dataset_lists_the_valid_names():
  with pytest.raises(
    ConfigError,
    match="valid: cifar10, cifar100, digits, fashion_mnist, imagenet2012, imagenette, mnist, "
    "mnist5k, records",
  ):
    datasets.load_dataset("imagenet")
