"""sweep.py end to end: runs, resumption, summary, TensorBoard's HTTP API, bad input."""

import contextlib
import csv
import json
import math
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request

import pytest

import runs
from easgd import sweep

# Whole runs, train.py or several processes: left out of the quick loop (-m 'not e2e').
pytestmark = pytest.mark.e2e

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SWEEP_CONFIG = """
from easgd.configs import default
from easgd import sweep


def get_config():
  config = default.get_config()
  config.model = "mlp"  # quick to compile
  config.workers = 2
  config.run.total_steps = 50
  config.run.log_every = 25
  config.run.eval_every = 50
  config.pipeline.stage_steps = 25
  return config


def get_sweep():
  return {points}
"""


def write_config(directory, points: str):
  path = directory / "swept.py"
  path.write_text(SWEEP_CONFIG.format(points=points))
  return path


def sweep_cli(config_path, workdir, *flags):
  command = [sys.executable, "sweep.py", f"--config={config_path}", f"--workdir={workdir}", *flags]
  return subprocess.run(command, check=False, cwd=REPO, capture_output=True, text=True, timeout=400)


@pytest.fixture(scope="module")
def finished_sweep(tmp_path_factory):
  directory = tmp_path_factory.mktemp("sweep")
  # A learning rate of 1e6 diverges: the sweep records it and goes on.
  points = (
    'sweep.product({"optimizer.learning_rate": [0.05, 1e6, 0.2], "outer.moving_rate": [0.1]})'
  )
  config = write_config(directory, points)
  workdir = directory / "runs"
  result = sweep_cli(config, workdir, "--config.outer.comm_period=2")
  assert result.returncode == 0, result.stderr[-3000:]
  return config, workdir, result


@pytest.fixture(scope="module")
def pipelined_sweep(tmp_path_factory):
  directory = tmp_path_factory.mktemp("pipelined")
  config = write_config(
    directory, 'sweep.product({"optimizer.learning_rate": [0.02, 0.2]}, seed=[3, 4])'
  )
  workdir = directory / "runs"
  # 4 models on 2 devices: two models a device, moving together.
  result = sweep_cli(config, workdir, "--pipeline", "--config.run.devices=2")
  assert result.returncode == 0, result.stderr[-3000:]
  return config, workdir, result


def read_summary(workdir):
  with open(workdir / "summary.csv") as handle:
    return list(csv.DictReader(handle))


def test_each_point_is_a_run_with_the_overrides_and_a_sorted_summary(finished_sweep):
  _, workdir, result = finished_sweep
  names = [
    "optimizer.learning_rate=0.05,outer.moving_rate=0.1",
    "optimizer.learning_rate=0.2,outer.moving_rate=0.1",
  ]
  assert all((workdir / name / "checkpoints" / "50").is_dir() for name in names)
  rows = read_summary(workdir)
  assert [row["run"] for row in rows[:2]] in (names, names[::-1])
  accuracies = [float(row["eval/center_accuracy"]) for row in rows[:2]]
  assert accuracies == sorted(accuracies, reverse=True) and accuracies[0] > 0.5
  assert [row["status"] for row in rows] == ["done", "done", "diverged"]
  assert rows[2]["run"] == "optimizer.learning_rate=1000000.0,outer.moving_rate=0.1"
  assert rows[2]["eval/center_accuracy"] == ""
  header = "| run | optimizer.learning_rate | outer.moving_rate | status | eval/center_accuracy"
  assert header in result.stdout
  saved = json.loads(
    (workdir / names[0] / "checkpoints" / "50" / "config" / "metadata").read_text()
  )
  assert saved["outer"]["comm_period"] == 2 and saved["optimizer"]["learning_rate"] == 0.05


def test_a_finished_sweep_is_skipped_when_run_again(finished_sweep):
  config, workdir, _ = finished_sweep
  before = read_summary(workdir)
  again = sweep_cli(config, workdir, "--config.outer.comm_period=2")
  assert again.returncode == 0
  # The two finished points are skipped; the diverged one is tried again.
  assert again.stdout.count("is finished") == 2
  assert read_summary(workdir) == before
  # Its points' folders hold runs of comm_period 2: another value is refused up front.
  other = sweep_cli(config, workdir, "--config.outer.comm_period=3")
  assert other.returncode == 2 and "holds a checkpoint of another configuration" in other.stderr
  assert read_summary(workdir) == before


def _train_py_processes(workdir) -> list[int]:
  """The pids of the train.py processes writing under `workdir`."""
  found = []
  for pid in filter(str.isdigit, os.listdir("/proc")):
    try:
      with open(f"/proc/{pid}/cmdline", "rb") as handle:
        arguments = handle.read().split(b"\0")
    except OSError:
      continue  # ended meanwhile
    if any(arg.startswith(f"--workdir={workdir}".encode()) for arg in arguments):
      found.append(int(pid))
  return found


def test_a_parallel_sweep_killed_and_run_again_ends_with_the_serial_runs_bits(
  finished_sweep, tmp_path
):
  config, serial, _ = finished_sweep
  workdir = tmp_path / "parallel"
  flags = ["--config.outer.comm_period=2", "--parallel=2"]
  command = [sys.executable, "sweep.py", f"--config={config}", f"--workdir={workdir}", *flags]
  # sweep.py alone is killed once a point has logged its first steps (or earlier,
  # if it ended first: the same command must finish it either way). The bounds
  # only end a failing test.
  first = subprocess.Popen(
    command, cwd=REPO, start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
  )
  try:
    bound = time.monotonic() + 300
    while first.poll() is None and not any(
      "step 25/50" in log.read_text() for log in workdir.glob("*/train.log")
    ):
      assert time.monotonic() < bound, "no point logged a step"
      time.sleep(0.1)
    first.kill()
    first.wait()
    # Its Ray ends with it, and each point's train.py with the Ray process that
    # started it: none is left writing into the folders the next command resumes.
    bound = time.monotonic() + 120
    while [pid for pid in _train_py_processes(workdir) if _alive(pid)]:
      assert time.monotonic() < bound, "a point's train.py outlived the sweep that started it"
      time.sleep(0.1)
  finally:
    with contextlib.suppress(ProcessLookupError):
      os.killpg(first.pid, signal.SIGKILL)  # what Ray leaves of itself
  again = sweep_cli(config, workdir, *flags)
  assert again.returncode == 0, again.stderr[-3000:]
  assert read_summary(workdir) == read_summary(serial)
  for row in read_summary(serial):
    if row["status"] == "done":
      runs.assert_same_bits(serial / row["run"], workdir / row["run"], 50)
    assert (
      f"{row['run']} {row['status']}" in again.stdout or f"{row['run']} is finished" in again.stdout
    )


def _alive(pid: int) -> bool:
  """Whether `pid` runs (a zombie, dead but not yet reaped, does not)."""
  try:
    with open(f"/proc/{pid}/stat") as handle:
      return handle.read().rsplit(")", 1)[1].split()[0] != "Z"
  except OSError:
    return False


def test_a_sweep_whose_points_fail_writes_its_summary_and_exits_1(tmp_path, starter):
  # Data that is not there: each train.py refuses its point when it loads it.
  config = write_config(tmp_path, '[{"data.dataset": "mnist"}, {"data.dataset": "cifar10"}]')
  (tmp_path / "no_data").mkdir()
  workdir = tmp_path / "runs"
  argv = [
    "sweep.py",
    f"--config={config}",
    f"--workdir={workdir}",
    f"--config.run.data_dir={tmp_path / 'no_data'}",
  ]
  code, stdout, stderr = starter.run(argv, REPO)
  assert code == 1
  assert [row["status"] for row in read_summary(workdir)] == ["failed (exit 2)"] * 2
  assert stderr.splitlines()[-1] == (
    "error: 2 of 2 points failed: data.dataset=mnist, data.dataset=cifar10"
  )


def test_pipelined_sweep_trains_one_model_per_point(pipelined_sweep):
  _, workdir, _ = pipelined_sweep
  rows = {row["run"]: row for row in read_summary(workdir)}
  assert sorted(rows) == [f"model_{m}" for m in range(4)]
  expected = [("0.02", "3"), ("0.02", "4"), ("0.2", "3"), ("0.2", "4")]
  values = [
    (rows[f"model_{m}"]["optimizer.learning_rate"], rows[f"model_{m}"]["seed"]) for m in range(4)
  ]
  assert values == expected
  assert all(0 < float(row["eval/center_accuracy"]) <= 1 for row in rows.values())


def _free_port():
  with socket.socket() as probe:
    probe.bind(("127.0.0.1", 0))
    return probe.getsockname()[1]


def _get(url, body=None):
  data = None if body is None else json.dumps(body).encode()
  request = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
  with urllib.request.urlopen(request, timeout=10) as response:
    return json.loads(response.read())


@pytest.mark.parametrize("which", ["finished_sweep", "pipelined_sweep"])
def test_tensorboard_serves_every_run_with_scalars_and_hparams(which, request):
  _, workdir, _ = request.getfixturevalue(which)
  rows = read_summary(workdir)
  summary = {row["run"]: row for row in rows if row["status"] == "done"}
  port = _free_port()
  tensorboard = os.path.join(os.path.dirname(sys.executable), "tensorboard")
  server = subprocess.Popen(
    [tensorboard, "--logdir", str(workdir), "--host", "127.0.0.1", f"--port={port}"],
    stdout=subprocess.DEVNULL,
    stderr=subprocess.DEVNULL,
  )
  base = f"http://127.0.0.1:{port}/data"

  def served():
    assert sorted(_get(f"{base}/runs")) == sorted(row["run"] for row in rows)
    for run, row in summary.items():
      tags = _get(f"{base}/plugin/scalars/tags")[run]
      assert {"train/loss", "eval/center_accuracy"} <= set(tags)
      url = f"{base}/plugin/scalars/scalars?run={urllib.parse.quote(run)}&tag=eval/center_accuracy"
      last = _get(url)[-1]
      assert last[1] == 50 and math.isclose(
        last[2], float(row["eval/center_accuracy"]), rel_tol=1e-3
      )
    groups = _get(
      f"{base}/plugin/hparams/session_groups",
      {"experimentName": "", "allowedStatuses": ["STATUS_SUCCESS"], "sliceSize": 100},
    )["sessionGroups"]
    assert sorted(group["name"] for group in groups) == sorted(summary)
    for group in groups:
      row = summary[group["name"]]
      rate = group["hparams"]["optimizer.learning_rate"]
      assert math.isclose(rate, float(row["optimizer.learning_rate"]))
      metrics = {value["name"]["tag"]: value["value"] for value in group["metricValues"]}
      assert math.isclose(
        metrics["eval/center_accuracy"], float(row["eval/center_accuracy"]), rel_tol=1e-3
      )

  # TensorBoard lists a run before it has loaded its events, and loads them in the
  # background: what it serves is checked until it is whole (a hang guard bounds it).
  deadline = time.monotonic() + 300
  try:
    while True:
      try:
        served()
        break
      except (AssertionError, KeyError, IndexError, OSError):
        if time.monotonic() > deadline:
          raise
      time.sleep(0.5)
  finally:
    server.terminate()
    server.wait(timeout=10)


@pytest.mark.parametrize(
  "points,flags,message",
  [
    ("[]", [], "get_sweep() returned no points"),
    (
      '[{"optimizer.learnig_rate": 0.1}]',
      [],
      "sweep point 0 (optimizer.learnig_rate=0.1): config.optimizer.learnig_rate does not exist",
    ),
    (
      '[{"learning_rate": 0.1}]',
      [],
      "config.learning_rate is now config.optimizer.learning_rate",
    ),
    (
      '[{"optimizer.learning_rate": 0.1}]',
      ["--config.optimizer.learning_rate=0.2"],
      "config.optimizer.learning_rate is both swept and set",
    ),
    (
      '[{"optimizer.learning_rate": -1.0}]',
      [],
      "sweep point 0 (optimizer.learning_rate=-1.0): config.optimizer.learning_rate=-1.0 is",
    ),
    (
      '[{"outer.moving_rate": 0.1}]',
      ["--pipeline"],
      "--pipeline: the sweep sets outer.moving_rate",
    ),
    ('[{"optimizer.learning_rate": 0.1}]', ["--config.foo=1"], "config.foo does not exist"),
    ('[{"optimizer.learning_rate": 0.1}]', ["--parallel=0"], "--parallel=0 is invalid"),
    (
      '[{"optimizer.learning_rate": 0.1}]',
      ["--pipeline", "--parallel=2"],
      "--pipeline is one run of one process: drop --parallel",
    ),
  ],
)
def test_bad_sweep_exits_2_with_one_line_and_runs_nothing(
  tmp_path, starter, points, flags, message
):
  config = write_config(tmp_path, points)
  argv = ["sweep.py", f"--config={config}", f"--workdir={tmp_path / 'runs'}", *flags]
  code, _, stderr = starter.run(argv, REPO)
  assert code == 2
  errors = [line for line in stderr.splitlines() if line.startswith("error:")]
  assert len(errors) == 1 and message in errors[0], stderr[-2000:]
  assert not (tmp_path / "runs").exists()


def test_a_point_asking_more_than_ray_has_is_refused_before_anything_is_written(tmp_path):
  config = write_config(tmp_path, '[{"optimizer.learning_rate": 0.1}]')
  result = sweep_cli(config, tmp_path / "runs", "--parallel=2", "--point_gpus=64")
  assert result.returncode == 2
  errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
  assert len(errors) == 1 and "asks for 1 CPUs and 64 GPUs" in errors[0], result.stderr[-2000:]
  assert not (tmp_path / "runs").exists()


def test_product_and_names():
  points = sweep.product({"optimizer.learning_rate": [0.1, 0.2]}, seed=[0])
  assert points == [
    {"optimizer.learning_rate": 0.1, "seed": 0},
    {"optimizer.learning_rate": 0.2, "seed": 0},
  ]
  assert sweep.name({"optimizer.learning_rate": 0.1, "cluster.stragglers": (1, 2)}) == (
    "optimizer.learning_rate=0.1,cluster.stragglers=(1, 2)"
  )


def test_summary_puts_the_best_first_and_runs_without_accuracy_last(tmp_path):
  rows = [
    {"run": "a", "status": "diverged", "eval/center_accuracy": math.nan},
    {"run": "b", "status": "done", "eval/center_accuracy": 0.5},
    {"run": "c", "status": "failed (exit 3)"},
    {"run": "d", "status": "done", "eval/center_accuracy": 0.9},
  ]
  sweep.write_summary(rows, [], str(tmp_path))
  assert [row["run"] for row in read_summary(tmp_path)] == ["d", "b", "a", "c"]
  assert (tmp_path / "summary.md").read_text().splitlines()[2].startswith("| d | done | 0.9")


def test_a_sweep_does_not_overwrite_a_summary_it_did_not_write(tmp_path):
  config = write_config(tmp_path, '[{"optimizer.learning_rate": 0.1}]')
  workdir = tmp_path / "notes"
  workdir.mkdir()
  (workdir / "summary.md").write_text("my own summary\n")
  result = sweep_cli(config, workdir)
  assert result.returncode == 2
  errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
  assert len(errors) == 1 and "summary.md' exists and was not written by this tool" in errors[0]
  assert sorted(p.name for p in workdir.iterdir()) == ["summary.md"]
  assert (workdir / "summary.md").read_text() == "my own summary\n"
