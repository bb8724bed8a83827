"""The parameter-server rules against a literal event loop in NumPy, the identities
that hold between rules (docs/asynchrony.md lists them), and a resume of
async_local_sgd's master between its momentum's moves."""

import dataclasses
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import tiers

import numpy_optim
import numpy_reference
from easgd import rules, steps
from easgd.infra import sharding
from easgd.sim import timing
from easgd.sim.ticks import OpKind, Tick
from least_squares import DIM, OUT, loss_fn, numpy_grad
from runs import assert_stopped_and_resumed_ends_as_never_stopped

ETA, ALPHA, MU = 0.05, 0.2, 0.9
WORKERS, BATCH = 4, 4

# Unequal speeds (worker 3 twice as slow as worker 0, worker 1 a straggler),
# jitter, and a master slow enough that requests queue and overlap.
UNEQUAL = timing.Cluster(
  compute_time=1.0,
  speed_spread=1.0,
  jitter=0.3,
  stragglers=(1,),
  straggler_slowdown=1.5,
  latency=0.05,
  bandwidth=math.inf,
  master_time=0.4,
)
EQUAL = timing.Cluster(compute_time=1.0, latency=0.05, master_time=0.2)

# name -> (family, lock, period, server, mu, nesterov)
REFERENCE = {
  "original_easgd": ("elastic", "round_robin", 2, "sgd", None, False),
  "async_easgd": ("elastic", "fcfs", 2, "sgd", None, False),
  "async_measgd": ("elastic", "fcfs", 2, "sgd", MU, True),
  "hogwild_easgd": ("elastic", None, 2, "sgd", None, False),
  "async_sgd": ("push", "fcfs", 1, "sgd", None, False),
  "async_msgd": ("push", "fcfs", 1, "momentum", MU, False),
  "hogwild_sgd": ("push", None, 1, "sgd", None, False),
  "downpour": ("push", "fcfs", 3, "adagrad", None, False),
  "async_local_sgd": ("local", "fcfs", 2, "delayed_nesterov", None, False),
}
# async_local_sgd's master: Delayed Nesterov with eta_o, beta, N and c.
OUTER_ETA, OUTER_MU, DN_PERIOD, DN_ACTIVATION = 0.5, 0.8, 3, 0.1


def hyper_for(name, num_workers=WORKERS, comm_period=2):
  momentum = MU if rules.RULES[name].momentum == rules.Momentum.REQUIRED else 0.0
  return rules.Hyper(
    num_workers=num_workers,
    learning_rate=ETA,
    momentum=momentum,
    nesterov=name == "async_measgd",
    comm_period=comm_period,
    moving_rate=ALPHA,
    n_sync=3,
    server_optimizer="adagrad",
    outer_learning_rate=OUTER_ETA,
    outer_momentum=OUTER_MU,
    momentum_period=DN_PERIOD,
    momentum_activation=DN_ACTIVATION,
  )


def make_data(num_workers, steps_count, seed=0):
  """x0 and batches[i][k]: worker i's batch for its k-th local step."""
  rng = np.random.default_rng(seed)
  x0 = {"w": rng.normal(size=(DIM, OUT)), "b": rng.normal(size=OUT)}
  true_w = rng.normal(size=(DIM, OUT))
  batches = []
  for _ in range(num_workers):
    x = rng.normal(size=(steps_count, BATCH, DIM))
    y = x @ true_w + 0.1 * rng.normal(size=(steps_count, BATCH, OUT))
    batches.append([{"x": x[k], "y": y[k]} for k in range(steps_count)])
  return x0, batches


def run_ticks(name, hyper, timing, x0, batches, num_ticks, num_devices, seed=0, rule=None):
  """Runs a rule's compiled step (of `rule`, if given) for num_ticks ticks of its clock.

  Returns (states after each tick, the ticks).
  """
  mesh = sharding.make_mesh(num_devices)
  rule = rule or rules.make_rule(name, hyper)
  params = jax.tree.map(lambda a: jnp.asarray(a, jnp.float32), x0)
  state = steps.init_state(rule, params, jax.random.PRNGKey(0), mesh)
  step = steps.build_rule_step(rule, loss_fn, mesh, state)
  clock = rule.make_clock(timing, model_bytes=4 * (DIM * OUT + OUT), seed=seed)
  num_workers = hyper.num_workers
  taken = np.zeros(num_workers, int)
  states, ticks = [], []
  for _ in range(num_ticks):
    tick = clock.next_tick()
    # Each worker's batch for its next step (unused by workers not in the tick).
    batch = {
      key: np.stack([batches[i][taken[i]][key] for i in range(num_workers)]).astype(np.float32)
      for key in ("x", "y")
    }
    state, _ = step(state, batch, rule.tick_inputs(tick))
    taken += tick.local
    states.append(jax.device_get(state))
    ticks.append(tick)
  return states, ticks


def assert_close(actual, expected):
  for key in expected:
    np.testing.assert_allclose(np.asarray(actual[key]), expected[key], rtol=2e-5, atol=2e-5)


def worker_row(state, i):
  return {key: value[i] for key, value in state.workers.items()}


def test_every_parameter_server_rule_has_its_settings_in_the_reference():
  """The event loop's settings of every parameter-server rule of the registry, and of
  no other rule: a new one is named here rather than left out of the test below."""
  assert sorted(REFERENCE) == sorted(rules.names(parameter_server=True))


# Every parameter-server rule of the registry.
@pytest.mark.parametrize("num_devices", tiers.devices(4, 2))
@pytest.mark.parametrize("name", tiers.cases(sorted(rules.names(parameter_server=True))))
def test_rule_follows_a_literal_parameter_server(name, num_devices):
  assert name in REFERENCE, f"{name} has no settings of the event loop in REFERENCE"
  _, _, _, server, mu, nesterov = REFERENCE[name]
  # async_msgd's momentum is its master's; a momentum rule's workers have it.
  if not mu or server == "momentum":
    inner = None
  elif nesterov:
    inner = numpy_optim.LookAheadSGD(numpy_optim.constant(ETA), mu)
  else:
    inner = numpy_optim.sgd(ETA, mu)
  follows_the_event_loop(name, hyper_for(name), inner, num_devices)


# AdamW under a schedule and EAMSGD's look-ahead step (its L2 term there too) in the
# quick tier; the other inner optimizers and schedules with the whole suite.
@pytest.mark.parametrize(
  "name,settings,inner",
  tiers.first_quick(
    [
      (
        "async_easgd",
        dict(optimizer="adamw", schedule="warmup_cosine", warmup_steps=4, weight_decay=0.1),
        numpy_optim.Optimizer("adamw", numpy_optim.warmup_cosine(ETA, 4, 30), wd=0.1),
      ),
      (
        "async_measgd",  # EAMSGD's look-ahead form: the L2 term's gradient at the look-ahead too
        dict(schedule="warmup_step", warmup_steps=2, boundaries=(0.3,), weight_decay=0.1),
        numpy_optim.LookAheadSGD(numpy_optim.warmup_step(ETA, 2, 30, (0.3,), 0.1), MU, wd=0.1),
      ),
      (
        "hogwild_easgd",
        dict(momentum=MU, schedule="warmup_step", warmup_steps=2, boundaries=(0.2, 0.4)),
        numpy_optim.Optimizer("sgd", numpy_optim.warmup_step(ETA, 2, 30, (0.2, 0.4), 0.1), mu=MU),
      ),
      (
        "downpour",  # the master's learning rate is the pusher's, at its last local step
        dict(momentum=0.0, schedule="warmup_cosine", warmup_steps=3),
        numpy_optim.Optimizer("sgd", numpy_optim.warmup_cosine(ETA, 3, 30)),
      ),
      (
        "async_measgd",  # SC17's classic form, with an L2 term
        dict(nesterov=False, schedule="warmup_cosine", warmup_steps=3, weight_decay=0.1),
        numpy_optim.Optimizer("sgd", numpy_optim.warmup_cosine(ETA, 3, 30), mu=MU, wd=0.1),
      ),
      (
        "async_msgd",
        dict(schedule="warmup_step", warmup_steps=2, boundaries=(0.3,)),
        numpy_optim.Optimizer("sgd", numpy_optim.warmup_step(ETA, 2, 30, (0.3,), 0.1)),
      ),
    ],
    quick=2,
  ),
)
def test_each_workers_inner_optimizer_and_schedule_follow_its_own_steps(name, settings, inner):
  """A slow worker's schedule lags a fast one's: each runs on its own local step count."""
  hyper = dataclasses.replace(hyper_for(name), total_steps=30, **settings)
  follows_the_event_loop(name, hyper, inner, 2)


@pytest.mark.parametrize(
  "settings,inner",
  [
    # Nesterov at every push (N = 1), the workers with momentum SGD.
    (dict(momentum_period=1, momentum_activation=0.0, momentum=MU), numpy_optim.sgd(ETA, MU)),
    # Delayed Nesterov, no activation, and DyLU: H = 4 on speeds 1, 1/2, 3/5, 1/2.
    (dict(momentum_activation=0.0, comm_period=4, dynamic_local_steps=True), None),
    # Delayed Nesterov with an activation, DyLU, and AdamW workers under a schedule.
    (
      dict(
        comm_period=3,
        dynamic_local_steps=True,
        optimizer="adamw",
        schedule="warmup_cosine",
        warmup_steps=4,
        weight_decay=0.1,
      ),
      numpy_optim.Optimizer("adamw", numpy_optim.warmup_cosine(ETA, 4, 30), wd=0.1),
    ),
  ],
)
def test_async_local_sgd_follows_the_event_loop(settings, inner):
  hyper = dataclasses.replace(hyper_for("async_local_sgd"), total_steps=30, **settings)
  follows_the_event_loop("async_local_sgd", hyper, inner, 2)


def dynamic_local_steps(comm_period, mean_step_times):
  """DyLU (Liu et al. 2024): H_w = floor(H * v_w / max v), v = 1/c, at least one step."""
  speeds = 1 / np.asarray(mean_step_times)
  return [max(1, math.floor(comm_period * v / speeds.max() + 1e-9)) for v in speeds]


def follows_the_event_loop(name, hyper, inner, num_devices):
  """The rule's state after each tick is numpy_reference.parameter_server's after the
  same events."""
  family, lock, period, server, mu, _ = REFERENCE[name]
  x0, batches = make_data(WORKERS, steps_count=60)
  states, ticks = run_ticks(name, hyper, UNEQUAL, x0, batches, 30, num_devices)

  mean = UNEQUAL.mean_step_times(WORKERS)
  outer = None
  if family == "local":
    outer = numpy_optim.DelayedNesterov(
      OUTER_ETA, OUTER_MU, hyper.momentum_period, hyper.momentum_activation
    )
    period = hyper.comm_period
    if hyper.dynamic_local_steps:
      period = dynamic_local_steps(period, mean)
      assert len(set(period)) > 1, period  # the speeds really differ

  def durations(i, k):
    # The timing model's formula, written out: lognormal jitter from (seed, i, k).
    z = np.random.default_rng([0, i, k]).standard_normal()
    return mean[i] * math.exp(0.3 * z - 0.3**2 / 2)

  centers, worker_histories, staleness = numpy_reference.parameter_server(
    x0,
    batches,
    numpy_grad,
    family=family,
    lock=lock,
    period=period,
    durations=durations,
    message=0.05,
    master_time=0.4,
    eta=ETA,
    alpha=ALPHA,
    mu=mu,
    inner=inner,
    server=server,
    outer=outer,
    until=ticks[-1].time + 10,
  )
  writes = np.zeros((), int)
  updates = np.zeros(WORKERS, int)
  served = []
  for state, tick in zip(states, ticks, strict=True):
    for kind, worker in tick.ops:
      writes += kind in (OpKind.EXCHANGE, OpKind.WRITE)
      if family in ("push", "local"):
        updates[worker] += kind in (OpKind.EXCHANGE, OpKind.READ)
    updates += tick.local
    served += tick.staleness
    # The state after each tick is the reference's after the same events.
    assert_close(state.center, centers[writes])
    for i in range(WORKERS):
      assert_close(worker_row(state, i), worker_histories[i][updates[i]])
  assert served == staleness[: len(served)]
  # The run is long enough to mean something, and speeds really differ.
  assert writes >= 12 and sum(len(t.ops) for t in ticks) >= 12
  taken = states[-1].worker_steps
  assert sum(taken) >= 30
  # Under round robin every worker waits for its turn, so all keep pace with
  # the slowest; otherwise the fast worker 0 takes more steps than worker 3.
  assert taken[0] == taken[3] if lock == "round_robin" else taken[0] > taken[3]
  if lock is None:
    assert overlapping_reads([op for t in ticks for op in t.ops]) >= 2


def overlapping_reads(ops):
  """Hogwild reads that another read followed before their own write."""
  count = 0
  for n, (kind, worker) in enumerate(ops):
    if kind == OpKind.READ and (OpKind.WRITE, worker) in ops[n:]:
      end = ops.index((OpKind.WRITE, worker), n)
      count += any(other == OpKind.READ for other, _ in ops[n + 1 : end])
  return count


def final(name, hyper, timing, ticks=16, num_workers=WORKERS, seed=0):
  x0, batches = make_data(num_workers, steps_count=40)
  states, schedule = run_ticks(name, hyper, timing, x0, batches, ticks, num_workers, seed)
  return states[-1], schedule


def assert_same_state(a, b, exact=True):
  """Center and workers equal: bitwise, or (for other compiled programs) to float rounding."""
  pairs = zip(
    jax.tree.leaves((a.center, a.workers)), jax.tree.leaves((b.center, b.workers)), strict=True
  )
  for x, y in pairs:
    if exact:
      np.testing.assert_array_equal(x, y)
    else:
      np.testing.assert_allclose(x, y, rtol=1e-5, atol=1e-6)


def test_equal_speeds_make_async_easgd_the_round_robin_original():
  # All workers finish together; ties go to the lower index, so the first
  # come first served order is the round-robin order 0, 1, ..., P-1.
  a, ticks_a = final("async_easgd", hyper_for("async_easgd"), EQUAL)
  b, ticks_b = final("original_easgd", hyper_for("original_easgd"), EQUAL)
  assert [t.ops for t in ticks_a] == [t.ops for t in ticks_b]
  assert_same_state(a, b)


@pytest.mark.parametrize(
  "locked,hogwild", [("async_easgd", "hogwild_easgd"), ("async_sgd", "hogwild_sgd")]
)
def test_without_service_time_hogwild_is_the_locked_rule(locked, hogwild):
  # A write lands the moment it is read, before any other request arrives:
  # no two requests overlap, so there is nothing for the lock to serialise.
  instant = dataclasses.replace(UNEQUAL, master_time=0.0)
  a, ticks_a = final(locked, hyper_for(locked), instant)
  b, ticks_b = final(hogwild, hyper_for(hogwild), instant)
  # The same requests in the same order; each Hogwild write follows its read.
  assert [w for t in ticks_a for _, w in t.ops] == [w for t in ticks_b for _, w in t.ops][::2]
  assert_same_state(a, b, exact=False)


def test_fully_overlapping_hogwild_easgd_is_sync_easgd():
  # Equal speeds: every exchange reads the same center and all increments are
  # added: x_i <- x_i + u_i - alpha*(x_i - c), c <- c + alpha*sum_i (x_i - c).
  # Each worker exchanges every other tick; sync_easgd exchanges on the same steps.
  hogwild, ticks = final("hogwild_easgd", hyper_for("hogwild_easgd"), EQUAL)
  assert all(t.local.all() for t in ticks)
  sync, _ = final("sync_easgd", hyper_for("sync_easgd"), EQUAL)
  assert_same_state(hogwild, sync, exact=False)


@pytest.mark.parametrize(
  "name,sync_name",
  [("async_sgd", "sync_sgd"), ("async_easgd", "sync_easgd"), ("hogwild_easgd", "sync_easgd")],
)
def test_one_worker_has_no_asynchrony(name, sync_name):
  timing = dataclasses.replace(UNEQUAL, stragglers=())
  a, _ = final(name, hyper_for(name, num_workers=1), timing, num_workers=1)
  b, _ = final(sync_name, hyper_for(sync_name, num_workers=1), timing, num_workers=1)
  for x, y in zip(jax.tree.leaves(a.center), jax.tree.leaves(b.center), strict=True):
    np.testing.assert_allclose(x, y, rtol=1e-5, atol=1e-6)


def test_downpour_with_one_local_step_and_sgd_is_async_sgd():
  hyper = hyper_for("downpour")
  downpour = dataclasses.replace(hyper, n_sync=1, server_optimizer="sgd")
  a, _ = final("downpour", downpour, UNEQUAL)
  b, _ = final("async_sgd", hyper_for("async_sgd"), UNEQUAL)
  assert_same_state(a, b)


def test_the_seed_replays_the_run_and_another_seed_changes_the_order():
  a, ticks_a = final("async_easgd", hyper_for("async_easgd"), UNEQUAL, seed=3)
  b, ticks_b = final("async_easgd", hyper_for("async_easgd"), UNEQUAL, seed=3)
  assert_same_state(a, b)
  _, ticks_c = final("async_easgd", hyper_for("async_easgd"), UNEQUAL, seed=4)
  assert [t.ops for t in ticks_a] == [t.ops for t in ticks_b]
  assert [t.ops for t in ticks_a] != [t.ops for t in ticks_c]


def test_one_worker_of_async_local_sgd_with_nesterov_at_every_push_is_diloco():
  # One worker's H local steps, its push, the master's Nesterov step and the fetch
  # are diloco's step on one worker. (To float rounding: XLA fuses a parameter-server
  # rule's local step otherwise than the center family's, as for async_sgd's.)
  timing = dataclasses.replace(UNEQUAL, stragglers=())
  hyper = dataclasses.replace(
    hyper_for("async_local_sgd", num_workers=1, comm_period=3),
    momentum_period=1,
    momentum_activation=0.0,
  )
  a, ticks = final("async_local_sgd", hyper, timing, ticks=12, num_workers=1)
  assert sum(len(t.ops) for t in ticks) == 4
  diloco = dataclasses.replace(hyper, outer_optimizer="sgd", outer_nesterov=True)
  b, _ = final("diloco", diloco, timing, ticks=12, num_workers=1)
  assert_same_state(a, b, exact=False)


@pytest.mark.e2e
def test_async_local_sgd_resumed_between_momentum_moves_ends_as_one_never_stopped(tmp_path):
  """Stopped after step 22 with pushes buffered since Delayed Nesterov's momentum
  last moved, and a 3x slower worker pushing after every local step (DyLU)."""
  overrides = {
    "outer.moving_rate": 0.0,
    "outer.momentum_period": 3,
    "outer.momentum_activation": 0.2,
    "outer.dynamic_local_steps": True,
    "cluster.stragglers": (1,),
    "cluster.straggler_slowdown": 3.0,
  }
  assert_stopped_and_resumed_ends_as_never_stopped(tmp_path, "async_local_sgd", overrides, 22)


@pytest.mark.parametrize("name", ["async_measgd", "async_msgd"])
def test_a_reset_in_the_tick_of_the_workers_step_leaves_it_at_the_ticks_center(name):
  """runtime=ray's join or leave at a cut: the last operation of a tick in which the
  worker also stepped (easgd.sim.events). Its row ends at the center after the
  tick's operations, its optimizer state fresh; the step it took there is
  discarded (an elastic rule's deferred update, EAMSGD's look-ahead shift, a
  pushing rule's step and accumulated gradient), and the other worker's row is
  as in the same tick without the reset."""
  hyper = hyper_for(name, num_workers=2)
  x0, batches = make_data(2, 3)
  rule = rules.make_rule(name, hyper)
  rule.resets = True  # as a replay whose trace holds a join or leave sets it
  mesh = sharding.make_mesh(2)
  params = jax.tree.map(lambda a: jnp.asarray(a, jnp.float32), x0)
  initial = steps.init_state(rule, params, jax.random.PRNGKey(0), mesh)
  step = steps.build_rule_step(rule, loss_fn, mesh, initial)
  batch = {
    key: np.stack([batches[i][0][key] for i in range(2)]).astype(np.float32) for key in ("x", "y")
  }

  def after(ops):
    tick = Tick.empty(2)
    tick.local[:] = True
    tick.ops.extend(ops)
    state = steps.init_state(rule, params, jax.random.PRNGKey(0), mesh)
    # A step first, so that momentum and accumulated gradients are not zero.
    first = Tick.empty(2)
    first.local[:] = True
    state, _ = step(state, batch, rule.tick_inputs(first))
    return jax.device_get(step(state, batch, rule.tick_inputs(tick))[0])

  reset = after([(OpKind.EXCHANGE, 0), (OpKind.RESET, 1)])
  plain = after([(OpKind.EXCHANGE, 0)])
  for key in x0:
    np.testing.assert_array_equal(reset.workers[key][1], reset.center[key])
    np.testing.assert_array_equal(reset.workers[key][0], plain.workers[key][0])
    np.testing.assert_array_equal(reset.center[key], plain.center[key])
    assert not np.array_equal(plain.workers[key][1], plain.center[key])
  fresh = jax.device_get(rule.fresh_worker_opt(jax.tree.map(lambda a: a[None], params)))
  for got, want in zip(
    jax.tree.leaves(jax.tree.map(lambda a: a[1], reset.worker_opt)),
    jax.tree.leaves(jax.tree.map(lambda a: a[0], fresh)),
    strict=True,
  ):
    np.testing.assert_array_equal(got, want)


class _StalenessInTheBias(rules.RULES["async_easgd"]):
  """async_easgd that also adds each request's staleness to the center's bias: what
  of the staleness reaches the master's program (`serve_read`'s input)."""

  def serve_read(self, carry, j, key, locked, staleness=0):
    center, center_opt, shared = super().serve_read(carry, j, key, locked)
    return {**center, "b": center["b"] + staleness}, center_opt, shared


def test_each_requests_staleness_reaches_the_masters_program():
  """The clock's staleness of every request (Tick.staleness) is the master's input, in
  the tick program and in runtime=threads' program of one operation."""
  from easgd.train.runtimes.threads import runtime as threads  # noqa: PLC0415

  # No elastic pull (alpha = 0): the center moves by the staleness alone, and nothing
  # feeds back into the workers.
  hyper = dataclasses.replace(hyper_for("async_easgd"), moving_rate=0.0)
  x0, batches = make_data(WORKERS, 40)
  rule = _StalenessInTheBias(hyper)
  counted, ticks = run_ticks("async_easgd", hyper, UNEQUAL, x0, batches, 30, 2, rule=rule)
  staleness = np.cumsum([sum(tick.staleness) for tick in ticks])
  assert staleness[-1] > 10  # requests did queue behind others
  got = np.asarray([state.center["b"] - x0["b"] for state in counted])
  np.testing.assert_allclose(got, staleness[:, None] * np.ones(OUT), atol=1e-4)

  device = jax.devices()[0]
  _, master = threads.programs(rule, loss_fn, BATCH, None)
  program = threads.on_device(master, threads.MASTER_SPECS, device)
  center = jax.tree.map(lambda a: jnp.asarray(a, jnp.float32), x0)
  row = {"workers": jax.tree.map(lambda a: a[None], center), "worker_steps": jnp.ones(1, jnp.int32)}

  def bias_after(staleness):
    numbers = (np.int32(0), np.int32(0), np.int32(OpKind.EXCHANGE), np.int32(staleness))
    return np.asarray(program(center, (), row, jax.random.PRNGKey(0), *numbers)[0]["b"])

  np.testing.assert_allclose(bias_after(7) - bias_after(0), 7.0, atol=1e-5)
