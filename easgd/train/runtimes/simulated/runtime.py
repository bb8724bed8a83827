"""runtime=simulated: every worker steps in the ticks of a schedule, one program for all.

The schedule comes from the timing model (easgd.sim.clocks) or, with
cluster.replay, from a trace that the threads runtime recorded
(easgd.train.runtimes.trace). Each tick, the trainee asks the clock for it,
runs the rule's compiled step on it, and counts what it did; it knows no rule
by name.
"""

import ml_collections
import numpy as np

from easgd import steps
from easgd.data import augment as augment_lib
from easgd.data import stream
from easgd.errors import require
from easgd.infra import sharding
from easgd.infra.compile import compile_program
from easgd.rules import RULES, Rule, TrainState
from easgd.sim import clocks, ticks
from easgd.train import setup as setup_lib
from easgd.train.runtimes import trace
from easgd.train.runtimes.rule_runtime import RuleReports, RuleRuntime, parameter_server_rules
from easgd.train.runtimes.simulated import replay_clock
from easgd.train.runtimes.simulated.fields import REPLAY


class SimulatedTrainee(RuleReports):
  """A rule's part of the loop under the simulated runtime: its state, clock,
  compiled step and reports."""

  def __init__(
    self,
    setup: setup_lib.Setup,
    rule: Rule,
    state: TrainState,
    clock: clocks.Clock,
    resumed_at: int | None = None,
  ):
    super().__init__(setup, rule, clock, resumed_at)
    config = setup.config
    self.state = state
    augment = augment_lib.get(config.data.augment)
    empty_tick = rule.tick_inputs(ticks.Tick.empty(config.workers))
    self.streamer = None
    if setup.streamed:
      # Each worker's local steps, mirrored on the host from the clock's ticks:
      # they pick the batches to read.
      self.host_steps = np.asarray(sharding.fetch(state.worker_steps), np.int64)
      self.streamer = stream.Streamer(
        setup.mesh,
        setup.dataset.train_images,
        setup.dataset.train_labels,
        config.workers,
        config.data.batch_size,
        config.seed,
        state.rng,
        self.host_steps,
        config.run.total_steps,
      )
      try:
        program = steps.build_batch_step(rule, setup.loss_fn, setup.mesh, state, augment)
        lowered = program.lower(state, *self.streamer.batches(self.host_steps), empty_tick)
        self.train_step = compile_program(lowered, setup.platform)
      except BaseException:
        self.streamer.close()  # its readers' threads end with the error
        raise
    else:
      program = steps.build_train_step(
        rule, setup.loss_fn, setup.mesh, state, config.data.batch_size, augment
      )
      lowered = program.lower(state, setup.train_images, setup.train_labels, empty_tick)
      self.train_step = compile_program(lowered, setup.platform)

  def step(self):
    tick = self.clock.next_tick()
    if self.streamer is None:
      images, labels = self.setup.train_images, self.setup.train_labels
    else:
      images, labels = self.streamer.batches(self.host_steps)
      self.host_steps = self.host_steps + tick.local
    self.state, step_metrics = self.train_step(
      self.state, images, labels, self.rule.tick_inputs(tick)
    )
    self.totals.add(tick)
    # The workers whose step gave the recorded run no values (a replay's).
    return step_metrics, tick.unvalued or None

  def save(self, divergence):
    # One model: a state that is not finite stops the run from the checkpointer
    # itself (TrainingDiverged), in the pass that computes its fingerprint.
    del divergence
    self.setup.checkpointer.save(self.state, self.clock.state_dict(), self.setup.config)

  def close(self):
    if self.streamer is not None:
      self.streamer.close()
    super().close()


class SimulatedRuntime(RuleRuntime):
  """Every rule, its workers in the ticks of the timing model or of a replayed trace."""

  name = "simulated"
  spans_processes = True
  streams = True
  declares = (REPLAY,)

  @classmethod
  def check(cls, config: ml_collections.ConfigDict) -> None:
    """A replay replays a parameter-server rule's order of requests: the rule must have
    one, and the trace must be one of this configuration."""
    replay = config.cluster.replay
    if replay:
      server_rules = ", ".join(parameter_server_rules())
      require(
        RULES[config.algorithm].parameter_server(),
        REPLAY.path,
        replay,
        f"replays a parameter-server rule's order of requests ({server_rules}); "
        f"{config.algorithm} has none (a synchronous rule's rounds replay under "
        "runtime=threads)",
      )
      trace.check_replay(config)

  def trainee(self, state, clock_state, resumed_at) -> SimulatedTrainee:
    config = self.setup.config
    if config.cluster.replay:
      replayed = trace.check_replay(config)
      # A runtime=ray trace in which worker processes joined or left: the tick
      # program serves their RESETs too.
      resets = (kind == ticks.OpKind.RESET for tick in replayed for kind, _ in tick.ops)
      self.rule.resets = any(resets)
      clock = replay_clock.ReplayClock(
        replayed,
        self.cluster,
        self.model_bytes,
        config.seed,
        self.sent_bytes,
        groups=trace.server_groups(config),
      )
    else:
      clock = self.rule.make_clock(self.cluster, self.model_bytes, config.seed, self.sent_bytes)
    if clock_state is not None:
      clock.load_state_dict(clock_state)
    return SimulatedTrainee(self.setup, self.rule, state, clock, resumed_at=resumed_at)
