"""Hierarchical Local SGD, run sharded over the mesh, against its equations in plain
NumPy; its identity with post_local_sgd; its clock's levels on the network."""

import dataclasses

import numpy as np
import pytest
import tiers
from test_rules import ETA, assert_close, make_problem, per_worker, run_rule

import numpy_optim
from easgd import rules
from easgd.sim import timing
from least_squares import numpy_grad
from numpy_reference import warm_up_then_local


def hierarchical_local_sgd(x0, batches, inner, switch, levels):
  """[(workers, center)] after each step t (from 0), from docs/algorithms.md: post-local
  SGD's warm-up and local steps (numpy_reference.warm_up_then_local); then of the
  levels (period, size) whose period divides t - switch, the one of the largest period
  sets every worker to the mean of its block of `size` consecutive workers, and the
  center to the mean of all when the block is every worker."""

  def average(since_switch, workers):
    due = [(period, size) for period, size in levels if since_switch % period == 0]
    if not due:
      return workers, None
    _, size = max(due)
    blocks = [workers[start : start + size] for start in range(0, len(workers), size)]
    means = [{k: np.mean([w[k] for w in block], axis=0) for k in x0} for block in blocks]
    workers = [dict(mean) for mean, block in zip(means, blocks, strict=True) for _ in block]
    return workers, dict(workers[0]) if size == len(workers) else None

  return warm_up_then_local(x0, batches, numpy_grad, inner, switch, average)


# Pairs every 2 steps, fours every 4, all 8 every 8 (given out of order: the largest
# period due is the level, whatever the order).
LEVELS = ((4, 4), (2, 2), (8, 8))


def assert_follows(switch, levels, num_devices, deterministic_sums=False):
  x0, batches = make_problem(num_workers=8, steps_count=13)
  inner = numpy_optim.sgd(ETA, mu=0.9, nesterov=True)
  hyper = rules.Hyper(
    8,
    ETA,
    momentum=0.9,
    nesterov=True,
    switch_step=switch,
    levels=levels,
    deterministic_sums=deterministic_sums,
  )
  actual = run_rule("hierarchical_local_sgd", hyper, x0, batches, num_devices)
  expected = hierarchical_local_sgd(x0, [per_worker(b) for b in batches], inner, switch, levels)
  for state, (workers, center) in zip(actual, expected, strict=True):
    assert_close(state.center, center)
    for i, values in enumerate(workers):
      assert_close({k: v[i] for k, v in state.workers.items()}, values)


@pytest.mark.parametrize("num_devices", tiers.devices(8, 2))
def test_it_follows_its_equations_across_the_warm_up(num_devices):
  """Nesterov momentum crosses the warm-up at step 3; then pairs at 5, fours at 7,
  all at 11 (8 steps after it), pairs at 9 and 13; on 8 devices every block spans
  devices, on 2 the pairs and fours are within one."""
  assert_follows(3, LEVELS, num_devices)


def test_it_follows_its_equations_with_sums_in_worker_order():
  assert_follows(0, LEVELS, 4, deterministic_sums=True)


def test_one_level_of_every_worker_is_post_local_sgd_bit_for_bit():
  x0, batches = make_problem(num_workers=4, steps_count=9)
  settings = dict(momentum=0.9, switch_step=2, comm_period=3)
  post = run_rule("post_local_sgd", rules.Hyper(4, ETA, **settings), x0, batches, 2)
  hyper = rules.Hyper(4, ETA, **settings, levels=((3, 4),))
  ours = run_rule("hierarchical_local_sgd", hyper, x0, batches, 2)
  for a, b in zip(ours, post, strict=True):
    for key in x0:
      np.testing.assert_array_equal(a.workers[key], b.workers[key])
      np.testing.assert_array_equal(a.center[key], b.center[key])


def test_its_clock_charges_each_level_on_the_links_it_crosses():
  """Two groups of 4 (the link between 10x slower): pairs and fours stay inside a
  group, the whole crosses; before the warm-up ends the whole every step."""
  hyper = rules.Hyper(8, ETA, switch_step=2, levels=((2, 2), (4, 4), (8, 8)))
  rule = rules.make_rule("hierarchical_local_sgd", hyper)
  cluster = timing.Cluster(
    compute_time=1.0, latency=0.01, bandwidth=1e5, between_latency=0.1, between_bandwidth=1e4
  )
  groups = dataclasses.replace(cluster, groups=(4, 4))
  clock = rule.make_clock(groups, model_bytes=1000.0, seed=0)
  levels = []
  for _ in range(11):
    tick = clock.next_tick()
    levels.append(tuple(tick.levels))
  # Steps 0, 1: the warm-up's gradients (the whole); 2: the whole (t - t0 = 0); then
  # pairs at 4, fours at 6, pairs at 8, the whole at 10.
  assert levels == [(2,), (2,), (2,), (), (0,), (), (1,), (), (0,), (), (2,)]
  assert clock.level_exchanges == [2, 1, 4]
  # Only the whole's exchanges crossed: 4 of them, 2(G-1)/G n/s = 250 bytes each.
  np.testing.assert_allclose(clock.bytes_between, 4 * 250.0)


@pytest.mark.parametrize(
  "overrides,words",
  [
    ({"outer.levels": ((4, 4), (16, 6))}, "all 8 workers"),
    ({"outer.levels": ((4, 4), (6, 8))}, "each period must divide the next"),
    ({"outer.levels": ((4, 3), (16, 8))}, "each group size must divide the next"),
    ({"outer.levels": ((2, 4), (4, 2), (8, 8))}, "each group size must divide the next"),
    ({"outer.levels": ((4, 4), (4, 8))}, "each period must divide the next"),
    ({"outer.levels": ((4, 0), (16, 8))}, "only the last level's group size may be 0"),
    ({"outer.levels": ()}, "pairs of integers"),
    ({"outer.levels": ((0, 8),)}, "periods >= 1"),
    ({"algorithm": "local_sgd", "outer.levels": ((4, 8),)}, "local_sgd has no levels"),
  ],
)
def test_levels_that_do_not_nest_are_refused_in_one_line(overrides, words):
  from easgd.config import validation  # noqa: PLC0415 (after conftest has set the devices)
  from easgd.errors import ConfigError  # noqa: PLC0415
  from runs import config_with  # noqa: PLC0415

  config = config_with({"algorithm": "hierarchical_local_sgd", **overrides})
  with pytest.raises(ConfigError) as refused:
    validation.validate(config)
  message = str(refused.value)
  assert message.startswith("config.outer.levels=") and words in message
  assert "\n" not in message


# The GPU tier's checks of this rule (tests/test_gpu.py), on its one device.
GPU_CHECKS = {"hierarchical_local_sgd": [lambda: assert_follows(3, LEVELS, 1)]}
