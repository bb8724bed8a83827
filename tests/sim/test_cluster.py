"""The timing model and its clocks: durations, ticks, totals, replay and resume."""

import json
import math

import numpy as np
import pytest

from easgd.sim import clocks, ticks, timing

MODEL_BYTES = 1000
TIMING = timing.Cluster(
  compute_time=1.0,
  speed_spread=0.5,
  jitter=0.2,
  stragglers=(2,),
  straggler_slowdown=3.0,
  latency=0.01,
  bandwidth=1e5,
  master_time=0.1,
)
POLICIES = [
  (clocks.Policy.FCFS, True, 2),
  (clocks.Policy.ROUND_ROBIN, True, 2),
  (clocks.Policy.HOGWILD, True, 1),
  (clocks.Policy.FCFS, True, 1),
  (clocks.Policy.FCFS, False, 1),
  (clocks.Policy.HOGWILD, False, 3),
]


def async_clock(policy, exchange_first, period, seed=0, timing=TIMING, workers=4):
  return clocks.AsyncClock(
    timing, workers, MODEL_BYTES, seed, period=period, policy=policy, exchange_first=exchange_first
  )


def test_mean_step_times_spread_linearly_and_stragglers_are_slower():
  np.testing.assert_allclose(TIMING.mean_step_times(5), [1.0, 1.125, 3 * 1.25, 1.375, 1.5])
  assert TIMING.message_time(1000) == pytest.approx(0.01 + 0.01)
  # Ring: 2(P-1) rounds of a message of n/P bytes.
  assert TIMING.allreduce_time(1000, 4) == pytest.approx(6 * (0.01 + 250 / 1e5))
  assert TIMING.allreduce_time(1000, 1) == 0


def test_each_straggler_may_have_its_own_slowdown():
  cluster = timing.Cluster(
    compute_time=1.0, stragglers=(3, 1), straggler_slowdown=9.0, straggler_slowdowns=(4.0, 2.0)
  )
  np.testing.assert_allclose(cluster.mean_step_times(4), [1.0, 2.0, 1.0, 4.0])


def test_jitter_is_mean_preserving_and_a_function_of_seed_worker_and_step():
  times = [TIMING.step_time(2.0, seed=1, worker=0, step=k) for k in range(4000)]
  assert np.mean(times) == pytest.approx(2.0, rel=0.02)
  assert np.std(np.log(times)) == pytest.approx(0.2, rel=0.05)
  assert TIMING.step_time(2.0, 1, 0, 7) == times[7]
  assert TIMING.step_time(2.0, 2, 0, 7) != times[7]
  assert timing.Cluster(compute_time=1.0).step_time(2.0, 1, 0, 7) == 2.0


def test_sync_clock_waits_for_the_slowest_worker_at_every_all_reduce():
  clock = clocks.SyncClock(TIMING, 4, MODEL_BYTES, seed=0, period=3)
  means = TIMING.mean_step_times(4)
  workers = np.zeros(4)
  for step in range(6):
    tick = clock.next_tick()
    workers += [TIMING.step_time(means[i], 0, i, step) for i in range(4)]
    if (step + 1) % 3 == 0:
      workers[:] = workers.max() + TIMING.allreduce_time(MODEL_BYTES, 4)
    assert tick.local.all() and not tick.ops
    assert tick.time == pytest.approx(workers.max())
  # The straggler (worker 2) sets the pace: 3 x 1.33 x 3 steps per period.
  assert clock.time > 2 * 3 * means[2] * 0.8
  np.testing.assert_array_equal(clock.requests, [2, 2, 2, 2])
  np.testing.assert_allclose(clock.bytes_sent, 2 * timing.allreduce_bytes(MODEL_BYTES, 4))
  restored = clocks.SyncClock(TIMING, 4, MODEL_BYTES, seed=0, period=3)
  restored.load_state_dict(json.loads(json.dumps(clock.state_dict())))
  assert restored.next_tick().to_dict() == clock.next_tick().to_dict()


def test_a_gossip_all_reduces_among_its_group_behind_the_barrier_of_all():
  """A level of blocks of 2 of 4 workers: each all-reduce is timed and counted as one of
  two workers (noloco's pairs), after the slowest of all four has arrived."""
  pairs = (timing.Exchange(block=2),)
  clock = clocks.SyncClock(TIMING, 4, MODEL_BYTES, seed=0, period=3, levels=pairs)
  means = TIMING.mean_step_times(4)
  workers = np.zeros(4)
  for step in range(6):
    tick = clock.next_tick()
    workers += [TIMING.step_time(means[i], 0, i, step) for i in range(4)]
    if (step + 1) % 3 == 0:
      workers[:] = workers.max() + TIMING.allreduce_time(MODEL_BYTES, 2)
      np.testing.assert_allclose(tick.bytes_sent, timing.allreduce_bytes(MODEL_BYTES, 2))
    assert tick.time == pytest.approx(workers.max())
  assert clock.peak_bytes_per_step() == timing.allreduce_bytes(MODEL_BYTES, 2)
  np.testing.assert_array_equal(clock.requests, [2, 2, 2, 2])


@pytest.mark.parametrize("policy,exchange_first,period", POLICIES)
def test_ticks_are_well_formed(policy, exchange_first, period):
  clock = async_clock(policy, exchange_first, period)
  times = []
  for _ in range(200):
    tick = clock.next_tick()
    times.append(tick.time)
    assert tick.local.any()
    assert len(tick.ops) <= 2 * len(tick.local)
    inputs = tick.device_inputs()
    assert inputs["num_ops"] == len(tick.ops)
    # Each request's staleness at the position of the operation that served it.
    served = [p for p, (kind, _) in enumerate(tick.ops) if kind in ticks.REQUESTS]
    assert inputs["op_staleness"][served].tolist() == tick.staleness
    for kind, worker in tick.ops:
      if exchange_first and kind != ticks.OpKind.WRITE:
        # The elastic exchange belongs to a local step of the same tick.
        assert tick.local[worker]
  assert times == sorted(times)
  assert clock.requests.sum() > 20
  np.testing.assert_allclose(clock.bytes_sent, clock.requests * MODEL_BYTES)


@pytest.mark.parametrize("policy,exchange_first,period", POLICIES)
def test_a_restored_clock_continues_exactly(policy, exchange_first, period):
  straight = async_clock(policy, exchange_first, period)
  for _ in range(37):
    straight.next_tick()
  saved = json.loads(json.dumps(straight.state_dict()))
  restored = async_clock(policy, exchange_first, period)
  restored.load_state_dict(saved)
  for _ in range(60):
    a, b = straight.next_tick(), restored.next_tick()
    assert a.to_dict() == b.to_dict()
  assert straight.state_dict() == restored.state_dict()


@pytest.mark.parametrize("exchange_first", [True, False])
def test_each_worker_requests_after_its_own_period(exchange_first):
  clock = async_clock(clocks.Policy.FCFS, exchange_first, (1, 2, 3, 4))
  for _ in range(120):
    clock.next_tick()
  # A request falls in the tick of the step it belongs to, so at most the last one is
  # still to come.
  for worker, period in enumerate((1, 2, 3, 4)):
    assert clock.worker_steps[worker] // period - clock.requests[worker] in (0, 1)
  assert clock.requests.min() >= 5


@pytest.mark.parametrize("period", [(1, 2, 3), (2, 2.0, 2, 2)])
def test_periods_are_one_integer_for_each_worker(period):
  with pytest.raises((ValueError, TypeError)):
    async_clock(clocks.Policy.FCFS, False, period)


def test_a_straggler_takes_fewer_steps_and_everyone_else_keeps_going():
  clock = async_clock(clocks.Policy.FCFS, True, 4, timing=TIMING)
  for _ in range(300):
    clock.next_tick()
  steps = clock.worker_steps
  # Worker 2 is 3 x 1.17 times slower than worker 0.
  assert steps[2] / steps[0] == pytest.approx(1 / (3 * (1 + 0.5 * 2 / 3)), rel=0.15)
  assert steps[0] > steps[1] > steps[3] > steps[2]


def test_round_robin_makes_every_worker_wait_for_the_slowest():
  clock = async_clock(clocks.Policy.ROUND_ROBIN, True, 2)
  for _ in range(100):
    clock.next_tick()
  assert clock.worker_steps.max() - clock.worker_steps.min() <= 2
  order = [w for _ in range(20) for _, w in clock.next_tick().ops]
  assert len(order) > 10
  assert all((b - a) % 4 == 1 for a, b in zip(order, order[1:], strict=False))


def test_a_busy_master_makes_requests_queue():
  slow_master = timing.Cluster(compute_time=1.0, jitter=0.1, master_time=0.5)
  clock = async_clock(clocks.Policy.FCFS, False, 1, timing=slow_master)
  waits = [w for _ in range(100) for w in clock.next_tick().waits]
  assert np.mean(waits) > 0.1
  # Under Hogwild nothing waits.
  clock = async_clock(clocks.Policy.HOGWILD, False, 1, timing=slow_master)
  assert not any(w for _ in range(100) for w in clock.next_tick().waits)


def test_infinite_bandwidth_and_no_latency_cost_nothing():
  free = timing.Cluster(compute_time=1.0, bandwidth=math.inf)
  assert free.message_time(10**9) == 0
  assert free.allreduce_time(10**9, 8) == 0
