"""The streaming rules (easgd.rules.streaming) and their fragments, schedule and clock,
against plain NumPy step by step and the identities with their family's members."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import tiers
from test_outer import assert_follows
from test_rules import ALPHA, ETA, make_problem, per_worker, run_rule

import numpy_optim
from easgd import assembly, rules
from easgd.rules import fragments
from easgd.sim import clocks, timing
from easgd.train import setup
from least_squares import numpy_grad
from runs import assert_stopped_and_resumed_ends_as_never_stopped, small_config

TAU, STEPS = 4, 13
OUTER = dict(outer_learning_rate=0.7, outer_momentum=0.9, outer_nesterov=True)


def hyper(**values):
  base = dict(num_workers=8, learning_rate=ETA, comm_period=TAU, fragments=2)
  return rules.Hyper(**{**base, **values})


def reference(x0, batches, pull, **settings):
  return numpy_optim.streaming(
    x0,
    [per_worker(b) for b in batches],
    numpy_grad,
    numpy_optim.sgd(ETA),
    TAU,
    [["b"], ["w"]],  # the least-squares model's two blocks, in leaf order
    pull=pull,
    **settings,
  )


# (delay, merge): none, one step, and delays past H/F = 2, where both fragments are in
# flight at once and one's result lands on the other's send.
DELAYS_AND_MERGES = [(0, 1.0), (1, 1.0), (3, 0.5), (2, 0.25)]
EASGD_DELAYS = [0, 2]


@pytest.mark.parametrize("delay,merge", DELAYS_AND_MERGES)
def test_streaming_diloco_follows_its_equations(delay, merge, num_devices=2):
  x0, batches = make_problem(num_workers=8, steps_count=STEPS)
  settings = hyper(sync_delay=delay, merge=merge, **OUTER)
  actual = run_rule("streaming_diloco", settings, x0, batches, num_devices)
  outer = numpy_optim.sgd(0.7, mu=0.9, nesterov=True)
  expected = reference(x0, batches, "reset", delay=delay, outer=outer, merge=merge)
  assert_follows(actual, expected)


@pytest.mark.parametrize("num_devices", tiers.devices(8, 1))
@pytest.mark.parametrize("delay", EASGD_DELAYS)
def test_streaming_easgd_follows_its_equations(delay, num_devices):
  x0, batches = make_problem(num_workers=8, steps_count=STEPS)
  settings = hyper(sync_delay=delay, moving_rate=ALPHA)
  actual = run_rule("streaming_easgd", settings, x0, batches, num_devices)
  expected = reference(x0, batches, "elastic", delay=delay, alpha=ALPHA)
  assert_follows(actual, expected)


def test_each_fragment_moves_the_center_on_its_own_schedule():
  """Fragment b (f = 0) at t = 4, 8, 12; fragment w (f = 1) at t = 2, 6, 10; one step later
  with a delay of 1."""
  x0, batches = make_problem(num_workers=8, steps_count=STEPS)
  states = run_rule("streaming_diloco", hyper(sync_delay=1, **OUTER), x0, batches, 2)
  centers = [jax.tree.map(np.float32, x0)] + [state.center for state in states]
  for key, arrivals in (("b", {5, 9, 13}), ("w", {3, 7, 11})):
    moved = {
      t for t in range(1, STEPS + 1) if not np.array_equal(centers[t][key], centers[t - 1][key])
    }
    assert moved == arrivals, key


def positions(state):
  return jax.tree.leaves((state.center, state.workers))


@pytest.mark.parametrize("num_devices", tiers.devices(8, 2, 1))
@pytest.mark.parametrize(
  "name,member,settings",
  [
    ("streaming_diloco", "diloco", OUTER),
    ("streaming_easgd", "sync_easgd", dict(moving_rate=ALPHA)),
  ],
)
def test_one_fragment_without_delay_is_its_familys_member_bit_for_bit(
  name, member, settings, num_devices
):
  x0, batches = make_problem(num_workers=8, steps_count=7)
  family = hyper(fragments=1, comm_period=3, **settings)
  for a, b in zip(
    run_rule(name, family, x0, batches, num_devices),
    run_rule(member, family, x0, batches, num_devices),
    strict=True,
  ):
    for x, y in zip(positions(a), positions(b), strict=True):
      np.testing.assert_array_equal(x, y)


def test_fragments_are_contiguous_layers_of_about_equal_size():
  tree = {
    name: np.zeros(size) for name, size in zip("abcdef", (10, 30, 10, 10, 20, 20), strict=True)
  }
  assert fragments.split(tree, 1).blocks == (tuple("abcdef"),)
  halves = fragments.split(tree, 2)
  assert halves.blocks == (("a", "b", "c"), ("d", "e", "f")) and halves.sizes == (50, 50)
  assert fragments.split(tree, 6).blocks == tuple((name,) for name in "abcdef")
  # A block too large to share: every fragment still gets one.
  lopsided = {"a": np.zeros(100), "b": np.zeros(1), "c": np.zeros(1)}
  assert fragments.split(lopsided, 3).blocks == (("a",), ("b",), ("c",))
  with pytest.raises(ValueError, match="a model of 3 parameter blocks .* not 4"):
    fragments.split(lopsided, 4)


def test_a_batch_norm_layers_statistics_go_with_its_fragment():
  tree = {
    "params": {"BatchNorm_0": {"scale": np.ones(4)}, "Dense_0": {"kernel": np.ones((4, 2))}},
    "batch_stats": {"BatchNorm_0": {"mean": np.zeros(4)}},
  }
  parts = fragments.split(tree, 2)
  first, second = parts.take(tree, 0), parts.take(tree, 1)
  assert list(first["batch_stats"]) == ["BatchNorm_0"] and not second["batch_stats"]
  assert parts.put(tree, 1, second) == tree
  # A layer of statistics alone (a BatchNorm without scale or shift) is a block too.
  tree["batch_stats"]["BatchNorm_1"] = {"mean": np.zeros(2)}
  parts = fragments.split(tree, 3)
  assert parts.blocks == (("BatchNorm_0",), ("BatchNorm_1",), ("Dense_0",))
  middle = parts.take(tree, 1)
  assert middle["params"] == {} and list(middle["batch_stats"]) == ["BatchNorm_1"]


def test_the_clock_sends_one_fragment_at_a_time_and_overlaps_its_delay():
  cluster = timing.Cluster(compute_time=1.0, latency=0.5, bandwidth=1e3)
  sync = clocks.SyncClock(cluster, 4, 4000.0, seed=0, period=TAU)
  one = clocks.StreamingClock(cluster, 4, 4000.0, 0, TAU, fragment_bytes=[4000.0], delay=0)
  halves = clocks.StreamingClock(cluster, 4, 4000.0, 0, TAU, [1000.0, 3000.0], delay=0)
  hidden = clocks.StreamingClock(cluster, 4, 4000.0, 0, TAU, [1000.0, 3000.0], delay=1)
  clocks_by_name = {"sync": sync, "one": one, "halves": halves, "hidden": hidden}
  ticks = {name: [c.next_tick() for _ in range(12)] for name, c in clocks_by_name.items()}
  assert [t.time for t in ticks["one"]] == [t.time for t in ticks["sync"]]
  # Fragment 0 (1000 bytes) at t = 4, 8, 12 and fragment 1 (3000 bytes) at t = 2, 6, 10.
  sent = [t.bytes_sent[0] for t in ticks["halves"]]
  assert [t for t, b in enumerate(sent, start=1) if b] == [2, 4, 6, 8, 10, 12]
  assert sent[1] == timing.allreduce_bytes(3000.0, 4) and sent[3] == timing.allreduce_bytes(
    1000.0, 4
  )
  assert (
    halves.peak_bytes_per_step() == timing.allreduce_bytes(3000.0, 4) < sync.peak_bytes_per_step()
  )
  # The whole model's bytes, in all; overlapped with a step, the exchanges cost less time.
  assert sum(sent) == pytest.approx(3 * timing.allreduce_bytes(4000.0, 4))
  assert ticks["hidden"][-1].time < ticks["halves"][-1].time
  restored = clocks.StreamingClock(cluster, 4, 4000.0, 0, TAU, [1000.0, 3000.0], delay=1)
  state = hidden.state_dict()
  assert [step for step, _ in state["arrivals"]] == [13]  # fragment 0's, sent at t = 12
  restored.load_state_dict(state)
  # A checkpoint written before rounds kept one end a step, every worker's.
  older = clocks.StreamingClock(cluster, 4, 4000.0, 0, TAU, [1000.0, 3000.0], delay=1)
  older.load_state_dict(
    dict(state, arrivals=[[step, max(ends)] for step, ends in state["arrivals"]])
  )
  assert restored.next_tick().time == older.next_tick().time == hidden.next_tick().time


@pytest.mark.e2e
def test_a_run_resumed_with_a_fragment_in_flight_ends_as_one_never_stopped(tmp_path):
  """Stopped after step 22, when fragment 1 was sent at a quorum that dropped workers:
  its result is applied a step later, merged into the members and taken as it is by
  the dropped (their drop is in the checkpoint)."""
  overrides = {
    "outer.moving_rate": 0.0,
    "outer.fragments": 2,
    "outer.sync_delay": 1,
    "outer.merge": 0.5,
    "outer.quorum": 0.5,
    "cluster.stragglers": (2, 3),
  }
  config = small_config(overrides, algorithm="streaming_diloco")
  rule = assembly.rule(config)
  shapes = setup.model_shapes(config)
  rule.init(jax.tree.map(lambda s: np.zeros(s.shape, s.dtype), shapes), jax.random.PRNGKey(0))
  cluster = timing.Cluster.from_config(config.cluster)
  clock = rule.make_clock(cluster, sum(rule.fragment_bytes), config.seed)
  last = [clock.next_tick() for _ in range(22)][-1]
  assert last.round is not None and last.round.dropped.any()  # applied after the stop
  assert_stopped_and_resumed_ends_as_never_stopped(tmp_path, "streaming_diloco", overrides, 22)


@pytest.mark.parametrize("average_stats", [True, False])
def test_a_heal_costs_one_workers_parameters_and_optimizer_state(average_stats):
  """What a dropped worker downloads (the clock's heal_bytes): one row of the workers, its
  statistics left out when they stay local, and one row of its AdamW state."""
  tree = {
    "params": {"BatchNorm_0": {"scale": np.ones(4)}, "Dense_0": {"kernel": np.ones((4, 2))}},
    "batch_stats": {"BatchNorm_0": {"mean": np.zeros(4), "var": np.ones(4)}},
  }
  params = jax.tree.map(lambda a: jnp.asarray(a, jnp.float32), tree)
  settings = hyper(optimizer="adamw", weight_decay=0.1, average_stats=average_stats)
  rule = rules.make_rule("streaming_diloco", settings)
  state = rule.init(params, jax.random.PRNGKey(0))
  sent = state.workers if average_stats else state.workers["params"]
  rows = jax.tree.leaves((sent, state.worker_opt["inner"]))
  assert all(leaf.shape[0] == 8 for leaf in rows)
  assert rule.heal_bytes == sum(leaf[0].nbytes for leaf in rows)
  assert rule.heal_bytes == (12 + 8 * average_stats) * 4 + 2 * 12 * 4 + 4  # + AdamW's count
