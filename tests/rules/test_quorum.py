"""Rounds at a quorum (easgd.sim.rounds, easgd.rules.quorum): the rules' exchanges with a
round's membership given, run sharded over the mesh, against plain NumPy written from
docs/algorithms.md ("Rounds at a quorum") step by step, and the identities the
equations imply."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from test_outer import assert_follows
from test_rules import ALPHA, ETA, assert_close, loss_fn, make_problem, per_worker

import numpy_optim
import numpy_reference
from easgd import assembly, rules, steps
from easgd.infra import sharding
from easgd.sim import rounds, ticks, timing
from least_squares import numpy_grad
from runs import assert_stopped_and_resumed_ends_as_never_stopped, small_config

TAU, WORKERS = 2, 8
# Each round's (members, the others) over the 7 steps' 3 rounds: two missing, then one,
# then none; the first member is not worker 0 in the second round.
MEMBERSHIPS = [
  ({0, 1, 2, 3, 4, 5}, {6, 7}),
  ({1, 2, 3, 4, 5, 6, 7}, {0}),
  (set(range(WORKERS)), set()),
]


def membership(missed: str, always_out: int | None = None):
  """[(members, late, dropped)] of the rounds: MEMBERSHIPS, or every worker but
  `always_out` in every round."""
  if always_out is not None:
    pattern = [(set(range(WORKERS)) - {always_out}, {always_out})] * len(MEMBERSHIPS)
  else:
    pattern = MEMBERSHIPS
  return [
    (members, out if missed == "late" else set(), out if missed == "drop" else set())
    for members, out in pattern
  ]


def as_round(members, late, dropped, held, num_workers=WORKERS) -> rounds.Round:
  def mask(workers):
    return np.isin(np.arange(num_workers), sorted(workers))

  return rounds.Round(mask(members), mask(late), mask(dropped), mask(held))


def exchange_at(rule, t) -> int | None:
  """What step t (steps taken before it) ends with an exchange of: a streaming rule's
  fragment, sent; 0 for every other rule's exchange (`exchanges_after`); None: none."""
  if hasattr(rule, "fragment_at"):
    fragment = int(rule.fragment_at(t + 1, rule.hyper.fragments))
    return fragment if fragment >= 0 else None
  return 0 if rule.exchanges_after(t) else None


def run_in_rounds(name, hyper, x0, batches, memberships, num_devices=2):
  """The rule's compiled step, each exchange step's tick carrying its round."""
  mesh = sharding.make_mesh(num_devices)
  rule = rules.make_rule(name, hyper)
  params = jax.tree.map(lambda a: jnp.asarray(a, jnp.float32), x0)
  state = steps.init_state(rule, params, jax.random.PRNGKey(0), mesh)
  step = steps.build_rule_step(rule, loss_fn, mesh, state)
  # The late workers of each fragment's round before (one fragment, but the streaming rules').
  history, held, schedule = [], {}, iter(memberships)
  for t, batch in enumerate(batches):
    tick = ticks.Tick.empty(hyper.num_workers)
    fragment = exchange_at(rule, t)
    if rule.round_policy is not None and fragment is not None:
      members, late, dropped = next(schedule)
      tick.round = as_round(members, late, dropped, held.get(fragment, set()), hyper.num_workers)
      held[fragment] = late
    inputs = rule.tick_inputs(tick)
    state, _ = step(state, jax.tree.map(lambda a: jnp.asarray(a, jnp.float32), batch), inputs)
    history.append(jax.device_get(state))
  return history


def hyper(missed="drop", world_size="dynamic", **values):
  base = dict(
    num_workers=WORKERS,
    learning_rate=ETA,
    comm_period=TAU,
    moving_rate=ALPHA,
    quorum=0.5,
    missed=missed,
    world_size=world_size,
  )
  return rules.Hyper(**{**base, **values})


ADAMW = dict(optimizer="adamw", learning_rate=0.01, weight_decay=0.1)
# name -> (hyper-parameters, NumPy inner optimizer, pull, NumPy outer optimizer, alpha).
CASES = {
  # Momentum inside: a dropped worker's heal takes a member's velocity.
  "sync_easgd": (
    dict(momentum=0.9),
    lambda: numpy_optim.sgd(ETA, mu=0.9),
    "elastic",
    lambda: numpy_optim.sgd(WORKERS * ALPHA),
    ALPHA,
  ),
  # AdamW inside (its moments and count healed), outer Nesterov SGD.
  "diloco": (
    dict(**ADAMW, outer_learning_rate=0.7, outer_momentum=0.9, outer_nesterov=True),
    lambda: numpy_optim.Optimizer("adamw", numpy_optim.constant(0.01), wd=0.1),
    "reset",
    lambda: numpy_optim.sgd(0.7, mu=0.9, nesterov=True),
    0.0,
  ),
}


@pytest.mark.parametrize("missed", rounds.MISSED)
@pytest.mark.parametrize("name", sorted(CASES))
def test_rounds_follow_their_equations(name, missed):
  values, inner, pull, outer, alpha = CASES[name]
  x0, batches = make_problem(num_workers=WORKERS)
  schedule = membership(missed)
  actual = run_in_rounds(name, hyper(missed, **values), x0, batches, schedule)
  expected = numpy_optim.center_family_in_rounds(
    x0, [per_worker(b) for b in batches], numpy_grad, inner(), TAU, pull, outer(), schedule, alpha
  )
  assert_follows(actual, expected)


STREAMING_TAU, STREAMING_STEPS = 4, 13
# name -> (hyper-parameters, pull, NumPy outer optimizer, alpha, merge, delay): two
# fragments sent every 2 steps; streaming_diloco merging, each result applied on the
# step of the other fragment's send (d = 2); streaming_easgd's results 3 steps later,
# both fragments in flight at once (a heal copies a member's difference in flight).
STREAMING = {
  "streaming_diloco": (
    dict(outer_learning_rate=0.7, outer_momentum=0.9, outer_nesterov=True, merge=0.5),
    "reset",
    lambda: numpy_optim.sgd(0.7, mu=0.9, nesterov=True),
    0.0,
    0.5,
    2,
  ),
  "streaming_easgd": (dict(), "elastic", lambda: None, ALPHA, 1.0, 3),
}


@pytest.mark.parametrize("missed", rounds.MISSED)
@pytest.mark.parametrize("name", sorted(STREAMING))
def test_streaming_rounds_follow_their_equations(name, missed):
  """Six sends, alternating fragments: a late message held for its own fragment's next
  send, a dropped worker a member's copy that takes its fragment's result as it is."""
  values, pull, outer, alpha, merge, delay = STREAMING[name]
  x0, batches = make_problem(num_workers=WORKERS, steps_count=STREAMING_STEPS)
  schedule = membership(missed) * 2
  settings = hyper(
    missed,
    comm_period=STREAMING_TAU,
    fragments=2,
    sync_delay=delay,
    momentum=0.9,
    **values,
  )
  actual = run_in_rounds(name, settings, x0, batches, schedule)
  expected = numpy_optim.streaming_in_rounds(
    x0,
    [per_worker(b) for b in batches],
    numpy_grad,
    numpy_optim.sgd(ETA, mu=0.9),
    STREAMING_TAU,
    [["b"], ["w"]],  # the least-squares model's two blocks, in leaf order
    delay,
    pull,
    schedule,
    outer=outer(),
    alpha=alpha,
    merge=merge,
  )
  assert_follows(actual, expected)


@pytest.mark.parametrize("missed", rounds.MISSED)
@pytest.mark.parametrize(
  "name,member", [("streaming_diloco", "diloco"), ("streaming_easgd", "sync_easgd")]
)
def test_one_streamed_fragment_without_delay_is_its_familys_member_in_rounds(name, member, missed):
  """F = 1, d = 0: the same rounds train the family member's bits (a dropped worker's
  copy of a member, then the round's result, is the member's heal)."""
  values = {k: v for k, v in STREAMING[name][0].items() if k != "merge"}
  x0, batches = make_problem(num_workers=WORKERS)
  settings = hyper(missed, fragments=1, sync_delay=0, momentum=0.9, **values)
  schedule = membership(missed)
  streamed = run_in_rounds(name, settings, x0, batches, schedule)
  plain = run_in_rounds(member, settings, x0, batches, schedule)
  for a, b in zip(streamed, plain, strict=True):
    for x, y in zip(
      jax.tree.leaves((a.center, a.workers)), jax.tree.leaves((b.center, b.workers)), strict=True
    ):
      np.testing.assert_array_equal(x, y)


def test_a_fixed_world_size_divides_by_the_workers():
  values, inner, pull, outer, alpha = CASES["diloco"]
  x0, batches = make_problem(num_workers=WORKERS)
  schedule = membership("late")
  settings = hyper("late", "fixed", **values)
  actual = run_in_rounds("diloco", settings, x0, batches, schedule)
  expected = numpy_optim.center_family_in_rounds(
    x0,
    [per_worker(b) for b in batches],
    numpy_grad,
    inner(),
    TAU,
    pull,
    outer(),
    schedule,
    0.0,
    True,
  )
  assert_follows(actual, expected)


@pytest.mark.parametrize("name", ["sync_sgd", "sync_easgd", "diloco", "post_local_sgd"])
def test_a_round_of_every_worker_is_the_rule_bitwise(name):
  """A quorum whose rounds all take every worker (a deadline past every arrival) trains
  the rule's own bits."""
  values = CASES.get(name, (dict(momentum=0.9, switch_step=3),))[0]
  x0, batches = make_problem(num_workers=WORKERS)
  everyone = [(set(range(WORKERS)), set(), set())] * len(batches)
  in_rounds = run_in_rounds(name, hyper(**values), x0, batches, everyone)
  plain = run_in_rounds(name, hyper(quorum=1.0, **values), x0, batches, everyone)
  for a, b in zip(in_rounds, plain, strict=True):
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
      np.testing.assert_array_equal(x, y)


@pytest.mark.parametrize(
  "name,world_size", [("diloco", "dynamic"), ("sync_easgd", "fixed"), ("sync_sgd", "dynamic")]
)
def test_drop_with_one_worker_always_out_is_the_rule_on_the_others(name, world_size):
  """DiLoCo (a mean) at its contributions, EASGD (a sum of elastic forces) at the fixed
  world size, sync_sgd's gradient mean: the rule on P - 1 workers, the one out reset
  to the center each round."""
  values = CASES.get(name, (dict(momentum=0.9),))[0]
  x0, batches = make_problem(num_workers=WORKERS)
  period = 1 if name == "sync_sgd" else TAU
  out = 3
  schedule = membership("drop", always_out=out) * (len(batches) // len(MEMBERSHIPS) + 1)
  settings = hyper("drop", world_size, comm_period=period, **values)
  actual = run_in_rounds(name, settings, x0, batches, schedule[: len(batches) // period])
  others = [{k: np.delete(v, out, axis=0) for k, v in b.items()} for b in batches]
  fewer = hyper(quorum=1.0, num_workers=WORKERS - 1, comm_period=period, **values)
  expected = run_in_rounds(name, fewer, x0, others, [], num_devices=1)
  for t, (a, b) in enumerate(zip(actual, expected, strict=True)):
    assert_close(a.center, {k: np.asarray(v) for k, v in b.center.items()})
    if name == "sync_sgd":
      continue
    kept = {k: np.delete(v, out, axis=0) for k, v in a.workers.items()}
    assert_close(kept, b.workers)
    if (t + 1) % period == 0:
      assert_close({k: v[out] for k, v in a.workers.items()}, a.center)


def test_a_dropped_workers_diverged_steps_do_not_reach_the_round():
  """Worker 7 steps on NaNs before the first round, which drops it: the center stays
  finite, and the round heals the worker to it."""
  x0, batches = make_problem(num_workers=WORKERS)
  for step in range(TAU):
    batches[step]["x"][7] = np.nan
  values = CASES["sync_easgd"][0]
  history = run_in_rounds("sync_easgd", hyper(**values), x0, batches, membership("drop"))
  healed = history[TAU - 1]
  for key in x0:
    assert np.isfinite(healed.center[key]).all()
    np.testing.assert_array_equal(healed.workers[key][7], healed.center[key])


def test_post_local_sgd_drops_in_its_gradient_rounds_and_its_averages():
  """Before t0 a round is sync_sgd's, after it local_sgd's with a member's optimizer
  state for the dropped (momentum: their velocity healed)."""
  x0, batches = make_problem(num_workers=WORKERS)
  switch, period = 3, 2
  members = [m for m, _ in MEMBERSHIPS]
  schedule = [(m, set(), set(range(WORKERS)) - m) for m in (members * 2)[:5]]
  settings = hyper(momentum=0.9, switch_step=switch, comm_period=period)
  actual = run_in_rounds("post_local_sgd", settings, x0, batches, schedule)
  expected = numpy_reference.post_local_in_rounds(
    x0,
    [per_worker(b) for b in batches],
    numpy_grad,
    numpy_optim.sgd(ETA, mu=0.9),
    switch,
    period,
    [m for m, _, _ in schedule],
  )
  assert_follows(actual, expected)


@pytest.mark.e2e
def test_a_run_with_late_rounds_and_error_feedback_resumes_bit_for_bit(tmp_path):
  """Stopped after step 22, whose round left late messages held for the next, with
  error feedback's residuals from the exchanges before: they and the clock's rounds
  are in the checkpoint."""
  overrides = {
    "outer.moving_rate": 0.0,
    "outer.exchange_dtype": "int2",
    "outer.error_feedback": True,
    "outer.quorum": 0.5,
    "outer.missed": "late",
    "outer.deadline": 0.005,
    "cluster.stragglers": (2, 3),
    "run.checkpoint_every": 22,
    "outer.comm_period": 2,
  }
  config = small_config(overrides, algorithm="diloco")
  rule = assembly.rule(config)
  clock = rule.make_clock(timing.Cluster.from_config(config.cluster), 1e4, config.seed)
  last = [clock.next_tick() for _ in range(22)][-1]
  assert last.round is not None and last.round.late.any()  # held across the stop
  assert_stopped_and_resumed_ends_as_never_stopped(tmp_path, "diloco", overrides, stop=22)
