"""Checks of a configuration before anything is compiled or written.

What a rule accepts comes from the rule class itself (`easgd.rules.Rule`'s
declarations); which fields may change on resume from `easgd.config.schema`.
"""

import math
import os

import ml_collections

from easgd.config import optimizer_checks, schema
from easgd.data import augment, stream
from easgd.data.datasets import DATASETS
from easgd.errors import ConfigError
from easgd.infra import profiler
from easgd.models import BATCH_NORM_MODELS, DTYPES, MODELS
from easgd.pipeline.programs import PER_MODEL_FIELDS
from easgd.rules import RULES, model_state
from easgd.rules.base import DEFAULT_BETA, Pull
from easgd.rules.parameter_server import Downpour
from easgd.sim import timing

SERVER_OPTIMIZERS = Downpour.server_optimizers


_require = optimizer_checks.require
_is_int = optimizer_checks.is_int
_is_number = optimizer_checks.is_number


def validate(config: ml_collections.ConfigDict) -> None:
  """Raises ConfigError naming the first field that is unknown or out of range."""
  # A config file may only set the fields there are: an old flat name or a
  # typo would otherwise be a field nothing reads.
  known = schema.flatten(schema.default_config().to_dict())
  for field in schema.flatten(config.to_dict()):
    if field not in known:
      raise ConfigError(schema.hint(field))
  for field, registry in (
    ("algorithm", schema.ALGORITHMS),
    ("model", MODELS),
    ("data.dataset", DATASETS),
  ):
    value = schema.lookup(config, field)
    _require(value in registry, field, value, f"valid: {', '.join(sorted(registry))}")
  _require(
    _is_int(config.seed) and 0 <= config.seed < 2**32,
    "seed",
    config.seed,
    "must be an integer in [0, 2**32)",
  )
  _require(
    isinstance(config.deterministic_sums, bool),
    "deterministic_sums",
    config.deterministic_sums,
    "True or False",
  )
  _require(
    config.dtype in DTYPES,
    "dtype",
    config.dtype,
    f"valid: {', '.join(DTYPES)} (what the models compute in; parameters stay float32)",
  )
  # Which runtime runs the config, and what it needs of it, its runtime checks
  # (easgd.train.runtimes.select); the trace to replay is a path.
  _require(isinstance(config.runtime, str), "runtime", config.runtime, "the name of a runtime")
  _require(
    isinstance(config.cluster.replay, str),
    "cluster.replay",
    config.cluster.replay,
    "a trace.jsonl path, or '' (off)",
  )
  _require(
    _is_int(config.workers) and config.workers >= 1,
    "workers",
    config.workers,
    "must be an integer >= 1",
  )
  _validate_data(config.data)
  _validate_run(config.run)  # before the schedule, which spans run.total_steps
  optimizer_checks.validate_optimizer(config)
  _validate_outer(config)
  optimizer_checks.validate_outer_optimizer(config)
  _validate_downpour(config.downpour)
  validate_cluster(config.cluster, config.workers)
  _validate_device(config.device)
  _validate_pipeline_counts(config.pipeline)
  if config.algorithm == schema.PIPELINE:
    _validate_pipeline(config)
  else:
    _validate_rule(config)


def _validate_data(data: ml_collections.ConfigDict) -> None:
  _require(
    _is_int(data.batch_size) and data.batch_size >= 1,
    "data.batch_size",
    data.batch_size,
    "must be an integer >= 1 (examples per worker per step)",
  )
  _require(
    data.augment in augment.CHOICES,
    "data.augment",
    data.augment,
    f"valid: {', '.join(augment.CHOICES)}",
  )
  _require(
    data.source in stream.SOURCES,
    "data.source",
    data.source,
    f"valid: {', '.join(stream.SOURCES)} (easgd/data/stream.py)",
  )
  budget = data.device_budget
  _require(
    _is_number(budget) and math.isfinite(budget) and budget > 0,
    "data.device_budget",
    budget,
    "must be a finite number of bytes > 0 (what a device may hold of training data)",
  )


def _validate_outer(config: ml_collections.ConfigDict) -> None:
  outer = config.outer
  _require(
    outer.batch_stats in model_state.BATCH_STATS_CHOICES,
    "outer.batch_stats",
    outer.batch_stats,
    f"valid: {', '.join(model_state.BATCH_STATS_CHOICES)} (BatchNorm statistics: "
    "averaged into the center like parameters, or kept by each worker)",
  )
  # In range whoever reads them (the rules with a center): a typo is caught anyway.
  tau = outer.comm_period
  _require(_is_int(tau) and tau >= 1, "outer.comm_period", tau, "must be an integer >= 1")
  alpha = outer.moving_rate
  _require(
    _is_number(alpha) and 0 <= alpha < 1,
    "outer.moving_rate",
    alpha,
    "must be in (0, 1), or 0 for beta = workers*moving_rate = 0.9",
  )
  if optimizer_checks.pull_in_force(config) == Pull.RESET:
    _require(
      alpha == 0,
      "outer.moving_rate",
      alpha,
      f"{config.algorithm}'s reset pull has no alpha (leave it 0); "
      "outer.pull=elastic pulls with it (diloco)",
    )


def _elastic(config: ml_collections.ConfigDict) -> bool:
  """Whether the configured rule pulls its workers elastically (reads alpha)."""
  rule = RULES.get(config.algorithm)
  return rule is not None and optimizer_checks.pull_in_force(config) == Pull.ELASTIC


def _validate_downpour(downpour: ml_collections.ConfigDict) -> None:
  _require(
    _is_int(downpour.n_sync) and downpour.n_sync >= 1,
    "downpour.n_sync",
    downpour.n_sync,
    "must be an integer >= 1 (downpour's local steps between push and fetch)",
  )
  _require(
    downpour.server_optimizer in SERVER_OPTIMIZERS,
    "downpour.server_optimizer",
    downpour.server_optimizer,
    f"valid: {', '.join(SERVER_OPTIMIZERS)}",
  )


def _validate_run(run: ml_collections.ConfigDict) -> None:
  _require(
    _is_int(run.total_steps) and run.total_steps >= 1,
    "run.total_steps",
    run.total_steps,
    "must be an integer >= 1",
  )
  for field in ("eval_every", "checkpoint_every", "log_every"):
    _require(
      _is_int(run[field]) and run[field] >= 0,
      f"run.{field}",
      run[field],
      "must be an integer >= 0 (0: only at the end)",
    )
  _require(
    _is_int(run.devices) and run.devices >= 0,
    "run.devices",
    run.devices,
    "must be an integer >= 1, or 0 for the default (docs/configuration.md)",
  )
  _require(isinstance(run.data_dir, str), "run.data_dir", run.data_dir, "must be a path or ''")
  # Read, never written: it must be there (TFDS prepares datasets into it
  # beforehand). A remote one (gs://...) is TFDS's to find.
  _require(
    not run.data_dir or "://" in run.data_dir or os.path.isdir(os.path.expanduser(run.data_dir)),
    "run.data_dir",
    run.data_dir,
    "is not a directory: give the directory TFDS prepared the dataset in, or '' for TFDS's default",
  )
  why = profiler.refusal(run.profile, run.total_steps)
  _require(why is None, "run.profile", run.profile, why)


def _validate_device(device: ml_collections.ConfigDict) -> None:
  for field in ("memory", "flops"):
    _require(
      _is_number(device[field]) and device[field] >= 0,
      f"device.{field}",
      device[field],
      "must be a finite number >= 0 (0: not given)",
    )


def _require_spread(config: ml_collections.ConfigDict, field: str) -> None:
  """run.devices divides config.<field> (workers or pipeline.models, checked >= 1 already)."""
  count, devices = schema.lookup(config, field), config.run.devices
  _require(
    devices == 0 or count % devices == 0,
    "run.devices",
    devices,
    f"must divide config.{field}={count} (each device holds {field}/devices of them)",
  )


def _validate_pipeline_counts(pipeline: ml_collections.ConfigDict) -> None:
  """In range whatever the algorithm: a typo is caught before it matters."""
  _require(
    _is_int(pipeline.models) and pipeline.models >= 1,
    "pipeline.models",
    pipeline.models,
    "must be an integer >= 1",
  )
  _require(
    _is_int(pipeline.stage_steps) and pipeline.stage_steps >= 1,
    "pipeline.stage_steps",
    pipeline.stage_steps,
    "must be an integer >= 1 (steps on one partition before the models move)",
  )


def _validate_pipeline(config: ml_collections.ConfigDict) -> None:
  pipeline = config.pipeline
  models = pipeline.models
  _require_spread(config, "pipeline.models")
  checks = {
    "learning_rate": (lambda v: _is_number(v) and v > 0, "every value must be > 0"),
    "momentum": (lambda v: _is_number(v) and 0 <= v < 1, "every value must be in [0, 1)"),
    "weight_decay": (lambda v: _is_number(v) and v >= 0, "every value must be >= 0"),
    "b1": (lambda v: _is_number(v) and 0 <= v < 1, "every value must be in [0, 1)"),
    "b2": (lambda v: _is_number(v) and 0 <= v < 1, "every value must be in [0, 1)"),
    "seed": (lambda v: _is_int(v) and 0 <= v < 2**32, "every value must be in [0, 2**32)"),
  }
  for field in PER_MODEL_FIELDS:
    values = pipeline.per_model[field]
    _require(
      isinstance(values, (tuple, list)) and len(values) in (0, models),
      f"pipeline.per_model.{field}",
      values,
      f"must be () or a tuple of config.pipeline.models={models} values",
    )
    ok, allowed = checks[field]
    _require(all(ok(v) for v in values), f"pipeline.per_model.{field}", values, allowed)
  _require(
    bool(pipeline.per_model.seed) or config.seed + models <= 2**32,
    "seed",
    config.seed,
    f"model m's seed is seed + m: must be < 2**32 - {models - 1} for {models} models "
    "(or give pipeline.per_model.seed)",
  )
  momentum = pipeline.per_model.momentum
  _require(
    config.optimizer.name != "adamw" or not any(momentum),
    "pipeline.per_model.momentum",
    momentum,
    "adamw has no momentum of SGD's (each model's first moment is pipeline.per_model.b1)",
  )


def _validate_rule(config: ml_collections.ConfigDict) -> None:
  """What the chosen rule accepts, as its class declares it."""
  workers = config.workers
  _require_spread(config, "workers")
  rule = RULES[config.algorithm]
  optimizer_checks.validate_rule_optimizer(config)
  if _elastic(config):
    alpha = config.outer.moving_rate or DEFAULT_BETA / workers
    _require(
      workers * alpha < 1,
      "outer.moving_rate",
      alpha,
      f"beta = workers*moving_rate = {workers * alpha:g} must be < 1, "
      f"i.e. moving_rate < {1 / workers:g}",
    )
  _require(
    config.model not in BATCH_NORM_MODELS or config.outer.batch_stats in rule.batch_stats,
    "outer.batch_stats",
    config.outer.batch_stats,
    f"{rule.name} supports {', '.join(rule.batch_stats)} for {config.model}'s BatchNorm "
    "statistics (sync_sgd's workers share one model, so its statistics are averaged; "
    "'local' needs a rule whose workers have models of their own)",
  )
  for field in PER_MODEL_FIELDS:
    values = config.pipeline.per_model[field]
    _require(
      not values,
      f"pipeline.per_model.{field}",
      values,
      "only the pipeline has per-model values (())",
    )


def validate_cluster(cluster: ml_collections.ConfigDict, workers: int) -> None:
  """The timing model: positive times and bandwidth, stragglers among the workers."""

  def require(ok, field, allowed):
    _require(ok, f"cluster.{field}", cluster[field], allowed)

  def number(value):  # a bandwidth may be inf (not modelled), never NaN
    return isinstance(value, (int, float)) and not isinstance(value, bool) and not math.isnan(value)

  require(
    _is_number(cluster.compute_time) and cluster.compute_time > 0,
    "compute_time",
    "must be a finite number > 0",
  )
  for field in ("speed_spread", "jitter", "latency", "master_time"):
    require(
      _is_number(cluster[field]) and cluster[field] >= 0, field, "must be a finite number >= 0"
    )
  require(
    number(cluster.bandwidth) and cluster.bandwidth > 0, "bandwidth", "must be > 0 (bytes/second)"
  )
  require(
    _is_number(cluster.straggler_slowdown) and cluster.straggler_slowdown >= 1,
    "straggler_slowdown",
    "must be >= 1 (how many times slower a straggler is)",
  )
  require(_is_int(cluster.servers) and cluster.servers >= 1, "servers", "must be an integer >= 1")
  require(
    number(cluster.server_bandwidth) and cluster.server_bandwidth > 0,
    "server_bandwidth",
    "must be > 0 (bytes/second; inf: the servers' links are not modelled)",
  )
  require(
    cluster.allreduce in tuple(timing.Allreduce),
    "allreduce",
    f"must be one of {', '.join(timing.Allreduce)}",
  )
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
  owner = "device" if config.algorithm == schema.PIPELINE else "worker"
  _require(
    config.data.batch_size <= per_part,
    "data.batch_size",
    config.data.batch_size,
    f"must be <= {per_part}, the examples in each {owner}'s partition "
    f"({train_examples} {config.data.dataset} training examples over {parts} {owner}s)",
  )


def check_resumable(saved: dict, config: ml_collections.ConfigDict, workdir: str) -> None:
  """A workdir's checkpoint may only be resumed by a configuration that trains the same
  trajectory: only fields that do not shape it (easgd.config.schema) may differ."""
  # A checkpoint of an earlier version has flat names: compare under the grouped ones.
  saved = schema.grouped(saved)
  current = schema.flatten(config.to_dict())
  missing = [
    field
    for field in sorted(current)
    if field not in saved and schema.shapes_trajectory(field, config.algorithm, config.optimizer)
  ]
  if missing:
    # Its state has another structure too: nothing of it can be restored.
    raise ConfigError(
      f"workdir {workdir!r} holds a checkpoint written by an earlier version, whose config "
      f"has no config.{missing[0]}; this version cannot resume it: use another --workdir"
    )
  for field in sorted(set(saved) | set(current)):
    if not schema.shapes_trajectory(field, config.algorithm, config.optimizer):
      continue
    if saved.get(field) != current.get(field):
      raise ConfigError(
        f"workdir {workdir!r} holds a checkpoint of another configuration "
        f"(config.{field} is {saved.get(field)!r} there, {current.get(field)!r} here); "
        "use another --workdir or the same configuration"
      )
