"""Hierarchical elastic averaging, run sharded over the mesh, against its equations in
plain NumPy, and the identities they imply: one group and groups of one are
sync_easgd, and with no global exchange each group runs a sync_easgd of its own."""

import numpy as np
import pytest
import tiers
from test_rules import ETA, assert_close, make_problem, per_worker, run_rule

import numpy_reference
from easgd import rules
from least_squares import numpy_grad

ALPHA_1, ALPHA_2 = 0.2, 0.3


def hierarchical_easgd(x0, batches, size, short, long):
  """[(workers, group centers, center)] after each step t, from docs/algorithms.md:
  u_i = -eta g_i(x_i); on steps with (t+1) % short == 0, d_i = x_i - c_b(i) from before
  the step, x_i <- x_i + u_i - alpha_1 d_i, c_b <- c_b + alpha_1 sum_{i in b} d_i; else
  x_i <- x_i + u_i; then on steps with (t+1) % long == 0, D_b = c_b - x~,
  c_b <- c_b - alpha_2 D_b, x~ <- x~ + alpha_2 sum_b D_b."""
  num_workers = len(batches[0])
  workers = [dict(x0) for _ in range(num_workers)]
  groups = [dict(x0) for _ in range(num_workers // size)]
  center = dict(x0)
  history = []
  for t, step_batches in enumerate(batches):
    updates = [
      {k: -ETA * g for k, g in numpy_grad(w, b).items()}
      for w, b in zip(workers, step_batches, strict=True)
    ]
    if (t + 1) % short == 0:
      distances = [{k: w[k] - groups[i // size][k] for k in w} for i, w in enumerate(workers)]
      workers = [
        {k: w[k] + u[k] - ALPHA_1 * d[k] for k in w}
        for w, u, d in zip(workers, updates, distances, strict=True)
      ]
      for b, c in enumerate(groups):
        block = distances[b * size : (b + 1) * size]
        groups[b] = {k: c[k] + ALPHA_1 * np.sum([d[k] for d in block], axis=0) for k in c}
    else:
      workers = [{k: w[k] + u[k] for k in w} for w, u in zip(workers, updates, strict=True)]
    if (t + 1) % long == 0:
      pulls = [{k: c[k] - center[k] for k in c} for c in groups]
      groups = [{k: c[k] - ALPHA_2 * d[k] for k in c} for c, d in zip(groups, pulls, strict=True)]
      center = {k: center[k] + ALPHA_2 * np.sum([d[k] for d in pulls], axis=0) for k in center}
    history.append(([dict(w) for w in workers], [dict(c) for c in groups], dict(center)))
  return history


def hyper(levels, **settings):
  return rules.Hyper(
    8, ETA, moving_rate=ALPHA_1, global_moving_rate=ALPHA_2, levels=levels, **settings
  )


@pytest.mark.parametrize("num_devices", tiers.devices(8, 2))
def test_it_follows_its_equations(num_devices):
  """Two groups of 4: the groups' pull every 2 steps, the global one every 4 (both at
  steps 3, 7, 11); on 2 devices a group is one device's, on 8 it spans four."""
  x0, batches = make_problem(num_workers=8, steps_count=12)
  actual = run_rule("hierarchical_easgd", hyper(((2, 4), (4, 8))), x0, batches, num_devices)
  expected = hierarchical_easgd(x0, [per_worker(b) for b in batches], 4, 2, 4)
  for state, (workers, groups, center) in zip(actual, expected, strict=True):
    assert_close(state.center, center)
    for b, values in enumerate(groups):
      assert_close({k: v[b] for k, v in state.center_opt["groups"].items()}, values)
    for i, values in enumerate(workers):
      assert_close({k: v[i] for k, v in state.workers.items()}, values)


@pytest.mark.parametrize(
  ("levels", "rate", "period"),
  [(((2, 8), (4, 8)), ALPHA_1, 2), (((2, 1), (4, 8)), ALPHA_2, 4)],
  ids=["one group: sync_easgd at alpha_1, tau_1", "groups of one: sync_easgd at alpha_2, tau_2"],
)
def test_a_level_of_one_center_is_sync_easgd_bit_for_bit(levels, rate, period):
  x0, batches = make_problem(num_workers=8, steps_count=9)
  ours = run_rule("hierarchical_easgd", hyper(levels, momentum=0.9), x0, batches, 4)
  sync = rules.Hyper(8, ETA, momentum=0.9, moving_rate=rate, comm_period=period)
  theirs = run_rule("sync_easgd", sync, x0, batches, 4)
  for a, b in zip(ours, theirs, strict=True):
    for key in x0:
      np.testing.assert_array_equal(a.workers[key], b.workers[key])
      np.testing.assert_array_equal(a.center[key], b.center[key])


def test_without_a_global_exchange_each_group_is_a_sync_easgd_of_its_own():
  x0, batches = make_problem(num_workers=8, steps_count=10)
  actual = run_rule("hierarchical_easgd", hyper(((2, 4), (16, 8))), x0, batches, 2)
  for b in range(2):
    mine = [per_worker(batch)[4 * b : 4 * b + 4] for batch in batches]
    expected = numpy_reference.sync_easgd(x0, mine, numpy_grad, ETA, ALPHA_1, 2)
    for state, (workers, center) in zip(actual, expected, strict=True):
      assert_close({k: v[b] for k, v in state.center_opt["groups"].items()}, center)
      for i, values in enumerate(workers):
        assert_close({k: v[4 * b + i] for k, v in state.workers.items()}, values)
      assert_close(state.center, x0)  # never pulled


@pytest.mark.parametrize(
  ("overrides", "field", "words"),
  [
    ({"outer.levels": ((4, 2), (8, 4), (16, 8))}, "outer.levels", "has 2 levels"),
    ({"outer.global_moving_rate": 0.5}, "outer.global_moving_rate", "beta_2 = groups"),
    # alpha_1's beta is the group's: 4 * 0.25 = 1.
    ({"outer.moving_rate": 0.25}, "outer.moving_rate", "beta = group size*moving_rate = 1"),
  ],
)
def test_moving_rates_are_bounded_by_their_levels_in_one_line(overrides, field, words):
  from easgd.config import validation  # noqa: PLC0415 (after conftest has set the devices)
  from easgd.errors import ConfigError  # noqa: PLC0415
  from runs import config_with  # noqa: PLC0415

  base = {"algorithm": "hierarchical_easgd", "outer.levels": ((4, 4), (16, 8))}
  with pytest.raises(ConfigError) as refused:
    validation.validate(config_with({**base, **overrides}))
  message = str(refused.value)
  assert message.startswith(f"config.{field}=") and words in message and "\n" not in message
  # 0.2 * 4 = 0.8: the group's beta, though 8 workers * 0.2 would be 1.6.
  validation.validate(config_with({**base, "outer.moving_rate": 0.2}))


def test_the_defaults_resolve_each_levels_beta_to_0_9():
  from runs import config_with  # noqa: PLC0415

  config = config_with({"algorithm": "hierarchical_easgd", "outer.levels": ((4, 2), (16, 8))})
  rule = rules.make_rule("hierarchical_easgd", rules.Hyper.from_config(config))
  assert rule.hyper.moving_rate == pytest.approx(0.9 / 2) and rule.global_rate == 0.9 / 4


# The GPU tier's checks of this rule (tests/test_gpu.py), on its one device.
GPU_CHECKS = {"hierarchical_easgd": [lambda: test_it_follows_its_equations(1)]}


@pytest.mark.e2e
def test_stopped_between_global_pulls_it_resumes_as_never_stopped(tmp_path):
  """The group centers are state of their own: stopped at step 22 of the runs' small MLP
  (4 workers, pairs), it ends at 40 with the bits of a run never stopped."""
  from runs import assert_stopped_and_resumed_ends_as_never_stopped  # noqa: PLC0415

  overrides = {"outer.levels": ((2, 2), (8, 0)), "outer.moving_rate": 0.2}
  assert_stopped_and_resumed_ends_as_never_stopped(tmp_path, "hierarchical_easgd", overrides, 22)
