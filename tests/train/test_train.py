"""End to end: training, TensorBoard, TFDS, the pipeline's resume, bad input, divergence."""

import json
import os
import re
import shutil
import subprocess
import sys

import numpy as np
import orbax.checkpoint as ocp
import pytest
import tensorflow_datasets as tfds
from tensorboard.backend.event_processing import event_accumulator

import runs
from easgd import ownership
from easgd.errors import ConfigError, TrainingDiverged
from easgd.infra import scalars
from easgd.train import trainer
from runs import assert_bfloat16_run_keeps_float32_state, config_with, small_flags

# Whole runs, train.py or several processes: left out of the quick loop (-m 'not e2e').
pytestmark = pytest.mark.e2e

REPO = runs.REPO
TAGS = {
  "train/loss",
  "train/accuracy",
  "train/images_per_sec",
  "train/learning_rate",
  "eval/center_accuracy",
  "eval/worker_accuracy",
  "eval/consensus_distance",
  "comm/bytes_per_worker",
}


def test_default_config_learns_in_120_steps_and_writes_tensorboard(tmp_path):
  # No logging, evaluation or checkpoint before the end: 120 steps are queued
  # with only the in-flight bound between them (collectives would deadlock
  # past about 32 queued programs). Measured: center 0.935, workers 0.891
  # (0.931 and 0.905 with config.seed=1; the whole run's 600 steps end >= 0.95).
  config = config_with(
    {"run.total_steps": 120, "run.log_every": 0, "run.eval_every": 0, "run.checkpoint_every": 0}
  )
  result = trainer.train_and_evaluate(config, str(tmp_path))
  assert result.metrics["eval/center_accuracy"] >= 0.9
  assert result.metrics["eval/worker_accuracy"] >= 0.85
  assert 0 < result.metrics["eval/consensus_distance"] < 0.5
  logged = scalars.read(str(tmp_path))
  assert TAGS <= set(logged)
  # 120 steps, tau = 4: 30 ring all-reduces of 61,706 float32 parameters, logged once.
  assert logged["comm/bytes_per_worker"] == [(120, pytest.approx(30 * 2 * 7 / 8 * 61706 * 4))]
  assert logged["eval/center_accuracy"][-1][1] == pytest.approx(
    result.metrics["eval/center_accuracy"]
  )


def test_default_config_learns_in_bfloat16_and_saves_a_float32_state(tmp_path):
  assert_bfloat16_run_keeps_float32_state(tmp_path, steps=100, accuracy=0.85)


def test_async_rule_logs_its_simulated_cluster(tmp_path):
  # Worker 7 is a straggler, 4x slower: it takes far fewer steps than the others.
  config = config_with(
    {"run.total_steps": 60, "run.log_every": 20, "run.eval_every": 60, "run.checkpoint_every": 0},
    algorithm="async_easgd",
  )
  config.cluster.stragglers = (7,)
  result = trainer.train_and_evaluate(config, str(tmp_path))
  accumulator = event_accumulator.EventAccumulator(str(tmp_path), size_guidance={"histograms": 0})
  accumulator.Reload()
  async_tags = {
    "sim/time",
    "sim/worker_steps_min",
    "sim/worker_steps_max",
    "comm/exchanges_per_worker",
    "async/staleness_mean",
    "async/queue_wait",
  }
  assert TAGS | async_tags <= set(accumulator.Tags()["scalars"])
  assert "async/staleness" in accumulator.Tags()["histograms"]
  [_, _, last] = accumulator.Histograms("async/staleness")
  assert last.step == 60 and last.histogram_value.num > 10
  times = [event.value for event in accumulator.Scalars("sim/time")]
  assert 0 < times[0] < times[1] < times[2]
  metrics = result.metrics
  assert metrics["sim/worker_steps_max"] == 60
  assert metrics["sim/worker_steps_min"] < 0.5 * metrics["sim/worker_steps_max"]
  assert metrics["eval/center_accuracy"] > 0.5


def test_tfds_dataset_trains_under_mock_data(tmp_path):
  # The dataset's path is the same under every rule (CIFAR-10's: test_models.py).
  config = config_with(
    {
      "data.dataset": "mnist",
      "optimizer.momentum": 0.9,
      "data.batch_size": 4,
      "run.total_steps": 3,
    },
    algorithm="sync_sgd",
  )
  with tfds.testing.mock_data(num_examples=64):
    result = trainer.train_and_evaluate(config, str(tmp_path))
  assert np.isfinite(result.metrics["train/loss"])
  assert os.path.isdir(tmp_path / "checkpoints" / "3")


def test_divergence_stops_with_the_step_and_keeps_the_last_good_checkpoint(tmp_path):
  config = config_with(
    {
      "optimizer.learning_rate": 1e6,
      "run.total_steps": 50,
      "run.checkpoint_every": 1,
      "run.log_every": 1,
    }
  )
  # The loss that stops being finite, or a state that does at a checkpoint
  # (the loss of a step is taken before its update): whichever comes first.
  stopped = r"(loss became (nan|inf) at step|state after step) (\d+)"
  with pytest.raises(TrainingDiverged, match=stopped) as error:
    trainer.train_and_evaluate(config, str(tmp_path))
  bad_step = int(re.search(stopped, str(error.value)).group(3))
  kept = sorted(int(name) for name in os.listdir(tmp_path / "checkpoints") if name.isdigit())
  assert kept and kept[-1] == bad_step - 1
  state = ocp.PyTreeCheckpointer().restore(tmp_path / "checkpoints" / str(kept[-1]) / "state")
  assert all(np.isfinite(leaf).all() for leaf in _leaves(state) if leaf.dtype.kind == "f")
  assert f"the checkpoint of step {kept[-1]} is kept" in str(error.value)


def _leaves(tree):
  if isinstance(tree, dict):
    return [leaf for value in tree.values() for leaf in _leaves(value)]
  if isinstance(tree, (list, tuple)):
    return [leaf for value in tree for leaf in _leaves(value)]
  return [np.asarray(tree)]


def test_a_pipeline_stopped_mid_stage_resumes_its_models_in_their_slots(tmp_path, small_run):
  """The pipeline's models resume on the devices and partitions where they were
  (an asynchronous rule's clock: tests/infra/test_preemption.py; SIGKILL of
  train.py and its history: tests/infra/test_history.py)."""
  straight = small_run("pipeline")
  runs.assert_stopped_and_resumed_ends_as_never_stopped(tmp_path, "pipeline", {}, 15, straight)


@pytest.mark.parametrize(
  "overrides,message",
  [
    (["--config.algorithm=easgd"], "config.algorithm='easgd' is invalid: valid: async_easgd"),
    (["--config.data.batch_size=501"], "config.data.batch_size=501 is invalid: must be <= 500"),
    (["--config.foo=1"], "config.foo does not exist"),
    (["--config.optimizer.learning_rat=1"], "did you mean config.optimizer.learning_rate"),
    (
      ["--config.learning_rate=0.2"],
      "config.learning_rate is now config.optimizer.learning_rate",
    ),
    (["--config.workers=abc"], "flag --config.workers=abc: invalid literal"),
    (
      ["--config.algorithm=pipeline", "--config.pipeline.stage_steps=0"],
      "config.pipeline.stage_steps=0 is invalid: must be an integer >= 1",
    ),
    (
      ["--config.outer.batch_stats=mean"],
      "config.outer.batch_stats='mean' is invalid: valid: averaged, local",
    ),
    (
      ["--num_processes=2", "--process_id=0", "--config.run.devices=3", "--config.workers=3"],
      "config.run.devices=3 is invalid: must be a multiple of the 2 processes",
    ),
    (["--num_processes=2", "--process_id=2"], "--process_id=2 is invalid: must be in [0, 2)"),
    (["--config=configs/nonexistent.py"], "--config 'configs/nonexistent.py' is not a file"),
    (["--config=easgd/errors.py"], "--config 'easgd/errors.py' defines no get_config()"),
    (["--config.seed=-1"], "config.seed=-1 is invalid: must be an integer in [0, 2**32)"),
    (
      # Known only from the model: checked before anything is written.
      [
        "--config.algorithm=streaming_diloco",
        "--config.outer.comm_period=8",
        "--config.outer.fragments=8",
      ],
      "config.outer.fragments=8 is invalid: a model of 5 parameter blocks",
    ),
    (["--workdir="], "--workdir is empty"),
    (["--workdir=README.md"], "--workdir='README.md' is not a directory"),
    (["--workdir=README.md/run"], "lies under"),
  ],
)
def test_bad_input_exits_2_with_one_line_and_writes_nothing(tmp_path, starter, overrides, message):
  # One case of each kind of check; tests/config/test_validation.py has every message.
  workdir = tmp_path / "run"
  code, _, stderr = starter.run(["train.py", f"--workdir={workdir}", *overrides], REPO)
  assert code == 2
  errors = [line for line in stderr.splitlines() if line.startswith("error:")]
  assert len(errors) == 1 and message in errors[0]
  assert stderr.rstrip().endswith(errors[0])
  assert not workdir.exists()


def test_workdir_of_another_configuration_is_refused_untouched(tmp_path, small_run, starter):
  workdir = tmp_path / "run"
  shutil.copytree(small_run("pipeline"), workdir)
  before = sorted(os.listdir(workdir / "checkpoints"))
  flags = [*small_flags(algorithm="pipeline"), "--config.optimizer.learning_rate=0.2"]
  code, _, stderr = starter.run(["train.py", f"--workdir={workdir}", *flags], REPO)
  assert code == 2
  assert "holds a checkpoint of another configuration" in stderr
  assert "config.optimizer.learning_rate is 0.1 there, 0.2 here" in stderr
  assert sorted(os.listdir(workdir / "checkpoints")) == before


def test_a_deliberate_change_resumes_and_is_recorded_an_accidental_one_is_refused(
  tmp_path, small_run
):
  """Population-based training's explore: a field a run can change mid-run, named in
  `changing`, may differ from the checkpoint's, and the change is recorded in the run's
  history (a file, the checkpoints, TensorBoard); unnamed, or of a field the state
  depends on, it is refused as before."""
  workdir = tmp_path / "run"
  shutil.copytree(small_run("sync_easgd"), workdir)
  for step in (30, 40):  # back to step 20
    shutil.rmtree(workdir / "checkpoints" / str(step))
  changed = runs.small_config({"outer.moving_rate": 0.1}, algorithm="sync_easgd")
  with pytest.raises(ConfigError, match=r"config.outer.moving_rate is 0.2 there, 0.1 here"):
    trainer.train_and_evaluate(changed, str(workdir))
  with pytest.raises(ConfigError, match=r"config.workers cannot change in the middle of a run"):
    trainer.train_and_evaluate(changed, str(workdir), changing=("workers",))
  trainer.train_and_evaluate(changed, str(workdir), changing=("outer.moving_rate",))
  record = {"step": 20, "fields": {"outer.moving_rate": [0.2, 0.1]}}
  assert (workdir / trainer.CHANGES_FILE).read_text() == json.dumps(record) + "\n"
  for step in (30, 40):
    saved = workdir / "checkpoints" / str(step)
    assert json.loads((saved / "changes" / "metadata").read_text()) == [record]
    assert json.loads((saved / "config" / "metadata").read_text())["outer"]["moving_rate"] == 0.1
  logged = scalars.read(str(workdir))
  assert logged["config/outer.moving_rate"] == [(0, pytest.approx(0.2)), (20, pytest.approx(0.1))]
  texts = event_accumulator.EventAccumulator(str(workdir))
  texts.Reload()
  [text] = texts.Tensors(trainer.CHANGES_TAG + "/text_summary")
  said = text.tensor_proto.string_val[0]
  assert text.step == 20 and b"| config.outer.moving_rate | 0.2 | 0.1 |" in said


def test_a_second_run_on_a_running_workdir_is_refused_in_one_line_naming_it(tmp_path, starter):
  running = subprocess.Popen(  # a run on the workdir, as its lock says
    [
      sys.executable,
      "-c",
      f"from easgd import ownership; ownership.hold({str(tmp_path)!r})"
      "; print('held', flush=True); import time; time.sleep(600)",
    ],
    stdout=subprocess.PIPE,
    text=True,
  )
  try:
    assert running.stdout.readline() == "held\n"
    code, _, stderr = starter.run(["train.py", f"--workdir={tmp_path}", *small_flags()], REPO)
  finally:
    running.kill()
    running.wait()
  assert code == 2
  [line] = [line for line in stderr.splitlines() if line.startswith("error:")]
  assert f"is in use by process {running.pid} on " in line and "one run a workdir" in line
  assert os.listdir(tmp_path) == [ownership.RUN_LOCK]  # nothing written


@pytest.mark.e2e
def test_without_a_workdir_each_algorithm_gets_its_own(tmp_path, starter):
  """runs/<algorithm> under the current directory: another rule starts afresh beside
  the runs of the others."""
  (tmp_path / "runs" / "sync_easgd").mkdir(parents=True)  # another rule's run
  train = os.path.join(REPO, "train.py")
  overrides = {"run.total_steps": 2, "run.checkpoint_every": 0, "outer.moving_rate": 0.0}
  code, _, stderr = starter.run([train, *small_flags(overrides, algorithm="local_sgd")], tmp_path)
  assert code == 0, stderr[-2000:]
  assert sorted(os.listdir(tmp_path / "runs")) == ["local_sgd", "sync_easgd"]
  assert os.listdir(tmp_path / "runs" / "sync_easgd") == []
