"""The training means every runtime of the rules logs: over the local steps the
workers took since the last log, each step counted once, whatever the runtime
(a threads or ray run hands its steps one by one, the tick program a tick's at
once) and whatever the order of the additions."""

import json
import types

import numpy as np
import pytest

import numpy_optim
from easgd import assembly
from easgd.train.runtimes.rule_runtime import RuleReports, mean_learning_rate
from easgd.train.runtimes.threads.live_clock import LiveClock
from runs import config_with

ETA, WARMUP, TOTAL = 0.1, 4, 20


def _rule(algorithm="async_easgd", workers=2):
  config = config_with(
    {
      "optimizer.learning_rate": ETA,
      "optimizer.schedule": "warmup_cosine",
      "optimizer.warmup_steps": WARMUP,
      "run.total_steps": TOTAL,
    },
    algorithm=algorithm,
    workers=workers,
  )
  return config, assembly.rule(config)


def _reports(tmp_path, algorithm="async_easgd", workers=2):
  config, rule = _rule(algorithm, workers)
  clock = LiveClock(workers)
  setup = types.SimpleNamespace(workdir=str(tmp_path), config=config)
  return RuleReports(setup, rule, clock, resumed_at=None), clock


def test_the_rate_is_the_mean_over_the_steps_taken_of_the_rate_each_took():
  _, rule = _rule(workers=3)
  rate = numpy_optim.warmup_cosine(ETA, WARMUP, TOTAL)
  start, end = np.array([0, 3, 7]), np.array([5, 3, 12])  # worker 1 took none
  taken = [*range(0, 5), *range(7, 12)]
  expected = np.mean([rate(t) for t in taken])
  assert mean_learning_rate(rule, start, end) == pytest.approx(expected, rel=1e-6)
  assert mean_learning_rate(rule, end, end) is None


def test_a_tick_of_a_parameter_server_rule_counts_only_the_workers_that_stepped(tmp_path):
  reports, clock = _reports(tmp_path)
  # Tick 1: both workers step; tick 2: worker 0 alone (worker 1's value is not a step's).
  reports.add({"loss": [1.0, 3.0], "accuracy": [0.5, 1.0], "stepping": [1, 1]}, None)
  clock.worker_steps += [1, 1]
  # Worker 1's value is not a step's: even a NaN there is no divergence.
  nan = float("nan")
  losses = reports.add({"loss": [5.0, nan], "accuracy": [0.0, nan], "stepping": [1, 0]}, None)
  clock.worker_steps += [1, 0]
  assert np.isfinite(losses).all()
  logged = reports.log(2, train_seconds=1.0)
  # (1 + 3 + 5) / 3 over the three steps, not (2 + 5) / 2 over the two ticks.
  assert logged["train/loss"] == 3.0
  assert logged["train/accuracy"] == pytest.approx(0.5)
  rate = numpy_optim.warmup_cosine(ETA, WARMUP, TOTAL)
  assert logged["train/learning_rate"] == pytest.approx((rate(0) + rate(1) + rate(0)) / 3)
  assert logged["cluster/live_workers"] == 2.0
  # The next window starts where this one ended.
  reports.add({"loss": [2.0, 4.0], "accuracy": [1.0, 1.0], "stepping": [0, 1]}, None)
  clock.worker_steps += [0, 1]
  logged = reports.log(3, train_seconds=1.0)
  assert logged["train/loss"] == 4.0
  assert logged["train/learning_rate"] == pytest.approx(rate(1))
  reports.close()


def test_a_replayed_step_that_gave_the_run_no_values_is_left_out_of_the_means(tmp_path):
  reports, clock = _reports(tmp_path)
  # Worker 1's step gave the recorded run no values (its process died computing it):
  # the tick's context names it, and the means are worker 0's alone.
  losses = reports.add(
    {"loss": [1.0, float("nan")], "accuracy": [0.5, 0.0], "stepping": [1, 1]}, [1]
  )
  clock.worker_steps += [1, 1]
  assert np.isfinite(losses).all()
  logged = reports.log(1, train_seconds=1.0)
  assert logged["train/loss"] == 1.0 and logged["train/accuracy"] == 0.5
  reports.close()


def test_the_same_steps_give_the_same_bits_one_by_one_or_a_tick_at_a_time(tmp_path):
  """A run hands each step's values as they commit; its replay a tick's at once,
  in another order: the means are the same bits."""
  values = np.random.default_rng(0).uniform(1e-3, 3.0, (50, 2)).astype(np.float32)
  accuracies = np.random.default_rng(1).integers(0, 33, (50, 2)) / 32
  ticks, one_by_one = _reports(tmp_path / "ticks"), _reports(tmp_path / "steps")
  for _, clock in (ticks, one_by_one):
    clock.worker_steps += [50, 50]
  for tick in range(50):
    ticks[0].add({"loss": values[tick], "accuracy": accuracies[tick], "stepping": [1, 1]}, None)
  # Worker 1's steps first, then worker 0's backwards: another order of the additions.
  for j, order in ((1, range(50)), (0, reversed(range(50)))):
    for tick in order:
      one_by_one[0].add_local_steps([float(values[tick, j])], [float(accuracies[tick, j])])
  a, b = ticks[0].log(50, 1.0), one_by_one[0].log(50, 1.0)
  for tag in ("train/loss", "train/accuracy", "train/learning_rate"):
    assert a[tag] == b[tag], tag
  for reports, _ in (ticks, one_by_one):
    reports.close()


def test_a_stepping_workers_nan_loss_is_reported_not_finite(tmp_path):
  reports, _ = _reports(tmp_path)
  losses = reports.add({"loss": [1.0, np.nan], "accuracy": [1.0, 0.0], "stepping": [1, 1]}, None)
  assert not np.isfinite(losses).all()
  reports.close()


def test_a_window_saved_between_two_logs_is_continued_by_a_resumed_run(tmp_path):
  """The window goes with the clock's state into a checkpoint: a run stopped
  between two logs and resumed logs what it would have without stopping."""
  values = np.random.default_rng(2).uniform(0.01, 3.0, (9, 2))
  accuracy = [0.5, 0.5]
  straight, clock = _reports(tmp_path / "straight")
  for tick in range(9):
    straight.add({"loss": values[tick], "accuracy": accuracy, "stepping": [1, 1]}, None)
    clock.worker_steps += [1, 1]
  expected = straight.log(9, 1.0)

  stopped, clock = _reports(tmp_path / "stopped")
  for tick in range(5):
    stopped.add({"loss": values[tick], "accuracy": accuracy, "stepping": [1, 1]}, None)
    clock.worker_steps += [1, 1]
  saved = json.loads(json.dumps(clock.state_dict()))  # as the checkpoint writes it
  resumed, clock = _reports(tmp_path / "resumed")
  clock.load_state_dict(saved)
  for tick in range(5, 9):
    resumed.add({"loss": values[tick], "accuracy": accuracy, "stepping": [1, 1]}, None)
    clock.worker_steps += [1, 1]
  logged = resumed.log(9, 1.0)
  for tag in ("train/loss", "train/accuracy", "train/learning_rate"):
    assert logged[tag] == expected[tag], tag
  for reports in (straight, stopped, resumed):
    reports.close()


def test_a_window_without_a_local_step_logs_no_training_means(tmp_path):
  reports, _ = _reports(tmp_path)
  logged = reports.log(1, train_seconds=1.0)
  assert not any(tag in logged for tag in ("train/loss", "train/learning_rate"))
  assert logged["train/images_per_sec"] == 0.0
  reports.close()


def test_a_synchronous_rule_averages_its_ticks_means(tmp_path):
  reports, _ = _reports(tmp_path, algorithm="sync_easgd")
  for loss in (1.0, 2.0, 6.0):
    reports.add({"loss": loss, "accuracy": 0.5, "learning_rate": ETA}, None)
  logged = reports.log(3, train_seconds=1.0)
  assert logged["train/loss"] == 3.0 and logged["train/learning_rate"] == pytest.approx(ETA)
  reports.close()
