"""What every run is built on: its checked inputs, dataset, mesh, model, loss,
evaluator, checkpointer and training partitions (`setup`), before a runtime
(easgd.train.runtimes) adds its state and programs."""

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

import jax
import ml_collections
from absl import logging
from jax.sharding import Mesh

from easgd import assembly, evaluation, ownership
from easgd.config import hyperparameters, validation
from easgd.data import batches, stream
from easgd.data.datasets import Dataset, load_dataset, shape_of
from easgd.errors import ConfigError
from easgd.infra import checkpoint, sharding


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
  # The workdir's lock, held while the run runs (process 0's; None in the others).
  lock: ownership.Held | None = None

  def release(self) -> None:
    """Lets another run use the workdir (this one has ended)."""
    if self.lock is not None:
      self.lock.release()

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
      hyperparameters.units(self.config) // mesh.size,
      self.config.model,
      dataset.name,
      len(dataset.train_labels),
      len(dataset.test_labels),
    )


def _able(others: Sequence, can: str) -> list[str]:
  """What a refusal offers in place of the runtime: the others that can ("runtime=X")."""
  return [f"runtime={runtime.name}" for runtime in others if getattr(runtime, can)]


def model_shapes(config: ml_collections.ConfigDict):
  """The shapes of the tree of config.model on config.data.dataset, traced without data."""
  shape = shape_of(config.data.dataset, config.run.data_dir)
  normalization = assembly.Normalization.stand_in(shape.image_shape[-1])

  def shapes():
    built = assembly.network(config, shape.num_classes, shape.image_shape, normalization)
    return built.init_params(jax.random.PRNGKey(0))

  # Traced whole, the network and the key included: the checks that call this run
  # before train.py sets the devices, and an array made outside the trace (the
  # normalisation's constants too) would start a backend.
  return jax.eval_shape(shapes)


def check_inputs(
  config: ml_collections.ConfigDict, workdir: str, parts: int, changing=()
) -> Dataset:
  """The checks of what `config` names beyond itself: its dataset, the partitions
  of it, and the checkpoint in `workdir` (whose `changing` fields may differ:
  validation.check_resumable). Raises ConfigError; writes nothing.

  `parts` is the number of training-set partitions. Returns the loaded dataset.
  """
  dataset = load_dataset(config.data.dataset, config.run.data_dir)
  validation.validate_partition(config, len(dataset.train_labels), parts)
  validation.check_checkpoint(config, workdir, changing)
  return dataset


def setup(
  config: ml_collections.ConfigDict,
  workdir: str,
  runtime,
  others: Sequence = (),
  changing: Sequence[str] = (),
) -> Setup:
  """Checks the inputs and builds the run's common parts for `runtime`, the Runtime
  class that runs `config` (easgd.train.runtimes.registry.select). It says how many
  partitions the training set is split into, whether they may stream from disk,
  and whether the run may span processes. `others`: the other runtimes that
  config.runtime may name for this algorithm, which a refusal names; `changing`: the
  fields that may differ from the checkpoint's (check_inputs).

  Before it writes anything, process 0 takes the workdir's lock (easgd.ownership):
  another run holding it is refused in one line (ConfigError) naming that run."""
  num_devices = hyperparameters.resolve_devices(config, len(jax.devices()))
  parts = runtime.partitions(config, num_devices)
  dataset = check_inputs(config, workdir, parts, changing)
  if not runtime.spans_processes and jax.process_count() > 1:
    raise ConfigError(
      f"config.runtime={config.runtime!r}: the {runtime.name} runtime runs on one host; this "
      f"run has {jax.process_count()} processes: "
      f"use {' or '.join(_able(others, 'spans_processes') or ['a runtime that spans them'])} "
      "(docs/asynchrony.md, 'Beyond one host')"
    )
  mesh = sharding.make_mesh(num_devices)
  built = assembly.for_dataset(config, dataset)

  placement = stream.choose(
    config.data, dataset.train_images.shape[1:], len(dataset.train_labels), parts, num_devices
  )
  if placement.source == stream.STREAM and not runtime.streams:
    raise ConfigError(
      f"config.data.source={config.data.source!r}: the {runtime.name} runtime reads its "
      f"batches from partitions kept on the devices and cannot stream ({placement.reason}); "
      f"use {' or '.join(['data.source=device', *_able(others, 'streams')])}"
    )
  logging.info("training data: %s (%s)", placement.source, placement.reason)
  train_images = train_labels = None
  if placement.source == stream.DEVICE:
    train_images, train_labels = batches.place_partitions(
      mesh, dataset.train_images, dataset.train_labels, parts, config.seed
    )
  evaluator = evaluation.Evaluator(mesh, built.apply_fn, dataset.test_images, dataset.test_labels)
  lock = ownership.hold(workdir) if jax.process_index() == 0 else None
  return Setup(
    config=config,
    workdir=workdir,
    dataset=dataset,
    mesh=mesh,
    model=built.model,
    loss_fn=built.loss_fn,
    init_params=built.init_params,
    evaluator=evaluator,
    checkpointer=checkpoint.Checkpointer(workdir),
    placement=placement,
    train_images=train_images,
    train_labels=train_labels,
    lock=lock,
  )
