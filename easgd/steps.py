"""Compiled programs: a rule's step over the mesh, with batches drawn on device
or handed to it.

With the data on the devices (config.data.source=device) the training data
never leaves them after it is placed: each device holds its workers'
partitions, and every step draws each worker's batch from its own partition
with indices that are a pure function of (rng, worker, the worker's local
step count) (easgd.data.batches). Streamed (easgd.data.stream) the host reads
the same examples and the step takes them as arguments; either way the step
augments them.
"""

from collections.abc import Callable

import jax
import jax.numpy as jnp
import optax
from jax.sharding import Mesh
from jax.sharding import PartitionSpec as P

from easgd.data import augment as augment_lib
from easgd.data.batches import augment_local_batches, sample_batches, sample_local_batches
from easgd.infra import sharding
from easgd.rules import AXIS, LossFn, Rule, TickInputs, TrainState, model_state


def make_normalize(statistics) -> Callable[[jax.Array], jax.Array]:
  """uint8 images -> float32 (image/max_value - mean)/std, per channel; `statistics`:
  a Dataset, or its easgd.assembly.Normalization."""
  mean = jnp.asarray(statistics.mean, jnp.float32)
  std = jnp.asarray(statistics.std, jnp.float32)
  scale = 1.0 / statistics.max_value

  def normalize(images):
    return (images.astype(jnp.float32) * scale - mean) / std

  return normalize


def make_loss_fn(model, normalize) -> LossFn:
  """Mean softmax cross-entropy and accuracy of one worker on one batch, in
  training mode; a model with BatchNorm also returns its new statistics."""

  def loss_fn(tree, batch):
    images = normalize(batch["image"])
    extra = {}
    if model_state.has_stats(tree):
      logits, updated = model.apply(
        model_state.variables(tree), images, train=True, mutable=[model_state.STATS]
      )
      extra[model_state.STATS] = updated[model_state.STATS]
    else:
      logits = model.apply({"params": tree}, images, train=True)
    # In float32 whatever the model computes in (config.dtype): a bfloat16
    # log-softmax would round the loss and its gradient.
    loss = optax.softmax_cross_entropy_with_integer_labels(
      logits.astype(jnp.float32), batch["label"]
    ).mean()
    accuracy = (logits.argmax(-1) == batch["label"]).mean()
    return loss, {"accuracy": accuracy, **extra}

  return loss_fn


def make_apply_fn(model, normalize) -> Callable:
  """(model tree, uint8 images) -> logits, in evaluation mode."""

  def apply_fn(tree, images):
    return model.apply(model_state.variables(tree), normalize(images))

  return apply_fn


def _compile(
  per_device, rule: Rule, mesh: Mesh, state: TrainState, num_worker_args: int, donate: bool = True
):
  """jit(shard_map(per_device)) for per_device(state, *worker_args, tick) -> (state, metrics).

  The state keeps its layout (worker fields split over `workers`, the rest
  replicated) and is donated (unless not `donate`), so its buffers are updated in place; the
  worker arguments have a leading workers axis; the tick is replicated, and
  the metrics lie as the rule says (`Rule.metrics_spec`).
  """
  specs = sharding.state_specs(state)
  in_specs = (specs,) + (P(AXIS),) * num_worker_args + (P(),)
  out_specs = (specs, rule.metrics_spec())
  return sharding.jit_shard_map(per_device, mesh, in_specs, out_specs, donate=donate)


def build_rule_step(rule: Rule, loss_fn: LossFn, mesh: Mesh, state: TrainState):
  """(state, batch, tick) -> (state, metrics), with explicit batches [P, b, ...]."""

  def per_device(state, batch, tick: TickInputs):
    return rule.step(state, batch, loss_fn, tick)

  return _compile(per_device, rule, mesh, state, 1)


def build_train_step(
  rule: Rule,
  loss_fn: LossFn,
  mesh: Mesh,
  state: TrainState,
  batch_size: int,
  augment: augment_lib.Augment | None = None,
  donate: bool = True,
):
  """(state, images, labels, tick) -> (state, metrics), drawing (and augmenting) batches on device.

  images [P, n, H, W, C] and labels [P, n] are the resident partitions; the
  tick is `rule.tick_inputs(...)` of the rule's clock; the state is donated
  unless not `donate`.
  """

  def per_device(state, images, labels, tick: TickInputs):
    batch = sample_local_batches(images, labels, state.rng, state.worker_steps, batch_size, augment)
    return rule.step(state, batch, loss_fn, tick)

  return _compile(per_device, rule, mesh, state, 2, donate)


def build_worker_step(
  rule: Rule,
  loss_fn: LossFn,
  mesh: Mesh,
  row: TrainState,
  batch_size: int,
  augment: augment_lib.Augment | None = None,
):
  """(row, images, labels, worker, tick) -> (row, metrics) for one worker alone, on a
  mesh of its device: `row` is the state with the worker's rows alone (worker fields
  [1, ...]), images [1, n, ...] and labels [1, n] its partition, worker [1] its index
  among all the run's workers, which draws its batches as `build_train_step` draws
  them. The rule's own step, for a tick without an exchange (runtime=threads' workers
  of a synchronous rule); nothing donated (the row's center is its device's copy,
  which the device's other workers read).
  """

  def per_device(row, images, labels, worker, tick: TickInputs):
    batch = sample_batches(images, labels, row.rng, worker, row.worker_steps, batch_size, augment)
    return rule.step(row, batch, loss_fn, tick)

  return _compile(per_device, rule, mesh, row, 3, donate=False)


def build_batch_step(
  rule: Rule,
  loss_fn: LossFn,
  mesh: Mesh,
  state: TrainState,
  augment: augment_lib.Augment | None = None,
):
  """(state, images, labels, tick) -> (state, metrics) on streamed batches.

  images [P, b, H, W, C] and labels [P, b] are each worker's batch of its
  local step (easgd.data.stream.Streamer), augmented here as
  `build_train_step` augments the batches it draws.
  """

  def per_device(state, images, labels, tick: TickInputs):
    batch = augment_local_batches(images, labels, state.rng, state.worker_steps, augment)
    return rule.step(state, batch, loss_fn, tick)

  return _compile(per_device, rule, mesh, state, 2)


def init_program(rule: Rule, params, rng: jax.Array, mesh: Mesh):
  """rule.init jitted to write the state straight into its sharded layout; `params`
  and `rng` may be abstract (jax.ShapeDtypeStruct)."""
  abstract = jax.eval_shape(rule.init, params, rng)
  shardings = sharding.named(mesh, sharding.state_specs(abstract))
  return jax.jit(rule.init, out_shardings=shardings)


def init_state(rule: Rule, params, rng: jax.Array, mesh: Mesh) -> TrainState:
  """rule.init compiled to write the state straight into its sharded layout.

  The state gets buffers of its own (the train step donates them).
  """
  return init_program(rule, params, rng, mesh)(params, rng)
