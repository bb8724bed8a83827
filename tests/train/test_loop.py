"""The one training loop, with a scripted trainee: schedule, lag, divergence, preemption."""

import re

import numpy as np
import pytest

from easgd.errors import TrainingDiverged
from easgd.train import loop
from runs import config_with


class ScriptedTrainee:
  """Returns scripted per-model losses and records what the loop asks of it."""

  def __init__(self, losses, num_models=1):
    self.losses = [np.asarray(loss, float).reshape(num_models) for loss in losses]
    self.num_models = num_models
    self.calls: list[tuple] = []
    self.stepped = 0
    self.added: list[int] = []

  def step(self):
    self.stepped += 1
    return {"loss": self.losses[self.stepped - 1]}, self.stepped

  def add(self, metrics, context):
    self.added.append(context)
    return metrics["loss"]

  def log(self, step, train_seconds):
    assert train_seconds > 0
    self.calls.append(("log", step, list(self.added)))
    return {"train/loss": 0.0}

  def evaluate(self, step):
    self.calls.append(("eval", step))
    return {"eval/center_accuracy": 1.0}

  def stop_at(self, step):
    return step, None

  def save(self, divergence):
    del divergence
    self.calls.append(("save", self.stepped))

  def finish(self):
    self.calls.append(("finish",))

  def flush(self):
    pass

  def close(self):
    self.calls.append(("close",))


class NoCheckpoints:
  def latest_step(self):
    return None

  def close(self):
    pass


def schedule(total, log, evaluate, save):
  return config_with(
    {
      "run.total_steps": total,
      "run.log_every": log,
      "run.eval_every": evaluate,
      "run.checkpoint_every": save,
    }
  )


def test_logs_evaluations_and_checkpoints_fall_on_their_steps_with_every_metric_added():
  trainee = ScriptedTrainee([1.0] * 12)
  final, preempted = loop.run(schedule(12, 4, 6, 5), trainee, 0, NoCheckpoints())
  assert not preempted and final == {"train/loss": 0.0, "eval/center_accuracy": 1.0}
  events = [call[:2] for call in trainee.calls]
  assert events == [
    ("log", 4),
    ("save", 5),
    ("eval", 6),
    ("log", 8),
    ("save", 10),
    ("log", 12),
    ("eval", 12),
    ("save", 12),
    ("finish",),
    ("close",),
  ]
  # Every step's metrics were added, in order, before the log that covers them.
  logs = {call[1]: call[2] for call in trainee.calls if call[0] == "log"}
  assert logs[4] == [1, 2, 3, 4] and logs[12] == list(range(1, 13))


class Preempted:
  """A PreemptionWatch whose notice comes after step `at`."""

  def __init__(self, at):
    self.at = at

  def __call__(self):
    return self

  def should_stop(self, step):
    return step >= self.at

  def reached(self, step):  # no step to stop after was asked for (--stop_after)
    del step
    return False

  def close(self):
    pass


class RunsAhead(ScriptedTrainee):
  """Workers ahead of the loop: a preemption stops them at the cut of step `cut`,
  with the steps taken past the loop's."""

  def __init__(self, losses, cut):
    super().__init__(losses)
    self.cut = cut

  def stop_at(self, step):
    past = self.cut - step
    self.stepped += past
    return self.cut, {"loss": np.ones(1) * past}


def test_a_preempted_run_stops_at_its_runtimes_cut_and_logs_it_as_a_scheduled_step(monkeypatch):
  """A preemption after step 5 whose cut the workers reach at step 8, a log and
  evaluation step: logged, evaluated and saved at 8, as a run that never stopped
  logs it; the steps taken to reach it are added before the log."""
  monkeypatch.setattr(loop.preemption, "PreemptionWatch", Preempted(5))
  trainee = RunsAhead([1.0] * 12, cut=8)
  _, preempted = loop.run(schedule(12, 4, 8, 0), trainee, 0, NoCheckpoints())
  assert preempted
  assert [call[:2] for call in trainee.calls] == [
    ("log", 4),
    ("log", 8),
    ("eval", 8),
    ("save", 8),
    ("close",),
  ]
  assert trainee.calls[1][2] == [1, 2, 3, 4, 5, None]  # the cut's steps, added before the log


def test_a_preemption_whose_cut_is_the_last_step_finishes_the_run(monkeypatch):
  monkeypatch.setattr(loop.preemption, "PreemptionWatch", Preempted(10))
  trainee = RunsAhead([1.0] * 12, cut=12)
  _, preempted = loop.run(schedule(12, 4, 0, 0), trainee, 0, NoCheckpoints())
  assert not preempted
  assert [call[:2] for call in trainee.calls][-5:] == [
    ("log", 12),
    ("eval", 12),
    ("save", 12),
    ("finish",),
    ("close",),
  ]


def test_resumed_at_the_end_still_evaluates_and_finishes():
  trainee = ScriptedTrainee([])
  final, _ = loop.run(schedule(5, 1, 1, 1), trainee, 5, NoCheckpoints())
  assert trainee.calls == [("eval", 5), ("finish",), ("close",)]
  assert final == {"eval/center_accuracy": 1.0}


def test_one_model_diverging_stops_the_run_with_its_step():
  trainee = ScriptedTrainee([1.0, 1.0, np.nan, 1.0, 1.0])
  with pytest.raises(TrainingDiverged, match=r"became nan at step 3; stopped, no checkpoint"):
    loop.run(schedule(5, 0, 0, 0), trainee, 0, NoCheckpoints())
  assert ("close",) in trainee.calls and ("finish",) not in trainee.calls


def test_several_models_stop_only_when_every_one_has_diverged(caplog):
  some = ScriptedTrainee([[1.0, 1.0], [np.inf, 1.0], [np.nan, 1.0], [np.nan, 2.0]], num_models=2)
  loop.run(schedule(4, 0, 0, 0), some, 0, NoCheckpoints())
  assert ("finish",) in some.calls
  assert "model 0 diverged at step 2: training loss became inf at step 2" in caplog.text
  every = ScriptedTrainee([[1.0, 1.0], [np.inf, 1.0], [np.nan, np.nan], [1.0, 1.0]], num_models=2)
  with pytest.raises(TrainingDiverged, match=r"every model's training loss .* by step 3"):
    loop.run(schedule(4, 0, 0, 0), every, 0, NoCheckpoints())


def test_metrics_are_fetched_with_a_bounded_lag():
  trainee = ScriptedTrainee([1.0] * 40)
  lags = []
  original_step = trainee.step

  def step():
    lags.append(trainee.stepped - len(trainee.added))
    return original_step()

  trainee.step = step
  loop.run(schedule(40, 0, 0, 0), trainee, 0, NoCheckpoints())
  assert max(lags) == loop.MAX_IN_FLIGHT and len(trainee.added) == 40


def test_a_state_refused_at_a_checkpoint_stops_the_run_and_keeps_the_one_before():
  class RefusesStep4(ScriptedTrainee):
    def save(self, divergence):
      if self.stepped == 4:
        raise TrainingDiverged("the state after step 4 is not finite (first in state.center)")
      super().save(divergence)

  class Kept(NoCheckpoints):
    def latest_step(self):
      return 2

  trainee = RefusesStep4([1.0] * 6)
  kept = r"after step 4 is not finite .*; stopped, the checkpoint of step 2 is kept"
  with pytest.raises(TrainingDiverged, match=kept):
    loop.run(schedule(6, 0, 0, 2), trainee, 0, Kept())
  assert ("save", 2) in trainee.calls and ("close",) in trainee.calls


def test_a_state_found_not_finite_counts_as_its_model_diverging(caplog):
  class StateBreaks(ScriptedTrainee):
    def save(self, divergence):
      divergence.check_state(self.stepped, [1] if self.stepped == 2 else [0, 1])
      super().save(divergence)

  trainee = StateBreaks([[1.0, 1.0]] * 4, num_models=2)
  every = r"every model's training loss or state stopped being finite by step 4"
  with pytest.raises(TrainingDiverged, match=every):
    loop.run(schedule(4, 0, 0, 2), trainee, 0, NoCheckpoints())
  assert "model 1 diverged at step 2: the state after step 2 is not finite" in caplog.text
  assert ("save", 2) in trainee.calls and ("save", 4) not in trainee.calls
  alone = loop.Divergence(1)
  with pytest.raises(TrainingDiverged, match=r"^the state after step 20 is not finite; it was not"):
    alone.check_state(20, [0])


@pytest.mark.parametrize(
  ("total", "log", "evaluate", "save"), [(12, 4, 6, 5), (10, 0, 3, 0), (7, 7, 0, 2), (5, 0, 0, 0)]
)
def test_the_schedule_stops_where_the_loop_logs_evaluates_or_saves(total, log, evaluate, save):
  """What the threads runtime asks the schedule (its next cut) agrees with the loop's
  own stops, step by step."""
  trainee = ScriptedTrainee([1.0] * total)
  loop.run(schedule(total, log, evaluate, save), trainee, 0, NoCheckpoints())
  stops = sorted({call[1] for call in trainee.calls if call[0] in ("log", "eval", "save")})
  plan = loop.Schedule(total, log, evaluate, save)
  assert [step for step in range(1, total + 1) if plan.stops_at(step)] == stops
  for step in range(1, total + 1):
    assert plan.next_stop(step) == min(stop for stop in stops if stop >= step)


def test_the_progress_line_says_the_step_the_share_the_speed_and_the_time_left(caplog):
  caplog.set_level("INFO")
  progress = loop.Progress(start=0, total=400)
  progress.report(
    100,
    {
      "train/loss": 0.123456,
      "train/accuracy": 0.98765,
      "train/images_per_sec": 12345.6,
      "eval/center_accuracy": 0.95,
      "sim/time": 3.0,
    },
  )
  line = caplog.records[-1].getMessage()
  assert re.fullmatch(
    r"step 100/400 \(25%\), loss 0\.1235, accuracy 0\.9877, center accuracy 0\.95, "
    r"12,346 images/s, \d+ s left",
    line,
  ), line
  # Several models: each value is their mean.
  progress.report(400, {"model_0/train/loss": 1.0, "model_1/train/loss": 2.0})
  assert caplog.records[-1].getMessage() == "step 400/400 (100%), loss 1.5"
