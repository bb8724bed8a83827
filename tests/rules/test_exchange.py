"""Compressed exchanges: what a receiver gets of a message, its size, and rules sending it."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import test_parameter_server
import tiers
from test_outer import TAU, assert_follows, hyper
from test_rules import ALPHA, ETA, make_problem, per_worker, run_rule

import numpy_optim
from easgd import rules
from easgd.rules import exchange, spmd
from easgd.train import trainer
from least_squares import numpy_grad
from runs import small_config


def bfloat16_nearest_even(x):
  """float32 -> the nearest bfloat16 (ties to even), back as float64: on the bits."""
  bits = np.asarray(x, np.float32).view(np.uint32).astype(np.uint64)
  bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
  return bits.astype(np.uint32).view(np.float32).astype(np.float64)


def test_bfloat16_rounds_each_entry_to_the_nearest_even():
  magnitudes = 10.0 ** np.arange(-5, 5).repeat(100)
  values = (np.random.default_rng(0).normal(size=1000) * magnitudes).astype(np.float32)
  received = np.asarray(exchange.compress({"v": jnp.asarray(values)}, "bfloat16", None)["v"])
  np.testing.assert_array_equal(received, bfloat16_nearest_even(values).astype(np.float32))


@pytest.mark.parametrize("dtype,levels", [("int8", 127), ("int4", 7), ("int2", 1)])
def test_the_integer_dtypes_are_on_their_grid_within_one_step_and_unbiased(dtype, levels):
  rng = np.random.default_rng(1)
  values = jnp.asarray(rng.normal(size=(6, 5)), jnp.float32)
  scale = float(jnp.max(jnp.abs(values))) / levels
  draws = np.stack([
    np.asarray(exchange.compress({"v": values}, dtype, jax.random.PRNGKey(k))["v"])
    for k in range(2000)
  ])  # fmt: skip
  steps = draws / scale
  np.testing.assert_allclose(steps, np.round(steps), atol=1e-3)
  assert np.abs(steps).max() <= levels + 1e-3
  assert np.abs(draws - np.asarray(values)).max() < scale * (1 + 1e-5)
  # E[Q(v)] = v: the mean of 2000 draws is within 4 standard errors (<= scale/2/sqrt(n)).
  assert np.abs(draws.mean(axis=0) - np.asarray(values)).max() < 4 * scale / 2 / np.sqrt(2000)
  # The key decides: the same key, the same message.
  again = exchange.compress({"v": values}, dtype, jax.random.PRNGKey(7))["v"]
  np.testing.assert_array_equal(np.asarray(again), draws[7])


def test_a_zero_message_stays_zero():
  zero = {"v": jnp.zeros((3, 3))}
  for dtype in exchange.DTYPES:
    assert not np.any(np.asarray(exchange.compress(zero, dtype, jax.random.PRNGKey(0))["v"]))


def test_message_bytes_count_entries_and_scales():
  tree = {"w": np.zeros((5, 3), np.float32), "b": np.zeros(3, np.float32)}
  assert exchange.message_bytes(tree, "float32") == 4 * 18
  assert exchange.message_bytes(tree, "bfloat16") == 2 * 18
  assert exchange.message_bytes(tree, "int8") == 18 + 4 * 2
  # Two int4 entries a byte, an odd count rounded up: 15 entries in 8 bytes, 3 in 2.
  assert exchange.message_bytes(tree, "int4") == 8 + 2 + 4 * 2
  # Four int2 entries a byte: 15 entries in 4 bytes, 3 in 1.
  assert exchange.message_bytes(tree, "int2") == 4 + 1 + 4 * 2


@pytest.mark.parametrize("name,pull", [("sync_easgd", "elastic"), ("local_sgd", "reset")])
def test_rules_send_what_bfloat16_keeps_of_their_differences(name, pull):
  x0, batches = make_problem(num_workers=8)
  actual = run_rule(name, hyper(exchange_dtype="bfloat16"), x0, batches, 4)
  outer = numpy_optim.sgd(8 * ALPHA if pull == "elastic" else 1.0)
  expected = numpy_optim.center_family(
    x0, [per_worker(b) for b in batches], numpy_grad, numpy_optim.sgd(ETA), TAU, pull, outer,
    alpha=ALPHA, sent=lambda d, t, i: {k: bfloat16_nearest_even(v) for k, v in d.items()},
  )  # fmt: skip
  assert_follows(actual, expected)


def _final_centers(name, settings):
  """The final center of `name` with `settings`, synchronous or on the parameter server's clock."""
  if rules.RULES[name].parameter_server():
    state, _ = test_parameter_server.final(name, settings, test_parameter_server.UNEQUAL)
    return jax.tree.leaves(state.center)
  x0, batches = make_problem(num_workers=settings.num_workers)
  return jax.tree.leaves(run_rule(name, settings, x0, batches, 2)[-1].center)


@pytest.mark.parametrize(
  "name",
  tiers.cases(["sync_easgd", "diloco", "sync_sgd", "async_easgd", "downpour", "async_local_sgd"]),
)
def test_int8_exchanges_train_close_to_float32_and_replay_bit_for_bit(name):
  if rules.RULES[name].parameter_server():
    settings = test_parameter_server.hyper_for(name)
  else:
    settings = hyper()
  compressed = dataclasses.replace(settings, exchange_dtype="int8")
  a, b = _final_centers(name, compressed), _final_centers(name, compressed)
  exact = _final_centers(name, settings)
  for x, y, z in zip(a, b, exact, strict=True):
    np.testing.assert_array_equal(x, y)
    assert not np.array_equal(x, z)  # int8 was sent, ...
    np.testing.assert_allclose(x, z, atol=0.05)  # ... and it trains alike


@pytest.mark.e2e
@pytest.mark.parametrize("algorithm", ["sync_easgd", "async_easgd"])
def test_the_bytes_a_run_reports_are_those_sent(tmp_path, algorithm):
  """Counted from the model's entries and tensors: a compressed message out, the float32
  result back (an all-reduce's two phases: each worker sends (P-1)/P of each). int8
  alone: float32 takes the same path, with a message out as large as the one back."""
  overrides = {"outer.exchange_dtype": "int8", "run.checkpoint_every": 0}
  overrides |= {"run.total_steps": 12, "run.log_every": 12}
  config = small_config(overrides, algorithm=algorithm)
  result = trainer.train_and_evaluate(config, str(tmp_path))
  reported = result.metrics["comm/bytes_per_worker"]
  exchanges = result.metrics["comm/exchanges_per_worker"]
  leaves = jax.tree.leaves(result.state.center)
  entries, tensors = sum(leaf.size for leaf in leaves), len(leaves)
  int8 = entries + 4 * tensors
  if algorithm == "sync_easgd":  # 4 workers, tau = 4: 3 all-reduces in 12 steps
    assert exchanges == 3
    np.testing.assert_allclose(reported, 3 * 3 / 4 * (4 * entries + int8))
  else:  # a request carries the worker's message; the float32 reply is the master's
    np.testing.assert_allclose(reported / exchanges, int8)


# Error feedback (docs/algorithms.md, "Compressed exchanges"): 4 workers, 7 steps.
FEEDBACK_WORKERS = 4
DILOCO_OUTER = dict(outer_learning_rate=0.7, outer_momentum=0.9, outer_nesterov=True)


def stochastic(levels):
  """Q of a message sent as int8, int4 or int2, from its equations: s = max|v|/levels
  per tensor, q = clip(floor(v/s + U), -levels, levels), Q(v) = s*q, with the uniform
  numbers U of the run's key, the step, the worker and the tensor (those the code
  draws: the equations leave them to it)."""

  def sent(v, t, i):
    key = jax.random.fold_in(jax.random.PRNGKey(0), spmd.EXCHANGE_STREAM)
    key = jax.random.fold_in(jax.random.fold_in(key, t), i)
    names = sorted(v)  # the order of a dict's leaves
    received = {}
    for name, k in zip(names, jax.random.split(key, len(names)), strict=True):
      noise = np.asarray(jax.random.uniform(k, v[name].shape, jnp.float32), np.float64)
      scale = np.max(np.abs(v[name])) / levels
      scale = scale if scale > 0 else 1.0
      received[name] = scale * np.clip(np.floor(v[name] / scale + noise), -levels, levels)
    return received

  return sent


def assert_within(actual, expected, rtol=1e-5, atol=1e-6):
  """Every worker and the center after each step, within 1e-5 relative."""
  for state, (workers, center) in zip(actual, expected, strict=True):
    for key in center:
      np.testing.assert_allclose(np.asarray(state.center[key]), center[key], rtol, atol)
    for i, values in enumerate(workers):
      for key in values:
        np.testing.assert_allclose(np.asarray(state.workers[key][i]), values[key], rtol, atol)


def assert_feedback_follows_its_equations(name, dtype, num_devices):
  """diloco (tau = 3) or streaming_diloco (H = 4 in 2 fragments, each applied a step
  after it is sent; the least-squares model has two layers), sending int4 or int2 with
  error feedback, against numpy_optim's rules with a residual per worker."""
  x0, batches = make_problem(num_workers=FEEDBACK_WORKERS)
  worker_batches = [per_worker(b) for b in batches]
  levels = exchange.LEVELS[dtype]
  sent = numpy_optim.feedback(stochastic(levels), FEEDBACK_WORKERS)
  outer = numpy_optim.sgd(0.7, mu=0.9, nesterov=True)
  settings = dict(
    num_workers=FEEDBACK_WORKERS, exchange_dtype=dtype, error_feedback=True, **DILOCO_OUTER
  )
  if name == "diloco":
    actual = run_rule(name, hyper(**settings), x0, batches, num_devices)
    expected = numpy_optim.center_family(
      x0, worker_batches, numpy_grad, numpy_optim.sgd(ETA), TAU, "reset", outer, sent=sent
    )
  else:
    streaming = dict(comm_period=4, fragments=2, sync_delay=1)
    actual = run_rule(name, hyper(**settings, **streaming), x0, batches, num_devices)
    expected = numpy_optim.streaming(
      x0, worker_batches, numpy_grad, numpy_optim.sgd(ETA), 4, [["b"], ["w"]], delay=1,
      pull="reset", outer=outer, sent=sent,
    )  # fmt: skip
  assert_within(actual, expected)
  # What compression dropped is kept: each worker's residual is nonzero.
  residual = actual[-1].worker_opt["residual"]
  assert all(np.abs(residual[key][i]).max() > 0 for key in x0 for i in range(4))


FEEDBACK_CASES = [
  ("diloco", "int2"),
  ("streaming_diloco", "int4"),
  ("diloco", "int4"),
  ("streaming_diloco", "int2"),
]


@pytest.mark.parametrize("name,dtype", tiers.first_quick(FEEDBACK_CASES, quick=2))
def test_error_feedback_follows_its_equations(name, dtype):
  assert_feedback_follows_its_equations(name, dtype, num_devices=2)


def test_error_feedback_sends_what_the_messages_add_up_to_but_the_last_residual():
  """sum_k Q(v_k + e_k) = sum_k v_k - e_K: nothing a worker's messages held is lost, and
  each residual is within one step of int2's grid (|e| <= s = max|v + e|)."""
  rng = np.random.default_rng(3)
  messages = [{"v": jnp.asarray(rng.normal(size=(2, 5, 3)), jnp.float32)} for _ in range(6)]
  residual = jax.tree.map(jnp.zeros_like, messages[0])
  sent_total = jax.tree.map(jnp.zeros_like, messages[0])
  for k, message in enumerate(messages):
    total = message["v"] + residual["v"]
    sent, residual = exchange.with_feedback(
      message, residual, "int2", jax.random.PRNGKey(k), jnp.arange(2)
    )
    scales = jnp.max(jnp.abs(total), axis=(1, 2), keepdims=True)
    assert bool(jnp.all(jnp.abs(residual["v"]) <= scales * (1 + 1e-6)))
    sent_total = jax.tree.map(jnp.add, sent_total, sent)
  every = np.sum([np.asarray(m["v"]) for m in messages], axis=0)
  np.testing.assert_allclose(np.asarray(sent_total["v"]), every - residual["v"], atol=1e-5)


@pytest.mark.parametrize("name", tiers.first_quick(["diloco", "streaming_diloco"]))
def test_error_feedback_with_float32_exchanges_is_none_bit_for_bit(name):
  """Q the identity: e = (v + 0) - (v + 0) = 0 at every exchange, and the workers send v."""
  x0, batches = make_problem(num_workers=FEEDBACK_WORKERS)
  settings = dict(num_workers=FEEDBACK_WORKERS, fragments=2, sync_delay=1, comm_period=4)
  if name == "diloco":
    settings = dict(num_workers=FEEDBACK_WORKERS, **DILOCO_OUTER)
  plain = run_rule(name, hyper(**settings), x0, batches, 2)
  fed = run_rule(name, hyper(**settings, error_feedback=True), x0, batches, 2)
  for a, b in zip(plain, fed, strict=True):
    ours, theirs = jax.tree.leaves((a.center, a.workers)), jax.tree.leaves((b.center, b.workers))
    for x, y in zip(ours, theirs, strict=True):
      np.testing.assert_array_equal(x, y)
    assert not any(np.any(leaf) for leaf in jax.tree.leaves(b.worker_opt["residual"]))
