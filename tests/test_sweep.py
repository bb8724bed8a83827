"""sweep.py end to end: runs, resumption, summary, TensorBoard's HTTP API, bad input."""

import contextlib
import csv
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import tempfile
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


def _alive(pid: int) -> bool:
  """Whether `pid` runs (a zombie, dead but not yet reaped, does not)."""
  try:
    with open(f"/proc/{pid}/stat") as handle:
      return handle.read().rsplit(")", 1)[1].split()[0] != "Z"
  except OSError:
    return False


def _left_of(session: int) -> list[str]:
  """What runs of the session `session` (a sweep started as its leader: its Ray, its
  points' train.py processes, Ray's agents)."""
  left = []
  for entry in filter(str.isdigit, os.listdir("/proc")):
    try:
      if os.getsid(int(entry)) == session and _alive(int(entry)):
        with open(f"/proc/{entry}/cmdline", "rb") as handle:
          left.append(handle.read().replace(b"\0", b" ")[:120].decode())
    except OSError:
      continue  # ended meanwhile
  return left


# A hang guard only: each wait ends as soon as what it waits for is seen.
BOUND = 400.0


def _until(done, what: str, bound: float = BOUND) -> None:
  deadline = time.monotonic() + bound
  while not done():
    assert time.monotonic() < deadline, what
    time.sleep(0.1)


def _logged(workdir, text: str, sizes: dict | None = None) -> bool:
  """Whether a point's train.log under `workdir` says `text` (past `sizes`, its size
  then, if given)."""
  for log in workdir.glob("*/train.log"):
    with open(log, "rb") as handle:
      handle.seek((sizes or {}).get(log, 0))
      if text.encode() in handle.read():
        return True
  return False


def _signal_session(session: int, how: signal.Signals) -> None:
  """`how` to every process of the session `session`."""
  for entry in filter(str.isdigit, os.listdir("/proc")):
    with contextlib.suppress(OSError):
      if os.getsid(int(entry)) == session:
        os.kill(int(entry), how)


def _stopped(sweep: runs.Process, how: signal.Signals, held: bool = False) -> tuple[int, str]:
  """The sweep sent `how` (its process alone): its exit status and output, once
  nothing of its session is left (its Ray, its train.py processes, Ray's agents).
  `held`: its session was stopped (SIGSTOP), and continues once `how` is pending."""
  sweep.popen.send_signal(how)
  if held:
    _signal_session(sweep.popen.pid, signal.SIGCONT)
  code = sweep.popen.wait(timeout=BOUND)
  # Within half of the minute Ray's agents took on their own.
  _until(lambda: not _left_of(sweep.popen.pid), f"left: {_left_of(sweep.popen.pid)}", 30)
  sweep.wait(60)
  return code, sweep.output()


def _assert_resumed_to_the_serial_bits(serial, workdir, done) -> None:
  """The summary's rows are the serial sweep's, and so are the bits of its runs, but
  for points a scheduler stopped (each kept its checkpoint of that step alone)."""
  rows = {row["run"]: row for row in read_summary(workdir)}
  for row in read_summary(serial):
    got = rows[row["run"]]
    if got["status"].startswith("stopped early"):
      assert got["status"] == "stopped early (step 25)" and row["status"] == "done"
      assert runs.steps_saved(workdir / row["run"]) == [25]
      continue
    assert got == row
    if row["status"] == "done":
      runs.assert_same_bits(serial / row["run"], workdir / row["run"], 50)
    # Its line, or, for a point that ended before the resume, its row of the summary.
    assert f"{row['run']} {row['status']}" in done or f"| {row['run']} |" in done


def test_a_parallel_asha_sweep_stopped_killed_and_run_again_ends_with_the_serial_bits(
  finished_sweep, tmp_path
):
  """SIGTERM (a preemption): the running points save and the sweep exits 0 saying what
  to rerun; kill -9: nothing of it is left within seconds; the same command restores
  Tune's experiment and ends with the serial sweep's runs, bit for bit, but for the
  points ASHA stopped at its rung (step 25)."""
  config, serial, _ = finished_sweep
  workdir = tmp_path / "parallel"
  flags = [
    "--config.outer.comm_period=2",
    "--config.run.eval_every=25",  # a rung: evaluations change no bit of a run
    "--parallel=2",
    "--scheduler=asha",
    "--reduction_factor=2",
  ]
  command = ("sweep.py", f"--config={config}", f"--workdir={workdir}", *flags)
  sweep = runs.Process(*command)
  _until(lambda: _logged(workdir, "step 25/50") or sweep.popen.poll() is not None, "no step")
  code, said = _stopped(sweep, signal.SIGTERM)
  assert code == 0 and "sweep: stopped by a preemption notice (" in said, said[-3000:]
  assert f"run the same command to resume: python {' '.join(command)}" in said

  sizes = {log: log.stat().st_size for log in workdir.glob("*/train.log")}
  sweep = runs.Process(*command)
  _until(
    lambda: _logged(workdir, "training data:", sizes) or sweep.popen.poll() is not None,
    "no point started",
  )
  code, said = _stopped(sweep, signal.SIGKILL)
  assert code == -signal.SIGKILL, said[-3000:]

  again = sweep_cli(config, workdir, *flags)
  assert again.returncode == 0, again.stderr[-3000:]
  assert "sweep: resuming the sweep's Tune experiment in " in again.stdout
  _assert_resumed_to_the_serial_bits(serial, workdir, again.stdout)


def test_a_serial_sweep_stopped_and_killed_leaves_nothing_and_resumes_to_its_bits(
  finished_sweep, tmp_path, starter
):
  """One sweep a workdir (a second is refused naming the first); SIGTERM: the running
  point saves and the sweep exits 0 saying what to rerun; kill -9: its train.py ends
  with it; the same command ends with the serial sweep's bits."""
  config, serial, _ = finished_sweep
  workdir = tmp_path / "serial"
  command = ("sweep.py", f"--config={config}", f"--workdir={workdir}")
  flags = ("--config.outer.comm_period=2",)
  sweep = runs.Process(*command, *flags)
  sweep.wait_for(r"step 25/50", BOUND)
  # Held there (its point would end within a second): the notice finds the point running.
  _signal_session(sweep.popen.pid, signal.SIGSTOP)
  code, _, stderr = starter.run([*command, *flags], REPO)
  assert code == 2 and f"is in use by process {sweep.popen.pid} on " in stderr, stderr[-2000:]
  code, said = _stopped(sweep, signal.SIGTERM, held=True)
  assert code == 0 and "sweep: stopped by a preemption notice (point 1/3 " in said, said[-3000:]

  sweep = runs.Process(*command, *flags)
  sweep.wait_for(r"sweep: point 2/3 (.|\n)*training data:", BOUND)
  code, said = _stopped(sweep, signal.SIGKILL)
  assert code == -signal.SIGKILL, said[-3000:]

  again = sweep_cli(config, workdir, *flags)
  assert again.returncode == 0, again.stderr[-3000:]
  assert read_summary(workdir) == read_summary(serial)
  for row in read_summary(serial):
    if row["status"] == "done":
      runs.assert_same_bits(serial / row["run"], workdir / row["run"], 50)


def test_a_pbt_sweep_copies_the_better_points_run_and_records_what_it_changed(
  finished_sweep, tmp_path
):
  """Population-based training over the learning rate, two points, a round at step 25:
  the lower point copies the upper one's checkpoint and explores (its learning rate
  one of the sweep's, recorded where it changed)."""
  config, _, _ = finished_sweep
  pbt = tmp_path / "pbt.py"
  pbt.write_text(
    config.read_text().replace(
      'sweep.product({"optimizer.learning_rate": [0.05, 1e6, 0.2], "outer.moving_rate": [0.1]})',
      'sweep.product({"optimizer.learning_rate": [0.05, 0.2]})',
    )
  )
  flags = [
    "--config.outer.comm_period=2",
    "--config.run.eval_every=25",
    "--parallel=2",
    "--scheduler=pbt",
    "--pbt_fields=optimizer.learning_rate",
  ]
  workdir = tmp_path / "runs"
  result = sweep_cli(pbt, workdir, *flags)
  assert result.returncode == 0, result.stderr[-3000:]
  rows = {row["run"]: row for row in read_summary(workdir)}
  names = ["optimizer.learning_rate=0.05", "optimizer.learning_rate=0.2"]
  assert sorted(rows) == names and [rows[name]["status"] for name in names] == ["done", "done"]
  # The lower point at step 25 copied the upper one's checkpoint of step 25 and
  # explored: its learning rate is now one of the sweep's, recorded if it changed.
  copied = [
    (number, name)
    for number, name in enumerate(names)
    if "checkpoint of step 25 (population-based training's exploit)"
    in (workdir / name / "train.log").read_text()
  ]
  [(lower, name)] = copied
  rate = float(rows[name]["optimizer.learning_rate"])
  assert rate in (0.05, 0.2)
  upper_rate = (0.05, 0.2)[1 - lower]
  # Its history: the copy (the other point's values in place of its own), then its
  # explore where that moved a value (train.py's record of the change it resumed with).
  changes = (workdir / name / "config_changes.jsonl").read_text().splitlines()
  copy = {"optimizer.learning_rate": [(0.05, 0.2)[lower], upper_rate]}
  records = [{"step": 25, "copied": names[1 - lower], "fields": copy}]
  if rate != upper_rate:
    records.append({"step": 25, "fields": {"optimizer.learning_rate": [upper_rate, rate]}})
  assert [json.loads(line) for line in changes] == records
  assert (workdir / "tune" / "pbt_global.txt").is_file()  # Tune's own record of the rounds


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
  port = runs.free_port()
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
    # Tune's schedulers: their flags, each named with what is allowed.
    ('[{"optimizer.learning_rate": 0.1}]', ["--grace_steps=10"], "--grace_steps set a scheduler"),
    (
      '[{"optimizer.learning_rate": 0.1}]',
      ["--scheduler=asha"],
      "--scheduler=asha runs the points as Ray Tune's trials: give --parallel N",
    ),
    (
      '[{"optimizer.learning_rate": 0.1}]',
      ["--parallel=2", "--scheduler=asha", "--reduction_factor=1"],
      "--reduction_factor=1 is invalid: must be an integer >= 2",
    ),
    (
      '[{"optimizer.learning_rate": 0.1}]',
      ["--parallel=2", "--scheduler=asha", "--grace_steps=30"],
      "--grace_steps: ASHA's rung at step 30 is not a step where the runs log "
      "eval/center_accuracy (every 50 steps, config.run.eval_every)",
    ),
    (
      '[{"optimizer.learning_rate": 0.1}, {"optimizer.learning_rate": 0.2}]',
      ["--parallel=2", "--scheduler=pbt", "--pbt_fields=workers"],
      "--pbt_fields: config.workers cannot change in the middle of a run",
    ),
    (
      '[{"optimizer.learning_rate": 0.1}, {"optimizer.learning_rate": 0.2}]',
      ["--parallel=2", "--scheduler=pbt", "--pbt_fields=outer.moving_rat"],
      "--pbt_fields: config.outer.moving_rat does not exist",
    ),
    (
      '[{"optimizer.learning_rate": 0.1}, {"optimizer.learning_rate": 0.2}]',
      ["--parallel=2", "--scheduler=pbt", "--pbt_fields=outer.moving_rate"],
      "--pbt_fields: config.outer.moving_rate is not swept",
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


def _block(path: str, marker: str) -> str:
  """The ```bash block of the file at `path` (from the repository) that holds `marker`."""
  with open(os.path.join(REPO, path)) as handle:
    blocks = handle.read().split("```bash\n")[1:]
  [block] = [block.split("```")[0] for block in blocks if marker in block]
  return block


# Stand-ins for SLURM's commands on one machine: the allocation's first node is this
# one, and srun starts a command here, but for the other nodes (--exclude), which
# this machine does not have.
SCONTROL = "#!/bin/bash\necho 127.0.0.1\n"
SRUN = """#!/bin/bash
while [[ $# -gt 0 ]]; do
  case "$1" in
    --exclude=*) exit 0 ;;
    -w) shift 2 ;;
    -*) shift ;;
    *) break ;;
  esac
done
exec "$@"
"""


def test_the_slurm_recipe_runs_as_written_on_a_head_with_token_authentication(
  tmp_path, monkeypatch
):
  """docs/running.md's SLURM script, on this machine, with a token in its home (as any
  earlier local Ray run leaves one): the head uses token authentication and the
  sweep's explicit address passes it; a token the head refuses, or none, is one line.
  The script is run as written but for a free port for 6379 (and for Ray's own fixed
  ports), a small config for the example's, and a workdir under the test's folder."""
  from easgd import ray_connection  # noqa: PLC0415
  from easgd.errors import ConfigError  # noqa: PLC0415

  home, stand_ins = tmp_path / "home", tmp_path / "bin"
  (home / ".ray").mkdir(parents=True)
  token = "0123456789abcdef0123456789abcdef"
  (home / ".ray" / "auth_token").write_text(token)
  stand_ins.mkdir()
  for name, text in (("scontrol", SCONTROL), ("srun", SRUN)):
    (stand_ins / name).write_text(text)
    (stand_ins / name).chmod(0o755)
  port, client, agent = runs.free_port(), runs.free_port(), runs.free_port()
  config = write_config(tmp_path, '[{"optimizer.learning_rate": 0.1}]')
  script = (
    _block("docs/running.md", "#SBATCH")
    .replace(
      "--port=6379",
      f"--port={port} --ray-client-server-port={client} --dashboard-agent-listen-port={agent}",
    )
    .replace(":6379", f":{port}")
    .replace("/6379", f"/{port}")
    .replace("configs/sweep_example.py", str(config))
    .replace('"runs/', f'"{tmp_path}/runs/')
  )
  assert "6379" not in script
  (tmp_path / "sweep.sh").write_text(script)
  ray_tmp = tempfile.mkdtemp(prefix="r", dir="/tmp")  # Ray's sockets want a short path
  environment = {
    **os.environ,
    "HOME": str(home),
    "RAY_TMPDIR": ray_tmp,
    "PATH": os.pathsep.join([str(stand_ins), os.path.dirname(sys.executable), os.environ["PATH"]]),
    "SLURM_JOB_NODELIST": "node[1-4]",
    "SLURM_JOB_ID": "7",
  }
  log = tmp_path / "sweep.log"  # a file: the head's srun, in the background, keeps it open
  with open(log, "w") as output:
    job = subprocess.Popen(
      ["bash", str(tmp_path / "sweep.sh")],
      cwd=REPO,
      env=environment,
      stdout=output,
      stderr=subprocess.STDOUT,
      start_new_session=True,
    )
  try:
    job.wait(timeout=BOUND)
    output = log.read_text()
    assert job.returncode == 0, output[-3000:]
    [row] = read_summary(tmp_path / "runs" / "sweep_7")
    assert row["status"] == "done", output[-3000:]
    # The head, still up (srun's ray start --block), wants a token: others are refused.
    address = f"127.0.0.1:{port}"
    # check() turns token authentication on for this process (RAY_AUTH_MODE=token):
    # recorded first, so that the test's end takes it back for the tests after it.
    monkeypatch.setenv("RAY_AUTH_MODE", "")
    monkeypatch.delenv("RAY_AUTH_MODE")
    monkeypatch.setenv("HOME", str(tmp_path))  # no token here
    with pytest.raises(ConfigError, match="uses token authentication, and this machine has no"):
      ray_connection.check(address, "--ray_address")
    monkeypatch.setenv("RAY_AUTH_TOKEN", "f" * 32)
    with pytest.raises(ConfigError, match=r"refused this machine's token \(from RAY_AUTH_TOKEN\)"):
      ray_connection.check(address, "--ray_address")
    monkeypatch.setenv("RAY_AUTH_TOKEN", token)
    ray_connection.check(address, "--ray_address")
    assert os.environ["RAY_AUTH_MODE"] == "token"  # what this process presents from now on
  finally:
    with contextlib.suppress(ProcessLookupError):
      os.killpg(job.pid, signal.SIGTERM)  # ray start --block ends the head's processes
    try:
      _until(lambda: not _left_of(job.pid), f"left: {_left_of(job.pid)}")
    finally:
      with contextlib.suppress(ProcessLookupError):
        os.killpg(job.pid, signal.SIGKILL)
      shutil.rmtree(ray_tmp, ignore_errors=True)
