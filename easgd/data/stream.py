"""Streamed input: each worker's batches read from the host's dataset as it trains.

`config.data.source` picks where a worker's examples come from:
  device  the training partitions are placed on the devices once and each
          step gathers its batches there (easgd.steps.build_train_step);
  stream  each process reads only its own workers' batches from the dataset
          on the host (a records folder or TFDS's array_record files, read by
          index), prefetched by grain's threads, and hands each step its
          batches (easgd.steps.build_batch_step);
  auto    device when one device's partitions fit in `data.device_budget`
          bytes, else stream; one log line says which and why.

Both sources give a worker the same examples at the same local step: the
indices are `easgd.data.batches.batch_indices(rng, step, worker, n, b)`, computed by
the same JAX function (on the host's CPU device when streamed) into the same
partitions (easgd.data.batches.partition_indices). So a streamed run trains
the same bits as one on the devices, resumes from any checkpoint with no
iterator state (grain's iterators are rebuilt at each worker's restored step:
their own state is a position that the step already gives), and the
parameter-server rules' replay holds.

Why augmentation stays on the device: it is keyed by (run key, worker,
step) inside the compiled step in both sources, so it is the same program
and the same bits either way, and the host only copies pixels. Records hold
raw pixels (easgd.data.records), so a streamed step decodes nothing either:
reading and stacking are the host's whole work, which grain's threads do
ahead of the step. JPEG or PNG sources (TFDS's) are decoded in those threads.
"""

import dataclasses
import functools
import math
import threading

import jax
import numpy as np
from absl import logging
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from easgd.data import batches
from easgd.declare import Field, Shapes, number, one_of
from easgd.errors import ConfigError
from easgd.infra import sharding
from easgd.rules import AXIS

DEVICE, STREAM, AUTO = "device", "stream", "auto"
SOURCES = (DEVICE, STREAM, AUTO)
# How the data reaches the workers, not which data: a run may change these on
# resume (easgd.config.hyperparameters), since both sources give every worker the same batches.
FIELDS = (
  Field(
    "data.source",
    AUTO,
    one_of(SOURCES, "easgd/data/stream.py"),
    "device: placed on the devices once; stream: read on the host as each worker trains "
    "(the same batches); auto: device if they fit in data.device_budget (docs/data.md)",
    Shapes.NEVER,
  ),
  Field(
    "data.device_budget",
    2e9,
    number(
      0,
      low_open=True,
      words="must be a finite number of bytes > 0 (what a device may hold of training data)",
    ),
    "bytes of training data a device may hold, which decides data.source=auto; at least "
    "one step's batches of a device (streamed, those of the steps queued ahead too)",
    Shapes.NEVER,
  ),
)
PLACEMENT_FIELDS = tuple(field.path for field in FIELDS)
# Each worker's reader: grain threads, and batches read ahead of its step.
READ_THREADS = 2
READ_AHEAD = 4


@dataclasses.dataclass(frozen=True)
class Placement:
  """Where the training data lives, and why."""

  source: str  # DEVICE or STREAM
  device_bytes: int  # one device's partitions, if placed
  batch_bytes: int  # one step's batches of one device
  reason: str


def example_bytes(image_shape) -> int:
  """Bytes of one example on a device: its uint8 pixels and its int32 label."""
  return math.prod(image_shape) + 4


def choose(data, image_shape, train_examples: int, parts: int, devices: int) -> Placement:
  """Resolves `data.source` (auto: by `data.device_budget`); ConfigError if the budget
  cannot hold one step's batches of a device."""
  per_device = parts // devices
  size = example_bytes(image_shape)
  device_bytes = (train_examples // parts) * per_device * size
  batch_bytes = data.batch_size * per_device * size
  budget = data.device_budget
  mb = lambda n: f"{n / 2**20:.1f} MiB"  # noqa: E731
  if budget < batch_bytes:
    raise ConfigError(
      f"config.data.device_budget={budget!r} is below one step's batches of a device "
      f"({batch_bytes} bytes: {per_device} x {data.batch_size} examples of {size} bytes); "
      "give at least that"
    )
  if data.source == DEVICE:
    return Placement(DEVICE, device_bytes, batch_bytes, "data.source=device")
  if data.source == STREAM:
    return Placement(STREAM, device_bytes, batch_bytes, "data.source=stream")
  if device_bytes <= budget:
    reason = f"a device's partitions ({mb(device_bytes)}) fit data.device_budget ({mb(budget)})"
    return Placement(DEVICE, device_bytes, batch_bytes, reason)
  reason = f"a device's partitions ({mb(device_bytes)}) exceed data.device_budget ({mb(budget)})"
  return Placement(STREAM, device_bytes, batch_bytes, reason)


@functools.cache
def _permutation_fn():
  """The permutation of a worker's partition in an epoch, as easgd.data.batches.batch_indices
  draws it on the device, compiled for the host's CPU device."""

  def permutation(rng, epoch, worker, size):
    # With a batch of the whole partition, an epoch is one step and its batch
    # is the epoch's whole permutation.
    return batches.batch_indices(rng, epoch, worker, size, size)

  return jax.jit(permutation, static_argnums=3)


class Streamer:
  """This process's workers' batches, read on the host and placed on the mesh.

  `batches(worker_steps)` returns the step's images [P, b, H, W, C] and labels
  [P, b] (split over `workers`), each worker's batch that of its local step
  `worker_steps[w]`. Each local worker has a grain iterator over its own
  local steps that reads READ_AHEAD batches ahead in READ_THREADS threads; a
  worker that does not step in a tick keeps its batch.
  """

  def __init__(
    self,
    mesh: Mesh,
    images,
    labels,
    num_workers: int,
    batch_size: int,
    seed: int,
    rng: jax.Array,
    start_steps: np.ndarray,
    total_steps: int,
  ):
    import grain  # noqa: PLC0415 (only streamed runs need it)

    self._images, self._labels = images, labels
    self._partitions = batches.partition_indices(len(labels), num_workers, seed)
    self._size = self._partitions.shape[1]
    self._batch_size = batch_size
    self._steps_per_epoch = self._size // batch_size
    self._sharding = NamedSharding(mesh, P(AXIS))
    self._shape = (num_workers, batch_size, *images.shape[1:])
    cpu = jax.local_devices(backend="cpu")[0]  # this process's own
    self._rng = jax.device_put(np.asarray(sharding.fetch(rng)), cpu)
    self._cpu = cpu
    self._orders: dict[int, dict[int, np.ndarray]] = {}
    self._lock = threading.Lock()
    index_map = self._sharding.addressable_devices_indices_map((num_workers,))
    self.local_workers = sorted(
      {w for index in index_map.values() for w in range(*index[0].indices(num_workers))}
    )
    logging.info(
      "process %d streams the batches of %d of %d workers",
      jax.process_index(),
      len(self.local_workers),
      num_workers,
    )
    options = grain.ReadOptions(num_threads=READ_THREADS, prefetch_buffer_size=READ_AHEAD)
    self._iterators = {}
    self._current = {}
    try:
      for worker in self.local_workers:
        start = int(start_steps[worker])
        # A worker takes at most one local step a tick: total_steps bounds its steps.
        steps = grain.MapDataset.range(start, max(start, total_steps) + 1)
        dataset = steps.map(functools.partial(self.read, worker)).to_iter_dataset(options)
        self._iterators[worker] = iter(dataset)
        self._current[worker] = (start, *next(self._iterators[worker]))
    except BaseException:
      self.close()  # the readers already started stop with the error
      raise

  def _order(self, worker: int, epoch: int) -> np.ndarray:
    """The permutation of worker's partition in `epoch`, computed once; each
    worker keeps its two latest epochs (its readers may straddle a boundary)."""
    with self._lock:
      order = self._orders.get(worker, {}).get(epoch)
    if order is None:
      draw = _permutation_fn()
      order = np.asarray(
        draw(self._rng, jax.device_put(np.int32(epoch), self._cpu), np.int32(worker), self._size)
      )
      with self._lock:
        kept = self._orders.setdefault(worker, {})
        kept[epoch] = order
        for old in sorted(kept)[:-2]:
          del kept[old]
    return order

  def read(self, worker: int, step: int) -> tuple[np.ndarray, np.ndarray]:
    """Worker's batch at its local step `step`: images [b, H, W, C], labels [b].

    The same examples as easgd.data.batches.batch_indices picks on the device.
    """
    epoch, position = divmod(int(step), self._steps_per_epoch)
    order = self._order(worker, epoch)
    rows = order[position * self._batch_size : (position + 1) * self._batch_size]
    examples = self._partitions[worker][rows]
    return np.asarray(self._images[examples], np.uint8), np.asarray(
      self._labels[examples], np.int32
    )

  def batches(self, worker_steps: np.ndarray) -> tuple[jax.Array, jax.Array]:
    """The step's batches, for the workers' local steps `worker_steps` [P]."""
    for worker in self.local_workers:
      step = int(worker_steps[worker])
      current = self._current[worker]
      while current[0] < step:
        current = (current[0] + 1, *next(self._iterators[worker]))
      if current[0] != step:
        raise RuntimeError(f"worker {worker} asked for local step {step} after {current[0]}")
      self._current[worker] = current

    def rows(column):
      def of(index):
        start, stop, _ = index[0].indices(self._shape[0])
        if stop - start == 1:
          return self._current[start][column][None]  # a view: one worker a device
        return np.stack([self._current[w][column] for w in range(start, stop)])

      return of

    images = jax.make_array_from_callback(self._shape, self._sharding, rows(1))
    labels = jax.make_array_from_callback(self._shape[:2], self._sharding, rows(2))
    return images, labels

  def close(self) -> None:
    """Stops the readers' threads."""
    for iterator in self._iterators.values():
      close = getattr(iterator, "close", None)
      if close is not None:
        close()
    self._iterators.clear()
