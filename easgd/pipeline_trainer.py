"""train_and_evaluate for the pipeline: M models, one TensorBoard run each.

Each model m writes to <workdir>/model_<m> the tags of the other rules
(train/loss, train/accuracy, train/images_per_sec, eval/center_accuracy: the
model is its own center) and an HParams summary with its hyper-parameters,
so TensorBoard's HParams dashboard lists the models side by side.
"""

import json
import os
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
  evaluation,
  metrics,
  model_state,
  pipeline,
  preemption,
  sharding,
  steps,
  trainer,
  validation,
)


def per_model_values(config: ml_collections.ConfigDict) -> dict[str, list]:
  """Each model's learning_rate, momentum, weight_decay and seed: M values each."""
  defaults = {
    "learning_rate": [config.learning_rate] * config.models,
    "momentum": [config.momentum] * config.models,
    "weight_decay": [config.weight_decay] * config.models,
    "seed": [config.seed + m for m in range(config.models)],
  }
  return {field: list(config.per_model[field]) or default for field, default in defaults.items()}


def model_hparams(config: ml_collections.ConfigDict, values: dict, m: int) -> dict:
  """Model m's hyper-parameters for the HParams dashboard."""
  shared = {
    "algorithm": config.algorithm,
    "model": config.model,
    "dataset": config.dataset,
    "batch_size": config.batch_size,
    "nesterov": config.nesterov,
    "stage_steps": config.stage_steps,
    "total_steps": config.total_steps,
  }
  return shared | {field: values[field][m] for field in validation.PER_MODEL_FIELDS}


def train_and_evaluate(config: ml_collections.ConfigDict, workdir: str) -> trainer.TrainResult:
  """Trains config.models models in `workdir`, resuming from its newest checkpoint."""
  num_devices = trainer.resolve_devices(config, len(jax.devices()))
  dataset = trainer.check_inputs(config, workdir, num_devices)
  mesh = sharding.make_mesh(num_devices)
  num_models = config.models
  logging.info(
    "pipeline: %d models on %d %s devices (%d a device), %d steps a stage, %s on %s",
    num_models,
    num_devices,
    mesh.devices.flat[0].platform,
    num_models // num_devices,
    config.stage_steps,
    config.model,
    config.dataset,
  )

  model = models.get_model(config.model, dataset.num_classes)
  normalize = steps.make_normalize(dataset)
  loss_fn = steps.make_loss_fn(model, normalize)
  sample = jnp.zeros((1, *dataset.train_images.shape[1:]))

  def init_params(key):
    return model_state.model_tree(model.init(key, sample))

  values = per_model_values(config)
  runner = pipeline.Pipeline(num_models, num_devices, config.stage_steps, config.nesterov)
  hypers = [np.asarray(values["seed"], np.int32)] + [
    np.asarray(values[field], np.float32) for field in ("learning_rate", "momentum", "weight_decay")
  ]
  state = pipeline.init_state(runner, init_params, hypers, mesh)

  writers = [
    metrics.MetricWriter(os.path.join(workdir, f"model_{m}"), label=f"model_{m}")
    for m in range(num_models)
  ]
  checkpointer = checkpoint.Checkpointer(workdir)
  if checkpointer.latest_step() is not None:
    resumed, state, _ = checkpointer.restore(state)
    logging.info("resumed from the checkpoint of step %d", resumed)
  else:
    for m, writer in enumerate(writers):
      this_model = {"this_model": model_hparams(config, values, m)}
      text = json.dumps(config.to_dict() | this_model, indent=2)
      writer.text("config", "```\n" + text + "\n```")

  # Data: D partitions, placed once, one a device; they never move.
  train_images, train_labels = sharding.place_partitions(
    mesh, dataset.train_images, dataset.train_labels, num_devices, config.seed
  )
  local_step = (
    pipeline.build_step(
      runner, loss_fn, mesh, state, config.batch_size, augment_lib.get(config.augment)
    )
    .lower(state, train_images, train_labels)
    .compile()
  )
  move = pipeline.build_move(runner, mesh, state).lower(state).compile()

  evaluator = evaluation.Evaluator(
    mesh, steps.make_apply_fn(model, normalize), dataset.test_images, dataset.test_labels
  )

  def by_model(slot_values, model_id) -> np.ndarray:
    """Slot-ordered values -> model-ordered."""
    ordered = np.empty_like(slot_values)
    ordered[model_id] = slot_values
    return ordered

  def evaluate(state) -> None:
    accuracies = by_model(evaluator.worker_accuracies(state.models), slot_models)
    for m, writer in enumerate(writers):
      writer.scalars(step, {"eval/center_accuracy": float(accuracies[m])})
      final[f"model_{m}/eval/center_accuracy"] = float(accuracies[m])

  step = int(jax.device_get(state.step))
  slot_models = np.asarray(sharding.fetch(state.model_id))  # which model is in each slot
  pending = []  # the slot-ordered metrics of the steps not yet added to `sums`
  sums, summed_steps = np.zeros((2, num_models)), 0
  diverged: set[int] = set()
  final: dict[str, float] = {}

  def add_pending() -> None:
    nonlocal sums, summed_steps
    for fetched in sharding.fetch(pending):
      loss = by_model(fetched["loss"], slot_models)
      sums += (loss, by_model(fetched["accuracy"], slot_models))
      for m in np.flatnonzero(~np.isfinite(loss)):
        if m not in diverged:
          diverged.add(int(m))
          logging.warning("model %d diverged (loss %s) by step %d", m, loss[m], step)
    summed_steps += len(pending)
    pending.clear()

  watch = preemption.PreemptionWatch()
  preempted = False
  resumed_at, train_seconds = time.perf_counter(), 0.0
  try:
    while step < config.total_steps:
      state, step_metrics = local_step(state, train_images, train_labels)
      step += 1
      pending.append(step_metrics)
      if len(pending) >= trainer.MAX_IN_FLIGHT:
        add_pending()
      if step % config.stage_steps == 0:
        add_pending()
        state = move(state)
        slot_models = np.asarray(sharding.fetch(state.model_id))
      preempted = watch.should_stop(step)
      due = {
        name: trainer.due(step, every, config.total_steps)
        for name, every in (
          ("log", config.log_every),
          ("eval", config.eval_every),
          ("save", config.checkpoint_every),
        )
      }
      due["save"] = due["save"] or preempted
      if not any(due.values()):
        continue
      add_pending()
      train_seconds += time.perf_counter() - resumed_at
      if due["log"]:
        images_per_sec = summed_steps * config.batch_size / train_seconds
        for m, writer in enumerate(writers):
          writer.scalars(
            step,
            {
              "train/loss": sums[0, m] / summed_steps,
              "train/accuracy": sums[1, m] / summed_steps,
              "train/images_per_sec": images_per_sec,
            },
          )
        logging.info("step %d: %.0f model-images/s", step, images_per_sec * num_models)
        sums[:], summed_steps, train_seconds = 0.0, 0, 0.0
      if due["eval"]:
        evaluate(state)
      if due["save"]:
        checkpointer.save(state, {}, config)
      for writer in writers:
        writer.flush()
      if preempted:
        break
      resumed_at = time.perf_counter()
    if not preempted:  # a preempted run is not over: no final evaluation or HParams yet
      if not final:
        # Resumed at or past total_steps: report the state as it is.
        evaluate(state)
      for m, writer in enumerate(writers):
        writer.hparams(model_hparams(config, values, m))
  finally:
    watch.close()
    checkpointer.close()
    for writer in writers:
      writer.close()
  return trainer.TrainResult(state=state, metrics=final, preempted=preempted)
