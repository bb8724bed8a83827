"""The profile window (config.run.profile): which steps it traces, and where the trace goes."""

import collections
import gzip
import json
import re

import pytest

from easgd.config import validation
from easgd.errors import ConfigError, TrainingDiverged
from easgd.infra import profiler
from easgd.train import loop, trainer
from runs import config_with, small_config


@pytest.mark.parametrize(
  "value,window", [("", None), ("0:1", (0, 1)), ("2:6", (2, 6)), ("7:1", (7, 1)), ("00:8", (0, 8))]
)
def test_a_window_is_start_and_steps_within_the_run(value, window):
  assert profiler.parse(value, 8) == window
  assert profiler.refusal(value, 8) is None


@pytest.mark.parametrize(
  "value",
  ["3", "a:b", "-1:2", "2:-1", "2:0", "5:10", "8:1", "1:2:3", " 1:2", "1_0:2", ":", 3, True, None],
)
def test_anything_else_is_refused(value):
  assert profiler.refusal(value, 8) is not None
  with pytest.raises(ValueError, match=r"^config.run.profile=.* is invalid"):
    profiler.parse(value, 8)


def test_validation_refuses_a_window_outside_the_run_in_one_line():
  config = config_with({"run.total_steps": 8, "run.profile": "5:10"})
  with pytest.raises(ConfigError) as refused:
    validation.validate(config)
  said = str(refused.value)
  assert "\n" not in said
  assert said.startswith("config.run.profile='5:10' is invalid: a profile window outside the run")
  assert "run.total_steps=8" in said
  validation.validate(config_with({"run.total_steps": 8, "run.profile": "5:3"}))


class Trainee:
  """Counts steps; the loop's calls to the profiler are recorded at the step reached."""

  num_models = 1
  state = None

  def __init__(self, fail_at=0):
    self.stepped, self.fail_at = 0, fail_at

  def step(self):
    self.stepped += 1
    if self.stepped == self.fail_at:
      raise TrainingDiverged("scripted")
    return {"loss": [1.0]}, None

  def add(self, metrics, context):
    return metrics["loss"]

  def log(self, step, train_seconds):
    return {}

  def evaluate(self, step):
    return {}

  def stop_at(self, step):
    return step, None

  def save(self, divergence):
    pass

  def finish(self):
    pass

  def flush(self):
    pass

  def close(self):
    pass


class Checkpoints:
  def __init__(self, workdir):
    self.workdir = str(workdir)

  def latest_step(self):
    return None

  def close(self):
    pass


def _traced(monkeypatch, tmp_path, profile, resumed=0, total=8, fail_at=0):
  """Runs the loop from step `resumed`; the trace's (start, stop) as the loop's steps."""
  calls = []
  trainee = Trainee(fail_at)
  monkeypatch.setattr(
    profiler.jax.profiler, "start_trace", lambda path: calls.append(("start", path))
  )
  monkeypatch.setattr(profiler.jax.profiler, "stop_trace", lambda: calls.append(("stop",)))
  config = config_with({"run.total_steps": total, "run.profile": profile})
  try:
    loop.run(config, _Recorder(trainee, calls, resumed), resumed, Checkpoints(tmp_path))
  except TrainingDiverged:
    pass
  return calls


class _Recorder:
  """The trainee, with each step's number put among the profiler's calls."""

  def __init__(self, trainee, calls, resumed):
    self._trainee, self._calls, self._step = trainee, calls, resumed

  def __getattr__(self, name):
    return getattr(self._trainee, name)

  def step(self):
    self._step += 1
    self._calls.append(self._step)
    return self._trainee.step()


def test_the_trace_holds_steps_start_plus_1_to_start_plus_steps(monkeypatch, tmp_path):
  calls = _traced(monkeypatch, tmp_path, "2:3")
  assert calls == [1, 2, ("start", str(tmp_path / "profile")), 3, 4, 5, ("stop",), 6, 7, 8]


def test_no_window_traces_nothing_and_writes_nothing(monkeypatch, tmp_path):
  assert _traced(monkeypatch, tmp_path, "") == list(range(1, 9))
  assert list(tmp_path.iterdir()) == []


def test_a_run_resumed_inside_the_window_traces_the_rest_of_it(monkeypatch, tmp_path):
  inside = _traced(monkeypatch, tmp_path, "2:3", resumed=3)
  assert inside == [("start", str(tmp_path / "profile")), 4, 5, ("stop",), 6, 7, 8]
  assert _traced(monkeypatch, tmp_path, "2:3", resumed=5) == [6, 7, 8]  # past it: nothing


def test_a_run_that_stops_inside_the_window_stops_the_trace(monkeypatch, tmp_path):
  calls = _traced(monkeypatch, tmp_path, "2:3", fail_at=4)
  assert calls == [1, 2, ("start", str(tmp_path / "profile")), 3, 4, ("stop",)]


def test_each_process_of_a_run_writes_its_own_trace(monkeypatch):
  assert profiler.log_dir("w") == "w/profile"
  monkeypatch.setattr(profiler.jax, "process_count", lambda: 2)
  monkeypatch.setattr(profiler.jax, "process_index", lambda: 1)
  # jax.profiler names the file after the host, which the processes may share.
  assert profiler.log_dir("w") == "w/profile/process_1"


def _program_runs(trace_dir) -> dict[str, int]:
  """How often each device (and the host, "") ran a compiled program in the trace."""
  [trace] = trace_dir.glob("*.trace.json.gz")
  events = json.loads(gzip.decompress(trace.read_bytes()))["traceEvents"]
  runs = collections.Counter()
  for event in events:
    match = re.match(r"(\[\d+\] )?CommonPjRtLoadedExecutable::Execute \(", event.get("name", ""))
    if event.get("ph") == "X" and match:
      runs[(match.group(1) or "").strip()] += 1
  return dict(runs)


# Whole (short) runs of both trainers.
@pytest.mark.e2e
# The pipeline's trainer goes through the same loop (its order is checked above).
@pytest.mark.parametrize("algorithm", ["sync_easgd"])
def test_a_run_writes_the_trace_of_its_window_where_tensorboard_reads_it(
  tmp_path, small_run, algorithm
):
  # The shared run of the same config without a window (compiled once for both).
  assert not (small_run(algorithm) / "profile").exists()
  schedule = {"run.total_steps": 6, "run.log_every": 0, "run.checkpoint_every": 0}
  config = small_config({**schedule, "run.profile": "2:3"}, algorithm=algorithm)
  trainer.train_and_evaluate(config, str(tmp_path))
  [session] = (tmp_path / "profile" / "plugins" / "profile").iterdir()
  [xplane] = session.glob("*.xplane.pb")
  assert xplane.stat().st_size > 0
  # Steps 3, 4 and 5, each one program on each of the 4 devices: none of steps 1, 2 or 6.
  assert _program_runs(session) == {"": 3, "[0]": 3, "[1]": 3, "[2]": 3, "[3]": 3}
