"""runtime=threads: the parameter-server rules run for real on one host (the
synchronous rules' rounds are easgd.train.runtimes.threads.rounds').

The workers (easgd.train.runtimes.threads.workers) run in threads of their own; this
module is their side of the training loop (easgd.train.loop). The loop's step s is tick
s - 1 of the events as they commit (ticks count from 0, as the simulated
runtime's), and the loop keeps pace with the leading worker. The workers'
limit is the next step at which the loop logs, evaluates or checkpoints;
at that step the loop waits until every worker is parked there, and
evaluates or saves that consistent cut, which the replay of the trace
(cluster.replay) reaches at the same step. A preemption notice lowers the
limit to one tick past the leading worker, at most the next such step: the
loop stops there, logs and evaluates it if it is one of theirs, and saves it.

Each worker's step and each master operation is compiled as shard_map over
a mesh of its one device, with the tick program's own conditionals around
it, so that XLA compiles the arithmetic as it does in the simulated
runtime's program: a replay reaches the same bits (docs/asynchrony.md, "Real
asynchrony", says where it does not).
"""

import dataclasses

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
from absl import logging
from jax import lax
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from easgd import assembly
from easgd.data import augment as augment_lib
from easgd.data import batches
from easgd.errors import require
from easgd.infra import profiler, sharding
from easgd.infra.compile import compile_program
from easgd.rules import AXIS, RULES, Rule, TrainState, tiers
from easgd.rules.outer import CenterRule
from easgd.rules.spmd import exchange_key
from easgd.rules.streaming import StreamingRule
from easgd.sim import timing
from easgd.train import loop
from easgd.train import setup as setup_lib
from easgd.train.runtimes import trace as trace_lib
from easgd.train.runtimes.rule_runtime import RuleReports, RuleRuntime, parameter_server_rules
from easgd.train.runtimes.simulated.fields import REPLAY
from easgd.train.runtimes.threads.layout import Layout
from easgd.train.runtimes.threads.live_clock import LiveClock
from easgd.train.runtimes.threads.rounds import RoundsTrainee
from easgd.train.runtimes.threads.workers import Rows, TwoTier, Workers


def programs(rule: Rule, loss_fn, batch_size: int, augment):
  """The pieces, each jitted alone: a worker's local step, and the master's operations."""

  def local(workers, worker_opt, worker_steps, rng, images, labels, worker, base):
    """The local step at `workers`; the EASGD family applies its deferred step to
    `base` (x_j, or x_j - e after the exchange: `apply_deferred`), in the same
    program as the simulated runtime does: XLA fuses the update's last product
    into that sum."""
    batch = batches.sample_batches(images, labels, rng, worker, worker_steps, batch_size, augment)
    view = TrainState(
      step=0,
      rng=rng,
      center=(),
      center_opt=(),
      workers=workers,
      worker_opt=worker_opt,
      worker_steps=worker_steps,
    )
    stepping = worker >= 0  # always; a value XLA cannot fold, as in the tick program
    new_workers, new_opt, deferred, loss, accuracy = rule.local_step(view, batch, loss_fn, stepping)
    # What the worker keeps crosses a conditional, as it crosses the master's in
    # the simulated step (ParameterServerRule.step): XLA then fuses (and rounds)
    # the update's arithmetic alike in both programs.
    kept = base if deferred is not None else new_workers
    kept, new_opt = lax.cond(worker[0] >= 0, lambda *a: a, lambda *a: a, kept, new_opt)
    if deferred is not None:
      kept = rule.apply_deferred(kept, deferred)
    return kept, new_opt, loss, accuracy

  def master(center, center_opt, row, rng, tick, position, kind, staleness):
    """Operation `kind` of worker j (row 0), the position-th of tick `tick`, at its
    `staleness`: the tick program's loop and key (ParameterServerRule.serve), run for
    this one operation."""
    size = 2 * rule.hyper.num_workers
    ops = {
      "op_kind": jnp.zeros(size, jnp.int32).at[position].set(kind),
      "op_worker": jnp.zeros(size, jnp.int32),
      "op_staleness": jnp.zeros(size, jnp.int32).at[position].set(staleness),
      "num_ops": position + 1,
    }
    key = exchange_key(TrainState(tick, rng, (), (), (), (), ()))
    carry = (center, center_opt, row)
    return lax.cond(
      ops["num_ops"] > 0, lambda: rule.serve(ops, key, position, carry), lambda: carry
    )

  return local, master


def served_rule(rule: Rule) -> Rule:
  """The rule as its master serves one request: itself, or with two-tier servers as the
  one master serves it, on a group's center (each group server's operation)."""
  if not rule.hyper.two_tier:
    return rule
  served = type(rule)(dataclasses.replace(rule.hyper, two_tier=False))
  served.resets = rule.resets
  return served


def server_program(rule: Rule):
  """Two-tier servers' own operation (SEND, APPLY or MERGE) for one group, as the tick
  program runs it (easgd.rules.tiers.server_operation)."""

  def server(center, global_opt, group, kind):
    return tiers.server_operation(center, global_opt, group, kind, rule.hyper)

  return server


# The in and out specs of `programs`' local step and master operation, each jitted over
# a mesh of one device: the local step takes its worker's rows, and the run's key whole;
# and of the two-tier servers' own operation.
LOCAL_SPECS = ((P(AXIS),) * 3 + (P(),) + (P(AXIS),) * 4, P(AXIS))
MASTER_SPECS = ((P(),) * 8, P())
SERVER_SPECS = ((P(),) * 4, P())


def on_device(function, specs, device):
  """jit(shard_map(function)) over a mesh of `device` alone, with `specs` (LOCAL_SPECS or
  MASTER_SPECS), nothing donated."""
  in_specs, out_specs = specs
  mesh = Mesh(np.array([device]), (AXIS,))
  return sharding.jit_shard_map(function, mesh, in_specs, out_specs, donate=False)


class ThreadsTrainee(RuleReports):
  """The loop's trainee for runtime=threads (see the module docstring)."""

  def __init__(
    self,
    setup: setup_lib.Setup,
    rule: Rule,
    state: TrainState,
    cluster: timing.Cluster,
    sent_bytes: float,
    clock_state: dict | None,
    resumed_at: int | None,
    model_bytes: float = 0.0,
  ):
    config = setup.config
    clock = LiveClock(config.workers, trace_lib.server_groups(config))
    if clock_state is not None:
      clock.load_state_dict(clock_state)
    # First: a resumed run whose trace is missing or short stops here, having written nothing.
    trace = trace_lib.Writer(setup.workdir, config, None if clock_state is None else clock.events)
    super().__init__(setup, rule, clock, resumed_at)
    self.schedule = loop.Schedule.from_config(config.run)
    self.rng = state.rng
    self.cut = int(jax.device_get(state.step))  # the loop step of the last consistent cut
    self._loop_step = self.cut
    self.layout = Layout(setup.mesh, config.workers)
    self.devices, self.per_device = self.layout.devices, self.layout.per_device
    rows = self._split(state, setup.train_images, setup.train_labels)
    mean_times = cluster.mean_step_times(config.workers)
    pacing = (sent_bytes, mean_times / mean_times.min() - 1.0, rule.periods(cluster), self.cut)
    pacing += (TwoTier.of(rule, cluster, model_bytes),)
    self.pool = self._workers(rule, setup, rows, clock, trace, pacing)
    self.started = False  # the threads start at the first step

  def _workers(self, rule: Rule, setup: setup_lib.Setup, rows: Rows, clock, trace, pacing):
    """The workers and their master: on this host's devices, each worker's program
    compiled for its device. pacing: Workers' (sent_bytes, delay_factor, periods, cut)."""
    compiled = self._compile(rule, setup, rows)
    return Workers(rule, rows, self.devices, compiled, clock, trace, *pacing)

  # Layout: the loop's sharded state <-> one row per worker on its device.

  def _split(self, state: TrainState, images, labels) -> Rows:
    layout = self.layout
    return Rows(
      workers=layout.rows(state.workers),
      worker_opt=layout.rows(state.worker_opt),
      images=layout.rows(images),
      labels=layout.rows(labels),
      steps=[int(n) for n in np.asarray(jax.device_get(state.worker_steps))],
      center=layout.on(state.center, self.devices[0]),
      center_opt=layout.on(state.center_opt, self.devices[0]),
      rng_on={device: jax.device_put(state.rng, device) for device in self.devices},
    )

  @property
  def state(self) -> TrainState:
    """The training state at the last cut, in the simulated runtime's layout."""
    pool, replicated = self.pool, NamedSharding(self.setup.mesh, P())
    return TrainState(
      step=jax.device_put(np.int32(self.cut), replicated),
      rng=self.rng,
      center=jax.device_put(pool.center, replicated),
      center_opt=jax.device_put(pool.center_opt_now(), replicated),
      workers=self.layout.stacked(pool.workers),
      worker_opt=self.layout.stacked(pool.worker_opt),
      worker_steps=jax.device_put(
        np.asarray(pool.steps, np.int32), NamedSharding(self.setup.mesh, P(AXIS))
      ),
    )

  def _compile(self, rule: Rule, setup: setup_lib.Setup, rows: Rows):
    """Each device's local step, and the master's operation on the center's device
    (two tiers: a group server's, on a group's center, and the servers' own)."""
    config = setup.config
    augment = augment_lib.get(config.data.augment)
    two_tier = rule.hyper.two_tier
    local, master = programs(served_rule(rule), setup.loss_fn, config.data.batch_size, augment)
    platform = setup.platform

    def on(device, value):
      return jax.device_put(np.asarray(value, np.int32), device)

    pending = {}
    for d, device in enumerate(self.devices):
      j = d * self.per_device
      workers, opt = rows.workers[j], rows.worker_opt[j]
      args = (workers, opt, on(device, [0]), rows.rng_on[device])
      args += (rows.images[j], rows.labels[j], on(device, [j]), workers)
      pending[device] = on_device(local, LOCAL_SPECS, device).lower(*args)
    center = self.devices[0]
    fields = {f: rows.worker_opt[0][f] for f in rule.request_fields()}
    row = {"workers": rows.workers[0], **fields, "worker_steps": on(self.devices[0], [0])}
    center_tree, center_opt = rows.center, rows.center_opt
    if two_tier:
      center_tree, center_opt = center_opt["groups"][0]["center"], center_opt["groups"][0]["opt"]
    args = (center_tree, center_opt, jax.device_put(row, center))
    args += (rows.rng_on[center], *(on(center, 0) for _ in range(4)))
    master_op = compile_program(on_device(master, MASTER_SPECS, center).lower(*args), platform)
    compiled = {device: compile_program(program, platform) for device, program in pending.items()}
    if not two_tier:
      return compiled, master_op
    server = on_device(server_program(rule), SERVER_SPECS, center)
    tiers_state = rows.center_opt
    args = (rows.center, tiers_state["global"], tiers_state["groups"][0], on(center, 0))
    return compiled, master_op, compile_program(server.lower(*args), platform)

  # The loop's side.

  def _cut(self) -> None:
    """The cut at the workers' limit (self.pool.cond held); its ticks go to the reports."""
    pool = self.pool
    pool.wait_for_cut()
    self.cut = pool.limit + 1
    for tick in pool.clock.packer.release_all():
      self.totals.add(tick)

  def step(self):
    pool = self.pool
    if not self.started:
      pool.start()
      self.started = True
    with pool.cond:
      step = self._loop_step = self._loop_step + 1
      pool.raise_limit(self.schedule.next_stop(step) - 1)
      if self.schedule.stops_at(step):
        self._cut()
      else:
        pool.wait_for_leader(step - 1)
      taken = pool.take_local_steps()
    # A loop step may see any number of local steps (or none).
    return taken, None

  def add(self, values, context) -> np.ndarray:
    del context
    return self.add_local_steps(values["loss"], values["accuracy"])

  def stop_at(self, step):
    """A preemption notice after the loop's `step`: that step if the workers are at
    its cut already (a scheduled one), else the first cut they can reach, at most
    the next scheduled stop (the limit never passes it), with the steps that
    reached it since the loop took them."""
    pool = self.pool
    with pool.cond:
      if self.cut == pool.limit + 1 and pool.parked():
        return step, None  # at a scheduled cut already
      pool.lower_limit()
      self._cut()
      self._loop_step = self.cut
      logging.info("stopping at the consistent cut after step %d", self.cut)
      return self.cut, pool.take_local_steps()

  def save(self, divergence):
    del divergence  # every step's loss was checked as the loop added it (step, stop_at)
    pool = self.pool
    with pool.cond:
      pool.trace.sync()
      clock_state = pool.clock.state_dict()
    self.setup.checkpointer.save(self.state, clock_state, self.setup.config)

  def finish(self):
    with self.pool.cond:
      self.pool.trace.end(self.pool.clock.events, self.cut)
    super().finish()

  def close(self):
    self.pool.stop()
    self.pool.trace.close()
    super().close()


def round_rules() -> tuple[str, ...]:
  """The synchronous rules that runtime=threads runs (easgd.train.runtimes.threads.rounds):
  the center family's, whose workers take local steps between rounds of the whole
  model (not the streaming rules', whose rounds send one fragment every H/F steps and
  apply it d steps later: those run simulated)."""
  return tuple(
    name
    for name, rule in RULES.items()
    if issubclass(rule, CenterRule)
    and not issubclass(rule, StreamingRule)
    and "drop" in rule.missed
  )


def exchange_ticks(config: ml_collections.ConfigDict) -> list[int]:
  """The ticks of a run of `config` that end with its rule's exchange (a round)."""
  rule = assembly.rule(config)
  return [tick for tick in range(config.run.total_steps) if rule.exchanges_after(tick)]


class ThreadsRuntime(RuleRuntime):
  """The parameter-server rules, each worker in a thread of its own on one host; and the
  center family's synchronous rules, each round closed on the workers' real arrivals."""

  name = "threads"
  spans_processes = False
  streams = False  # each worker reads its batches from its partition on its device
  # A synchronous rule's trace replays here (a parameter-server rule's under simulated).
  declares = (REPLAY,)

  @classmethod
  def algorithms(cls) -> tuple[str, ...]:
    return parameter_server_rules() + round_rules()

  @classmethod
  def runs(cls) -> str:
    return (
      f"the parameter-server rules ({', '.join(parameter_server_rules())}) and the "
      f"synchronous rules with local steps ({', '.join(round_rules())})"
    )

  @classmethod
  def check(cls, config: ml_collections.ConfigDict) -> None:
    """A parameter-server rule's run records a trace, which a replay drives the
    simulated runtime through; a synchronous rule's trace replays here. Neither has
    tick programs to profile."""
    if config.algorithm in round_rules():
      if config.cluster.replay:
        trace_lib.check_rounds_replay(config, exchange_ticks(config))
    else:
      require(
        not config.cluster.replay,
        REPLAY.path,
        config.cluster.replay,
        f"a parameter-server rule's trace replays under runtime=simulated; runtime={cls.name} "
        "records a new one: leave it ''",
      )
    require(
      not config.run.profile,
      profiler.PROFILE,
      config.run.profile,
      f"profiles the simulated runtime's tick programs; with runtime={cls.name} leave it ''",
    )

  def _trainee_arguments(self, state, clock_state, resumed_at) -> tuple:
    """What every trainee of this runtime (and of runtime=ray) starts from."""
    return (self.setup, self.rule, state, self.cluster, self.sent_bytes, clock_state, resumed_at)

  def trainee(self, state, clock_state, resumed_at):
    config = self.setup.config
    arguments = self._trainee_arguments(state, clock_state, resumed_at)
    if config.algorithm in round_rules():
      replayed = None
      if config.cluster.replay:
        replayed = trace_lib.check_rounds_replay(config, exchange_ticks(config))
      return RoundsTrainee(*arguments, replayed)
    return ThreadsTrainee(*arguments, model_bytes=self.model_bytes)
