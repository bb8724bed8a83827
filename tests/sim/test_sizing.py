"""The closed-form steady state agrees with the clocks' event-by-event simulation."""

import dataclasses

import numpy as np
import pytest
import tiers

from easgd.sim import clocks, sizing, timing

MODEL_BYTES = 250_000
# 10 ms steps on 1 Gbit/s Ethernet, a master that takes 2 ms a request.
NETWORK = timing.Cluster(compute_time=0.01, latency=5e-4, bandwidth=1.25e8, master_time=2e-3)


def simulated_step_time(clock: clocks.Clock, steps: int) -> float:
  """Seconds per local step of the average worker in the steady state: over the
  second `steps` steps of the slowest worker (the first are the start-up)."""
  marks = []
  for until in (steps, 2 * steps):
    while clock.worker_steps.min() < until:
      clock.next_tick()
    marks.append((clock.time, clock.worker_steps.mean()))
  (start, start_steps), (end, end_steps) = marks
  return (end - start) / (end_steps - start_steps)


@pytest.mark.parametrize("allreduce", ["ring", "tree"])
@pytest.mark.parametrize("workers", [2, 3, 8, 13])
def test_sync_step_time_is_the_simulated_one(allreduce, workers):
  timing_model = dataclasses.replace(NETWORK, allreduce=allreduce)
  timing = sizing.Timing(timing_model, MODEL_BYTES, 0.01, period=4, family=sizing.SYNC)
  clock = clocks.SyncClock(timing_model, workers, MODEL_BYTES, seed=0, period=4)
  assert simulated_step_time(clock, 40) == pytest.approx(timing.step_time(workers), rel=1e-9)


CASES = [  # policy, exchange first (EASGD) or gradient first (SGD), tau, family
  (clocks.Policy.FCFS, True, 4, sizing.LOCKED),
  (clocks.Policy.FCFS, False, 1, sizing.LOCKED),
  (clocks.Policy.ROUND_ROBIN, True, 4, sizing.LOCKED),
  (clocks.Policy.HOGWILD, True, 4, sizing.LOCK_FREE),
]


@pytest.mark.parametrize(("policy", "exchange_first", "period", "family"), CASES)
def test_parameter_server_step_time_is_the_simulated_one_below_and_past_saturation(
  policy, exchange_first, period, family
):
  timing = sizing.Timing(NETWORK, MODEL_BYTES, 0.01, period, family)
  for workers in (1, 4, 12, 24):
    clock = clocks.AsyncClock(
      NETWORK, workers, MODEL_BYTES, 0, period, policy, exchange_first=exchange_first
    )
    simulated = simulated_step_time(clock, 200)
    assert simulated == pytest.approx(timing.step_time(workers), rel=0.01), workers
  if family == sizing.LOCKED:  # the range above crosses saturation
    assert timing.cycle(24) > timing.cycle(1)


@pytest.mark.parametrize(
  ("family", "period", "allreduce"),
  [
    (sizing.SYNC, 1, "ring"),
    (sizing.SYNC, 4, "ring"),
    (sizing.SYNC, 4, "tree"),
    (sizing.LOCKED, 4, "ring"),
    (sizing.LOCKED, 1, "ring"),
  ],
)
def test_critical_workers_is_where_communication_first_takes_half(family, period, allreduce):
  timing_model = dataclasses.replace(NETWORK, allreduce=allreduce)
  timing = sizing.Timing(timing_model, MODEL_BYTES, 0.01, period, family)
  critical = timing.critical_workers()
  shares = np.array([timing.comm_share(p) for p in range(1, critical + 40)])
  assert np.flatnonzero(shares >= 0.5)[0] + 1 == critical


def test_no_critical_workers_without_latency_or_lock():
  no_latency = dataclasses.replace(NETWORK, latency=0.0, bandwidth=1e9)
  assert sizing.Timing(no_latency, MODEL_BYTES, 0.01, 4, sizing.SYNC).critical_workers() is None
  assert sizing.Timing(NETWORK, MODEL_BYTES, 0.01, 4, sizing.LOCK_FREE).critical_workers() is None
  # Messages alone longer than the steps between them: from the first worker.
  slow = dataclasses.replace(NETWORK, bandwidth=1e6)
  assert sizing.Timing(slow, MODEL_BYTES, 0.01, 4, sizing.LOCKED).critical_workers() == 1


@pytest.mark.parametrize("workers", tiers.first_quick([12, 25, 40]))
def test_servers_needed_keep_up_and_one_fewer_do_not(workers):
  # Servers on 1 Gbit/s links: each request moves 2W through them.
  busy = dataclasses.replace(NETWORK, server_bandwidth=1.25e8)
  needed = sizing.Timing(busy, MODEL_BYTES, 0.01, 4, sizing.LOCKED).servers_needed(workers)
  assert needed > 1
  for servers in (needed, needed - 1):
    timing_model = dataclasses.replace(busy, servers=servers)
    timing = sizing.Timing(timing_model, MODEL_BYTES, 0.01, 4, sizing.LOCKED)
    clock = clocks.AsyncClock(timing_model, workers, MODEL_BYTES, 0, 4, clocks.Policy.FCFS, True)
    simulated = simulated_step_time(clock, 200) * 4
    assert simulated == pytest.approx(timing.cycle(workers), rel=0.01)
    if servers == needed:  # no queue: every cycle is C, the cycle of a worker alone
      assert timing.cycle(workers) == timing.cycle(1)
    else:  # saturated: the queue stretches every cycle to P s
      assert timing.cycle(workers) == workers * timing.service > timing.cycle(1)


def test_service_time_splits_over_servers_and_counts_their_links():
  timing_model = dataclasses.replace(NETWORK, servers=4, server_bandwidth=1e8)
  assert timing_model.service_time(1e6) == pytest.approx((2e-3 + 2e6 / 1e8) / 4)
  assert NETWORK.service_time(1e6) == NETWORK.master_time  # the default: links not modelled


def test_tree_allreduce_takes_log_rounds_of_whole_messages():
  tree = dataclasses.replace(NETWORK, allreduce="tree")
  assert tree.allreduce_time(1e6, 8) == pytest.approx(2 * 3 * (5e-4 + 1e6 / 1.25e8))
  assert tree.allreduce_time(1e6, 5) == pytest.approx(2 * 3 * (5e-4 + 1e6 / 1.25e8))
  assert tree.allreduce_time(1e6, 1) == 0


def test_levels_over_groups_step_time_is_the_simulated_one():
  """A rule of two levels (groups of 4 every 2nd step, all 8 every 8th in their place)
  on two groups of 4 whose link between is 10x slower: T = t_c + sum_k r_k A_k."""
  groups = dataclasses.replace(
    NETWORK, groups=(4, 4), between_latency=5e-3, between_bandwidth=1.25e7
  )
  levels = (timing.Exchange(block=4), timing.Exchange())

  def fires(step):
    return ((step + 1) % 2 == 0 and (step + 1) % 8 != 0, (step + 1) % 8 == 0)

  rates = ((levels[0], 3 / 8), (levels[1], 1 / 8))
  steady = sizing.Timing(groups, MODEL_BYTES, 0.01, 2, sizing.SYNC, levels=rates, workers=8)
  clock = clocks.SyncClock(
    groups, 8, MODEL_BYTES, seed=0, period=2, levels=levels, level_exchanges=fires
  )
  assert simulated_step_time(clock, 80) == pytest.approx(steady.step_time(8), rel=1e-9)
  assert steady.critical_workers() is not None


def test_two_tier_servers_step_time_is_the_simulated_one():
  """Two groups of 6, a server each (messages inside the group), the global server
  in group 0: each group's server saturates as one master with 6 workers would."""
  groups = dataclasses.replace(NETWORK, groups=(6, 6), master_time=1e-2)
  steady = sizing.Timing(groups, MODEL_BYTES, 0.01, 4, sizing.LOCKED, workers=12, global_every=3)
  clock = clocks.TwoTierClock(
    groups, 12, MODEL_BYTES, 0, 4, clocks.Policy.FCFS, exchange_first=True, global_every=3
  )
  assert simulated_step_time(clock, 200) == pytest.approx(steady.step_time(12), rel=0.01)
  # Saturated: 6 workers' requests, 10 ms each, are longer than a worker's 55 ms cycle.
  assert steady.cycle(12) == pytest.approx(6 * 1e-2)
  assert 0 < steady.global_share(12) < 1
