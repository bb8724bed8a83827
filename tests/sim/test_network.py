"""The timing model's two-level network: groups, the link between them, the
hierarchical all-reduce and its bytes on each link, servers placed in a group,
and the clocks that cost their messages on the links they use. The expected
numbers are worked out by hand from easgd/sim/timing.py's docstring."""

import json

import numpy as np
import pytest

from easgd.errors import ConfigError
from easgd.sim import clocks, timing
from runs import config_with

MODEL_BYTES = 1000.0
# Inside a group: 10 ms and 100 kB/s; between groups: 100 ms and 10 kB/s.
LINKS = dict(latency=0.01, bandwidth=1e5, between_latency=0.1, between_bandwidth=1e4)
TWO_BY_FOUR = timing.Cluster(compute_time=1.0, groups=(4, 4), **LINKS)


def test_a_flat_cluster_exchanges_as_the_single_all_reduce():
  for shape in timing.Allreduce:
    flat = timing.Cluster(compute_time=1.0, allreduce=shape, **LINKS)
    seconds, sent, between = flat.exchange(MODEL_BYTES, 8)
    assert seconds == flat.allreduce_time(MODEL_BYTES, 8)  # the same float
    assert np.all(sent == timing.allreduce_bytes(MODEL_BYTES, 8)) and not between.any()


def test_an_all_reduce_over_two_groups_is_hierarchical():
  seconds, sent, between = TWO_BY_FOUR.exchange(MODEL_BYTES, 8)
  # Inside each group 2(s-1) rounds of n/s: 6 (0.01 + 250/1e5) = 0.075; between the
  # two groups a ring of 2 over the shards n/s: 2 (0.1 + 125/1e4) = 0.225.
  assert seconds == pytest.approx(0.075 + 0.225)
  # Each worker sends 2(s-1)/s n inside and 2(G-1)/G n/s between.
  np.testing.assert_allclose(sent, 1500 + 250)
  np.testing.assert_allclose(between, 250)
  tree = timing.Cluster(compute_time=1.0, groups=(4, 4), allreduce="tree", **LINKS)
  # 2 ceil(log2 4) whole messages inside, 2 ceil(log2 2) shards of n/s between.
  assert tree.exchange(MODEL_BYTES, 8)[0] == pytest.approx(4 * 0.02 + 2 * (0.1 + 250 / 1e4))


def test_uneven_groups_are_paced_by_the_largest_inside_and_the_smallest_between():
  uneven = timing.Cluster(compute_time=1.0, groups=(6, 2), **LINKS)
  seconds, sent, between = uneven.exchange(MODEL_BYTES, 8)
  inside = 10 * (0.01 + MODEL_BYTES / 6 / 1e5)  # the group of 6
  outside = 2 * (0.1 + MODEL_BYTES / 2 / 2 / 1e4)  # shards of n/2: the group of 2's
  assert seconds == pytest.approx(inside + outside)
  np.testing.assert_allclose(between, [MODEL_BYTES / 6] * 6 + [MODEL_BYTES / 2] * 2)
  np.testing.assert_allclose(sent - between, [2 * 5 / 6 * MODEL_BYTES] * 6 + [MODEL_BYTES] * 2)


def test_blocks_inside_a_group_stay_on_its_link_and_centers_cross_between():
  # Blocks of 4, each a group: one ring of 4 inside, nothing between.
  seconds, sent, between = TWO_BY_FOUR.exchange(MODEL_BYTES, 8, block=4)
  assert seconds == pytest.approx(0.075) and not between.any()
  np.testing.assert_allclose(sent, 1500)
  # The two groups' centers, each held whole by its 4 workers: a ring of 2 between
  # the groups, each worker carrying n/4.
  seconds, sent, between = TWO_BY_FOUR.exchange(MODEL_BYTES, 8, unit=4)
  assert seconds == pytest.approx(2 * (0.1 + 250 / 2 / 1e4))
  np.testing.assert_allclose(between, 250)
  np.testing.assert_allclose(sent, 250)
  # A block that spans two groups unevenly is hierarchical inside itself.
  straddling = timing.Cluster(compute_time=1.0, groups=(3, 5), **LINKS)
  seconds, _, between = straddling.exchange(MODEL_BYTES, 8, block=4)
  assert between[:4].all() and not between[4:].any()  # the second block is all group 1


def test_group_slowdowns_scale_each_groups_workers():
  slow = timing.Cluster(compute_time=1.0, groups=(2, 3), group_slowdowns=(1.0, 4.0))
  np.testing.assert_allclose(slow.mean_step_times(5), [1, 1, 4, 4, 4])
  np.testing.assert_array_equal(slow.group_of(5), [0, 0, 1, 1, 1])


def test_a_sync_clock_charges_each_level_on_its_links():
  levels = (timing.Exchange(block=4), timing.Exchange())
  clock = clocks.SyncClock(
    TWO_BY_FOUR,
    8,
    MODEL_BYTES,
    seed=0,
    period=2,
    levels=levels,
    level_exchanges=lambda step: ((step + 1) % 2 == 0, (step + 1) % 4 == 0),
  )
  times = [clock.next_tick().time for _ in range(4)]
  # Steps of 1 s; the groups' ring (0.075) after step 2; both levels after step 4.
  assert times == pytest.approx([1.0, 2.075, 3.075, 4.075 + 0.075 + 0.3])
  assert clock.level_exchanges == [2, 1]
  np.testing.assert_array_equal(clock.requests, 3)
  np.testing.assert_allclose(clock.bytes_sent, 3 * 1500 + 250)
  np.testing.assert_allclose(clock.bytes_between, 250)
  restored = clocks.SyncClock(
    TWO_BY_FOUR, 8, MODEL_BYTES, seed=0, period=2, levels=levels, level_exchanges=lambda s: (1, 1)
  )
  restored.load_state_dict(json.loads(json.dumps(clock.state_dict())))
  assert restored.level_exchanges == [2, 1]
  np.testing.assert_array_equal(restored.bytes_between, clock.bytes_between)


def test_workers_outside_the_servers_group_reach_them_between_groups():
  cluster = timing.Cluster(compute_time=1.0, groups=(2, 2), server_group=1, **LINKS)
  clock = clocks.AsyncClock(
    cluster, 4, MODEL_BYTES, 0, period=1, policy=clocks.Policy.FCFS, exchange_first=True
  )
  assert clock.messages == pytest.approx([0.1 + 0.1, 0.1 + 0.1, 0.01 + 0.01, 0.01 + 0.01])
  for _ in range(40):
    clock.next_tick()
  assert clock.requests.min() > 0
  np.testing.assert_allclose(clock.bytes_between, [*clock.bytes_sent[:2], 0, 0])


@pytest.mark.parametrize(
  "overrides,field,words",
  [
    ({"cluster.groups": (4, 3)}, "cluster.groups", "add up to the 8 workers"),
    ({"cluster.group_slowdowns": (2.0,)}, "cluster.group_slowdowns", "set cluster.groups first"),
    (
      {"cluster.groups": (4, 4), "cluster.group_slowdowns": (2.0, 1.0, 1.0)},
      "cluster.group_slowdowns",
      "one slowdown for each",
    ),
    ({"cluster.groups": (4, 4), "cluster.server_group": 2}, "cluster.server_group", "[0, 2)"),
    ({"cluster.server_group": 1}, "cluster.server_group", "a flat cluster has one group"),
  ],
)
def test_groups_that_do_not_fit_the_workers_are_named(overrides, field, words):
  from easgd.config import validation  # noqa: PLC0415 (after conftest has set the devices)

  with pytest.raises(ConfigError) as refused:
    validation.validate(config_with(overrides))
  message = str(refused.value)
  assert message.startswith(f"config.{field}=") and words in message and "\n" not in message
