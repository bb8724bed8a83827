"""train_and_evaluate: the whole run, from configuration to final accuracy.

The loop knows no algorithm by name: it asks the rule's clock (the timing
model) for the next tick, runs the rule's compiled step on it, asks the rule
which parameters its workers hold, and otherwise only evaluates, logs and
checkpoints.
"""

import collections
import dataclasses
import json
import math
import time

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
from absl import logging

import models
from easgd import augment as augment_lib
from easgd import (
  checkpoint,
  cluster,
  evaluation,
  metrics,
  model_state,
  preemption,
  sharding,
  steps,
  validation,
)
from easgd.algorithms import make_rule
from easgd.data import load_dataset
from easgd.errors import TrainingDiverged
from easgd.rules import Hyper, TrainState

# Programs queued without waiting for a result. More than about 32 queued
# programs with collectives deadlock XLA's CPU runtime on several devices.
MAX_IN_FLIGHT = 8


@dataclasses.dataclass
class TrainResult:
  """The state at the end, the last logged metrics, and whether a preemption
  notice (SIGTERM) stopped the run before total_steps (it then checkpointed)."""

  state: TrainState
  metrics: dict[str, float]
  preempted: bool = False


def units(config: ml_collections.ConfigDict) -> int:
  """What is spread over the devices: the pipeline's models, or the rules' workers."""
  return config.models if config.algorithm == validation.PIPELINE else config.workers


def resolve_devices(config: ml_collections.ConfigDict, available: int) -> int:
  """config.devices, or for 0 the largest divisor of the units <= min(units, 8, available)."""
  if config.devices:
    return config.devices
  limit = min(units(config), 8, available)
  return max(d for d in range(1, limit + 1) if units(config) % d == 0)


def hyper_from(config: ml_collections.ConfigDict) -> Hyper:
  return Hyper(
    num_workers=config.workers,
    learning_rate=config.learning_rate,
    momentum=config.momentum,
    nesterov=config.nesterov,
    comm_period=config.comm_period,
    moving_rate=config.moving_rate,
    n_sync=config.n_sync,
    server_optimizer=config.server_optimizer,
    weight_decay=config.weight_decay,
    average_stats=config.batch_stats == "averaged",
  )


def check_inputs(config: ml_collections.ConfigDict, workdir: str, parts: int):
  """Every check of the user's input; raises ConfigError. Writes nothing.

  `parts` is the number of training-set partitions. Returns the loaded dataset.
  """
  validation.validate(config)
  dataset = load_dataset(config.dataset, config.data_dir)
  validation.validate_partition(config, len(dataset.train_labels), parts)
  saved = checkpoint.saved_config(workdir)
  if saved is not None:
    validation.check_resumable(saved, config, workdir)
  return dataset


class _Progress:
  """Fetches step metrics with a bounded lag, checks them and averages them."""

  def __init__(self):
    self._pending = collections.deque()
    self._sums = collections.Counter()
    self._count = 0

  def push(self, step: int, step_metrics) -> None:
    self._pending.append((step, step_metrics))
    if len(self._pending) > MAX_IN_FLIGHT:
      self._consume(*self._pending.popleft())

  def drain(self) -> None:
    while self._pending:
      self._consume(*self._pending.popleft())

  def _consume(self, step: int, step_metrics) -> None:
    values = jax.device_get(step_metrics)
    if not math.isfinite(values["loss"]):
      raise TrainingDiverged(f"training loss became {values['loss']} at step {step}")
    self._sums.update({tag: float(value) for tag, value in values.items()})
    self._count += 1

  def means(self) -> dict[str, float]:
    """Mean of each metric since the last call (all pushed steps must be drained)."""
    means = {tag: total / self._count for tag, total in self._sums.items()}
    self._sums.clear()
    self._count = 0
    return means


class _Schedule:
  """What the clock's ticks did since the last log, and the run's totals."""

  def __init__(self, clock: cluster.Clock):
    self._clock = clock
    self._steps = 0
    self._staleness: list[int] = []
    self._waits: list[float] = []

  def add(self, tick: cluster.Tick) -> None:
    self._steps += int(tick.local.sum())
    self._staleness += tick.staleness
    self._waits += tick.waits

  def worker_steps(self) -> int:
    """Local steps taken by all workers since the last call to `scalars`."""
    return self._steps

  def scalars(self) -> dict[str, float]:
    clock = self._clock
    values = {
      "sim/time": clock.time,
      "sim/worker_steps_min": float(clock.worker_steps.min()),
      "sim/worker_steps_max": float(clock.worker_steps.max()),
      "sim/worker_steps_mean": float(clock.worker_steps.mean()),
      "comm/exchanges_per_worker": float(clock.requests.mean()),
      "comm/bytes_per_worker": float(clock.bytes_sent.mean()),
    }
    if self._staleness:
      values["async/staleness_mean"] = float(np.mean(self._staleness))
      values["async/queue_wait"] = float(np.mean(self._waits))
    self._steps = 0
    return values

  def staleness(self) -> list[int]:
    staleness, self._staleness, self._waits = self._staleness, [], []
    return staleness


# Config fields that say how a run reports or where it runs, not what it trains.
_NOT_HPARAMS = frozenset(
  {"log_every", "eval_every", "checkpoint_every", "devices", "data_dir"}
  | {"models", "stage_steps"}  # the pipeline's
  | {"cluster.device_memory", "cluster.device_flops"}  # the planner's
)


def _hparam(value):
  """A value the HParams dashboard shows: tuples and infinities as strings."""
  if isinstance(value, float) and not math.isfinite(value):
    return str(value)
  return value if isinstance(value, (str, bool, int, float)) else str(tuple(value))


def hparams_of(config: ml_collections.ConfigDict) -> dict:
  """The config's fields for TensorBoard's HParams dashboard."""
  return {
    field: _hparam(value)
    for field, value in validation.flatten(config.to_dict()).items()
    if field not in _NOT_HPARAMS and not field.startswith("per_model.")
  }


def due(step: int, every: int, total: int) -> bool:
  return step == total or (every > 0 and step % every == 0)


def train_and_evaluate(config: ml_collections.ConfigDict, workdir: str) -> TrainResult:
  """Trains `config` in `workdir`, resuming from its newest checkpoint."""
  dataset = check_inputs(config, workdir, config.workers)
  num_workers = config.workers
  mesh = sharding.make_mesh(resolve_devices(config, len(jax.devices())))
  logging.info(
    "%s: %d workers on %d %s devices (%d a device), %s on %s (%d train / %d test)",
    config.algorithm,
    num_workers,
    mesh.size,
    mesh.devices.flat[0].platform,
    num_workers // mesh.size,
    config.model,
    config.dataset,
    len(dataset.train_labels),
    len(dataset.test_labels),
  )

  # Model, rule and state.
  model = models.get_model(config.model, dataset.num_classes)
  normalize = steps.make_normalize(dataset)
  loss_fn = steps.make_loss_fn(model, normalize)
  rng = jax.random.PRNGKey(config.seed)
  init_rng, run_rng = jax.random.split(rng)
  params = model_state.model_tree(
    jax.jit(model.init)(init_rng, jnp.zeros((1, *dataset.train_images.shape[1:])))
  )
  rule = make_rule(config.algorithm, hyper_from(config))
  state = steps.init_state(rule, params, run_rng, mesh)
  model_bytes = sum(leaf.size * leaf.dtype.itemsize for leaf in jax.tree.leaves(params))

  clock = rule.make_clock(cluster.Cluster.from_config(config.cluster), model_bytes, config.seed)

  writer = metrics.MetricWriter(workdir)
  checkpointer = checkpoint.Checkpointer(workdir)
  if checkpointer.latest_step() is not None:
    resumed, state, clock_state = checkpointer.restore(state)
    clock.load_state_dict(clock_state)
    logging.info("resumed from the checkpoint of step %d", resumed)
  else:
    writer.text("config", "```\n" + json.dumps(config.to_dict(), indent=2) + "\n```")

  # Data: placed once, each worker's partition on its device.
  train_images, train_labels = sharding.place_partitions(
    mesh, dataset.train_images, dataset.train_labels, num_workers, config.seed
  )

  train_step = (
    steps.build_train_step(
      rule, loss_fn, mesh, state, config.batch_size, augment_lib.get(config.augment)
    )
    .lower(state, train_images, train_labels, rule.tick_inputs(cluster.Tick.empty(num_workers)))
    .compile()
  )

  evaluator = evaluation.Evaluator(
    mesh, steps.make_apply_fn(model, normalize), dataset.test_images, dataset.test_labels
  )

  def evaluate(state: TrainState) -> dict[str, float]:
    workers = rule.worker_params(state)
    if model_state.has_stats(state.center) and config.batch_stats == "local":
      # The center has no statistics of its own: it is scored with each
      # worker's in turn, and the mean is reported.
      center = float(
        evaluator.worker_accuracies(evaluation.center_with_stats_of(state.center, workers)).mean()
      )
    else:
      center = evaluator.center_accuracy(state.center)
    return {
      "eval/center_accuracy": center,
      "eval/worker_accuracy": float(evaluator.worker_accuracies(workers).mean()),
      "eval/consensus_distance": float(evaluation.consensus_distance(workers, state.center)),
    }

  step = int(jax.device_get(state.step))
  schedule = _Schedule(clock)
  progress = _Progress()
  watch = preemption.PreemptionWatch()
  preempted = False
  final: dict[str, float] = {}
  # Throughput counts training time only: evaluation and saving are left out.
  resumed_at, train_seconds = time.perf_counter(), 0.0
  try:
    while step < config.total_steps:
      tick = clock.next_tick()
      state, step_metrics = train_step(state, train_images, train_labels, rule.tick_inputs(tick))
      schedule.add(tick)
      step += 1
      progress.push(step, step_metrics)
      preempted = watch.should_stop(step)
      log_now = due(step, config.log_every, config.total_steps)
      eval_now = due(step, config.eval_every, config.total_steps)
      save_now = preempted or due(step, config.checkpoint_every, config.total_steps)
      if not (log_now or eval_now or save_now):
        continue
      progress.drain()
      train_seconds += time.perf_counter() - resumed_at
      if log_now:
        train = {f"train/{tag}": value for tag, value in progress.means().items()}
        images = schedule.worker_steps() * config.batch_size
        train["train/images_per_sec"] = images / train_seconds
        train_seconds = 0.0
        train.update(schedule.scalars())
        writer.scalars(step, train)
        writer.histogram(step, "async/staleness", schedule.staleness())
        final.update(train)
      if eval_now:
        final.update(evaluate(state))
        writer.scalars(step, {tag: final[tag] for tag in final if tag.startswith("eval/")})
      if save_now:
        checkpointer.save(state, clock.state_dict(), config)
      writer.flush()
      if preempted:
        break
      resumed_at = time.perf_counter()
    if not preempted:  # a preempted run is not over: no final evaluation or HParams yet
      if not any(tag.startswith("eval/") for tag in final):
        # Resumed at or past total_steps: report the state as it is.
        final.update(evaluate(state))
        writer.scalars(step, final)
      writer.hparams(hparams_of(config))
  except TrainingDiverged as error:
    last = checkpointer.latest_step()
    kept = f"the checkpoint of step {last} is kept" if last is not None else "no checkpoint"
    raise TrainingDiverged(f"{error}; stopped, {kept}") from None
  finally:
    watch.close()
    checkpointer.close()
    writer.close()
  return TrainResult(state=state, metrics=final, preempted=preempted)
