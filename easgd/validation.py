"""Checks of a configuration before anything is compiled or written."""

import json

import ml_collections

from easgd import augment
from easgd.algorithms import (
  ELASTIC_RULES,
  MOMENTUM_RULES,
  OPTIONAL_MOMENTUM_RULES,
  RULES,
  SERVER_OPTIMIZERS,
)
from easgd.cluster import ALLREDUCES
from easgd.data import DATASETS
from easgd.errors import ConfigError
from easgd.model_state import BATCH_STATS_CHOICES
from models import BATCH_NORM_MODELS, MODELS

# Rules whose momentum step may be Nesterov's.
NESTEROV_RULES = frozenset({"sync_sgd", "sync_measgd", "async_measgd"})

# Fields a checkpoint may be resumed with under other values: they change how
# long the run goes on, what it reports, or where it runs, not the trajectory.
RESUMABLE_FIELDS = frozenset(
  {"total_steps", "eval_every", "checkpoint_every", "log_every", "devices", "data_dir"}
  | {"cluster.device_memory", "cluster.device_flops"}  # read by the planner only
)


def _require(ok: bool, field: str, value, allowed: str) -> None:
  if not ok:
    raise ConfigError(f"config.{field}={value!r} is invalid: {allowed}")


def _is_int(value) -> bool:
  return isinstance(value, int) and not isinstance(value, bool)


PIPELINE = "pipeline"
ALGORITHMS = (*RULES, PIPELINE)
PER_MODEL_FIELDS = ("learning_rate", "momentum", "weight_decay", "seed")


def validate(config: ml_collections.ConfigDict) -> None:
  """Raises ConfigError naming the first field that is out of range."""
  for field, registry in (("algorithm", ALGORITHMS), ("model", MODELS), ("dataset", DATASETS)):
    value = config[field]
    _require(value in registry, field, value, f"valid: {', '.join(sorted(registry))}")
  _require(
    _is_int(config.batch_size) and config.batch_size >= 1,
    "batch_size",
    config.batch_size,
    "must be an integer >= 1 (examples per worker per step)",
  )
  _require(config.learning_rate > 0, "learning_rate", config.learning_rate, "must be > 0")
  _require(0 <= config.momentum < 1, "momentum", config.momentum, "must be in [0, 1)")
  for field in ("total_steps",):
    _require(_is_int(config[field]) and config[field] >= 1, field, config[field], "must be >= 1")
  for field in ("eval_every", "checkpoint_every", "log_every"):
    _require(
      _is_int(config[field]) and config[field] >= 0,
      field,
      config[field],
      "must be an integer >= 0 (0: only at the end)",
    )
  _require(_is_int(config.seed), "seed", config.seed, "must be an integer")
  _require(config.weight_decay >= 0, "weight_decay", config.weight_decay, "must be >= 0")
  _require(
    config.batch_stats in BATCH_STATS_CHOICES,
    "batch_stats",
    config.batch_stats,
    f"valid: {', '.join(BATCH_STATS_CHOICES)} (BatchNorm statistics: "
    "averaged into the center like parameters, or kept by each worker)",
  )
  _require(
    config.augment in augment.CHOICES,
    "augment",
    config.augment,
    f"valid: {', '.join(augment.CHOICES)}",
  )
  if config.algorithm == PIPELINE:
    _validate_pipeline(config)
  else:
    _validate_rule(config)


def _require_spread(config: ml_collections.ConfigDict, field: str) -> None:
  """config.<field> (workers or models) is >= 1 and config.devices divides it."""
  count, devices = config[field], config.devices
  _require(_is_int(count) and count >= 1, field, count, "must be an integer >= 1")
  _require(
    _is_int(devices) and devices >= 0, "devices", devices, f"must be >= 1, or 0 for min({field}, 8)"
  )
  _require(
    devices == 0 or count % devices == 0,
    "devices",
    devices,
    f"must divide config.{field}={count} (each device holds {field}/devices {field})",
  )


def _validate_pipeline(config: ml_collections.ConfigDict) -> None:
  models = config.models
  _require_spread(config, "models")
  stage_steps = config.stage_steps
  _require(
    _is_int(stage_steps) and stage_steps >= 1,
    "stage_steps",
    stage_steps,
    "must be an integer >= 1 (steps on one partition before the models move)",
  )
  for field in PER_MODEL_FIELDS:
    values = config.per_model[field]
    _require(
      isinstance(values, (tuple, list)) and len(values) in (0, models),
      f"per_model.{field}",
      values,
      f"must be () or a tuple of config.models={models} values",
    )
  checks = {
    "learning_rate": (lambda v: v > 0, "every value must be > 0"),
    "momentum": (lambda v: 0 <= v < 1, "every value must be in [0, 1)"),
    "weight_decay": (lambda v: v >= 0, "every value must be >= 0"),
    "seed": (_is_int, "every value must be an integer"),
  }
  for field, (ok, allowed) in checks.items():
    values = config.per_model[field]
    _require(
      all(not isinstance(v, bool) and isinstance(v, (int, float)) and ok(v) for v in values),
      f"per_model.{field}",
      values,
      allowed,
    )


def _validate_rule(config: ml_collections.ConfigDict) -> None:
  """The fields of the rules with workers and a center."""
  workers = config.workers
  _require_spread(config, "workers")
  algorithm = config.algorithm
  if algorithm in MOMENTUM_RULES:
    _require(
      0 < config.momentum < 1,
      "momentum",
      config.momentum,
      f"{algorithm} needs a momentum in (0, 1)",
    )
  elif algorithm not in OPTIONAL_MOMENTUM_RULES:
    with_momentum = ", ".join(sorted(MOMENTUM_RULES | OPTIONAL_MOMENTUM_RULES))
    _require(
      config.momentum == 0,
      "momentum",
      config.momentum,
      f"{algorithm} takes no momentum (momentum 0); rules with momentum: {with_momentum}",
    )
  _require(
    not config.nesterov or algorithm in NESTEROV_RULES,
    "nesterov",
    config.nesterov,
    f"{algorithm} has no Nesterov form; rules with one: {', '.join(sorted(NESTEROV_RULES))}",
  )
  _require(
    _is_int(config.n_sync) and config.n_sync >= 1,
    "n_sync",
    config.n_sync,
    "must be an integer >= 1 (downpour's local steps between push and fetch)",
  )
  _require(
    config.server_optimizer in SERVER_OPTIMIZERS,
    "server_optimizer",
    config.server_optimizer,
    f"valid: {', '.join(SERVER_OPTIMIZERS)}",
  )
  validate_cluster(config.cluster, workers)
  if config.algorithm in ELASTIC_RULES:
    tau, alpha = config.comm_period, config.moving_rate
    _require(_is_int(tau) and tau >= 1, "comm_period", tau, "must be an integer >= 1")
    _require(0 < alpha < 1, "moving_rate", alpha, "must be in (0, 1)")
    _require(
      workers * alpha < 1,
      "moving_rate",
      alpha,
      f"beta = workers*moving_rate = {workers * alpha:g} must be < 1, "
      f"i.e. moving_rate < {1 / workers:g}",
    )
  _require(
    not (
      algorithm == "sync_sgd"
      and config.batch_stats == "local"
      and config.model in BATCH_NORM_MODELS
    ),
    "batch_stats",
    config.batch_stats,
    f"sync_sgd's workers share one model, so {config.model}'s BatchNorm statistics "
    "are averaged ('averaged'); 'local' needs a rule whose workers have models of their own",
  )
  for field in PER_MODEL_FIELDS:
    values = config.per_model[field]
    _require(
      not values, f"per_model.{field}", values, "only the pipeline has per-model values (())"
    )


def validate_cluster(cluster: ml_collections.ConfigDict, workers: int) -> None:
  """The timing model: positive times and bandwidth, stragglers among the workers."""

  def require(ok, field, allowed):
    _require(ok, f"cluster.{field}", cluster[field], allowed)

  def number(value):
    return isinstance(value, (int, float)) and not isinstance(value, bool)

  require(number(cluster.compute_time) and cluster.compute_time > 0, "compute_time", "must be > 0")
  for field in ("speed_spread", "jitter", "latency", "master_time"):
    require(number(cluster[field]) and cluster[field] >= 0, field, "must be >= 0")
  require(
    number(cluster.bandwidth) and cluster.bandwidth > 0, "bandwidth", "must be > 0 (bytes/second)"
  )
  require(
    number(cluster.straggler_slowdown) and cluster.straggler_slowdown >= 1,
    "straggler_slowdown",
    "must be >= 1 (how many times slower a straggler is)",
  )
  require(_is_int(cluster.servers) and cluster.servers >= 1, "servers", "must be an integer >= 1")
  require(
    number(cluster.server_bandwidth) and cluster.server_bandwidth > 0,
    "server_bandwidth",
    "must be > 0 (bytes/second; inf: the servers' links are not modelled)",
  )
  require(cluster.allreduce in ALLREDUCES, "allreduce", f"must be one of {', '.join(ALLREDUCES)}")
  for field in ("device_memory", "device_flops"):
    require(number(cluster[field]) and cluster[field] >= 0, field, "must be >= 0 (0: not given)")
  stragglers = cluster.stragglers
  require(
    isinstance(stragglers, (tuple, list))
    and all(_is_int(i) and 0 <= i < workers for i in stragglers)
    and len(set(stragglers)) == len(stragglers),
    "stragglers",
    f"must be distinct worker indices in [0, {workers}), e.g. (3,) or (0, 5)",
  )


def validate_partition(config: ml_collections.ConfigDict, train_examples: int, parts: int) -> None:
  """The batch must fit in each partition of the training set (a worker's or a device's)."""
  per_part = train_examples // parts
  owner = "device" if config.algorithm == PIPELINE else "worker"
  _require(
    config.batch_size <= per_part,
    "batch_size",
    config.batch_size,
    f"must be <= {per_part}, the examples in each {owner}'s partition "
    f"({train_examples} {config.dataset} training examples over {parts} {owner}s)",
  )


def flatten(values: dict, prefix: str = "") -> dict:
  """{"cluster": {"latency": 1}} -> {"cluster.latency": 1}, through JSON (tuples become lists)."""
  flat = {}
  for key, value in json.loads(json.dumps(values)).items():
    if isinstance(value, dict):
      flat.update(flatten(value, f"{prefix}{key}."))
    else:
      flat[prefix + key] = value
  return flat


def check_resumable(saved: dict, config: ml_collections.ConfigDict, workdir: str) -> None:
  """A workdir's checkpoint may only be resumed by the configuration that wrote it."""
  saved, current = flatten(saved), flatten(config.to_dict())
  for field in sorted(set(saved) | set(current)):
    if field in RESUMABLE_FIELDS:
      continue
    if saved.get(field) != current.get(field):
      raise ConfigError(
        f"workdir {workdir!r} holds a checkpoint of another configuration "
        f"(config.{field} is {saved.get(field)!r} there, {current.get(field)!r} here); "
        "use another --workdir or the same configuration"
      )
