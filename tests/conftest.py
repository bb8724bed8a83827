"""Test setup: the tiers, and one compilation cache kept between runs.

The CPU tier (`pytest`, `pytest -m "not e2e"`) runs on 8 virtual CPU devices,
on every machine, an accelerator's too (JAX is then kept to its CPU backend),
and a collective that waits a minute fails instead of hanging. The GPU tier
(`pytest -m gpu`, tests/test_gpu.py) runs on the GPU JAX finds, with what
train.py sets for one, and is skipped where there is none; the CPU tier skips
its tests.

The platform is chosen in `pytest_configure`, before any test module imports
JAX: nothing here imports it at module level.

Many tests (and the train.py processes they start) compile the same
programs; JAX's persistent cache, shared through the environment with the
subprocesses, compiles each once. It is kept between runs, beside the one
train.py keeps (in easgd/jax-tests of the user's cache folder), so that a rerun
compiles only the programs a change touched: the quick tier took 184 s with
the folder empty and 66 s on the next run (2 cores). The folder grows with
every new program (nothing is evicted) and deleting it is safe. Under CI
(CI=true) a new folder is used and removed at the end, so that CI's time is a
fresh machine's. JAX_COMPILATION_CACHE_DIR, if set, names the folder instead.
"""

import os
import shutil
import tempfile

import pytest

GPU = "gpu"  # the marker of the GPU tier
_SESSION_CACHE = pytest.StashKey[str]()  # the compilation cache this session made


def gpu_tier(markexpr: str) -> bool:
  """Whether `-m` selects the GPU tier: `pytest -m gpu`, or an expression that asks for
  the marker (`-m "gpu and not e2e"`) rather than leaving it out (`-m "not gpu"`)."""
  words = markexpr.replace("(", " ( ").replace(")", " ) ").split()
  return any(word == GPU and (i == 0 or words[i - 1] != "not") for i, word in enumerate(words))


def _use_a_compilation_cache(config) -> None:
  """Points JAX_COMPILATION_CACHE_DIR, unless it is set, at the tests' folder kept
  between runs, or under CI at a new folder that the session removes at its end
  (pytest-xdist's workers inherit the variable, and with it the controller's
  folder)."""
  if "JAX_COMPILATION_CACHE_DIR" in os.environ:
    return
  if os.environ.get("CI") == "true":
    os.environ["JAX_COMPILATION_CACHE_DIR"] = tempfile.mkdtemp(prefix="jax-cache-")
    config.stash[_SESSION_CACHE] = os.environ["JAX_COMPILATION_CACHE_DIR"]
    return
  # Beside train.py's folder (easgd.infra.compile.default_cache_dir), named here:
  # importing that module would start JAX before it reads these variables.
  base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
  os.environ["JAX_COMPILATION_CACHE_DIR"] = os.path.join(base, "easgd", "jax-tests")


def pytest_unconfigure(config):
  if _SESSION_CACHE in config.stash:
    shutil.rmtree(config.stash[_SESSION_CACHE], ignore_errors=True)


def pytest_configure(config):
  # JAX reads these variables when it is imported: before anything imports it.
  _use_a_compilation_cache(config)
  os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
  if gpu_tier(config.option.markexpr or ""):
    # What train.py sets for an accelerator, and nothing CPU-only.
    from easgd.infra import platform  # noqa: PLC0415 (imports JAX, which has not started)

    platform.make_gpu_deterministic()
    return
  # Must be set before JAX starts its backends.
  os.environ["XLA_FLAGS"] = " ".join(
    [
      os.environ.get("XLA_FLAGS", ""),
      "--xla_force_host_platform_device_count=8",
      "--xla_cpu_collective_call_warn_stuck_timeout_seconds=3",
      # A hang guard only: a device thread of a busy machine may come many seconds late.
      "--xla_cpu_collective_call_terminate_timeout_seconds=60",
    ]
  )
  import jax  # noqa: PLC0415 (after the environment above)

  from easgd.infra import platform, sharding  # noqa: PLC0415

  # XLA:CPU sizes its thread pool by the larger of the processors and the process's
  # devices, and splits some sums by that size: a train.py of 4 devices on a 2-core
  # machine (4 threads) and this process of 8 (8 threads) round the same run's sums
  # differently, where on 8 cores or more both have the machine's count. Every
  # process the tests start sizes its pool as this one (PJRT_NPROC, read first), so
  # that a run in train.py and the same run in this process have the same bits on
  # any machine. A test of train.py's own pin (config.deterministic_sums) starts its
  # processes without it (runs.own_pool).
  os.environ[sharding.CPU_THREADS_VARIABLE] = str(max(sharding.processors(), 8))

  if platform.expected_backend() != "cpu":
    # An accelerator's machine: this process and the train.py processes the tests
    # start run on the CPU all the same. Only there: JAX_PLATFORMS=cpu slowed the
    # multi-process tests here (test_distributed.py's LeNet-5 test: 102 s against
    # 80 s, one run each).
    os.environ["JAX_PLATFORMS"] = "cpu"
    jax.config.update("jax_platforms", "cpu")
  assert len(jax.devices()) == 8, jax.devices()


def pytest_collection_modifyitems(config, items):
  """GPU-tier tests run under `-m gpu` on a machine with an accelerator; else skipped."""
  if gpu_tier(config.option.markexpr or ""):
    import jax  # noqa: PLC0415 (after pytest_configure)

    platform = jax.devices()[0].platform
    if platform == GPU:
      return
    reason = f"the GPU tier needs a GPU; JAX finds only {platform} devices here"
  else:
    reason = "the GPU tier: pytest -m gpu on a machine with a GPU"
  for item in items:
    if item.get_closest_marker(GPU) is not None:
      item.add_marker(pytest.mark.skip(reason=reason))


@pytest.fixture(scope="session")
def small_run(tmp_path_factory):
  """algorithm -> the workdir of runs.SMALL_RUN trained to the end in this process
  (a mesh of 4 of the 8 devices). Shared by several tests: copy it before changing it.
  """
  from easgd.train import trainer  # noqa: PLC0415 (after the devices are set)
  from runs import small_config  # noqa: PLC0415

  done = {}

  def run(algorithm: str):
    if algorithm not in done:
      workdir = tmp_path_factory.mktemp(f"small_{algorithm}")
      result = trainer.train_and_evaluate(small_config(algorithm=algorithm), str(workdir))
      assert not result.preempted
      done[algorithm] = workdir
    return done[algorithm]

  return run


@pytest.fixture(scope="session")
def starter():
  """Runs the absl programs (train.py, sweep.py, easgd.plan) as processes of their own,
  forked from one that has imported their libraries (tests/forked.py)."""
  import forked  # noqa: PLC0415 (a helper of the tests, beside this file)

  started = forked.Starter({**os.environ, "PYTHONDONTWRITEBYTECODE": "1"})
  yield started
  started.close()
