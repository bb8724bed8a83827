"""The GPU tier (`pytest -m gpu`): what must hold on an accelerator, on its first device.

Skipped without one (tests/conftest.py). Each test runs the CPU tier's own
check of the same property, on a mesh of the one GPU with several workers:
the default run's accuracy band, every rule's step against its NumPy
reference, BatchNorm against Flax's, a bitwise resume (XLA:GPU's deterministic
ops, which train.py sets, easgd/infra/platform.py), the threads runtime's
record and replay, and bfloat16 compute with float32 state.

The NumPy comparisons run at jax_default_matmul_precision=highest: a GPU's
float32 matrix products default to TF32 (10 mantissa bits), whose rounding
would hide an error of the same size, or fail a tolerance meant for float32.
The training runs keep the default precision, as users run them.
"""

import importlib
import pathlib

import jax
import numpy as np
import pytest
import test_batch_norm
import test_outer
import test_parameter_server
import test_rules
import test_streaming
import test_threads

from easgd import rules
from easgd.train import trainer
from runs import assert_bfloat16_run_keeps_float32_state, config_with, read_state

pytestmark = pytest.mark.gpu

# The GPU's one device holds every worker.
ONE_DEVICE = {"run.devices": 1}


@pytest.fixture
def highest_precision():
  with jax.default_matmul_precision("highest"):
    yield


def test_the_default_run_reaches_its_band(tmp_path):
  """README's default run (Sync EASGD, 8 workers, LeNet-5, 600 steps) ends at >= 0.95."""
  result = trainer.train_and_evaluate(config_with(), str(tmp_path))
  assert result.metrics["eval/center_accuracy"] >= 0.95


def _elastic(name, mu, nesterov):
  return lambda: test_rules.test_elastic_rules_follow_their_equations(
    name, mu, nesterov, tau=3, num_devices=1
  )


def _parameter_server(name):
  return lambda: test_parameter_server.test_rule_follows_a_literal_parameter_server(name, 1)


# Each rule's checks against its NumPy reference, those of the CPU tier on one device.
REFERENCE_CHECKS = {
  "sync_sgd": [
    lambda mu=mu, nesterov=nesterov: test_rules.test_sync_sgd_follows_its_equations(mu, nesterov, 1)
    for mu, nesterov in ((0.0, False), (test_rules.MU, False), (test_rules.MU, True))
  ],
  "sync_easgd": [
    _elastic(*variant) for variant in test_rules.ELASTIC if variant[0] == "sync_easgd"
  ],
  "sync_measgd": [
    _elastic(*variant) for variant in test_rules.ELASTIC if variant[0] == "sync_measgd"
  ],
  "diloco": [lambda: test_outer.test_diloco_follows_its_equations(1)],
  "local_sgd": [lambda: test_outer.test_local_sgd_follows_its_equations(1)],
  "lookahead": [lambda: test_outer.test_lookahead_follows_its_equations(8, 1)],
  **{name: [_parameter_server(name)] for name in rules.names(parameter_server=True)},
  "streaming_diloco": [
    lambda delay=delay, merge=merge: test_streaming.test_streaming_diloco_follows_its_equations(
      delay, merge, num_devices=1
    )
    for delay, merge in test_streaming.DELAYS_AND_MERGES
  ],
  "streaming_easgd": [
    lambda delay=delay: test_streaming.test_streaming_easgd_follows_its_equations(delay, 1)
    for delay in test_streaming.EASGD_DELAYS
  ],
}


# The test modules of the rules, any of which may keep a rule's checks (GPU_CHECKS).
RULE_TESTS = pathlib.Path(__file__).parent / "rules"


def checks_of(name: str) -> list:
  """The rule's checks against its NumPy reference: the table's above, or those the test
  modules of tests/rules keep for it (a dict `GPU_CHECKS` of rule name -> checks, in
  whichever module tests the rule): a new rule brings them. The CPU tier checks that
  every rule has some (tests/rules/test_rules.py)."""
  if name in REFERENCE_CHECKS:
    return REFERENCE_CHECKS[name]
  found = []
  for path in sorted(RULE_TESTS.glob("test_*.py")):
    module = importlib.import_module(path.stem)
    found += getattr(module, "GPU_CHECKS", {}).get(name, [])
  return found


@pytest.mark.parametrize("name", list(rules.RULES))
def test_every_rule_follows_its_numpy_reference(name, highest_precision):
  checks = checks_of(name)
  assert checks, f"{name} has no NumPy reference check in the GPU tier"
  for check in checks:
    check()


@pytest.mark.parametrize("shape", [(128, 32, 32, 16), (16, 8, 8, 64)])
def test_batch_norm_follows_its_equations(shape, highest_precision):
  test_batch_norm.test_training_step_matches_the_numpy_equations(shape)


def test_batch_norm_shares_flax_variables_and_running_averages(highest_precision):
  test_batch_norm.test_the_module_shares_flax_variables_and_running_averages()


@pytest.mark.parametrize("shape", [(16, 7), (6, 5, 5, 4)])
def test_batch_norm_has_flax_gradients(shape, highest_precision):
  test_batch_norm.test_a_training_loss_has_flax_gradients(shape)


@pytest.mark.parametrize("algorithm", ["sync_easgd", "hogwild_easgd"])
def test_a_resumed_run_ends_bitwise_equal_to_an_uninterrupted_one(tmp_path, algorithm):
  """LeNet-5 on mnist5k, 4 workers: 40 steps at once, or 20, then 20 more from the
  checkpoint of step 20 (hogwild_easgd resumes its simulated cluster too)."""
  run = {**ONE_DEVICE, "run.log_every": 10, "run.eval_every": 0, "run.checkpoint_every": 20}
  config = config_with({**run, "run.total_steps": 40}, algorithm=algorithm, workers=4)
  trainer.train_and_evaluate(config, str(tmp_path / "straight"))
  stopped = config_with({**run, "run.total_steps": 20}, algorithm=algorithm, workers=4)
  trainer.train_and_evaluate(stopped, str(tmp_path / "resumed"))
  trainer.train_and_evaluate(config, str(tmp_path / "resumed"))
  a = read_state(tmp_path / "straight" / "checkpoints" / "40" / "state")
  b = read_state(tmp_path / "resumed" / "checkpoints" / "40" / "state")
  assert len(a) == len(b) > 10
  for x, y in zip(a, b, strict=True):
    assert x.dtype == y.dtype and x.tobytes() == y.tobytes()


@pytest.mark.parametrize("algorithm", ["async_easgd", "hogwild_sgd"])
def test_threads_record_and_replay_to_the_same_trajectory(tmp_path, algorithm):
  """4 workers in threads of their own on the one GPU, then the trace replayed.

  On the CPU the replay reaches the same bits (tests/train/runtimes/test_threads.py). XLA:GPU
  fuses a worker's own program and the tick program that replays it
  otherwise, and rounds some sums differently: on an H200 (jax 0.11.2) the
  checkpoints of step 24 differed in the last bit of some entries. The replay
  follows the same trajectory to that rounding.
  """
  config = test_threads._config(algorithm, 4, **ONE_DEVICE)
  real, replay = test_threads._record_and_replay(tmp_path, config)
  for step in (12, 24):
    a = read_state(real / "checkpoints" / str(step) / "state")
    b = read_state(replay / "checkpoints" / str(step) / "state")
    assert len(a) == len(b) > 10
    for x, y in zip(a, b, strict=True):
      assert x.dtype == y.dtype
      np.testing.assert_allclose(x, y, rtol=1e-5, atol=1e-7)


def test_bfloat16_compute_keeps_a_float32_state(tmp_path):
  assert_bfloat16_run_keeps_float32_state(tmp_path, steps=400)


def test_the_gpu_is_what_runs(tmp_path):
  """The tier's runs happen on the accelerator, not on a CPU fallback."""
  result = trainer.train_and_evaluate(
    config_with({**ONE_DEVICE, "run.total_steps": 2, "run.checkpoint_every": 0}), str(tmp_path)
  )
  leaf = jax.tree.leaves(result.state)[0]
  assert {device.platform for device in leaf.devices()} == {"gpu"}
  assert np.isfinite(result.metrics["eval/center_accuracy"])
