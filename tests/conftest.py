"""Test setup: 8 virtual CPU devices, collectives that fail fast instead of
hanging, and one compilation cache for the session.

Many tests (and the train.py processes they start) compile the same
programs; JAX's persistent cache, shared through the environment with the
subprocesses, compiles each once. Set JAX_COMPILATION_CACHE_DIR to keep it
across sessions.
"""

import os
import tempfile

# Must be set before JAX starts its backends.
os.environ["XLA_FLAGS"] = " ".join(
  [
    os.environ.get("XLA_FLAGS", ""),
    "--xla_force_host_platform_device_count=8",
    "--xla_cpu_collective_call_warn_stuck_timeout_seconds=3",
    "--xla_cpu_collective_call_terminate_timeout_seconds=8",
  ]
)
os.environ.setdefault("JAX_COMPILATION_CACHE_DIR", tempfile.mkdtemp(prefix="jax-cache-"))
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")

import jax  # noqa: E402

assert len(jax.devices()) == 8, jax.devices()


import pytest  # noqa: E402

from runs import small_config  # noqa: E402


@pytest.fixture(scope="session")
def small_run(tmp_path_factory):
  """algorithm -> the workdir of runs.SMALL_RUN trained to the end in this process
  (a mesh of 4 of the 8 devices). Shared by several tests: copy it before changing it.
  """
  from easgd import trainer  # noqa: PLC0415 (after the devices are set)

  done = {}

  def run(algorithm: str):
    if algorithm not in done:
      workdir = tmp_path_factory.mktemp(f"small_{algorithm}")
      result = trainer.train_and_evaluate(small_config(algorithm=algorithm), str(workdir))
      assert not result.preempted
      done[algorithm] = workdir
    return done[algorithm]

  return run
