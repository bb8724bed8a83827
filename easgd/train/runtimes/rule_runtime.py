"""What the runtimes of the rules share: the rule and its state at step 0, the
bytes of its exchanges, and the reports (training means, the clock's totals,
simulated by easgd.sim.clocks or measured by the threads runtime, evaluations
and HParams, through easgd.infra.metrics)."""

import json
import math

import jax
import jax.numpy as jnp
import numpy as np

from easgd import assembly, evaluation, steps
from easgd.config import hyperparameters
from easgd.infra import metrics
from easgd.rules import RULES, Hyper, Rule, TrainState, exchange, model_state
from easgd.sim import ticks, timing
from easgd.train import setup as setup_lib
from easgd.train.runtimes.base import Runtime


def parameter_server_rules() -> tuple[str, ...]:
  """The rules whose workers exchange with a master, each at its own pace."""
  return tuple(name for name, rule in RULES.items() if rule.parameter_server())


class RuleRuntime(Runtime):
  """A runtime of the update rules (easgd.rules): one center, config.workers workers."""

  @classmethod
  def algorithms(cls) -> tuple[str, ...]:
    return tuple(RULES)

  @classmethod
  def check_model(cls, config, shapes) -> None:
    RULES[config.algorithm].check_model(Hyper.from_config(config), shapes)

  def __init__(self, setup: setup_lib.Setup):
    super().__init__(setup)
    config = setup.config
    self.rule = assembly.rule(config)
    self.cluster = timing.Cluster.from_config(config.cluster)

  def describe(self) -> str:
    return f"{self.setup.config.algorithm}: {self.setup.config.workers} workers"

  def init_state(self) -> TrainState:
    setup = self.setup
    init_rng, run_rng = jax.random.split(jax.random.PRNGKey(setup.config.seed))
    params = jax.jit(setup.init_params)(init_rng)
    # Every exchange is sized as it is sent (easgd.rules.exchange.sizes).
    self.model_bytes, self.sent_bytes = exchange.sizes(
      params, setup.config.outer.exchange_dtype, self.rule.hyper.average_stats
    )
    return steps.init_state(self.rule, params, run_rng, setup.mesh)


class _TickTotals:
  """What the clock's ticks did since the last log, and the run's totals: on a cluster
  of groups the bytes on each link, and for a rule of several levels the exchange
  rounds of each."""

  def __init__(self, clock, groups: bool = False, levels: int = 1, servers: bool = False):
    self._clock = clock
    self._steps = 0
    self._groups, self._levels, self._servers = groups, levels, servers

  def add(self, tick: ticks.Tick) -> None:
    self.add_steps(int(tick.local.sum()))
    window = self._clock.window
    window.staleness += tick.staleness
    window.waits += tick.waits

  def add_steps(self, count: int) -> None:
    """Counts `count` local steps taken (by a runtime that counts them itself)."""
    self._steps += count

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
      # Fewer than config.workers once a runtime=ray worker process left for good.
      "cluster/live_workers": float(clock.live_workers()),
      "comm/exchanges_per_worker": float(clock.requests.mean()),
      "comm/bytes_per_worker": float(clock.bytes_sent.mean()),
    }
    if self._groups:
      between = float(clock.bytes_between.mean())
      values["comm/bytes_between_groups_per_worker"] = between
      values["comm/bytes_inside_groups_per_worker"] = float(clock.bytes_sent.mean()) - between
    if self._levels > 1:
      counts = clock.level_exchanges + [0] * (self._levels - len(clock.level_exchanges))
      values.update({f"comm/level{k}_exchanges": float(n) for k, n in enumerate(counts)})
    if self._servers:  # two-tier servers: what they sent each other, on each link
      values["comm/server_bytes_inside_groups"] = float(clock.server_bytes[0])
      values["comm/server_bytes_between_groups"] = float(clock.server_bytes[1])
    round_totals = getattr(clock, "round_totals", None)
    if round_totals is not None:  # rounds at a quorum (easgd.sim.rounds)
      values.update(round_totals.scalars())
    peak = clock.peak_bytes_per_step()
    if peak is not None:
      values["comm/peak_bytes_per_step"] = float(peak)
    window = clock.window
    if window.staleness:
      values["async/staleness_mean"] = float(np.mean(window.staleness))
      values["async/queue_wait"] = float(np.mean(window.waits))
    self._steps = 0
    return values


def mean_learning_rate(rule: Rule, start: np.ndarray, end: np.ndarray) -> float | None:
  """The mean, over the local steps each worker j took from its step start_j to
  end_j, of the rate each took (rule.learning_rate of its count before it);
  None when no worker stepped.

  The rates are computed as one vector that depends on (start, end) alone,
  padded to a power of two (one compilation for windows of similar length),
  and added exactly (math.fsum): the same steps give the same bits in every
  runtime.
  """
  taken = np.concatenate([np.arange(a, b) for a, b in zip(start, end, strict=True)])
  if not taken.size:
    return None
  padded = np.full(1 << (taken.size - 1).bit_length(), taken[-1], np.int32)
  padded[: taken.size] = taken
  rates = np.asarray(rule.learning_rate(jnp.asarray(padded)), np.float64)[: taken.size]
  return math.fsum(rates.tolist()) / taken.size


class RuleReports:
  """What every runtime of the rules reports: the training means, the clock's
  totals (simulated or measured), the evaluations and the HParams.

  train/loss, train/accuracy and train/learning_rate are means over the local
  steps that the workers took since the last log, each step counted once (its
  loss and accuracy those of its forward pass, its rate the one its worker's
  step count gives); a runtime=ray step whose process died as it computed it
  has a rate but no loss or accuracy (Tick.unvalued), in the run and its replay.
  A parameter-server rule's workers step at their own pace: its runtimes hand
  each step's values (`add_local_steps`), as runtime=threads does for a
  synchronous rule's rounds (`_paced`), and the clock's
  LogWindow adds them exactly, so that a threads or ray run and the replay of
  its trace, which take the same steps between the same logs, log the same
  bits. The synchronous and outer rules step every worker each tick: the mean
  over a tick's workers is computed on the devices, then averaged over the
  ticks.
  """

  num_models = 1

  def __init__(self, setup: setup_lib.Setup, rule: Rule, clock, resumed_at: int | None):
    self.setup, self.rule, self.clock = setup, rule, clock
    self.writer = metrics.MetricWriter(setup.workdir, resumed_at=resumed_at)
    groups = bool(setup.config.cluster.groups)
    servers = bool(getattr(rule.hyper, "two_tier", False))
    self.totals = _TickTotals(clock, groups, len(rule.levels()), servers)

  def add(self, values, context) -> np.ndarray:
    if self.rule.parameter_server():
      # A tick's values of every worker, and whether each stepped; `context`, the
      # workers whose step gave the replayed run no values (Tick.unvalued).
      stepping = np.asarray(values["stepping"], bool).copy()
      stepping[list(context or ())] = False
      return self.add_local_steps(
        np.asarray(values["loss"])[stepping].tolist(),
        np.asarray(values["accuracy"])[stepping].tolist(),
      )
    self.clock.window.add({tag: float(value) for tag, value in values.items()})
    return np.array([values["loss"]])

  def _paced(self) -> bool:
    """Whether the workers' steps come one by one (`add_local_steps`), each at its
    worker's own count, rather than as the means of ticks that step every worker."""
    return self.rule.parameter_server()

  def add_local_steps(self, losses: list[float], accuracies: list[float]) -> np.ndarray:
    """Local steps' losses and accuracies; returns their sum of losses, which is
    not finite once one of them is not."""
    for loss, accuracy in zip(losses, accuracies, strict=True):
      self.clock.window.add({"loss": loss, "accuracy": accuracy})
    return np.array([sum(losses)])

  def _train_means(self) -> dict[str, float]:
    """The training means since the last log (the class docstring says which);
    none when no step's values came (no worker stepped)."""
    window = self.clock.window
    means = window.means()
    if means and self._paced():
      rate = mean_learning_rate(self.rule, window.start_steps, self.clock.worker_steps)
      if rate is not None:
        means["learning_rate"] = rate
    return {f"train/{tag}": value for tag, value in means.items()}

  def log(self, step, train_seconds):
    train = self._train_means()
    images = self.totals.worker_steps() * self.setup.config.data.batch_size
    train["train/images_per_sec"] = images / train_seconds
    train.update(self.totals.scalars())
    self.writer.scalars(step, train)
    window = self.clock.window
    self.writer.histogram(step, "async/staleness", window.staleness)
    window.restart(self.clock.worker_steps)
    return train

  def stop_at(self, step):
    """A preempted run stops at the loop's step: every worker stepped in it."""
    return step, None

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

  def write_config(self):
    text = json.dumps(self.setup.config.to_dict(), indent=2)
    self.writer.text("config", "```\n" + text + "\n```")

  def finish(self):
    self.writer.hparams(hyperparameters.hparams_of(self.setup.config))

  def flush(self):
    self.writer.flush()

  def close(self):
    self.writer.close()
