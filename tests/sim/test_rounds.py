"""Rounds at a quorum in the timing model (easgd.sim.rounds): when a round closes, who
is in it, what the workers' clocks do after it, and its state across a resume."""

import dataclasses
import json
import math

import numpy as np
import pytest

from easgd.sim import clocks, rounds, timing

MODEL_BYTES = 1000
WORKERS, PERIOD = 6, 2
# Worker 4 twice and worker 5 four times slower than the rest, with jitter.
CLUSTER = timing.Cluster(
  compute_time=1.0,
  jitter=0.3,
  stragglers=(4, 5),
  straggler_slowdowns=(2.0, 4.0),
  latency=0.01,
  bandwidth=1e5,
)


def torchft_close(arrivals, count, deadline):
  """The first time at which torchft's lighthouse would form the quorum: at least
  `count` joined, and everyone joined or `deadline` passed since the first join."""
  first = min(arrivals)
  candidates = sorted([*arrivals, first + deadline])
  for time in candidates:
    joined = sum(a <= time for a in arrivals)
    if joined >= count and (joined == len(arrivals) or time >= first + deadline):
      return time
  raise AssertionError("never closes")


def live_close(policy, arrivals):
  """When a round that sees the arrivals one by one (`Policy.due`, runtime=threads'
  gate) closes: at an arrival once it is due, or at its due time before the next."""
  ordered = sorted(arrivals)
  for k, arrival in enumerate(ordered):
    due = policy.due(ordered[: k + 1], len(ordered))
    if due is None:
      continue
    if due <= arrival:
      return arrival
    if k + 1 == len(ordered) or due < ordered[k + 1]:
      return due
  raise AssertionError("never closes")


@pytest.mark.parametrize("count", [1, 3, 5, 6])
@pytest.mark.parametrize("deadline", [0.0, 0.4, 2.0, math.inf])
def test_a_round_closes_when_torchfts_quorum_would_form(count, deadline):
  """In the timing model (all arrivals known) and live (one by one), alike."""
  rng = np.random.default_rng(count)
  for _ in range(20):
    arrivals = rng.exponential(1.0, WORKERS)
    policy = rounds.Policy(count, deadline, "drop")
    closes = torchft_close(arrivals.tolist(), count, deadline)
    assert policy.closing_time(arrivals) == closes
    assert live_close(policy, arrivals.tolist()) == closes


@pytest.mark.parametrize(("quorum", "count"), [(0.5, 3), (0.51, 4), (1.0, 6), (4.0, 4), (0.01, 1)])
def test_a_quorum_is_a_fraction_rounded_up_or_a_count(quorum, count):
  assert rounds.quorum_count(quorum, WORKERS) == count


def clock(deadline, missed, count=4):
  return clocks.SyncClock(
    CLUSTER,
    WORKERS,
    MODEL_BYTES,
    seed=0,
    period=PERIOD,
    policy=rounds.Policy(count, deadline, missed),
  )


def test_a_deadline_past_every_arrival_is_waiting_for_all():
  waiting = clocks.SyncClock(CLUSTER, WORKERS, MODEL_BYTES, seed=0, period=PERIOD)
  at_quorum = clock(math.inf, "drop")
  for _ in range(12):
    tick, plain = at_quorum.next_tick(), waiting.next_tick()
    assert tick.time == plain.time
    np.testing.assert_array_equal(tick.bytes_sent, plain.bytes_sent)
    assert tick.round is None or tick.round.members.all()
  assert at_quorum.round_totals.values["dropped"] == 0
  assert at_quorum.round_totals.values["saved"] == 0


def test_a_dropped_worker_abandons_its_steps_at_the_close():
  at_quorum = clock(0.0, "drop")
  means = CLUSTER.mean_step_times(WORKERS)
  seconds = CLUSTER.allreduce_time(MODEL_BYTES, WORKERS)
  times = np.zeros(WORKERS)
  lost = 0
  for step in range(20):
    tick = at_quorum.next_tick()
    times += [CLUSTER.step_time(means[i], 0, i, step) for i in range(WORKERS)]
    if (step + 1) % PERIOD:
      assert tick.round is None
      continue
    close = np.sort(times)[3]
    np.testing.assert_array_equal(tick.round.members, times <= close)
    np.testing.assert_array_equal(tick.round.dropped, times > close)
    assert not tick.round.late.any() and not tick.round.held.any()
    # The dropped send nothing.
    assert (tick.requests == tick.round.members).all()
    lost += PERIOD * int((times > close).sum())
    times[:] = close + seconds
    assert tick.time == pytest.approx(close + seconds)
  assert at_quorum.round_totals.values["lost_steps"] == lost > 0
  waiting = clocks.SyncClock(CLUSTER, WORKERS, MODEL_BYTES, seed=0, period=PERIOD)
  waited = [waiting.next_tick().time for _ in range(20)][-1]
  assert at_quorum.round_totals.values["saved"] == waited - at_quorum.time > 0


def test_a_late_message_enters_the_next_round_which_waits_for_it():
  at_quorum = clock(0.0, "late")
  means = CLUSTER.mean_step_times(WORKERS)
  seconds = CLUSTER.allreduce_time(MODEL_BYTES, WORKERS)
  times = np.zeros(WORKERS)
  late, late_until = np.zeros(WORKERS, bool), -math.inf
  for step in range(20):
    tick = at_quorum.next_tick()
    times += [CLUSTER.step_time(means[i], 0, i, step) for i in range(WORKERS)]
    if (step + 1) % PERIOD:
      continue
    close = max(np.sort(times)[3], late_until)
    np.testing.assert_array_equal(tick.round.held, late)
    np.testing.assert_array_equal(tick.round.members, times <= close)
    np.testing.assert_array_equal(tick.round.late, times > close)
    assert not tick.round.dropped.any()
    # Late workers send too, when they arrive.
    assert tick.requests.all()
    late = times > close
    late_until = times[late].max() if late.any() else -math.inf
    times = np.where(late, times + seconds, close + seconds)
    assert tick.time == pytest.approx(times.max())
  assert at_quorum.round_totals.values["late"] > 0


@pytest.mark.parametrize("streamed", [False, True])
@pytest.mark.parametrize("missed", rounds.MISSED)
def test_a_clock_resumed_from_its_state_goes_on_as_never_stopped(missed, streamed):
  """Stopped after step 7, or a streaming clock after step 6, whose fragment's result
  is applied at step 7 (each worker's end of its all-reduce in the state)."""

  def make():
    return streaming_clock(missed) if streamed else clock(0.2, missed)

  running = make()
  for _ in range(6 if streamed else 7):
    running.next_tick()
  resumed = make()
  resumed.load_state_dict(json.loads(json.dumps(running.state_dict(), allow_nan=False)))
  for _ in range(9):
    assert resumed.next_tick().to_dict() == running.next_tick().to_dict()
  assert resumed.round_totals.scalars() == running.round_totals.scalars()


FRAGMENT_BYTES = (300.0, 700.0)
HEAL_BYTES = 2500.0
# CLUSTER in two groups of 3 (the link between them slower): a heal may cross it.
GROUPED = dataclasses.replace(CLUSTER, groups=(3, 3), between_latency=0.05, between_bandwidth=2e4)


def streaming_clock(missed, fragment_bytes=FRAGMENT_BYTES, delay=1, period=4, cluster=CLUSTER):
  return clocks.StreamingClock(
    cluster,
    WORKERS,
    MODEL_BYTES,
    0,
    period,
    fragment_bytes,
    delay,
    policy=rounds.Policy(4, 0.0, missed),
    heal_bytes=HEAL_BYTES,
  )


@pytest.mark.parametrize(
  "fragment_bytes,delay,cluster",
  [(FRAGMENT_BYTES, 1, CLUSTER), (FRAGMENT_BYTES, 0, GROUPED), ((1000.0,), 2, CLUSTER)],
)
@pytest.mark.parametrize("missed", rounds.MISSED)
def test_a_streamed_fragments_round_waits_for_its_own_late_messages(
  missed, fragment_bytes, delay, cluster
):
  """Each fragment sent every period/F steps, its result applied `delay` steps later: a
  round closes at the 4th arrival and not before its fragment's late messages of the
  round before; the round's first member sends each dropped worker its state, one
  after another, and a dropped worker goes on once its own has arrived; every worker
  waits for the all-reduce's end (a late one's own, from its arrival) when the
  result is applied."""
  count, period = len(fragment_bytes), 4
  at_quorum = streaming_clock(missed, fragment_bytes, delay, period, cluster)
  means = cluster.mean_step_times(WORKERS)
  groups = cluster.group_of(WORKERS)
  times, pending = np.zeros(WORKERS), {}
  held, held_until = np.zeros((count, WORKERS), bool), [-math.inf] * count
  for step in range(24):
    tick = at_quorum.next_tick()
    times += [cluster.step_time(means[i], 0, i, step) for i in range(WORKERS)]
    t = step + 1
    if t % (period // count):
      assert tick.round is None
    else:
      f = (t % period) // (period // count)
      seconds, all_reduce = cluster.exchange(fragment_bytes[f], WORKERS)[:2]
      close = max(np.sort(times)[3], held_until[f])
      out = times > close
      np.testing.assert_array_equal(tick.round.members, ~out)
      np.testing.assert_array_equal(tick.round.held, held[f])
      late = out if missed == "late" else np.zeros(WORKERS, bool)
      np.testing.assert_array_equal(tick.round.late, late)
      np.testing.assert_array_equal(tick.round.dropped, out & ~late)
      pending[t + delay] = np.where(late, times + seconds, close + seconds)
      first, queued = int(np.argmax(~out)), 0.0
      expected = np.where(out & ~late, 0.0, all_reduce)
      crossed = np.where(out & ~late, 0.0, cluster.exchange(fragment_bytes[f], WORKERS)[2])
      for j in np.flatnonzero(out & ~late):
        between = bool(groups[j] != groups[first])
        latency, bandwidth = cluster.link(between)
        queued += HEAL_BYTES / bandwidth
        times[j] = close + latency + queued
        expected[first] += HEAL_BYTES
        crossed[first] += HEAL_BYTES * between
      np.testing.assert_allclose(tick.bytes_sent, expected)
      np.testing.assert_allclose(
        np.zeros(WORKERS) if tick.bytes_between is None else tick.bytes_between, crossed
      )
      held[f], held_until[f] = late, times[late].max() if late.any() else -math.inf
    if t in pending:
      times = np.maximum(times, pending.pop(t))
    assert tick.time == pytest.approx(times.max())
  assert at_quorum.round_totals.values["late" if missed == "late" else "dropped"] > 0
  if missed == "drop":
    largest = cluster.exchange(max(fragment_bytes), WORKERS)[1].max()
    assert at_quorum.peak_bytes_per_step() == pytest.approx(largest + 2 * HEAL_BYTES)
    # One fragment without delay: the round's result is the whole model, no upload.
    whole = streaming_clock(missed, (1000.0,), 0, period, cluster)
    assert whole.peak_bytes_per_step() == cluster.exchange(1000.0, WORKERS)[1].max()


@pytest.mark.parametrize("missed", rounds.MISSED)
def test_one_streamed_fragment_without_delay_is_the_sync_clocks_rounds(missed):
  one = streaming_clock(missed, fragment_bytes=[MODEL_BYTES], delay=0, period=PERIOD)
  sync = clock(0.0, missed)
  for _ in range(12):
    assert one.next_tick().to_dict() == sync.next_tick().to_dict()
  assert one.round_totals.scalars() == sync.round_totals.scalars()
