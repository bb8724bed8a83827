"""easgd.executor: the refusals of --parallel's flags, the progress line, and jobs run as
Ray tasks: retried when their process is lost or stopped, a failure one line, the
others finished."""

import os
import signal
import sys
import warnings

import jax
import pytest
import ray

from easgd import executor
from easgd.errors import ConfigError
from easgd.train import loop


def _closed_port() -> int:
  import socket  # noqa: PLC0415

  with socket.socket() as probe:
    probe.bind(("127.0.0.1", 0))
    return probe.getsockname()[1]  # closed again when the probe is


@pytest.mark.parametrize(
  ("values", "message"),
  [
    ({"points": 0}, "--parallel=0 is invalid: give the most runs at once, >= 1"),
    ({"cpus": 0.0}, "--point_cpus=0 is invalid: must be a number > 0"),
    ({"cpus": float("nan")}, "--point_cpus=nan is invalid"),
    ({"gpus": 1.5}, "--point_gpus=1.5 is invalid: give 0, a fraction of one GPU in (0, 1)"),
    ({"gpus": -0.5}, "--point_gpus=-0.5 is invalid"),
    ({"gpus": float("inf")}, "--point_gpus=inf is invalid"),
    ({"gpus": -1.0}, "--point_gpus=-1 is invalid"),
    ({"retries": -1}, "--point_retries=-1 is invalid"),
    ({"cpus": 0.00001}, "--point_cpus=1e-05 is invalid: must be a number > 0 in steps of 0.0001"),
    ({"gpus": 0.33333}, "--point_gpus=0.33333 is invalid"),
  ],
)
def test_a_bad_flag_is_one_line_naming_it_and_what_is_allowed(values, message):
  with pytest.raises(ConfigError) as error:
    executor.Parallel(**{"points": 2, **values}).check()
  assert str(error.value).startswith(message) and "\n" not in str(error.value)


def test_an_address_that_does_not_answer_is_refused_naming_where_it_came_from(monkeypatch):
  address = f"127.0.0.1:{_closed_port()}"
  with pytest.raises(ConfigError, match=r"^--ray_address='127\.0\.0\.1:\d+' is unreachable"):
    executor.parallel_of(2, None, None, address, None)
  with pytest.raises(ConfigError, match=r"^--ray_address='localhost' is not HOST:PORT"):
    executor.parallel_of(2, None, None, "localhost", None)
  monkeypatch.setenv("RAY_ADDRESS", address)
  with pytest.raises(ConfigError, match=r"^RAY_ADDRESS='127\.0\.0\.1:\d+' is unreachable"):
    executor.parallel_of(2, None, None, "", None)
  # Without --parallel or an address the runs go one after another, as always
  # (RAY_ADDRESS alone does not make them parallel) ...
  assert executor.parallel_of(None, None, None, "", None) is None
  # ... where what a run asks of Ray means nothing: refused, not ignored.
  with pytest.raises(ConfigError, match=r"^--point_gpus and --point_retries set what a run"):
    executor.parallel_of(None, None, 0.5, "", 2)


def test_a_run_asking_more_than_any_node_has_is_refused():
  nodes = [
    {"Alive": True, "Resources": {"CPU": 8.0, "GPU": 1.0}},
    {"Alive": False, "Resources": {"CPU": 64.0, "GPU": 8.0}},  # a dead node counts for nothing
  ]
  executor._check_resources(executor.Parallel(2, cpus=8, gpus=1), nodes)
  with pytest.raises(ConfigError) as error:
    executor._check_resources(executor.Parallel(2, cpus=1, gpus=2), nodes)
  assert "more than any node of the Ray cluster has (the most: 8 CPUs, 1 GPUs)" in str(error.value)


def test_statuses_and_the_progress_line(tmp_path, monkeypatch):
  assert [executor.Outcome(code).status for code in (0, 1, 2)] == [
    "done",
    "diverged",
    "failed (exit 2)",
  ]
  assert executor.Outcome(None, "lost: NodeDiedError").status == "failed (lost: NodeDiedError)"
  assert [executor.Outcome(c).failed for c in (0, 1, 2, None)] == [False, False, True, True]
  jobs = [executor.Job(name, str(tmp_path / name), 300, print) for name in "abc"]
  progress = executor.Progress(jobs)
  for number in range(3):
    progress.start(number)
  # The progress lines of the run's loop, as its log holds them.
  lines = []
  monkeypatch.setattr(
    loop.logging, "info", lambda text, *args: lines.append(text % args if args else text)
  )
  run_progress = loop.Progress(0, 300)
  run_progress.report(100, {"train/loss": 0.5})
  run_progress.report(200, {"train/loss": 0.4})
  (tmp_path / "a").mkdir()
  (tmp_path / "a" / executor.LOG).write_text("".join(f"I1128 loop.py:186] {t}\n" for t in lines))
  line = progress.line(1, [0], {1: executor.Outcome(0)})
  assert line.startswith("1 queued, 1 running (a at 200/300), 1 finished, 0 failed, about ")
  assert line.endswith(" left")


def test_a_train_py_killed_or_stopped_short_in_a_task_is_stopped(tmp_path, monkeypatch):
  python = [sys.executable, "-c"]
  killed, stopped = "import os; os.kill(os.getpid(), 9)", "pass"  # exit 0, no checkpoint of step 10
  # One after another, train.py's exit status, as the serial sweep always reported it.
  assert executor.train_py([*python, killed], str(tmp_path), 10) == -9
  assert executor.train_py([*python, stopped], str(tmp_path), 10) == 0
  # In a Ray task: Stopped, which Ray retries.
  monkeypatch.setattr(executor, "_IN_TASK", True)
  with pytest.raises(executor.Stopped, match="died of signal 9"):
    executor.train_py([*python, killed], str(tmp_path), 10)
  with pytest.raises(executor.Stopped, match="stopped before its last step"):
    executor.train_py([*python, stopped], str(tmp_path), 10)
  assert executor.train_py([*python, "raise SystemExit(3)"], str(tmp_path), 10) == 3


def test_one_after_another_a_stopped_run_stops_the_runs_after_it(tmp_path):
  started = []

  def job(name: str, stops: bool) -> executor.Job:
    def call():
      started.append(name)
      if stops:
        raise executor.Stopped("it stopped before its last step")  # a preemption notice
      return 0

    return executor.Job(name, str(tmp_path / name), 10, call)

  with pytest.raises(executor.Stopped):
    executor.run([job("a", False), job("b", True), job("c", False)], None, str(tmp_path))
  assert started == ["a", "b"]  # c waits for the same command to resume it


# ---- Jobs on a Ray on this machine ----


def _killed_once(marker: str) -> int:
  """Its process dies of SIGKILL the first time, then it finishes."""
  visible, platforms = os.environ.get("CUDA_VISIBLE_DEVICES"), os.environ.get("JAX_PLATFORMS")
  print(f"visible GPUs: {visible!r}, JAX_PLATFORMS: {platforms!r}", flush=True)
  if not os.path.exists(marker):
    open(marker, "w").close()
    os.kill(os.getpid(), signal.SIGKILL)
  return 0


def _stopped_once(marker: str) -> int:
  """Stopped before its last step the first time (as a SIGTERM'd train.py), then diverges."""
  if not os.path.exists(marker):
    open(marker, "w").close()
    raise executor.Stopped("it stopped before its last step")
  return 1


def _raises() -> int:
  raise ValueError("a broken run\nwith a second line")


@pytest.mark.e2e  # a Ray of its own
def test_jobs_on_ray_are_retried_when_lost_and_a_failure_leaves_the_others(tmp_path):
  ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])  # tests/ is not on Ray's path
  jobs = [
    executor.Job("killed", str(tmp_path / "killed"), 10, _killed_once, (str(tmp_path / "k"),)),
    executor.Job("raises", str(tmp_path / "raises"), 10, _raises),
    executor.Job("stopped", str(tmp_path / "stopped"), 10, _stopped_once, (str(tmp_path / "s"),)),
  ]
  said = []
  parallel = executor.Parallel(points=2, cpus=1, retries=1)
  # Ray's start forks processes of its own here, where JAX runs: no warning of it.
  jax.devices()  # JAX's backend started, as in a run (it warns at a fork from then on)
  with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    with executor.connected(parallel):
      # Every node (this one) sees the folder: nothing is left of the check.
      executor.check_shared(str(tmp_path / "shared"), parallel)
      assert list((tmp_path / "shared").iterdir()) == []
      outcomes = executor.run(
        jobs, parallel, str(tmp_path), label="t", say=lambda line, **_: said.append(line)
      )
  assert not [w for w in caught if "os.fork() was called" in str(w.message)]
  assert [o.status for o in outcomes] == ["done", "failed (ValueError: a broken run)", "diverged"]
  assert not ray.is_initialized()  # the Ray it started is shut down
  # Each job's line (a retry's and the 30 s progress line, which a slow machine
  # reaches, aside).
  ended = [line for line in said if "Ray runs it again" not in line and " queued, " not in line]
  assert sorted(ended) == [
    "t: killed done",
    f"t: raises failed (ValueError: a broken run); its output: {tmp_path / 'raises' / 'train.log'}",
    "t: stopped diverged",
  ]
  log = (tmp_path / "killed" / executor.LOG).read_text()
  # Two processes, each with no GPU to see and JAX on the CPU (the job asked for no GPU).
  assert log.count("==== started in process") == 2
  assert log.count("visible GPUs: '', JAX_PLATFORMS: 'cpu'") == 2
