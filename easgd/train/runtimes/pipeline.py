"""The pipeline's runtime: M models on a ring of devices, one TensorBoard run each.

Each model m writes to <workdir>/model_<m> the tags of the other rules
(train/loss, train/accuracy, train/learning_rate, train/images_per_sec,
eval/center_accuracy: the
model is its own center) and an HParams summary with its hyper-parameters,
so TensorBoard's HParams dashboard lists the models side by side.
"""

import json
import os

import jax
import ml_collections
import numpy as np

from easgd.config import hyperparameters
from easgd.data import augment as augment_lib
from easgd.errors import require
from easgd.infra import checkpoint, metrics, sharding
from easgd.infra.compile import compile_program
from easgd.pipeline import programs
from easgd.pipeline.algorithm import PIPELINE
from easgd.rules import Hyper
from easgd.train import setup as setup_lib
from easgd.train.runtimes.base import Runtime


def per_model_values(config: ml_collections.ConfigDict) -> dict[str, list]:
  """Each model's values of programs.PER_MODEL_FIELDS: M values each."""
  models = config.pipeline.models
  values = {}
  for field in programs.PER_MODEL_FIELDS:
    given = list(config.pipeline.per_model[field])
    shared = hyperparameters.lookup(config, programs.PER_MODEL_SOURCE[field])
    default = [shared + m for m in range(models)] if field == "seed" else [shared] * models
    values[field] = given or default
  return values


def model_hparams(config: ml_collections.ConfigDict, values: dict, m: int) -> dict:
  """Model m's hyper-parameters for the HParams dashboard: the run's, with its own values."""
  shared = {
    field: value
    for field, value in hyperparameters.hparams_of(config).items()
    if not field.startswith("pipeline.per_model.")
  }
  own = {
    source: values[field][m]
    for field, source in programs.PER_MODEL_SOURCE.items()
    if source == "seed"
    or hyperparameters.shapes_trajectory(source, PIPELINE.name, config.optimizer)
  }
  return shared | own


def _by_model(slot_values: np.ndarray, slot_models: np.ndarray) -> np.ndarray:
  """Slot-ordered values -> model-ordered."""
  ordered = np.empty_like(slot_values)
  ordered[slot_models] = slot_values
  return ordered


class PipelineTrainee:
  """The pipeline's part of the loop: its state, step and move programs, M writers."""

  def __init__(
    self,
    setup: setup_lib.Setup,
    runner: programs.Pipeline,
    state,
    values: dict,
    resumed_at: int | None = None,
  ):
    config = setup.config
    self.setup, self.runner, self.state, self.values = setup, runner, state, values
    self.num_models = runner.num_models
    self.writers = [
      metrics.MetricWriter(
        os.path.join(setup.workdir, f"model_{m}"), label=f"model_{m}", resumed_at=resumed_at
      )
      for m in range(self.num_models)
    ]
    local_step = programs.build_step(
      runner,
      setup.loss_fn,
      setup.mesh,
      state,
      config.data.batch_size,
      augment_lib.get(config.data.augment),
    ).lower(state, setup.train_images, setup.train_labels)
    self.local_step = compile_program(local_step, setup.platform)
    move = programs.build_move(runner, setup.mesh, state).lower(state)
    self.move = compile_program(move, setup.platform)
    self.step_count = int(jax.device_get(state.step))
    self.slot_models = self._slot_models()  # which model is in each slot
    self.sums, self.summed_steps = np.zeros((3, self.num_models)), 0

  def _slot_models(self) -> np.ndarray:
    return np.asarray(sharding.fetch(self.state.model_id))

  def write_config(self) -> None:
    for m, writer in enumerate(self.writers):
      this_model = {"this_model": model_hparams(self.setup.config, self.values, m)}
      text = json.dumps(self.setup.config.to_dict() | this_model, indent=2)
      writer.text("config", "```\n" + text + "\n```")

  def step(self):
    setup = self.setup
    self.state, step_metrics = self.local_step(self.state, setup.train_images, setup.train_labels)
    # The metrics are read with the slots' models of this step, before any move.
    slot_models = self.slot_models
    self.step_count += 1
    if self.step_count % self.runner.stage_steps == 0:
      self.state = self.move(self.state)
      self.slot_models = self._slot_models()
    return step_metrics, slot_models

  def add(self, values, slot_models) -> np.ndarray:
    loss = _by_model(values["loss"], slot_models)
    self.sums += [
      _by_model(values[tag], slot_models) for tag in ("loss", "accuracy", "learning_rate")
    ]
    self.summed_steps += 1
    return loss

  def log(self, step, train_seconds):
    images_per_sec = self.summed_steps * self.setup.config.data.batch_size / train_seconds
    final = {}
    for m, writer in enumerate(self.writers):
      scalars = {
        "train/loss": self.sums[0, m] / self.summed_steps,
        "train/accuracy": self.sums[1, m] / self.summed_steps,
        "train/learning_rate": self.sums[2, m] / self.summed_steps,
        "train/images_per_sec": images_per_sec,
      }
      writer.scalars(step, scalars)
      final.update({f"model_{m}/{tag}": value for tag, value in scalars.items()})
    self.sums[:], self.summed_steps = 0.0, 0
    return final

  def evaluate(self, step):
    accuracies = self.setup.evaluator.worker_accuracies(self.state.models)
    accuracies = _by_model(accuracies, self.slot_models)
    final = {}
    for m, writer in enumerate(self.writers):
      writer.scalars(step, {"eval/center_accuracy": float(accuracies[m])})
      final[f"model_{m}/eval/center_accuracy"] = float(accuracies[m])
    return final

  def stop_at(self, step):
    """A preempted run stops at the loop's step: every model stepped in it."""
    return step, None

  def save(self, divergence):
    # A model that diverged goes on being carried (the others train on), so its
    # slot is saved as it is; one found not finite here is reported diverged.
    finite = _by_model(
      np.asarray(sharding.fetch(checkpoint.finite_slots((self.state.models, self.state.opt)))),
      self.slot_models,
    )
    divergence.check_state(self.step_count, np.flatnonzero(~finite))
    self.setup.checkpointer.save(self.state, {}, self.setup.config, check_finite=False)

  def finish(self):
    for m, writer in enumerate(self.writers):
      writer.hparams(model_hparams(self.setup.config, self.values, m))

  def flush(self):
    for writer in self.writers:
      writer.flush()

  def close(self):
    for writer in self.writers:
      writer.close()


class PipelineRuntime(Runtime):
  """config.pipeline.models models, each its own center, moved around a ring of devices."""

  name = "pipeline"
  chosen_by_algorithm = True
  spans_processes = True
  streams = False  # one partition a device, kept there; the models move, not the data

  @classmethod
  def algorithms(cls) -> tuple[str, ...]:
    return (PIPELINE.name,)

  @classmethod
  def check(cls, config: ml_collections.ConfigDict) -> None:
    require(
      config.runtime == hyperparameters.default_config().runtime,
      "runtime",
      config.runtime,
      "the pipeline runs on a runtime of its own, whatever config.runtime says: "
      f"leave it {hyperparameters.default_config().runtime!r}",
    )

  @classmethod
  def partitions(cls, config: ml_collections.ConfigDict, num_devices: int) -> int:
    """One partition a device: they never move."""
    del config
    return num_devices

  def __init__(self, setup: setup_lib.Setup):
    super().__init__(setup)
    config = setup.config
    self.values = per_model_values(config)
    self.runner = programs.Pipeline(
      config.pipeline.models,
      setup.mesh.size,
      config.pipeline.stage_steps,
      Hyper.from_config(config),
    )

  def describe(self) -> str:
    pipeline = self.setup.config.pipeline
    return f"pipeline: {pipeline.models} models, {pipeline.stage_steps} steps a stage"

  def init_state(self):
    hypers = [np.asarray(self.values["seed"], np.uint32)] + [
      np.asarray(self.values[field], np.float32) for field in programs.HYPER_FIELDS
    ]
    return programs.init_state(self.runner, self.setup.init_params, hypers, self.setup.mesh)

  def trainee(self, state, clock_state, resumed_at) -> PipelineTrainee:
    del clock_state  # the pipeline has no clock
    return PipelineTrainee(self.setup, self.runner, state, self.values, resumed_at=resumed_at)
