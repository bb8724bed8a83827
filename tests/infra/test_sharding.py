"""XLA:CPU's thread pool: a process of one device whose pool is sized as another
process's (`cpu_threads`) computes a convolution's bits as that process of
several devices does, which runtime=ray's worker processes and the replay of
their trace rely on; and the environment that pins the pool to a run's devices."""

import os
import subprocess
import sys
import textwrap

import jax
import pytest

from easgd.infra import sharding

# A convolution's gradient, compiled as the training programs are (Eigen's
# convolutions, easgd.infra.compile), in a process of argv[1] CPU devices: its
# bits hashed, and that process's pool as `cpu_threads` gives it.
_CONVOLUTION = textwrap.dedent(
  """
  import hashlib, sys
  import jax, jax.numpy as jnp, numpy as np
  from easgd.infra import sharding
  from easgd.infra.compile import compile_program
  jax.config.update("jax_num_cpu_devices", int(sys.argv[1]))
  rng = np.random.default_rng(0)
  images = jnp.asarray(rng.normal(size=(32, 28, 28, 6)), jnp.float32)
  kernel = jnp.asarray(rng.normal(size=(5, 5, 6, 16)), jnp.float32)
  def loss(kernel):
    out = jax.lax.conv_general_dilated(images, kernel, (1, 1), "VALID",
                                       dimension_numbers=("NHWC", "HWIO", "NHWC"))
    return jnp.sum(jnp.tanh(out))
  program = compile_program(jax.jit(jax.grad(loss)).lower(kernel), "cpu")
  gradient = np.asarray(program(kernel))
  print(hashlib.sha256(gradient.tobytes()).hexdigest(), sharding.cpu_threads())
  """
)


def _convolution(devices: int, processors: int | None) -> tuple[str, int]:
  """(the gradient's hash, the pool's size) in a process of `devices` devices, its
  processor count given as `processors` (None: the machine's)."""
  unset = ("PJRT_NPROC", "NPROC", "XLA_FLAGS")
  environment = {k: v for k, v in os.environ.items() if k not in unset}
  environment["JAX_PLATFORMS"] = "cpu"
  if processors is not None:
    environment["PJRT_NPROC"] = str(processors)
  done = subprocess.run(
    [sys.executable, "-c", _CONVOLUTION, str(devices)],
    env=environment,
    capture_output=True,
    text=True,
    timeout=120,
    check=True,
  )
  digest, threads = done.stdout.split()
  return digest, int(threads)


@pytest.mark.e2e  # three processes that start JAX
def test_one_device_sized_as_a_process_of_eight_computes_its_bits():
  eight, threads = _convolution(8, None)
  assert threads >= 8  # the larger of this machine's processors and 8
  assert _convolution(1, threads)[0] == eight
  # The control: one device with a pool of one rounds otherwise, so the equality
  # above is the pool's doing.
  alone, alone_threads = _convolution(1, 1)
  assert alone_threads == 1 and alone != eight


def test_the_pool_counts_as_xla_reads_the_processors(monkeypatch):
  monkeypatch.delenv("PJRT_NPROC", raising=False)
  monkeypatch.setenv("NPROC", "1000")
  assert sharding.cpu_threads() == 1000
  monkeypatch.setenv("PJRT_NPROC", "999")  # read first
  assert sharding.cpu_threads() == 999
  monkeypatch.setenv("PJRT_NPROC", "many")  # not a count: XLA reads on
  assert sharding.cpu_threads() == 1000
  monkeypatch.setenv("PJRT_NPROC", "1")  # fewer than this process's 8 devices
  assert sharding.cpu_threads() == len(jax.local_devices(backend="cpu")) == 8
  assert sharding.cpu_threads_environment(6) == {"PJRT_NPROC": "6"}
