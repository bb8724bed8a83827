"""train_and_evaluate: the whole run, from configuration to final accuracy.

For the rules, the loop (easgd.loop) is handed `RuleTrainee`: it asks the
rule's clock (the timing model) for the next tick, runs the rule's compiled
step on it, and asks the rule which parameters its workers hold; it knows no
rule by name. The pipeline has its own trainee (easgd.pipeline.trainer).
"""

import json

import jax
import ml_collections
import numpy as np
from absl import logging

from easgd import evaluation, loop, schema, steps
from easgd.data import augment as augment_lib
from easgd.data import stream
from easgd.infra import metrics, sharding
from easgd.infra.compile import compile_program
from easgd.rules import Hyper, Rule, TrainState, exchange, make_rule, model_state
from easgd.sim import clocks, ticks, timing

TrainResult = loop.TrainResult


class _TickTotals:
  """What the clock's ticks did since the last log, and the run's totals."""

  def __init__(self, clock: clocks.Clock):
    self._clock = clock
    self._steps = 0
    self._staleness: list[int] = []
    self._waits: list[float] = []

  def add(self, tick: ticks.Tick) -> None:
    self._steps += int(tick.local.sum())
    self._staleness += tick.staleness
    self._waits += tick.waits

  def worker_steps(self) -> int:
    """Local steps taken by all workers since the last call to `scalars`."""
    return self._steps

  def scalars(self) -> dict[str, float]:
    clock = self._clock
    values = {
      "sim/time": clock.time,
      "sim/worker_steps_min": float(clock.worker_steps.min()),
      "sim/worker_steps_max": float(clock.worker_steps.max()),
      "sim/worker_steps_mean": float(clock.worker_steps.mean()),
      "comm/exchanges_per_worker": float(clock.requests.mean()),
      "comm/bytes_per_worker": float(clock.bytes_sent.mean()),
    }
    if self._staleness:
      values["async/staleness_mean"] = float(np.mean(self._staleness))
      values["async/queue_wait"] = float(np.mean(self._waits))
    self._steps = 0
    return values

  def staleness(self) -> list[int]:
    staleness, self._staleness, self._waits = self._staleness, [], []
    return staleness


class RuleTrainee:
  """A rule's part of the loop: its state, clock, compiled step and reports."""

  num_models = 1

  def __init__(
    self,
    setup: loop.Setup,
    rule: Rule,
    state: TrainState,
    clock: clocks.Clock,
    resumed_at: int | None = None,
  ):
    config = setup.config
    self.setup, self.rule, self.state, self.clock = setup, rule, state, clock
    self.writer = metrics.MetricWriter(setup.workdir, resumed_at=resumed_at)
    self.totals = _TickTotals(clock)
    self.sums: dict[str, float] = {}
    self.count = 0
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

  def add(self, values, context) -> np.ndarray:
    del context
    for tag, value in values.items():
      self.sums[tag] = self.sums.get(tag, 0.0) + float(value)
    self.count += 1
    return np.array([values["loss"]])

  def log(self, step, train_seconds):
    train = {f"train/{tag}": total / self.count for tag, total in self.sums.items()}
    self.sums, self.count = {}, 0
    images = self.totals.worker_steps() * self.setup.config.data.batch_size
    train["train/images_per_sec"] = images / train_seconds
    train.update(self.totals.scalars())
    self.writer.scalars(step, train)
    self.writer.histogram(step, "async/staleness", self.totals.staleness())
    return train

  def evaluate(self, step):
    state, evaluator = self.state, self.setup.evaluator
    workers = self.rule.worker_params(state)
    if model_state.has_stats(state.center) and not self.rule.hyper.average_stats:
      # The center has no statistics of its own: it is scored with each
      # worker's in turn, and the mean is reported.
      center_models = evaluation.center_with_stats_of(state.center, workers)
      center = float(evaluator.worker_accuracies(center_models).mean())
    else:
      center = evaluator.center_accuracy(state.center)
    values = {
      "eval/center_accuracy": center,
      "eval/worker_accuracy": float(evaluator.worker_accuracies(workers).mean()),
      "eval/consensus_distance": float(evaluation.consensus_distance(workers, state.center)),
    }
    self.writer.scalars(step, values)
    return values

  def save(self, divergence):
    # One model: a state that is not finite stops the run from the checkpointer
    # itself (TrainingDiverged), in the pass that computes its fingerprint.
    del divergence
    self.setup.checkpointer.save(self.state, self.clock.state_dict(), self.setup.config)

  def finish(self):
    self.writer.hparams(schema.hparams_of(self.setup.config))

  def flush(self):
    self.writer.flush()

  def close(self):
    if self.streamer is not None:
      self.streamer.close()
    self.writer.close()


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
  clock = rule.make_clock(cluster, model_bytes, config.seed, sent_bytes)

  checkpointer = setup.checkpointer
  resumed = None
  if checkpointer.latest_step() is not None:
    resumed, state, clock_state = checkpointer.restore(state)
    clock.load_state_dict(clock_state)
    logging.info("resumed from the checkpoint of step %d", resumed)
  trainee = RuleTrainee(setup, rule, state, clock, resumed_at=resumed)
  if resumed is None:
    trainee.writer.text("config", "```\n" + json.dumps(config.to_dict(), indent=2) + "\n```")
  final, preempted = loop.run(config, trainee, int(jax.device_get(state.step)), checkpointer)
  return TrainResult(state=trainee.state, metrics=final, preempted=preempted)
