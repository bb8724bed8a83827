"""train_and_evaluate: the whole run, from configuration to final accuracy.

The loop knows no algorithm by name: it calls the rule's compiled step, asks
the rule which parameters its workers hold and how often it communicates,
and otherwise only evaluates, logs and checkpoints.
"""

import collections
import dataclasses
import json
import math
import time

import jax
import jax.numpy as jnp
import ml_collections
from absl import logging
from jax.sharding import PartitionSpec as P

import models
from easgd import checkpoint, evaluation, metrics, sharding, steps, validation
from easgd.data import load_dataset, partition
from easgd.errors import TrainingDiverged
from easgd.rules import AXIS, Hyper, TrainState, make_rule

# Programs queued without waiting for a result. More than about 32 queued
# programs with collectives deadlock XLA's CPU runtime on several devices.
MAX_IN_FLIGHT = 8


@dataclasses.dataclass
class TrainResult:
  state: TrainState
  metrics: dict[str, float]


def resolve_devices(config: ml_collections.ConfigDict, available: int) -> int:
  """config.devices, or for 0 the largest divisor of workers <= min(workers, 8, available)."""
  if config.devices:
    return config.devices
  limit = min(config.workers, 8, available)
  return max(d for d in range(1, limit + 1) if config.workers % d == 0)


def hyper_from(config: ml_collections.ConfigDict) -> Hyper:
  return Hyper(
    num_workers=config.workers,
    learning_rate=config.learning_rate,
    momentum=config.momentum,
    nesterov=config.nesterov,
    comm_period=config.comm_period,
    moving_rate=config.moving_rate,
  )


def check_inputs(config: ml_collections.ConfigDict, workdir: str):
  """Every check of the user's input; raises ConfigError. Writes nothing.

  Returns the loaded dataset.
  """
  validation.validate(config)
  dataset = load_dataset(config.dataset, config.data_dir)
  validation.validate_partition(config, len(dataset.train_labels))
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


def _due(step: int, every: int, total: int) -> bool:
  return step == total or (every > 0 and step % every == 0)


def train_and_evaluate(config: ml_collections.ConfigDict, workdir: str) -> TrainResult:
  """Trains `config` in `workdir`, resuming from its newest checkpoint."""
  dataset = check_inputs(config, workdir)
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
  params = jax.jit(model.init)(init_rng, jnp.zeros((1, *dataset.train_images.shape[1:])))["params"]
  rule = make_rule(config.algorithm, hyper_from(config))
  state = steps.init_state(rule, params, run_rng, mesh)
  model_bytes = sum(leaf.size * leaf.dtype.itemsize for leaf in jax.tree.leaves(params))

  writer = metrics.MetricWriter(workdir)
  checkpointer = checkpoint.Checkpointer(workdir)
  if checkpointer.latest_step() is not None:
    state = checkpointer.restore(state)
    logging.info("resumed from the checkpoint of step %d", checkpointer.latest_step())
  else:
    writer.text("config", "```\n" + json.dumps(config.to_dict(), indent=2) + "\n```")

  # Data: placed once, each worker's partition on its device.
  train_images, train_labels = partition(
    dataset.train_images, dataset.train_labels, num_workers, config.seed
  )
  train_images = sharding.place(mesh, train_images, P(AXIS))
  train_labels = sharding.place(mesh, train_labels, P(AXIS))

  train_step = (
    steps.build_train_step(rule, loss_fn, mesh, state, config.batch_size)
    .lower(state, train_images, train_labels)
    .compile()
  )

  def apply_fn(params, images):
    return model.apply({"params": params}, normalize(images))

  evaluator = evaluation.Evaluator(mesh, apply_fn, dataset.test_images, dataset.test_labels)

  def evaluate(state: TrainState) -> dict[str, float]:
    workers = rule.worker_params(state)
    return {
      "eval/center_accuracy": evaluator.center_accuracy(state.center),
      "eval/worker_accuracy": float(evaluator.worker_accuracies(workers).mean()),
      "eval/consensus_distance": float(evaluation.consensus_distance(workers, state.center)),
    }

  step = int(jax.device_get(state.step))
  images_per_step = num_workers * config.batch_size
  progress = _Progress()
  final: dict[str, float] = {}
  # Throughput counts training time only: evaluation and saving are left out.
  resumed_at, interval_steps, train_seconds = time.perf_counter(), 0, 0.0
  try:
    while step < config.total_steps:
      state, step_metrics = train_step(state, train_images, train_labels)
      step += 1
      interval_steps += 1
      progress.push(step, step_metrics)
      log_now = _due(step, config.log_every, config.total_steps)
      eval_now = _due(step, config.eval_every, config.total_steps)
      save_now = _due(step, config.checkpoint_every, config.total_steps)
      if not (log_now or eval_now or save_now):
        continue
      progress.drain()
      train_seconds += time.perf_counter() - resumed_at
      if log_now:
        train = {f"train/{tag}": value for tag, value in progress.means().items()}
        train["train/images_per_sec"] = interval_steps * images_per_step / train_seconds
        interval_steps, train_seconds = 0, 0.0
        train["comm/bytes_per_worker"] = rule.exchanges(step) * metrics.allreduce_bytes(
          model_bytes, num_workers
        )
        writer.scalars(step, train)
        final.update(train)
      if eval_now:
        final.update(evaluate(state))
        writer.scalars(step, {tag: final[tag] for tag in final if tag.startswith("eval/")})
      if save_now:
        checkpointer.save(state, config)
      writer.flush()
      resumed_at = time.perf_counter()
    if not any(tag.startswith("eval/") for tag in final):
      # Resumed at or past total_steps: report the state as it is.
      final.update(evaluate(state))
      writer.scalars(step, final)
  except TrainingDiverged as error:
    last = checkpointer.latest_step()
    kept = f"the checkpoint of step {last} is kept" if last is not None else "no checkpoint"
    raise TrainingDiverged(f"{error}; stopped, {kept}") from None
  finally:
    checkpointer.close()
    writer.close()
  return TrainResult(state=state, metrics=final)
