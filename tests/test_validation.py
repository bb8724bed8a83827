"""Every bad input is named in one line with what is allowed."""

import importlib

import pytest

import models
from configs import default
from easgd import data, validation
from easgd.errors import ConfigError


def config_with(**overrides):
  config = default.get_config()
  config.update(overrides)
  return config


@pytest.mark.parametrize(
  "overrides,message",
  [
    ({"algorithm": "easgd"}, r"config.algorithm='easgd' .*valid: async_easgd, .*sync_sgd"),
    ({"model": "resnet"}, r"config.model='resnet' .*valid: alexnet, lenet5"),
    ({"dataset": "svhn"}, r"config.dataset='svhn' .*valid: cifar10, cifar100, digits"),
    ({"workers": 8, "devices": 3}, r"config.devices=3 .*must divide config.workers=8"),
    ({"comm_period": 0}, r"config.comm_period=0 .*integer >= 1"),
    ({"moving_rate": 0.0}, r"config.moving_rate=0.0 .*\(0, 1\)"),
    ({"moving_rate": 1.5}, r"config.moving_rate=1.5 .*\(0, 1\)"),
    ({"moving_rate": 0.125}, r"config.moving_rate=0.125 .*beta = workers\*moving_rate = 1"),
    ({"momentum": 0.9}, r"config.momentum=0.9 .*sync_easgd takes no momentum"),
    ({"algorithm": "async_sgd", "momentum": 0.9}, r"config.momentum=0.9 .*async_sgd takes no"),
    ({"algorithm": "async_msgd"}, r"config.momentum=0.0 .*async_msgd needs a momentum"),
    ({"algorithm": "async_msgd", "momentum": 0.9, "nesterov": True}, r"config.nesterov=True"),
    ({"algorithm": "downpour", "n_sync": 0}, r"config.n_sync=0 .*integer >= 1"),
    ({"server_optimizer": "adam"}, r"config.server_optimizer='adam' .*valid: sgd, adagrad"),
    ({"algorithm": "sync_measgd"}, r"config.momentum=0.0 .*sync_measgd needs a momentum"),
    ({"learning_rate": -1.0}, r"config.learning_rate=-1.0 .*> 0"),
    ({"batch_size": 0}, r"config.batch_size=0 .*>= 1"),
    ({"total_steps": 0}, r"config.total_steps=0 .*>= 1"),
    ({"workers": 0}, r"config.workers=0 .*>= 1"),
    ({"augment": "mixup"}, r"config.augment='mixup' .*valid: none, crop_flip"),
    ({"weight_decay": -0.1}, r"config.weight_decay=-0.1 .*>= 0"),
    (
      {"algorithm": "sync_sgd", "model": "resnet20", "batch_stats": "local"},
      r"config.batch_stats='local' .*sync_sgd's workers share one model",
    ),
    (
      {"algorithm": "pipeline", "models": 6, "devices": 4},
      r"config.devices=4 is invalid: must divide config.models=6",
    ),
    (
      {"algorithm": "pipeline", "per_model": {"learning_rate": (0.1, 0.2)}},
      r"config.per_model.learning_rate=\(0.1, 0.2\) is invalid: must be \(\) or a tuple of",
    ),
  ],
)
def test_bad_fields_are_named_with_their_valid_range(overrides, message):
  with pytest.raises(ConfigError, match=message) as error:
    validation.validate(config_with(**overrides))
  assert "\n" not in str(error.value)


@pytest.mark.parametrize(
  "field,value,message",
  [
    ("compute_time", 0.0, r"config.cluster.compute_time=0.0 .*> 0"),
    ("latency", -1e-3, r"config.cluster.latency=-0.001 .*>= 0"),
    ("master_time", -1.0, r"config.cluster.master_time=-1.0 .*>= 0"),
    ("jitter", -0.1, r"config.cluster.jitter=-0.1 .*>= 0"),
    ("bandwidth", 0.0, r"config.cluster.bandwidth=0.0 .*> 0 \(bytes/second\)"),
    ("straggler_slowdown", 0.5, r"config.cluster.straggler_slowdown=0.5 .*>= 1"),
    ("stragglers", (8,), r"config.cluster.stragglers=\(8,\) .*indices in \[0, 8\)"),
    ("stragglers", (2, 2), r"config.cluster.stragglers=\(2, 2\) .*distinct"),
    ("servers", 0, r"config.cluster.servers=0 .*integer >= 1"),
    ("server_bandwidth", 0.0, r"config.cluster.server_bandwidth=0.0 .*> 0"),
    ("allreduce", "star", r"config.cluster.allreduce='star' .*one of ring, tree"),
    ("device_memory", -1.0, r"config.cluster.device_memory=-1.0 .*>= 0"),
    ("device_flops", -1.0, r"config.cluster.device_flops=-1.0 .*>= 0"),
  ],
)
def test_bad_timing_model_is_named(field, value, message):
  config = default.get_config()
  config.cluster[field] = value
  with pytest.raises(ConfigError, match=message) as error:
    validation.validate(config)
  assert "\n" not in str(error.value)


def test_sync_sgd_ignores_the_elastic_fields():
  validation.validate(config_with(algorithm="sync_sgd", comm_period=0, moving_rate=0.0))


def test_default_config_is_valid():
  validation.validate(default.get_config())
  # batch_stats only matters for models with BatchNorm.
  validation.validate(config_with(algorithm="sync_sgd", batch_stats="local"))


@pytest.mark.parametrize("name", ["cifar10_resnet20", "cifar10_vgg11", "cifar10_alexnet"])
def test_cifar_configs_are_valid_and_their_batches_fit(name):
  config = importlib.import_module(f"configs.{name}").get_config()
  validation.validate(config)
  shape = data.SHAPES[config.dataset]
  validation.validate_partition(config, shape.train_examples, config.workers)
  assert config.augment == "crop_flip" and config.model in models.MODELS


def test_batch_must_fit_a_workers_partition():
  with pytest.raises(ConfigError, match=r"config.batch_size=600 .*<= 500"):
    validation.validate_partition(config_with(batch_size=600), train_examples=4000, parts=8)


def test_resuming_with_another_configuration_is_refused():
  saved = default.get_config().to_dict()
  validation.check_resumable(saved, config_with(total_steps=5000, devices=2), "w")
  with pytest.raises(ConfigError, match=r"config.learning_rate is 0.1 there, 0.2 here"):
    validation.check_resumable(saved, config_with(learning_rate=0.2), "w")


def test_resuming_names_a_changed_timing_model_field():
  saved = default.get_config().to_dict()
  changed = default.get_config()
  changed.cluster.stragglers = (3,)
  with pytest.raises(ConfigError, match=r"config.cluster.stragglers is \[\] there, \[3\] here"):
    validation.check_resumable(saved, changed, "w")
