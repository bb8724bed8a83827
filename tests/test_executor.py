"""easgd.executor: the refusals of --parallel's flags; jobs one after another handing a
preemption notice to the one training; jobs as Ray Tune's trials (easgd.tuning): run
again when their process is lost, a failure one line, the others finished, each with
the environment a job is given."""

import signal
import sys
import types

import pytest

import runs
from easgd import executor
from easgd.errors import ConfigError


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
  address = f"127.0.0.1:{runs.free_port()}"
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


def _job(tmp_path, name: str, code: str, total: int = 10) -> executor.Job:
  """A job whose "train.py" is `code`, run by Python in the job's folder W (a
  checkpoint is a folder W/checkpoints/STEP)."""
  workdir = tmp_path / name
  workdir.mkdir()
  program = f"import os, signal, sys, time\nW = {str(workdir)!r}\n{code}"
  return executor.Job(name, str(workdir), total, (sys.executable, "-c", program))


SAVES = "os.makedirs(os.path.join(W, 'checkpoints', '{step}'))"


def test_one_after_another_a_notice_is_handed_to_the_run_training_and_stops_the_rest(tmp_path):
  """A SIGTERM to the process that runs the jobs one after another goes to the job's
  process, which saves where it is (as train.py does); the jobs after it wait for the
  same command: Stopped."""
  noticed = (
    "signal.signal(signal.SIGTERM, lambda *_: (" + SAVES.format(step=5) + ", sys.exit(0)))\n"
    "os.kill(os.getppid(), signal.SIGTERM)\n"  # the notice, to the process of the jobs
    "time.sleep(120)\n"  # until it is handed on
  )
  jobs = [
    _job(tmp_path, "a", SAVES.format(step=10)),
    _job(tmp_path, "b", noticed),
    _job(tmp_path, "c", SAVES.format(step=10)),
  ]
  said = []
  own = signal.getsignal(signal.SIGTERM)
  with pytest.raises(executor.Stopped, match="b saved its step 5"):
    executor.run(jobs, None, str(tmp_path), say=lambda line, **_: said.append(line))
  assert said == ["run: a", "run: b"] and not (tmp_path / "c" / "checkpoints").exists()
  assert signal.getsignal(signal.SIGTERM) is own


@pytest.mark.e2e  # a Ray of its own
def test_jobs_on_tune_are_run_again_when_lost_and_a_failure_leaves_the_others(tmp_path):
  shown = "print(repr(os.environ.get('CUDA_VISIBLE_DEVICES')), os.environ.get('JAX_PLATFORMS'))\n"
  jobs = [
    _job(  # its process dies of SIGKILL the first time: Tune runs it again
      tmp_path,
      "killed",
      shown
      + "if not os.path.exists(W + '/once'):\n"
      + "  open(W + '/once', 'w').close(); os.kill(os.getpid(), signal.SIGKILL)\n"
      + SAVES.format(step=10),
    ),
    _job(tmp_path, "fails", "sys.exit(3)"),
    _job(tmp_path, "diverges", "sys.exit(1)"),
  ]
  said = []
  parallel = executor.Parallel(points=2, cpus=1, retries=1)
  outcomes = executor.run(
    jobs, parallel, str(tmp_path), label="t", say=lambda line, **_: said.append(line)
  )
  assert [o.status for o in outcomes] == ["done", "failed (exit 3)", "diverged"]
  import ray  # noqa: PLC0415

  assert not ray.is_initialized()  # the Ray it started is shut down
  assert "t: killed lost its process or stopped short; Tune runs it again, from its checkpoint" in (
    said
  )
  ended = [line for line in said if "Tune runs it again" not in line and " so far" not in line]
  assert sorted(ended) == ["t: diverges diverged", "t: fails failed (exit 3)", "t: killed done"]
  log = (tmp_path / "killed" / executor.LOG).read_text()
  # Two processes, each shown no GPU and JAX on the CPU (the job asked for no GPU).
  assert log.count("==== started in process") == 2
  assert log.count("'' cpu") == 2
  assert (tmp_path / "tune" / "tuner.pkl").is_file()  # Tune's experiment, for a rerun


def test_the_progress_line_counts_the_points_ended_running_and_waiting():
  from easgd import tuning  # noqa: PLC0415 (Ray Tune)
  from easgd.train import trainer  # noqa: PLC0415

  assert tuning.CHANGES_FILE == trainer.CHANGES_FILE  # the exploits' record is the run's

  def trial(status, **result):
    return types.SimpleNamespace(status=status, last_result=result, error_msg="")

  trials = [
    trial("TERMINATED", outcome="done", step=300),
    trial("TERMINATED", outcome="segment", step=100),  # stopped by ASHA
    trial("ERROR"),
    trial("RUNNING"),
    trial("PAUSED"),
  ]
  assert tuning.progress(trials, 6) == (
    "3 of 6 points ended (1 done, 1 stopped early, 1 failed), 1 running, 2 waiting"
  )
  assert [tuning._outcome(t).status for t in trials[:3]] == [
    "done",
    "stopped early (step 100)",
    "failed (lost)",
  ]
