"""The pipeline against a sequential NumPy reference, and what crosses devices."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

import least_squares
import numpy_reference
from easgd import rules
from easgd.data import batches
from easgd.infra import hlo, sharding
from easgd.pipeline import programs
from easgd.rules import AXIS

PARTITION_SIZE, BATCH, STAGE_STEPS = 12, 3, 4


def init_params(key):
  w_key, b_key = jax.random.split(key)
  return {
    "w": jax.random.normal(w_key, (least_squares.DIM, least_squares.OUT)),
    "b": jax.random.normal(b_key, (least_squares.OUT,)),
  }


def loss_fn(params, batch):
  return least_squares.loss_fn(params, {"x": batch["image"], "y": batch["label"]})


def data(num_devices):
  rng = np.random.default_rng(0)
  x = rng.normal(size=(num_devices, PARTITION_SIZE, least_squares.DIM)).astype(np.float32)
  y = rng.normal(size=(num_devices, PARTITION_SIZE, least_squares.OUT)).astype(np.float32)
  return x, y


def hypers(num_models):
  rng = np.random.default_rng(1)
  seeds = np.arange(num_models, dtype=np.int32) + 10
  learning_rate = rng.uniform(0.02, 0.1, num_models).astype(np.float32)
  momentum = np.where(np.arange(num_models) % 2, 0.9, 0.0).astype(np.float32)
  weight_decay = np.where(np.arange(num_models) % 3 == 1, 0.01, 0.0).astype(np.float32)
  b1, b2 = np.full(num_models, 0.9, np.float32), np.full(num_models, 0.999, np.float32)
  return seeds, learning_rate, momentum, weight_decay, b1, b2


def run(num_models, num_devices, num_stages, nesterov):
  mesh = sharding.make_mesh(num_devices)
  settings = rules.Hyper(num_workers=1, learning_rate=1.0, nesterov=nesterov)
  runner = programs.Pipeline(num_models, num_devices, STAGE_STEPS, settings)
  state = programs.init_state(runner, init_params, hypers(num_models), mesh)
  initial = jax.device_get(state)
  x, y = data(num_devices)
  images, labels = sharding.place(mesh, x, P(AXIS)), sharding.place(mesh, y, P(AXIS))
  step = programs.build_step(runner, loss_fn, mesh, state, BATCH)
  move = programs.build_move(runner, mesh, state)
  for _ in range(num_stages):
    for _ in range(STAGE_STEPS):
      state, _ = step(state, images, labels)
    state = move(state)
  return initial, jax.device_get(state)


def sequential_numpy_run(initial, num_models, num_devices, num_stages, nesterov):
  """numpy_reference.pipeline_sgd from the pipeline's initial state, with its data and
  hyper-parameters.

  The batch indices are the sampler's (batches.batch_indices, tested in
  test_steps.py): model m draws from its data key folded with the stage;
  everything else is written out in numpy_reference.
  """
  slots = [int(np.flatnonzero(initial.model_id == m)[0]) for m in range(num_models)]

  def batch_indices(m, stage, step, partition):
    key = jax.random.fold_in(initial.data_key[slots[m]], stage)
    return np.asarray(batches.batch_indices(key, jnp.int32(step), partition, PARTITION_SIZE, BATCH))

  x, y = data(num_devices)
  _, learning_rate, momentum, weight_decay, _, _ = hypers(num_models)
  return numpy_reference.pipeline_sgd(
    [{name: leaf[slot] for name, leaf in initial.models.items()} for slot in slots],
    [{"x": x[d], "y": y[d]} for d in range(num_devices)],
    least_squares.numpy_grad,
    batch_indices,
    learning_rate=learning_rate,
    momentum=momentum,
    weight_decay=weight_decay,
    num_stages=num_stages,
    stage_steps=STAGE_STEPS,
    nesterov=nesterov,
  )


@pytest.mark.parametrize(
  "num_models,num_devices,nesterov",
  [
    (4, 2, True),
    # A model a device, twice as many models as devices, and one device: with the
    # whole suite.
    pytest.param(4, 4, False, marks=pytest.mark.e2e),
    pytest.param(8, 4, False, marks=pytest.mark.e2e),
    pytest.param(3, 1, False, marks=pytest.mark.e2e),
  ],
)
def test_every_model_matches_its_sequential_numpy_run(num_models, num_devices, nesterov):
  num_stages = 2 * num_devices + 1  # every partition twice, and one more stage
  initial, final = run(num_models, num_devices, num_stages, nesterov)
  expected = sequential_numpy_run(initial, num_models, num_devices, num_stages, nesterov)
  assert int(final.step) == num_stages * STAGE_STEPS
  for m in range(num_models):
    slot = int(np.flatnonzero(final.model_id == m)[0])
    # After s stages model m sits s*k slots further along the ring.
    assert slot == (m + num_stages * (num_models // num_devices)) % num_models
    for name, leaf in final.models.items():
      np.testing.assert_allclose(leaf[slot], expected[m][name], rtol=2e-5, atol=2e-5)


def test_models_with_other_hyper_parameters_end_elsewhere():
  _, final = run(4, 4, 4, False)
  w = np.asarray(final.models["w"])
  assert all(not np.allclose(w[a], w[b]) for a in range(4) for b in range(a))


def compiled_programs(num_models, num_devices):
  mesh = sharding.make_mesh(num_devices)
  runner = programs.Pipeline(num_models, num_devices, STAGE_STEPS)
  state = programs.init_state(runner, init_params, hypers(num_models), mesh)
  x, y = data(num_devices)
  images, labels = sharding.place(mesh, x, P(AXIS)), sharding.place(mesh, y, P(AXIS))
  step = programs.build_step(runner, loss_fn, mesh, state, BATCH).lower(state, images, labels)
  move = programs.build_move(runner, mesh, state).lower(state)
  return state, step.compile().as_text(), move.compile().as_text()


def test_only_the_models_state_crosses_devices_once_a_stage():
  state, step, move = compiled_programs(8, 4)
  assert hlo.collectives(step) == []  # a training step sends nothing
  sent = hlo.collectives(move)
  assert sent and {kind for kind, _ in sent} == {"collective-permute"}
  # One device's 2 slots: parameters, momentum, hyper-parameters, step counts, ids, keys.
  slot_leaves = [leaf for leaf in jax.tree.leaves(state) if leaf.ndim >= 1]
  local_state = sum(leaf.addressable_shards[0].data.nbytes for leaf in slot_leaves)
  assert sum(size for _, size in sent) == local_state


def test_a_single_device_moves_nothing():
  _, step, move = compiled_programs(2, 1)
  assert hlo.collectives(step) == [] and hlo.collectives(move) == []
