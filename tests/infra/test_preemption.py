"""SIGTERM (a scheduler's preemption notice): checkpoint after the current step, stop, resume."""

import os
import signal

import numpy as np
import pytest

from easgd.infra import metrics
from easgd.train import trainer
from runs import read_state, small_config, small_flags, steps_saved, train

# Whole runs, train.py or several processes: left out of the quick loop (-m 'not e2e').
pytestmark = pytest.mark.e2e


def _sigterm_at_first_log(monkeypatch):
  """Sends this process SIGTERM when step 10 is logged."""
  scalars = metrics.MetricWriter.scalars

  def scalars_then_sigterm(self, step, values):
    scalars(self, step, values)
    if step == 10:
      os.kill(os.getpid(), signal.SIGTERM)

  monkeypatch.setattr(metrics.MetricWriter, "scalars", scalars_then_sigterm)


# hogwild_easgd resumes the timing model's simulation too (its event queue, its
# half-filled ticks and its requests in flight); the pipeline its models' slots.
@pytest.mark.parametrize("algorithm", ["sync_easgd", "hogwild_easgd", "pipeline"])
def test_preempted_run_resumes_bitwise(tmp_path, monkeypatch, small_run, algorithm):
  train_and_evaluate = trainer.train_and_evaluate
  config = small_config(algorithm=algorithm)

  # The process's own handler: the default, or one an earlier Ray (ray.init) left.
  own = signal.getsignal(signal.SIGTERM)
  with monkeypatch.context() as patch:
    _sigterm_at_first_log(patch)
    stopped = train_and_evaluate(config, str(tmp_path / "preempted"))
  assert stopped.preempted
  stop = steps_saved(tmp_path / "preempted")[-1]
  assert 10 <= stop < config.run.total_steps
  assert not any(tag.startswith("eval/") for tag in stopped.metrics)  # no final evaluation
  # SIGTERM is this process's own again.
  assert signal.getsignal(signal.SIGTERM) is own

  resumed = train_and_evaluate(config, str(tmp_path / "preempted"))
  assert not resumed.preempted
  a = read_state(small_run(algorithm) / "checkpoints" / "40" / "state")
  b = read_state(tmp_path / "preempted" / "checkpoints" / "40" / "state")
  assert len(a) == len(b) > 10
  for x, y in zip(a, b, strict=True):
    assert x.dtype == y.dtype and np.array_equal(x, y)


def test_train_py_exits_0_with_a_checkpoint_on_sigterm(tmp_path):
  run = train(tmp_path, *small_flags({"run.total_steps": 400}, algorithm="hogwild_easgd"))
  run.wait_for(r"step 10/", 120)
  run.popen.send_signal(signal.SIGTERM)
  assert run.wait(120) == 0, run.tail()
  stop = int(run.wait_for(r"stopping after step (\d+)", 1).group(1))
  assert steps_saved(tmp_path) == [10, stop] and stop < 400
  assert "run the same command to resume" in run.output()
