"""What the multi-process and fault tests share: one small run, as a config and as
train.py flags, processes whose output is read while they run, and
checkpoints read back as NumPy whatever the device layout that wrote them.
"""

import contextlib
import functools
import os
import re
import signal
import subprocess
import sys
import threading
import time

import jax
import numpy as np

from easgd import launch as launch_module
from easgd.configs import default
from easgd.infra import checkpoint, scalars, sharding

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# 4 workers (or models) on 4 devices, the MLP (quick to compile), 40 steps,
# a checkpoint every 10.
SMALL_RUN = {
  "model": "mlp",
  "workers": 4,
  "pipeline.models": 4,
  "run.devices": 4,
  "outer.moving_rate": 0.2,
  "run.total_steps": 40,
  "run.checkpoint_every": 10,
  "run.log_every": 10,
  "run.eval_every": 0,
  "pipeline.stage_steps": 10,
}


@functools.cache
def _ports():
  # A worker that xdist starts after a crash is named anew (gw2 of 2 workers): it
  # takes a share again, not a port past the range.
  shares = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
  worker = int(os.environ.get("PYTEST_XDIST_WORKER", "gw0").removeprefix("gw"))
  return launch_module.free_ports(worker % shares, shares)


def free_port() -> int:
  """A port to listen on, never one the kernel hands out on its own meanwhile, and
  never one another pytest-xdist worker of this run chooses (each has its share)."""
  port = next(_ports(), None)
  assert port is not None, "no free port left between Ray's and the kernel's ranges"
  return port


def config_with(overrides: dict | None = None, **top_level):
  """The default config with `overrides` (dotted fields) and top-level fields set."""
  config = default.get_config()
  config.update_from_flattened_dict({**(overrides or {}), **top_level})
  return config


def small_config(overrides: dict | None = None, **top_level):
  """SMALL_RUN's config with `overrides` (dotted fields) and top-level fields set."""
  config = default.get_config()
  config.update_from_flattened_dict({**SMALL_RUN, **(overrides or {}), **top_level})
  return config


def small_flags(overrides: dict | None = None, **top_level) -> list[str]:
  values = {**SMALL_RUN, **(overrides or {}), **top_level}
  return [f"--config.{field}={value}" for field, value in values.items()]


def read_state(path) -> list[np.ndarray]:
  """The leaves of a checkpoint's state as NumPy arrays, on any device layout."""
  return checkpoint.read_leaves(str(path))


def assert_same_bits(a_dir, b_dir, step: int) -> None:
  """The checkpoints of step `step` in workdirs `a_dir` and `b_dir` hold the same bytes."""
  a = read_state(a_dir / "checkpoints" / str(step) / "state")
  b = read_state(b_dir / "checkpoints" / str(step) / "state")
  assert len(a) == len(b) > 10
  for x, y in zip(a, b, strict=True):
    assert x.dtype == y.dtype and x.tobytes() == y.tobytes()


def assert_same_scalars(run_dir, replay_dir) -> None:
  """A run and the replay of its trace logged the same values for every tag but
  those that measure wall-clock time (the training means, the counts, the
  trace's times and the evaluations)."""
  run, replay = scalars.read(str(run_dir)), scalars.read(str(replay_dir))
  assert set(run) == set(replay) and "train/loss" in run and "cluster/live_workers" in run
  run, replay = scalars.without_wall_clock(run), scalars.without_wall_clock(replay)
  for tag in sorted(run):
    assert run[tag] == replay[tag], (tag, run[tag], replay[tag])


def steps_saved(workdir) -> list[int]:
  return checkpoint.saved_steps(str(workdir))


def assert_stopped_and_resumed_ends_as_never_stopped(
  tmp_path, algorithm, overrides, stop, straight=None
):
  """SMALL_RUN of `algorithm` with `overrides` trained straight to its end (or the
  workdir `straight` of that run), and trained to step `stop` then resumed to its end:
  the same bytes in every leaf at the end."""
  from easgd.train import trainer  # noqa: PLC0415 (after conftest has set the devices)

  stopped = tmp_path / "stopped"
  if straight is None:
    straight = tmp_path / "straight"
    trainer.train_and_evaluate(small_config(overrides, algorithm=algorithm), str(straight))
  early = small_config({**overrides, "run.total_steps": stop}, algorithm=algorithm)
  trainer.train_and_evaluate(early, str(stopped))
  assert steps_saved(stopped)[-1] == stop
  trainer.train_and_evaluate(small_config(overrides, algorithm=algorithm), str(stopped))
  end = SMALL_RUN["run.total_steps"]
  a = read_state(straight / "checkpoints" / str(end) / "state")
  b = read_state(stopped / "checkpoints" / str(end) / "state")
  assert len(a) == len(b) > 10
  for x, y in zip(a, b, strict=True):
    assert x.dtype == y.dtype and x.tobytes() == y.tobytes()


class Process:
  """A command run from the repository, its stdout and stderr collected as it runs.

  It leads a process group of its own: once it has ended, `wait` ends what it
  leaves behind (nothing, where it is not killed mid-test: tests/test_ownership.py
  and tests/test_sweep.py look for survivors), and a `wait_for` that fails ends
  the group, so that no later test shares the machine with it.
  """

  def __init__(self, *args: str, env: dict[str, str] | None = None):
    self.popen = subprocess.Popen(
      [sys.executable, *args],
      cwd=REPO,
      env=env,
      stdout=subprocess.PIPE,
      stderr=subprocess.STDOUT,
      text=True,
      start_new_session=True,
    )
    self._lines: list[str] = []
    self._reader = threading.Thread(target=self._read, daemon=True)
    self._reader.start()

  def _read(self) -> None:
    for line in self.popen.stdout:
      self._lines.append(line)

  def output(self) -> str:
    return "".join(self._lines)

  def wait_for(self, pattern: str, timeout: float) -> re.Match:
    """The first match of `pattern` in the output; fails, and ends the process group,
    after `timeout` s or at exit."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
      match = re.search(pattern, self.output())
      if match:
        return match
      if self.popen.poll() is not None:
        self._reader.join(timeout=5)
        match = re.search(pattern, self.output())
        if match:
          return match
        self._end_group()
        raise AssertionError(f"exited ({self.popen.returncode}) before {pattern!r}:\n{self.tail()}")
      time.sleep(0.05)
    self._end_group()
    raise AssertionError(f"no {pattern!r} within {timeout} s:\n{self.tail()}")

  def _end_group(self) -> None:
    with contextlib.suppress(ProcessLookupError):
      os.killpg(self.popen.pid, signal.SIGKILL)

  def wait(self, timeout: float) -> int:
    """The exit status; kills the process and fails after `timeout` s."""
    try:
      code = self.popen.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
      self.popen.kill()
      self.popen.wait()
      raise AssertionError(f"still running after {timeout} s:\n{self.tail()}") from None
    finally:
      self._end_group()  # what it left in its group
    self._reader.join(timeout=5)
    return code

  def tail(self, lines: int = 40) -> str:
    return "".join(self._lines[-lines:])


# The wrapper that has a run signal itself at the end of a phase of a step (its doc).
SIGNAL_AT = "tests/signal_at.py"


def _wrapper(signal_at: tuple) -> tuple[str, ...]:
  return (SIGNAL_AT, *map(str, signal_at)) if signal_at else ()


def own_pool() -> dict[str, str]:
  """This process's environment without the pool size that tests/conftest.py gives
  every process the tests start: train.py then sizes XLA:CPU's thread pool itself
  (by the machine, or by the run with config.deterministic_sums)."""
  return {k: v for k, v in os.environ.items() if k != sharding.CPU_THREADS_VARIABLE}


def train(workdir, *flags: str, signal_at: tuple = (), env: dict | None = None) -> Process:
  """train.py; `signal_at`: tests/signal_at.py's PHASE, STEP and options, where the run
  signals itself (SIGKILL unless told); `env`: its environment (None: this process's)."""
  return Process(*_wrapper(signal_at), "train.py", f"--workdir={workdir}", *flags, env=env)


def launch(
  workdir,
  *flags: str,
  processes: int = 2,
  grace: float | None = None,
  signal_at: tuple = (),
  env: dict | None = None,
) -> Process:
  """train.py over `processes` processes (easgd.launch; `grace`: its --grace);
  `signal_at`: as train's, in every process (--process=N: in process N only); `env`:
  as train's."""
  given = () if grace is None else (f"--grace={grace:g}",)
  given = (f"--port={free_port()}", *given)
  command = ("-m", "easgd.launch", f"--processes={processes}", *given, "--")
  command = (*command, *_wrapper(signal_at), "train.py")
  return Process(*command, f"--workdir={workdir}", *flags, env=env)


def assert_bfloat16_run_keeps_float32_state(tmp_path, steps: int, accuracy: float = 0.95) -> None:
  """config.dtype=bfloat16 computes in bfloat16; the default run still reaches
  `accuracy` (by default its band) after `steps` of its 600 steps at a constant
  rate, and what it keeps (center, workers, optimizer state) is float32. The GPU
  tier (test_gpu.py: 400 steps) runs it to the band; the CPU tier (test_train.py),
  where a bfloat16 step costs about 2.5 float32 ones, to 0.85 in 100 steps (0.914
  measured, as float32's 0.912; 0.954 at step 250)."""
  from easgd.train import trainer  # noqa: PLC0415 (after the tier has chosen the devices)

  overrides = {"run.total_steps": steps, "run.log_every": 0, "run.eval_every": 0}
  config = config_with(overrides | {"run.checkpoint_every": 0}, dtype="bfloat16")
  result = trainer.train_and_evaluate(config, str(tmp_path))
  assert result.metrics["eval/center_accuracy"] >= accuracy
  saved = read_state(tmp_path / "checkpoints" / str(steps) / "state")
  kept = [np.asarray(leaf) for leaf in jax.tree.leaves(jax.device_get(result.state))]
  for leaves in (saved, kept):
    assert {leaf.dtype.name for leaf in leaves if leaf.dtype.kind in "fV"} == {"float32"}


def stop_resume_and_replay(tmp_path, workdir, flags, run, sigterm_at, kill_at, total, timeout):
  """`run`, train.py started with `flags` in `workdir`: SIGTERM once it logs step
  `sigterm_at` (exit 0 before its end, a cut saved); a rerun killed (kill -9) once it
  logs step `kill_at`, the checkpoint before it committed; a rerun to step `total`.
  Then the replay of the whole trace, cut back at each resume, in tmp_path/replay:
  the final bits and every logged value but wall-clock time are the run's."""
  from easgd.train.runtimes import trace  # noqa: PLC0415 (after conftest has set the devices)

  run.wait_for(rf"step {sigterm_at}/", timeout)
  run.popen.send_signal(signal.SIGTERM)
  assert run.wait(timeout) == 0, run.tail()
  assert sigterm_at <= steps_saved(workdir)[-1] < total  # it stopped, before its end

  run = train(workdir, *flags)
  run.wait_for(rf"step {kill_at}/", timeout)
  run.popen.kill()
  run.wait(60)  # and what it left in its group
  every = next(int(f.split("=")[1]) for f in flags if f.startswith("--config.run.checkpoint_every"))
  assert kill_at - kill_at % every <= steps_saved(workdir)[-1] < total

  run = train(workdir, *flags)
  assert run.wait(2 * timeout) == 0, run.tail()
  replay = train(
    tmp_path / "replay",
    *[flag for flag in flags if not flag.startswith(("--config.runtime", "--config.ray."))],
    f"--config.cluster.replay={workdir / trace.FILE}",
  )
  assert replay.wait(2 * timeout) == 0, replay.tail()
  assert_same_bits(workdir, tmp_path / "replay", total)
  # The log window went into each checkpoint: the stopped run logged what the replay did.
  assert_same_scalars(workdir, tmp_path / "replay")
