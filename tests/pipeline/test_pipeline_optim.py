"""The pipeline with the inner optimizer: AdamW and a schedule, each model with its own
values, against NumPy model by model; and the learning rate each model logs."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P
from test_pipeline import BATCH, PARTITION_SIZE, STAGE_STEPS, data, init_params, loss_fn

import least_squares
import numpy_optim
from easgd import rules
from easgd.data import batches
from easgd.infra import scalars, sharding
from easgd.pipeline import programs
from easgd.rules import AXIS
from easgd.train import trainer
from runs import small_config

NUM_MODELS, NUM_DEVICES, NUM_STAGES = 4, 2, 3
TOTAL = NUM_STAGES * STAGE_STEPS
PEAK = np.array([0.05, 0.02, 0.1, 0.03], np.float32)
DECAY = np.array([0.0, 0.1, 0.01, 0.0], np.float32)
B1 = np.array([0.9, 0.8, 0.95, 0.5], np.float32)
B2 = np.array([0.999, 0.99, 0.9, 0.999], np.float32)


def test_models_train_with_adamw_under_a_schedule_at_their_own_values():
  mesh = sharding.make_mesh(NUM_DEVICES)
  settings = rules.Hyper(
    num_workers=1,
    learning_rate=1.0,
    optimizer="adamw",
    schedule="warmup_cosine",
    warmup_steps=3,
    total_steps=TOTAL,
  )
  runner = programs.Pipeline(NUM_MODELS, NUM_DEVICES, STAGE_STEPS, settings)
  seeds = np.arange(NUM_MODELS, dtype=np.int32)
  values = [seeds, PEAK, np.zeros(NUM_MODELS, np.float32), DECAY, B1, B2]
  state = programs.init_state(runner, init_params, values, mesh)
  initial = jax.device_get(state)
  x, y = data(NUM_DEVICES)
  images, labels = sharding.place(mesh, x, P(AXIS)), sharding.place(mesh, y, P(AXIS))
  step = programs.build_step(runner, loss_fn, mesh, state, BATCH)
  move = programs.build_move(runner, mesh, state)
  logged = np.zeros((TOTAL, NUM_MODELS))
  for stage in range(NUM_STAGES):
    for j in range(STAGE_STEPS):
      model_id = np.asarray(jax.device_get(state.model_id))
      state, metrics = step(state, images, labels)
      logged[stage * STAGE_STEPS + j, model_id] = np.asarray(metrics["learning_rate"])
    state = move(state)
  final = jax.device_get(state)

  rates = [numpy_optim.warmup_cosine(float(PEAK[m]), 3, TOTAL) for m in range(NUM_MODELS)]
  for m in range(NUM_MODELS):
    np.testing.assert_allclose(logged[:, m], [rates[m](t) for t in range(TOTAL)], rtol=1e-5)
  slots = [int(np.flatnonzero(initial.model_id == m)[0]) for m in range(NUM_MODELS)]

  def batch_indices(m, stage, j, partition):
    key = jax.random.fold_in(initial.data_key[slots[m]], stage)
    return np.asarray(batches.batch_indices(key, jnp.int32(j), partition, PARTITION_SIZE, BATCH))

  optimizers = [
    numpy_optim.Optimizer("adamw", rates[m], wd=float(DECAY[m]), b1=float(B1[m]), b2=float(B2[m]))
    for m in range(NUM_MODELS)
  ]
  expected = numpy_optim.pipeline(
    [{k: leaf[slot] for k, leaf in initial.models.items()} for slot in slots],
    [{"x": x[d], "y": y[d]} for d in range(NUM_DEVICES)],
    least_squares.numpy_grad,
    batch_indices,
    optimizers,
    num_stages=NUM_STAGES,
    stage_steps=STAGE_STEPS,
  )
  for m in range(NUM_MODELS):
    slot = int(np.flatnonzero(final.model_id == m)[0])
    for name, leaf in final.models.items():
      np.testing.assert_allclose(leaf[slot], expected[m][name], rtol=2e-5, atol=2e-5)


@pytest.mark.e2e
def test_each_models_run_logs_its_own_learning_rate(tmp_path):
  peaks = (0.01, 0.02, 0.03, 0.04)
  config = small_config(
    {
      "pipeline.per_model.learning_rate": peaks,
      "optimizer.schedule": "warmup_cosine",
      "optimizer.warmup_steps": 5,
      "run.checkpoint_every": 0,
    },
    algorithm="pipeline",
  )
  trainer.train_and_evaluate(config, str(tmp_path))
  for m, peak in enumerate(peaks):
    logged = dict(scalars.read(str(tmp_path / f"model_{m}"))["train/learning_rate"])
    rate = numpy_optim.warmup_cosine(peak, 5, 40)
    # Logged every 10 steps: the mean of the rates of the steps since the last log.
    expected = {s: np.mean([rate(t) for t in range(s - 10, s)]) for s in (10, 20, 30, 40)}
    assert sorted(logged) == sorted(expected)
    for step, value in expected.items():
      np.testing.assert_allclose(logged[step], value, rtol=1e-5)
