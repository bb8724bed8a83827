"""Pipelined multi-model training (Chen et al., IEEE ISM 2015): models move, data stays.

M models train at once on D devices (D divides M, k = M/D models a device).
The training set is split into D partitions, placed once, one a device.
Stage s (s = 0, 1, ...) is stage_steps SGD steps of every model on the
partition of the device that holds it (`local_step`, no communication);
then every model's state (parameters, optimizer state and the
hyper-parameters inside it) moves one device along the ring d -> d + 1
(`move`, one `lax.ppermute`). Model m starts on device m // k, so at
stage s it trains on partition

    d(m, s) = (m // k + s) mod D,

and after D stages it has seen every partition once. With k = 1, device d
trains model (d - s) mod M at stage s (docs/algorithms.md).

Each model m has its own hyper-parameters, held as arrays in its optimizer
state (optax.inject_hyperparams), so M models of one run are a sweep. The
optimizer is the rules' inner one (easgd.rules.optimizers) with model m's
values; with sgd:

    g  = grad of the mean loss of a batch of b examples at x_m
    g' = g + lambda_m * x_m                     (weight decay)
    v  <- mu_m * v + g'                         (optax.sgd's trace; v = 0 at start)
    x_m <- x_m - eta_m(t) * v                   (Nesterov: x_m - eta_m(t) * (g' + mu_m * v))

and with adamw, Adam's moments with model m's b1, b2 and decoupled decay
lambda_m. The schedule's shape is the run's (optimizer.schedule): model m's
learning rate is eta_m(t) = eta_m * s(t), s the schedule at peak 1, t the
model's step count.

Model m's initial parameters come from its seed; its batches are drawn from
(seed, stage, partition, step within the stage), a permutation of the
partition per stage, like the workers' batches of the other rules.
A model's BatchNorm statistics are part of its state and move with it; the
optimizer sees its parameters only, and each step sets the statistics to
the forward pass's s' (easgd.rules.model_state).
"""

import dataclasses
from collections.abc import Callable, Sequence

import jax
import jax.numpy as jnp
import optax
from flax import struct
from jax import lax
from jax.sharding import Mesh
from jax.sharding import PartitionSpec as P

from easgd.data import augment as augment_lib
from easgd.data import batches
from easgd.infra import sharding
from easgd.rules import AXIS, Hyper, LossFn, model_state, optimizers
from easgd.rules.spmd import map_workers


@struct.dataclass
class PipelineState:
  """The models in their slots: slot j (of M) lives on device j // k.

  Attributes:
    step: SGD steps each model has taken, int32; stage step // stage_steps.
    models: parameters, stacked on a leading axis of M slots (sharded).
    opt: each slot's optimizer state, hyper-parameters included (sharded).
    model_id: which model is in each slot, int32 [M] (sharded); it moves with
      the model.
    data_key: each slot's model's data key, [M] keys (sharded); moves too.
  """

  step: jax.Array
  models: object
  opt: object
  model_id: jax.Array
  data_key: jax.Array


# The values a model may set for itself (pipeline.per_model.*), and the
# config field each one replaces for that model.
PER_MODEL_SOURCE = {
  **{
    field.name: field.path
    for field in (
      optimizers.LEARNING_RATE,
      optimizers.MOMENTUM,
      optimizers.WEIGHT_DECAY,
      optimizers.B1,
      optimizers.B2,
    )
  },
  "seed": "seed",
}
PER_MODEL_FIELDS = tuple(PER_MODEL_SOURCE)
# The optimizer's, in the order Pipeline.init takes them after the seeds.
HYPER_FIELDS = ("learning_rate", "momentum", "weight_decay", "b1", "b2")


def _shape(hyper) -> Callable:
  """The schedule at peak 1: t -> s(t) (1 for the constant schedule)."""
  return optimizers.schedule(dataclasses.replace(hyper, learning_rate=1.0))


def _factory(hyper) -> Callable:
  """(eta, mu, lambda, b1, b2) -> the optimizer of one model: its values are arrays
  held in its state, and its learning rate eta * s(t) when there is a schedule."""
  shape = _shape(hyper)

  def make(learning_rate, momentum, weight_decay, b1, b2):
    rate = (lambda count: learning_rate * shape(count)) if callable(shape) else learning_rate
    if hyper.optimizer == "adamw":
      return optax.adamw(rate, b1=b1, b2=b2, eps=hyper.eps, weight_decay=weight_decay)
    return optax.chain(
      optax.add_decayed_weights(weight_decay),
      optax.sgd(rate, momentum=momentum, nesterov=hyper.nesterov),
    )

  return make


class Pipeline:
  """The pipeline's pure functions: init, a local step and the move, per device."""

  def __init__(
    self, num_models: int, num_devices: int, stage_steps: int, hyper: Hyper | None = None
  ):
    """hyper: the optimizer's name, schedule and other static settings
    (`Hyper.from_config`; None: sgd at a constant rate); each model's values
    of HYPER_FIELDS come to `init`."""
    hyper = hyper or Hyper(num_workers=1, learning_rate=1.0)
    self.num_models = num_models
    self.num_devices = num_devices
    self.stage_steps = stage_steps
    self.shape = _shape(hyper)
    # Hyper-parameters as optimizer state: update() reads each model's own
    # values from its state, so the values given here are placeholders.
    self.make_optimizer = optax.inject_hyperparams(_factory(hyper))
    self.optimizer = self.make_optimizer(0.0, 0.0, 0.0, 0.0, 0.0)

  def init(self, init_params, seeds, *values) -> PipelineState:
    """The state at step 0.

    Args:
      init_params: key -> one model's parameters.
      seeds, *values: [M] arrays, model m's seed and its values of HYPER_FIELDS.
    """
    keys = jax.vmap(jax.random.PRNGKey)(seeds)
    init_keys, data_keys = jax.vmap(jax.random.split, out_axes=1)(keys)
    models = jax.vmap(init_params)(init_keys)

    def init_opt(params, *model_values):
      return self.make_optimizer(*model_values).init(model_state.trainable(params))

    opt = jax.vmap(init_opt)(models, *values)
    return PipelineState(
      step=jnp.zeros((), jnp.int32),
      models=models,
      opt=opt,
      model_id=jnp.arange(self.num_models, dtype=jnp.int32),
      data_key=data_keys,
    )

  def local_step(
    self,
    state: PipelineState,
    images,
    labels,
    loss_fn: LossFn,
    batch_size: int,
    augment: augment_lib.Augment | None = None,
  ):
    """One SGD step of every model on its device's partition, per device inside shard_map.

    images [1, n, ...] and labels [1, n] are this device's partition; the
    state holds this device's k slots. Nothing crosses devices. Returns the
    new state and each local slot's loss and accuracy [k].
    """
    device = lax.axis_index(AXIS)
    stage, position = state.step // self.stage_steps, state.step % self.stage_steps
    images, labels = images[0], labels[0]

    def one_model(params, opt_state, data_key):
      rng = jax.random.fold_in(data_key, stage)
      indices = batches.batch_indices(rng, position, device, labels.shape[0], batch_size)
      batch_images = augment_lib.apply(augment, rng, device, position, images[indices])
      batch = {"image": batch_images, "label": labels[indices]}
      (loss, aux), grads = jax.value_and_grad(loss_fn, has_aux=True)(params, batch)
      trainable = model_state.trainable(params)
      updates, opt_state = self.optimizer.update(model_state.trainable(grads), opt_state, trainable)
      updates = model_state.stats_step(model_state.with_trainable(params, updates), params, aux)
      return optax.apply_updates(params, updates), opt_state, loss, aux["accuracy"]

    models, opt, loss, accuracy = map_workers(one_model, state.models, state.opt, state.data_key)
    new_state = state.replace(step=state.step + 1, models=models, opt=opt)
    # Each slot's learning rate in force at this step: eta_m * s(t).
    peak = state.opt.hyperparams["learning_rate"]
    learning_rate = peak * self.shape(state.step) if callable(self.shape) else peak
    return new_state, {"loss": loss, "accuracy": accuracy, "learning_rate": learning_rate}

  def move(self, state: PipelineState) -> PipelineState:
    """Every device's models (with their optimizer state, ids and data keys) to the
    next device on the ring, per device inside shard_map: the only communication.
    """
    if self.num_devices == 1:
      return state
    ring = [(d, (d + 1) % self.num_devices) for d in range(self.num_devices)]
    slots = (state.models, state.opt, state.model_id, state.data_key)
    models, opt, model_id, data_key = jax.tree.map(
      lambda leaf: lax.ppermute(leaf, AXIS, ring), slots
    )
    return state.replace(models=models, opt=opt, model_id=model_id, data_key=data_key)


def state_specs(state: PipelineState) -> PipelineState:
  """Slot-indexed fields split over the devices; the step replicated."""
  return PipelineState(
    step=P(),
    models=jax.tree.map(lambda _: P(AXIS), state.models),
    opt=jax.tree.map(lambda _: P(AXIS), state.opt),
    model_id=P(AXIS),
    data_key=P(AXIS),
  )


def init_program(pipeline: Pipeline, init_params, arrays: Sequence, mesh: Mesh):
  """pipeline.init jitted to write the state straight into its sharded layout: a
  program of the [M] arrays `arrays` (seeds and values, which may be abstract)."""

  def init(*arrays):
    return pipeline.init(init_params, *arrays)

  abstract = jax.eval_shape(init, *arrays)
  shardings = sharding.named(mesh, state_specs(abstract))
  return jax.jit(init, out_shardings=shardings)


def init_state(pipeline: Pipeline, init_params, hypers: Sequence, mesh: Mesh) -> PipelineState:
  """pipeline.init compiled to write the state straight into its sharded layout."""
  arrays = [jnp.asarray(a) for a in hypers]
  return init_program(pipeline, init_params, arrays, mesh)(*arrays)


def build_step(
  pipeline: Pipeline,
  loss_fn: LossFn,
  mesh: Mesh,
  state,
  batch_size: int,
  augment: augment_lib.Augment | None = None,
):
  """(state, images [D, n, ...], labels [D, n]) -> (state, metrics [M]): one local step.

  One program a step, not a loop over the stage: XLA's CPU backend runs
  convolution steps inside a while loop several times slower.
  """

  def per_device(state, images, labels):
    return pipeline.local_step(state, images, labels, loss_fn, batch_size, augment)

  specs = state_specs(state)
  return sharding.jit_shard_map(per_device, mesh, (specs, P(AXIS), P(AXIS)), (specs, P(AXIS)))


def build_move(pipeline: Pipeline, mesh: Mesh, state):
  """state -> state with every model one device further along the ring."""
  specs = state_specs(state)
  return sharding.jit_shard_map(pipeline.move, mesh, (specs,), specs)
