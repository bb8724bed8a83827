"""train_and_evaluate: the whole run, from configuration to final accuracy.

For the rules, the loop (easgd.loop) is handed `RuleTrainee`: it asks the
rule's clock (the timing model, or a replayed trace) for the next tick, runs
the rule's compiled step on it, and asks the rule which parameters its
workers hold; it knows no rule by name. Under config.runtime=threads it is
handed easgd.runtime.threads.ThreadsTrainee instead, whose workers run for
real. The pipeline has its own trainee (easgd.pipeline.trainer).
"""

import json

import jax
import ml_collections
import numpy as np
from absl import logging

from easgd import loop, runtime, schema, steps
from easgd.data import augment as augment_lib
from easgd.data import stream
from easgd.infra import sharding
from easgd.infra.compile import compile_program
from easgd.reports import RuleReports
from easgd.rules import Hyper, Rule, TrainState, exchange, make_rule
from easgd.runtime import threads, trace
from easgd.sim import clocks, ticks, timing

TrainResult = loop.TrainResult


class RuleTrainee(RuleReports):
  """A rule's part of the loop under the simulated runtime: its state, clock,
  compiled step and reports."""

  def __init__(
    self,
    setup: loop.Setup,
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
    return step_metrics, None

  def save(self, divergence):
    # One model: a state that is not finite stops the run from the checkpointer
    # itself (TrainingDiverged), in the pass that computes its fingerprint.
    del divergence
    self.setup.checkpointer.save(self.state, self.clock.state_dict(), self.setup.config)

  def close(self):
    if self.streamer is not None:
      self.streamer.close()
    super().close()


def train_and_evaluate(config: ml_collections.ConfigDict, workdir: str) -> TrainResult:
  """Trains `config` in `workdir`, resuming from its newest checkpoint."""
  if config.algorithm == schema.PIPELINE:
    from easgd.pipeline import trainer as pipeline_trainer  # noqa: PLC0415 (one or the other)

    return pipeline_trainer.train_and_evaluate(config, workdir)
  setup = loop.setup(config, workdir)
  setup.log_run(f"{config.algorithm}: {config.workers} workers")
  rng = jax.random.PRNGKey(config.seed)
  init_rng, run_rng = jax.random.split(rng)
  params = jax.jit(setup.init_params)(init_rng)
  rule = make_rule(config.algorithm, Hyper.from_config(config))
  state = steps.init_state(rule, params, run_rng, setup.mesh)
  cluster = timing.Cluster.from_config(config.cluster)
  # Every exchange is sized as it is sent (easgd.rules.exchange.sizes).
  model_bytes, sent_bytes = exchange.sizes(
    params, config.outer.exchange_dtype, rule.hyper.average_stats
  )
  checkpointer = setup.checkpointer
  resumed = clock_state = None
  if checkpointer.latest_step() is not None:
    resumed, state, clock_state = checkpointer.restore(state)
    logging.info("resumed from the checkpoint of step %d", resumed)
  if config.runtime == runtime.THREADS:
    trainee = threads.ThreadsTrainee(setup, rule, state, cluster, sent_bytes, clock_state, resumed)
  else:
    if config.cluster.replay:
      ticks = trace.check_replay(config)
      clock = trace.ReplayClock(ticks, cluster, model_bytes, config.seed, sent_bytes)
    else:
      clock = rule.make_clock(cluster, model_bytes, config.seed, sent_bytes)
    if clock_state is not None:
      clock.load_state_dict(clock_state)
    trainee = RuleTrainee(setup, rule, state, clock, resumed_at=resumed)
  if resumed is None:
    trainee.writer.text("config", "```\n" + json.dumps(config.to_dict(), indent=2) + "\n```")
  final, preempted = loop.run(config, trainee, int(jax.device_get(state.step)), checkpointer)
  return TrainResult(state=trainee.state, metrics=final, preempted=preempted)
