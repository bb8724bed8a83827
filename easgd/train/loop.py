"""The training loop that every runtime shares: the run from step to step.

The loop knows no algorithm and no runtime. A runtime
(easgd.train.runtimes) hands `run` a `Trainee`: the few things only it
knows. `run` owns the schedule of logs, evaluations and checkpoints
(`Schedule`, which a runtime may ask where the loop stops next), the bounded
lag of metric fetches, throughput timing, the progress line, preemption, the
divergence policy and clean-up.

Divergence policy (one for every runtime): a model whose training loss stops
being finite is reported with its step; when every model of the run has
(the rules train one, the pipeline M), the run stops with TrainingDiverged
(train.py exits 1) and its last checkpoint is kept.
"""

import collections
import dataclasses
import time
from typing import Any, Protocol

import ml_collections
import numpy as np
from absl import logging

from easgd.durations import duration
from easgd.errors import TrainingDiverged
from easgd.infra import preemption, profiler, sharding, watchdog

# Programs queued without waiting for a result. More than about 32 queued
# programs with collectives deadlock XLA's CPU runtime on several devices.
MAX_IN_FLIGHT = 8

# The values the progress line shows, as (tag, label); the rest is in TensorBoard.
PROGRESS_VALUES = (
  ("train/loss", "loss"),
  ("train/accuracy", "accuracy"),
  ("eval/center_accuracy", "center accuracy"),
)


@dataclasses.dataclass
class TrainResult:
  """The state at the end, the last logged metrics, and whether the run stopped
  before run.total_steps (it then checkpointed): `preempted`, and `noticed` if a
  preemption notice (SIGTERM) stopped it, not the step it was asked to stop after."""

  state: Any
  metrics: dict[str, float]
  preempted: bool = False
  noticed: bool = False


@dataclasses.dataclass(frozen=True)
class Schedule:
  """When the loop logs, evaluates and checkpoints (config.run): every `*_every`
  steps (0: never) and at the last step."""

  total_steps: int
  log_every: int
  eval_every: int
  checkpoint_every: int

  @classmethod
  def from_config(cls, run: ml_collections.ConfigDict) -> "Schedule":
    return cls(run.total_steps, run.log_every, run.eval_every, run.checkpoint_every)

  def _due(self, step: int, every: int) -> bool:
    return step == self.total_steps or (every > 0 and step % every == 0)

  def logs(self, step: int) -> bool:
    return self._due(step, self.log_every)

  def evaluates(self, step: int) -> bool:
    return self._due(step, self.eval_every)

  def saves(self, step: int) -> bool:
    return self._due(step, self.checkpoint_every)

  def stops_at(self, step: int) -> bool:
    """Whether the loop stops for its results after `step`: it logs, evaluates or saves."""
    return self.logs(step) or self.evaluates(step) or self.saves(step)

  def next_stop(self, step: int) -> int:
    """The first step >= `step` at which the loop stops (`stops_at`)."""
    everies = (self.log_every, self.eval_every, self.checkpoint_every)
    return min([self.total_steps] + [-(-step // every) * every for every in everies if every > 0])


class Trainee(Protocol):
  """What a trainer tells the loop; everything else is the loop's."""

  num_models: int  # models whose divergence the loop watches (the rules: 1)
  state: Any  # the training state on the devices; a profile window waits for it

  def step(self) -> tuple[Any, Any]:
    """Runs one training step; returns its metrics on the devices (fetched later)
    and any host value they must be read with (e.g. which model is in which slot)."""

  def add(self, metrics: dict, context: Any) -> np.ndarray:
    """Adds one step's fetched metrics to the means being logged; returns each
    model's training loss [num_models]."""

  def log(self, step: int, train_seconds: float) -> dict[str, float]:
    """Writes the training scalars since the last log; returns them."""

  def evaluate(self, step: int) -> dict[str, float]:
    """Writes and returns the evaluation scalars."""

  def stop_at(self, step: int) -> tuple[int, Any]:
    """Where a run preempted after the loop's `step` stops: (the step, the metrics of
    the steps its workers took past `step` to reach it, for `add`; None if none).
    A runtime whose workers run ahead of the loop (threads, ray) stops them at the
    first consistent cut they can reach, which may lie past `step`, up to the next
    scheduled log, evaluation or checkpoint; the loop then logs and evaluates as a
    run that reached that step does, and saves it."""

  def save(self, divergence: "Divergence") -> None:
    """Checkpoints the state. A trainer whose state may hold a diverged model (the
    pipeline) reports each model it finds not finite to `divergence`."""

  def write_config(self) -> None:
    """At the start of a new run (not a resumed one): writes its config to TensorBoard."""

  def finish(self) -> None:
    """At the end of a run that was not preempted: writes its HParams summary."""

  def flush(self) -> None: ...

  def close(self) -> None: ...


class Divergence:
  """The divergence policy: report each model once; stop when all have diverged."""

  def __init__(self, num_models: int):
    self.num_models = num_models
    self.diverged: dict[int, str] = {}  # model -> what stopped being finite, and when

  def check(self, step: int, losses: np.ndarray) -> None:
    """Each model's training loss of `step`."""
    for model in np.flatnonzero(~np.isfinite(np.asarray(losses))):
      self._report(int(model), step, f"training loss became {losses[model]} at step {step}")
    self._stop_if_all(step)

  def check_state(self, step: int, models) -> None:
    """Models whose state is not finite after `step`, though their loss still was."""
    for model in models:
      self._report(int(model), step, f"the state after step {step} is not finite; it was not saved")
    self._stop_if_all(step)

  def _report(self, model: int, step: int, what: str) -> None:
    if model in self.diverged:
      return
    self.diverged[model] = what
    if self.num_models > 1:
      logging.warning("model %d diverged at step %d: %s", model, step, what)

  def _stop_if_all(self, step: int) -> None:
    if len(self.diverged) == self.num_models:
      if self.num_models == 1:
        raise TrainingDiverged(self.diverged[0])
      raise TrainingDiverged(
        f"every model's training loss or state stopped being finite by step {step}"
      )


class Progress:
  """The progress line: the step out of the total, its percentage, images/s, the time
  left at the pace of this process's run so far, and the values a user watches first
  (PROGRESS_VALUES; a mean over the models when there are several)."""

  def __init__(self, start: int, total: int):
    self.start, self.total = start, total
    self.started = time.perf_counter()

  def report(self, step: int, values: dict[str, float]) -> None:
    parts = [f"step {step}/{self.total} ({100 * step / max(self.total, 1):.0f}%)"]
    for tag, label in PROGRESS_VALUES:
      found = _per_model(values, tag)
      if found:
        parts.append(f"{label} {np.mean(found):.4g}")
    rate = _per_model(values, "train/images_per_sec")
    if rate:
      parts.append(f"{np.mean(rate):,.0f} images/s")
    elapsed = time.perf_counter() - self.started
    if step > self.start and step < self.total:
      left = elapsed / (step - self.start) * (self.total - step)
      parts.append(f"{duration(left)} left")
    logging.info(", ".join(parts))


def _per_model(values: dict[str, float], tag: str) -> list[float]:
  """The values of `tag`: the run's own, or each model's (model_<m>/tag)."""
  return [value for key, value in values.items() if key == tag or key.endswith("/" + tag)]


def run(
  config: ml_collections.ConfigDict,
  trainee: Trainee,
  start: int,
  checkpointer,
  watch: preemption.PreemptionWatch | None = None,
) -> tuple:
  """Trains from step `start` to run.total_steps; returns (final scalars, preempted).
  `watch`: what stops the run early (a preemption notice, a step it was asked to
  stop after); by default a SIGTERM."""
  schedule = Schedule.from_config(config.run)
  total = schedule.total_steps
  pending: collections.deque = collections.deque()
  divergence = Divergence(trainee.num_models)
  window = profiler.Window(config.run.profile, total, start)  # run.profile; off for ""
  progress = Progress(start, total)

  def consume(count: int) -> None:
    taken = [pending.popleft() for _ in range(count)]
    fetched = sharding.fetch([metrics for _, metrics, _ in taken])
    for (step, _, context), metrics in zip(taken, fetched, strict=True):
      divergence.check(step, trainee.add(metrics, context))

  step = start
  # Every phase below is watched: one that hangs stops the process (easgd.infra.watchdog).
  dog = watchdog.Watchdog(watchdog.configured_timeout()).start()
  watch = watch or preemption.PreemptionWatch()
  # Asked to stop where it already is: nothing to train, nothing to save.
  preempted, evaluated = watch.reached(step) and step < total, False
  final: dict[str, float] = {}
  # Throughput counts training time only: evaluation and saving are left out.
  resumed_at, train_seconds = time.perf_counter(), 0.0
  try:
    while step < total and not preempted:
      if window.opens(step):
        with dog.phase("profile start", step):
          window.start(trainee.state, checkpointer.workdir, step)
      with dog.phase("training step", step + 1):
        metrics, context = trainee.step()
        step += 1
        pending.append((step, metrics, context))
        if len(pending) > MAX_IN_FLIGHT:
          consume(1)
        # Every process answers here (multi-process: a collective agreement).
        preempted = watch.should_stop(step)
        if preempted:
          stop, taken = trainee.stop_at(step)
          if taken is not None:
            pending.append((stop, taken, None))
          step = stop
          # A cut at the end is the end: the run finishes as one never stopped.
          preempted = step < total
      if window.closes(step):
        with dog.phase("profile stop", step):
          window.stop(trainee.state, step)
      log_now = schedule.logs(step)
      eval_now = schedule.evaluates(step)
      save_now = preempted or schedule.saves(step)
      if not (log_now or eval_now or save_now):
        continue
      # Waiting for the steps' results: where a step's execution (and a hung
      # collective) is seen, as dispatching them returns at once.
      with dog.phase("step results", step):
        consume(len(pending))
      train_seconds += time.perf_counter() - resumed_at
      now: dict[str, float] = {}  # this step's values, for the progress line
      if log_now:
        with dog.phase("log", step):
          now.update(trainee.log(step, train_seconds))
        train_seconds = 0.0
      if eval_now:
        with dog.phase("evaluation", step):
          now.update(trainee.evaluate(step))
        evaluated = True
      if now:
        final.update(now)
        progress.report(step, now)
      # Every point logged so far is on disk before the checkpoint that covers
      # it is committed: a run killed after the checkpoint loses no history.
      with dog.phase("event write", step):
        trainee.flush()
      if save_now:
        with dog.phase("checkpoint", step):
          trainee.save(divergence)
      if preempted:
        break
      resumed_at = time.perf_counter()
    if not preempted:  # a stopped run is not over: no final evaluation or HParams yet
      if not evaluated:
        # Resumed at or past total_steps: report the state as it is.
        with dog.phase("evaluation", step):
          final.update(trainee.evaluate(step))
      with dog.phase("event write", step):
        trainee.finish()
  except TrainingDiverged as error:
    last = checkpointer.latest_step()
    kept = f"the checkpoint of step {last} is kept" if last is not None else "no checkpoint"
    raise TrainingDiverged(f"{error}; stopped, {kept}") from None
  finally:
    window.close(step)  # a run that ended inside the window: no trace is left open
    dog.close()
    watch.close()
    checkpointer.close()
    trainee.close()
  return final, preempted
