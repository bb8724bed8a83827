"""sweep.py end to end: runs, resumption, summary, TensorBoard's HTTP API, bad input."""

import csv
import json
import math
import os
import socket
import subprocess
import sys
import time
import urllib.request

import pytest

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
  try:
    deadline = time.monotonic() + 60
    while True:
      try:
        runs = _get(f"{base}/runs")
        if sorted(runs) == sorted(row["run"] for row in rows):
          break
      except OSError:
        pass
      assert time.monotonic() < deadline, "tensorboard did not list the runs in 60 s"
      time.sleep(0.5)
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
