"""The training loop that every trainer shares: setup, and the run from step to step.

The loop knows no algorithm. `setup` builds what every run needs (checked
inputs, dataset, mesh, model, loss, evaluator, checkpointer, the training
partitions on their devices); a trainer (easgd.trainer for the rules,
easgd.pipeline.trainer for the pipeline) adds its state and programs and
hands `run` a `Trainee`: the few things only it knows. `run` owns the
schedule of logs, evaluations and checkpoints, the bounded lag of metric
fetches, throughput timing, preemption, the divergence policy and clean-up.

Divergence policy (one for every trainer): a model whose training loss stops
being finite is reported with its step; when every model of the run has
(the rules train one, the pipeline M), the run stops with TrainingDiverged
(train.py exits 1) and its last checkpoint is kept.
"""

import collections
import dataclasses
import time
from collections.abc import Callable
from typing import Any, Protocol

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
from absl import logging
from jax.sharding import Mesh

from easgd import evaluation, models, runtime, schema, steps, validation
from easgd.data import stream
from easgd.data.datasets import Dataset, load_dataset
from easgd.errors import ConfigError, TrainingDiverged
from easgd.infra import checkpoint, preemption, profiler, sharding, watchdog
from easgd.rules import model_state
from easgd.runtime import trace

# Programs queued without waiting for a result. More than about 32 queued
# programs with collectives deadlock XLA's CPU runtime on several devices.
MAX_IN_FLIGHT = 8


@dataclasses.dataclass
class TrainResult:
  """The state at the end, the last logged metrics, and whether a preemption
  notice (SIGTERM) stopped the run before run.total_steps (it then checkpointed)."""

  state: Any
  metrics: dict[str, float]
  preempted: bool = False


@dataclasses.dataclass
class Setup:
  """What every run is built on: the training set split into `parts` partitions,
  placed on `mesh` or streamed (`placement`)."""

  config: ml_collections.ConfigDict
  workdir: str
  dataset: Dataset
  mesh: Mesh
  model: Any
  loss_fn: Callable
  init_params: Callable[[jax.Array], Any]  # key -> one model's tree
  evaluator: evaluation.Evaluator
  checkpointer: checkpoint.Checkpointer
  placement: stream.Placement
  # Placed: [parts, n, H, W, C] and [parts, n], split over the mesh; streamed: None.
  train_images: jax.Array | None
  train_labels: jax.Array | None

  @property
  def streamed(self) -> bool:
    return self.placement.source == stream.STREAM

  @property
  def platform(self) -> str:
    """The devices' platform ("cpu", "gpu", "tpu"), which picks the compiler options."""
    return self.mesh.devices.flat[0].platform

  def log_run(self, what: str) -> None:
    """Logs what runs where: `what` names the algorithm and its units (workers, models)."""
    dataset, mesh = self.dataset, self.mesh
    logging.info(
      "%s on %d %s devices (%d a device), %s on %s (%d train / %d test)",
      what,
      mesh.size,
      mesh.devices.flat[0].platform,
      schema.units(self.config) // mesh.size,
      self.config.model,
      dataset.name,
      len(dataset.train_labels),
      len(dataset.test_labels),
    )


def check_inputs(config: ml_collections.ConfigDict, workdir: str, parts: int) -> Dataset:
  """Every check of the user's input; raises ConfigError. Writes nothing.

  `parts` is the number of training-set partitions. Returns the loaded dataset.
  """
  validation.validate(config)
  dataset = load_dataset(config.data.dataset, config.run.data_dir)
  validation.validate_partition(config, len(dataset.train_labels), parts)
  saved = checkpoint.saved_config(workdir)
  if saved is not None:
    validation.check_resumable(saved, config, workdir)
  if config.cluster.replay:
    trace.check_replay(config)
  return dataset


def setup(config: ml_collections.ConfigDict, workdir: str, parts_per_device: int = 0) -> Setup:
  """Checks the inputs and builds the run's common parts.

  The training set is split into one partition per worker (the rules) or,
  with `parts_per_device`=1, one per device (the pipeline).
  """
  validation.validate(config)  # before the device count is worked out from it
  num_devices = schema.resolve_devices(config, len(jax.devices()))
  parts = num_devices * parts_per_device if parts_per_device else config.workers
  dataset = check_inputs(config, workdir, parts)
  mesh = sharding.make_mesh(num_devices)
  model = models.get_model(config.model, dataset.num_classes, config.dtype)
  normalize = steps.make_normalize(dataset)
  sample = jnp.zeros((1, *dataset.train_images.shape[1:]))

  def init_params(key):
    return model_state.model_tree(model.init(key, sample))

  placement = stream.choose(
    config.data, dataset.train_images.shape[1:], len(dataset.train_labels), parts, num_devices
  )
  if config.algorithm == schema.PIPELINE and placement.source == stream.STREAM:
    raise ConfigError(
      f"config.data.source={config.data.source!r}: the pipeline keeps one partition a device "
      f"on the devices and cannot stream ({placement.reason}); use data.source=device"
    )
  if config.runtime == runtime.THREADS and placement.source == stream.STREAM:
    raise ConfigError(
      f"config.data.source={config.data.source!r}: runtime=threads reads each worker's batches "
      f"from its partition on its device and cannot stream ({placement.reason}); "
      "use data.source=device or runtime=simulated"
    )
  if config.runtime == runtime.THREADS and jax.process_count() > 1:
    raise ConfigError(
      f"config.runtime='threads' runs on one host; this run has {jax.process_count()} "
      "processes: use runtime=simulated (docs/asynchrony.md, 'Beyond one host')"
    )
  logging.info("training data: %s (%s)", placement.source, placement.reason)
  train_images = train_labels = None
  if placement.source == stream.DEVICE:
    train_images, train_labels = sharding.place_partitions(
      mesh, dataset.train_images, dataset.train_labels, parts, config.seed
    )
  evaluator = evaluation.Evaluator(
    mesh, steps.make_apply_fn(model, normalize), dataset.test_images, dataset.test_labels
  )
  return Setup(
    config=config,
    workdir=workdir,
    dataset=dataset,
    mesh=mesh,
    model=model,
    loss_fn=steps.make_loss_fn(model, normalize),
    init_params=init_params,
    evaluator=evaluator,
    checkpointer=checkpoint.Checkpointer(workdir),
    placement=placement,
    train_images=train_images,
    train_labels=train_labels,
  )


class Trainee(Protocol):
  """What a trainer tells the loop; everything else is the loop's."""

  num_models: int  # models whose divergence the loop watches (the rules: 1)
  state: Any  # the training state on the devices; a profile window waits for it

  def step(self) -> tuple[Any, Any]:
    """Runs one training step; returns its metrics on the devices (fetched later)
    and any host value they must be read with (e.g. which model is in which slot)."""

  def add(self, metrics: dict, context: Any) -> np.ndarray:
    """Adds one step's fetched metrics to the means being logged; returns each
    model's training loss [num_models]."""

  def log(self, step: int, train_seconds: float) -> dict[str, float]:
    """Writes the training scalars since the last log; returns them."""

  def evaluate(self, step: int) -> dict[str, float]:
    """Writes and returns the evaluation scalars."""

  def save(self, divergence: "Divergence") -> None:
    """Checkpoints the state. A trainer whose state may hold a diverged model (the
    pipeline) reports each model it finds not finite to `divergence`."""

  def finish(self) -> None:
    """At the end of a run that was not preempted: writes its HParams summary."""

  def flush(self) -> None: ...

  def close(self) -> None: ...


def due(step: int, every: int, total: int) -> bool:
  return step == total or (every > 0 and step % every == 0)


class Divergence:
  """The divergence policy: report each model once; stop when all have diverged."""

  def __init__(self, num_models: int):
    self.num_models = num_models
    self.diverged: dict[int, str] = {}  # model -> what stopped being finite, and when

  def check(self, step: int, losses: np.ndarray) -> None:
    """Each model's training loss of `step`."""
    for model in np.flatnonzero(~np.isfinite(np.asarray(losses))):
      self._report(int(model), step, f"training loss became {losses[model]} at step {step}")
    self._stop_if_all(step)

  def check_state(self, step: int, models) -> None:
    """Models whose state is not finite after `step`, though their loss still was."""
    for model in models:
      self._report(int(model), step, f"the state after step {step} is not finite; it was not saved")
    self._stop_if_all(step)

  def _report(self, model: int, step: int, what: str) -> None:
    if model in self.diverged:
      return
    self.diverged[model] = what
    if self.num_models > 1:
      logging.warning("model %d diverged at step %d: %s", model, step, what)

  def _stop_if_all(self, step: int) -> None:
    if len(self.diverged) == self.num_models:
      if self.num_models == 1:
        raise TrainingDiverged(self.diverged[0])
      raise TrainingDiverged(
        f"every model's training loss or state stopped being finite by step {step}"
      )


def run(config: ml_collections.ConfigDict, trainee: Trainee, start: int, checkpointer) -> tuple:
  """Trains from step `start` to run.total_steps; returns (final scalars, preempted)."""
  schedule = config.run
  total = schedule.total_steps
  pending: collections.deque = collections.deque()
  divergence = Divergence(trainee.num_models)
  window = profiler.Window(schedule.profile, total, start)  # run.profile; off for ""

  def consume(count: int) -> None:
    taken = [pending.popleft() for _ in range(count)]
    fetched = sharding.fetch([metrics for _, metrics, _ in taken])
    for (step, _, context), metrics in zip(taken, fetched, strict=True):
      divergence.check(step, trainee.add(metrics, context))

  step = start
  # Every phase below is watched: one that hangs stops the process (easgd.infra.watchdog).
  dog = watchdog.Watchdog(watchdog.configured_timeout()).start()
  watch = preemption.PreemptionWatch()
  preempted, evaluated = False, False
  final: dict[str, float] = {}
  # Throughput counts training time only: evaluation and saving are left out.
  resumed_at, train_seconds = time.perf_counter(), 0.0
  try:
    while step < total:
      if window.opens(step):
        with dog.phase("profile start", step):
          window.start(trainee.state, checkpointer.workdir, step)
      with dog.phase("training step", step + 1):
        metrics, context = trainee.step()
        step += 1
        pending.append((step, metrics, context))
        if len(pending) > MAX_IN_FLIGHT:
          consume(1)
        # Every process answers here (multi-process: a collective agreement).
        preempted = watch.should_stop(step)
      if window.closes(step):
        with dog.phase("profile stop", step):
          window.stop(trainee.state, step)
      log_now = due(step, schedule.log_every, total)
      eval_now = due(step, schedule.eval_every, total)
      save_now = preempted or due(step, schedule.checkpoint_every, total)
      if not (log_now or eval_now or save_now):
        continue
      # Waiting for the steps' results: where a step's execution (and a hung
      # collective) is seen, as dispatching them returns at once.
      with dog.phase("step results", step):
        consume(len(pending))
      train_seconds += time.perf_counter() - resumed_at
      if log_now:
        with dog.phase("log", step):
          final.update(trainee.log(step, train_seconds))
        train_seconds = 0.0
      if eval_now:
        with dog.phase("evaluation", step):
          final.update(trainee.evaluate(step))
        evaluated = True
      # Every point logged so far is on disk before the checkpoint that covers
      # it is committed: a run killed after the checkpoint loses no history.
      with dog.phase("event write", step):
        trainee.flush()
      if save_now:
        with dog.phase("checkpoint", step):
          trainee.save(divergence)
      if preempted:
        break
      resumed_at = time.perf_counter()
    if not preempted:  # a preempted run is not over: no final evaluation or HParams yet
      if not evaluated:
        # Resumed at or past total_steps: report the state as it is.
        with dog.phase("evaluation", step):
          final.update(trainee.evaluate(step))
      with dog.phase("event write", step):
        trainee.finish()
  except TrainingDiverged as error:
    last = checkpointer.latest_step()
    kept = f"the checkpoint of step {last} is kept" if last is not None else "no checkpoint"
    raise TrainingDiverged(f"{error}; stopped, {kept}") from None
  finally:
    window.close(step)  # a run that ended inside the window: no trace is left open
    dog.close()
    watch.close()
    checkpointer.close()
    trainee.close()
  return final, preempted
