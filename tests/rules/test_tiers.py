"""Two-tier parameter servers (HALoS's design, easgd/rules/tiers.py) against a literal
event loop in NumPy, and the identity with one master that the equations imply."""

import dataclasses
import math

import numpy as np
import pytest
import tiers
from test_parameter_server import (
  ALPHA,
  ETA,
  OUTER_ETA,
  OUTER_MU,
  UNEQUAL,
  WORKERS,
  assert_close,
  hyper_for,
  make_data,
  run_ticks,
  worker_row,
)

import numpy_optim
import numpy_reference
from easgd.sim import clocks
from easgd.sim.ticks import OpKind
from least_squares import numpy_grad

# Two groups of two; the link between groups 6x the link inside's latency (0.3 s
# against 0.05 s), the global server in group 0: group 0's server reaches it inside.
TWO_GROUPS = dataclasses.replace(
  UNEQUAL, groups=(2, 2), between_latency=0.3, between_bandwidth=math.inf
)
# Each group server sends after every 2 of its workers' requests; merges half way;
# the global server's Delayed Nesterov moves its momentum every 2nd send.
EVERY, WEIGHT, GLOBAL_ETA, GLOBAL_MU, GLOBAL_N = 2, 0.5, 0.8, 0.5, 2


def two_tier(name, **settings):
  return dataclasses.replace(
    hyper_for(name),
    two_tier=True,
    groups=(2, 2),
    global_every=EVERY,
    merge_weight=WEIGHT,
    global_learning_rate=GLOBAL_ETA,
    global_momentum=GLOBAL_MU,
    global_momentum_period=GLOBAL_N,
    **settings,
  )


@pytest.mark.parametrize("num_devices", tiers.devices(4, 2))
@pytest.mark.parametrize("name", ["async_easgd", "async_local_sgd"])
def test_two_tiers_follow_a_literal_event_loop(name, num_devices):
  """The global center, each group's center and every worker after each tick are the
  event loop's after the same events; the served order's staleness too."""
  hyper = two_tier(name, momentum_period=1)
  family = "elastic" if name == "async_easgd" else "local"
  x0, batches = make_data(WORKERS, steps_count=80)
  states, ticks = run_ticks(name, hyper, TWO_GROUPS, x0, batches, 40, num_devices)
  mean = TWO_GROUPS.mean_step_times(WORKERS)

  def durations(i, k):
    z = np.random.default_rng([0, i, k]).standard_normal()
    return mean[i] * math.exp(0.3 * z - 0.3**2 / 2)

  centers, groups, workers, staleness = numpy_reference.two_tier_parameter_server(
    x0,
    batches,
    numpy_grad,
    family=family,
    groups=(2, 2),
    period=2,
    durations=durations,
    message=0.05,
    uplink=[0.05, 0.3],
    master_time=0.4,
    eta=ETA,
    every=EVERY,
    weight=WEIGHT,
    global_outer=numpy_optim.DelayedNesterov(GLOBAL_ETA, GLOBAL_MU, GLOBAL_N),
    alpha=ALPHA,
    outer=numpy_optim.DelayedNesterov(OUTER_ETA, OUTER_MU, 1),
    until=ticks[-1].time + 10,
  )
  applies, changes = 0, np.zeros(2, int)
  updates, served = np.zeros(WORKERS, int), []
  for state, tick in zip(states, ticks, strict=True):
    for kind, index in tick.ops:
      applies += kind == OpKind.APPLY
      if kind == OpKind.EXCHANGE:
        changes[index // 2] += 1
        updates[index] += family == "local"
      if kind == OpKind.MERGE:
        changes[index] += 1
    updates += tick.local
    requests = [index // 2 for kind, index in tick.ops if kind == OpKind.EXCHANGE]
    served += list(zip(requests, tick.staleness, strict=True))
    assert_close(state.center, centers[applies])
    for g in range(2):
      assert_close(state.center_opt["groups"][g]["center"], groups[g][changes[g]])
    for i in range(WORKERS):
      assert_close(worker_row(state, i), workers[i][updates[i]])
  for g in range(2):  # each group server's order (the groups' interleave freely)
    ours = [value for group, value in served if group == g]
    assert ours == [value for group, value in staleness if group == g][: len(ours)]
  # Long enough to mean something: sends from both groups, merged back.
  merges = sum(kind == OpKind.MERGE for tick in ticks for kind, _ in tick.ops)
  assert applies >= 4 and merges >= 4 and changes.min() >= 6


def test_one_group_merging_every_change_at_once_is_the_one_master():
  """One group, K = 1, w = 1, the global server adding each change as it is, links and
  service free: every request's change reaches x~ before the next request, and the
  group's center is merged back to it: async_easgd's one master, to float rounding."""
  free = dataclasses.replace(UNEQUAL, latency=0.0, master_time=0.0, jitter=0.3)
  x0, batches = make_data(WORKERS, steps_count=60)
  flat, _ = run_ticks("async_easgd", hyper_for("async_easgd"), free, x0, batches, 30, 2)
  hyper = dataclasses.replace(
    hyper_for("async_easgd"), two_tier=True, global_every=1, merge_weight=1.0
  )
  ours, ticks = run_ticks("async_easgd", hyper, free, x0, batches, 30, 2)
  assert sum(kind == OpKind.MERGE for tick in ticks for kind, _ in tick.ops) >= 10
  for a, b in zip(ours, flat, strict=True):
    for key in x0:
      np.testing.assert_allclose(a.center[key], b.center[key], rtol=1e-5, atol=1e-6)
      np.testing.assert_allclose(a.workers[key], b.workers[key], rtol=1e-5, atol=1e-6)


def test_the_two_tier_clock_resumes_from_its_json_state():
  """A checkpoint holds the clock as JSON: sends in flight, merges due and every group's
  turn and count come back, and the ticks go on as the clock's own."""
  import json  # noqa: PLC0415

  def clock():
    return clocks.TwoTierClock(
      TWO_GROUPS, 4, 1000.0, 0, 2, clocks.Policy.FCFS, exchange_first=True, global_every=2
    )

  ticking = clock()
  for _ in range(17):
    ticking.next_tick()
  resumed = clock()
  resumed.load_state_dict(json.loads(json.dumps(ticking.state_dict())))
  for _ in range(20):
    assert resumed.next_tick().to_dict() == ticking.next_tick().to_dict()


@pytest.mark.e2e
def test_two_tiers_stopped_mid_run_resume_as_never_stopped(tmp_path):
  """The runs' small MLP (4 workers, 2 groups of 2), async_local_sgd with the global
  server's momentum: stopped at step 22 with sends in flight, the clock's JSON and the
  servers' state resume to the same bits at 40. (The two tiers of
  tests/train/runtimes/test_threads.py and test_ray.py: one compilation of their
  programs.)"""
  from runs import assert_stopped_and_resumed_ends_as_never_stopped  # noqa: PLC0415

  overrides = {"outer.two_tier": True, "cluster.groups": (2, 2), "outer.global_every": 2}
  overrides |= {"outer.merge_weight": 0.5, "outer.global_momentum": 0.5}
  overrides |= {"outer.comm_period": 2, "outer.momentum_period": 2}
  overrides |= {"cluster.between_latency": 0.05}
  assert_stopped_and_resumed_ends_as_never_stopped(tmp_path, "async_local_sgd", overrides, 22)
