"""Every bad input is named in one line with what is allowed."""

import importlib
import json

import pytest

from easgd import models
from easgd.config import hyperparameters, validation
from easgd.configs import default
from easgd.data import datasets
from easgd.errors import ConfigError
from easgd.infra import checkpoint
from runs import config_with


@pytest.mark.parametrize(
  "overrides,message",
  [
    ({"algorithm": "easgd"}, r"config.algorithm='easgd' .*valid: async_easgd, .*sync_sgd"),
    ({"model": "resnet"}, r"config.model='resnet' .*valid: alexnet, alexnet_imagenet, lenet5"),
    ({"data.dataset": "svhn"}, r"config.data.dataset='svhn' .*valid: cifar10, cifar100, digits"),
    ({"workers": 8, "run.devices": 3}, r"config.run.devices=3 .*must divide config.workers=8"),
    ({"outer.comm_period": 0}, r"config.outer.comm_period=0 .*integer >= 1"),
    ({"outer.moving_rate": -0.1}, r"config.outer.moving_rate=-0.1 .*\(0, 1\)"),
    ({"outer.moving_rate": 1.5}, r"config.outer.moving_rate=1.5 .*\(0, 1\)"),
    (
      {"outer.moving_rate": 0.125},
      r"config.outer.moving_rate=0.125 .*beta = workers\*moving_rate = 1",
    ),
    (
      {"algorithm": "hogwild_sgd", "optimizer.momentum": 0.9},
      r"config.optimizer.momentum=0.9 .*hogwild_sgd takes no momentum",
    ),
    (
      {"algorithm": "async_sgd", "optimizer.momentum": 0.9},
      r"config.optimizer.momentum=0.9 .*async_sgd takes no",
    ),
    ({"algorithm": "async_msgd"}, r"config.optimizer.momentum=0.0 .*async_msgd needs a momentum"),
    (
      {"algorithm": "async_msgd", "optimizer.momentum": 0.9, "optimizer.nesterov": True},
      r"config.optimizer.nesterov=True",
    ),
    ({"algorithm": "downpour", "downpour.n_sync": 0}, r"config.downpour.n_sync=0 .*integer >= 1"),
    (
      {"downpour.server_optimizer": "adam"},
      r"config.downpour.server_optimizer='adam' .*valid: sgd, adagrad",
    ),
    ({"algorithm": "sync_measgd"}, r"config.optimizer.momentum=0.0 .*sync_measgd needs a momentum"),
    ({"optimizer.learning_rate": -1.0}, r"config.optimizer.learning_rate=-1.0 .*> 0"),
    ({"data.batch_size": 0}, r"config.data.batch_size=0 .*>= 1"),
    ({"run.total_steps": 0}, r"config.run.total_steps=0 .*>= 1"),
    ({"workers": 0}, r"config.workers=0 .*>= 1"),
    ({"seed": -1}, r"config.seed=-1 .*integer in \[0, 2\*\*32\)"),
    ({"data.augment": "mixup"}, r"config.data.augment='mixup' .*valid: none, crop_flip"),
    ({"optimizer.weight_decay": -0.1}, r"config.optimizer.weight_decay=-0.1 .*>= 0"),
    (
      {"algorithm": "sync_sgd", "model": "resnet20", "outer.batch_stats": "local"},
      r"config.outer.batch_stats='local' .*sync_sgd's workers share one model",
    ),
    (
      {"algorithm": "pipeline", "pipeline.models": 6, "run.devices": 4},
      r"config.run.devices=4 is invalid: must divide config.pipeline.models=6",
    ),
    (
      {"algorithm": "pipeline", "pipeline.per_model.learning_rate": (0.1, 0.2)},
      r"config.pipeline.per_model.learning_rate=\(0.1, 0.2\) is invalid: must be \(\) or a tuple",
    ),
  ],
)
def test_bad_fields_are_named_with_their_valid_range(overrides, message):
  with pytest.raises(ConfigError, match=message) as error:
    validation.validate(config_with(overrides))
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
    # One slowdown a straggler (the default has none), each a number >= 1.
    (
      "straggler_slowdowns",
      (2.0,),
      r"straggler_slowdowns=\(2.0,\) .*stragglers first",
    ),
    ("straggler_slowdowns", (0.5,), r"config.cluster.straggler_slowdowns=\(0.5,\) .*>= 1"),
    ("straggler_slowdowns", ("x",), r"config.cluster.straggler_slowdowns=\('x',\) .*numbers"),
    ("servers", 0, r"config.cluster.servers=0 .*integer >= 1"),
    ("server_bandwidth", 0.0, r"config.cluster.server_bandwidth=0.0 .*> 0"),
    ("allreduce", "star", r"config.cluster.allreduce='star' .*one of ring, tree"),
    ("device.memory", -1.0, r"config.device.memory=-1.0 .*>= 0"),
    ("device.flops", -1.0, r"config.device.flops=-1.0 .*>= 0"),
  ],
)
def test_bad_timing_model_is_named(field, value, message):
  config = default.get_config()
  config.update_from_flattened_dict({field if "." in field else f"cluster.{field}": value})
  with pytest.raises(ConfigError, match=message) as error:
    validation.validate(config)
  assert "\n" not in str(error.value)


def test_sync_sgd_checks_the_elastic_fields_but_not_their_combination():
  # beta = 8 * 0.5 >= 1 matters only to a rule that pulls with it.
  validation.validate(config_with({"outer.moving_rate": 0.5}, algorithm="sync_sgd"))
  with pytest.raises(ConfigError, match=r"config.outer.comm_period=0 is invalid"):
    validation.validate(config_with({"outer.comm_period": 0}, algorithm="sync_sgd"))


def test_default_config_is_valid():
  validation.validate(default.get_config())
  # batch_stats only matters for models with BatchNorm.
  validation.validate(config_with({"outer.batch_stats": "local"}, algorithm="sync_sgd"))


@pytest.mark.parametrize(
  "name", ["cifar10_resnet20", "cifar10_resnet20_diloco", "cifar10_vgg11", "cifar10_alexnet"]
)
def test_cifar_configs_are_valid_and_their_batches_fit(name):
  config = importlib.import_module(f"easgd.configs.{name}").get_config()
  validation.validate(config)
  shape = datasets.SHAPES[config.data.dataset]
  validation.validate_partition(config, shape.train_examples, config.workers)
  assert config.data.augment == "crop_flip" and config.model in models.MODELS


@pytest.mark.parametrize(
  "name", ["imagenet2012_resnet50", "imagenette_resnet50", "imagenet2012_alexnet"]
)
def test_imagenet_configs_are_valid_and_their_batches_fit(name):
  config = importlib.import_module(f"easgd.configs.{name}").get_config()
  validation.validate(config)
  shape = datasets.SHAPES[config.data.dataset]
  validation.validate_partition(config, shape.train_examples, config.workers)
  assert config.model in models.MODELS and config.dtype in models.DTYPES
  # The planner's step time needs a FLOP rate; the recipe's momentum and decay are the papers'.
  assert config.device.flops > 0 and config.device.memory > 0
  assert config.optimizer.momentum == 0.9 and config.optimizer.weight_decay in (1e-4, 5e-4)


def test_batch_must_fit_a_workers_partition():
  with pytest.raises(ConfigError, match=r"config.data.batch_size=600 .*<= 500"):
    validation.validate_partition(
      config_with({"data.batch_size": 600}), train_examples=4000, parts=8
    )


def test_resuming_with_another_configuration_is_refused():
  saved = default.get_config().to_dict()
  validation.check_resumable(
    saved, config_with({"run.total_steps": 5000, "run.devices": 2}), "w", checkpoint.REVISION
  )
  with pytest.raises(ConfigError, match=r"config.optimizer.learning_rate is 0.1 there, 0.2 here"):
    validation.check_resumable(
      saved, config_with({"optimizer.learning_rate": 0.2}), "w", checkpoint.REVISION
    )


def test_resuming_names_a_changed_timing_model_field():
  saved = default.get_config().to_dict()
  changed = default.get_config()
  changed.cluster.stragglers = (3,)
  with pytest.raises(ConfigError, match=r"config.cluster.stragglers is \[\] there, \[3\] here"):
    validation.check_resumable(saved, changed, "w", checkpoint.REVISION)


@pytest.mark.parametrize(
  "field,message",
  [
    ("learning_rate", "config.learning_rate is now config.optimizer.learning_rate"),
    ("cluster.device_memory", "config.cluster.device_memory is now config.device.memory"),
    ("optimizer.learnig_rate", "config.optimizer.learnig_rate does not exist"),
  ],
)
def test_a_field_that_does_not_exist_is_named_not_ignored(field, message):
  # As a config file would set it: ml_collections lets a file add fields.
  config = default.get_config()
  group, _, name = field.rpartition(".")
  (config[group] if group else config)[name] = 0.5
  with pytest.raises(ConfigError, match=message):
    validation.validate(config)


def test_a_checkpoint_of_the_flat_config_resumes_under_the_grouped_names():
  flat = {"cluster": {}}
  for field, value in hyperparameters.flatten(default.get_config().to_dict()).items():
    sources = [
      o for o, new in hyperparameters.MOVED.items() if field == new or field.startswith(new + ".")
    ]
    old = sources[0] if sources else None
    name = old + field[len(hyperparameters.MOVED[old]) :] if old else field
    flat_group, _, key = name.rpartition(".")
    target = flat
    for part in flat_group.split(".") if flat_group else []:
      target = target.setdefault(part, {})
    target[key] = value
  assert "learning_rate" in flat and "device_memory" in flat["cluster"]
  validation.check_resumable(flat, default.get_config(), "w", checkpoint.REVISION)
  flat["learning_rate"] = 0.2
  with pytest.raises(ConfigError, match=r"config.optimizer.learning_rate is 0.2 there, 0.1 here"):
    validation.check_resumable(flat, default.get_config(), "w", checkpoint.REVISION)


def test_a_checkpoint_of_an_earlier_version_is_named_as_such():
  """A config without a field that shapes this run: its state has another structure too."""
  saved = hyperparameters.flatten(default.get_config().to_dict())
  del saved["optimizer.name"], saved["outer.exchange_dtype"]
  with pytest.raises(
    ConfigError, match=r"earlier version, whose config has no config.optimizer.name"
  ):
    validation.check_resumable(saved, default.get_config(), "w", checkpoint.REVISION)
  # A field the run does not read may be missing: sync_sgd has no outer optimizer.
  del saved["outer.learning_rate"]
  saved.update(
    {"optimizer.name": "sgd", "outer.exchange_dtype": "float32", "algorithm": "sync_sgd"}
  )
  validation.check_resumable(saved, config_with(algorithm="sync_sgd"), "w", checkpoint.REVISION)


def test_a_checkpoint_from_before_dtype_resumes_in_float32():
  saved = hyperparameters.flatten(default.get_config().to_dict())
  del saved["dtype"]
  validation.check_resumable(saved, default.get_config(), "w", checkpoint.REVISION)
  with pytest.raises(ConfigError, match=r"config.dtype is 'float32' there, 'bfloat16' here"):
    validation.check_resumable(saved, config_with(dtype="bfloat16"), "w", checkpoint.REVISION)


def test_a_checkpoint_from_before_deterministic_sums_resumes_with_them_off():
  saved = hyperparameters.flatten(default.get_config().to_dict())
  del saved["deterministic_sums"]
  validation.check_resumable(saved, default.get_config(), "w", checkpoint.REVISION)
  with pytest.raises(ConfigError, match=r"config.deterministic_sums is False there, True here"):
    validation.check_resumable(
      saved, config_with(deterministic_sums=True), "w", checkpoint.REVISION
    )


def test_a_nesterov_measgd_checkpoint_from_before_eamsgds_form_is_named_as_such():
  nesterov = {"optimizer.momentum": 0.9, "optimizer.nesterov": True}
  for algorithm in ("sync_measgd", "async_measgd"):
    config = config_with(nesterov, algorithm=algorithm)
    with pytest.raises(
      ConfigError,
      match=rf"checkpoint of {algorithm} written by an earlier version: its Nesterov step took "
      r"the gradient at x_i .*use another --workdir",
    ):
      validation.check_resumable(config.to_dict(), config, "w", 1)
    validation.check_resumable(config.to_dict(), config, "w", checkpoint.REVISION)
  # Classic momentum, and other rules' Nesterov (optax's form), train as before.
  classic = config_with({"optimizer.momentum": 0.9}, algorithm="async_measgd")
  validation.check_resumable(classic.to_dict(), classic, "w", 1)
  easgd = config_with(nesterov, algorithm="sync_easgd")
  validation.check_resumable(easgd.to_dict(), easgd, "w", 1)


def test_another_configuration_is_named_before_the_revision(tmp_path):
  """A checkpoint of another rule is that, whatever its revision; a workdir's
  checkpoint without a revision is the first one's."""
  nesterov = config_with({"optimizer.momentum": 0.9, "optimizer.nesterov": True})
  nesterov.algorithm = "sync_measgd"
  with pytest.raises(ConfigError, match=r"config.algorithm is 'sync_easgd' there"):
    validation.check_resumable(default.get_config().to_dict(), nesterov, "w", 1)
  folder = tmp_path / "checkpoints" / "10" / "config"
  folder.mkdir(parents=True)
  (folder / "metadata").write_text(json.dumps(nesterov.to_dict()))
  with pytest.raises(ConfigError, match=r"written by an earlier version"):
    validation.check_checkpoint(nesterov, str(tmp_path))
  assert validation.check_checkpoint(nesterov, str(tmp_path / "elsewhere")) is None


@pytest.mark.parametrize(
  "overrides,message",
  [
    (
      {"algorithm": "sync_sgd", "outer.exchange_dtype": "int4"},
      "config.outer.exchange_dtype='int4' is invalid: sync_sgd sends float32, bfloat16, int8; "
      "rules that send int4: sync_easgd, sync_measgd, diloco, local_sgd, lookahead, "
      "streaming_diloco, streaming_easgd",
    ),
    (
      {"algorithm": "diloco", "outer.error_feedback": True},
      "config.outer.error_feedback=True is invalid: float32 exchanges drop nothing to feed "
      "back: set outer.exchange_dtype to one that compresses (bfloat16, int8, int4, int2)",
    ),
    (
      {"algorithm": "async_easgd", "outer.exchange_dtype": "int8", "outer.error_feedback": True},
      "config.outer.error_feedback=True is invalid: async_easgd has no error feedback (leave "
      "it False); rules that read it: sync_easgd, sync_measgd, diloco, local_sgd, lookahead, "
      "streaming_diloco, streaming_easgd",
    ),
    (
      {"algorithm": "diloco", "outer.fragments": 2},
      "config.outer.fragments=2 is invalid: diloco has no fragments: it does not stream its "
      "exchanges (leave it 1); rules that read it: streaming_diloco, streaming_easgd",
    ),
    (
      {"algorithm": "streaming_easgd", "outer.merge": 0.5},
      "config.outer.merge=0.5 is invalid: streaming_easgd has no merge (leave it 1.0); "
      "rules that read it: streaming_diloco",
    ),
    (
      {"algorithm": "streaming_diloco", "outer.fragments": 3},
      "config.outer.fragments=3 is invalid: must divide outer.comm_period = 4",
    ),
    (
      {"algorithm": "streaming_diloco", "outer.sync_delay": 4},
      "config.outer.sync_delay=4 is invalid: must be below outer.comm_period = 4",
    ),
    (
      {"algorithm": "streaming_diloco", "outer.merge": 0.0},
      "config.outer.merge=0.0 is invalid: must be in (0, 1]",
    ),
  ],
)
def test_the_streaming_and_exchange_fields_are_refused_where_they_cannot_apply(overrides, message):
  with pytest.raises(ConfigError) as refused:
    validation.validate(config_with(overrides))
  assert str(refused.value).startswith(message)


@pytest.mark.parametrize(
  "overrides,message",
  [
    (
      {"outer.dynamic_local_steps": True},
      "config.outer.dynamic_local_steps=True is invalid: sync_easgd has no dynamic local "
      "steps (leave it False); rules that read it: async_local_sgd",
    ),
    (
      {"algorithm": "diloco", "outer.momentum_period": 8},
      "config.outer.momentum_period=8 is invalid: diloco has no Delayed Nesterov master "
      "(leave it 1); rules that read it: async_local_sgd",
    ),
    (
      {"algorithm": "async_easgd", "outer.dynamic_local_steps": True},
      "config.outer.dynamic_local_steps=True is invalid: async_easgd has no dynamic local "
      "steps (leave it False)",
    ),
    (
      {"algorithm": "downpour", "outer.momentum_activation": 0.1},
      "config.outer.momentum_activation=0.1 is invalid: downpour has no Delayed Nesterov master",
    ),
    (
      {
        "algorithm": "async_local_sgd",
        "outer.momentum_period": 4,
        "outer.momentum_activation": 0.5,
      },
      "config.outer.momentum_activation=0.5 is invalid: must be in [0, 1/outer.momentum_period] "
      "= [0, 0.25]",
    ),
    (
      {"algorithm": "async_local_sgd", "outer.nesterov": False},
      "config.outer.nesterov=False is invalid: async_local_sgd's master is Delayed Nesterov",
    ),
    (
      {"algorithm": "async_local_sgd", "outer.momentum_period": 0},
      "config.outer.momentum_period=0 is invalid: must be an integer >= 1",
    ),
  ],
)
def test_async_local_sgds_fields_are_refused_where_they_cannot_apply(overrides, message):
  with pytest.raises(ConfigError) as refused:
    validation.validate(config_with(overrides))
  assert str(refused.value).startswith(message)


@pytest.mark.parametrize(
  "field,value",
  [
    ("outer.fragments", 2),
    ("outer.sync_delay", 1),
    ("outer.merge", 0.5),
    ("outer.momentum_period", 8),
    ("outer.momentum_activation", 0.1),
    ("outer.dynamic_local_steps", True),
  ],
)
def test_the_pipeline_refuses_the_exchange_fields_it_has_no_use_for(field, value):
  with pytest.raises(ConfigError) as refused:
    validation.validate(config_with({"algorithm": "pipeline", field: value}))
  assert str(refused.value).startswith(f"config.{field}={value!r} is invalid: pipeline has no ")
