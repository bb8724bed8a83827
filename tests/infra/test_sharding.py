"""XLA:CPU's thread pool: its size in this process, and that a process of one
device whose pool is pinned to it computes a convolution's bits as a process of
several devices does (what runtime=ray's worker processes and the replay of
their trace rely on)."""

import os
import subprocess
import sys
import textwrap

import jax

from easgd.infra import sharding

# A convolution's gradient, compiled as the training programs are (Eigen's
# convolutions, easgd.infra.compile), its bits hashed, in a process of argv[1] CPU
# devices.
_CONVOLUTION = textwrap.dedent(
  """
  import hashlib, sys
  import jax, jax.numpy as jnp, numpy as np
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
  print(hashlib.sha256(gradient.tobytes()).hexdigest())
  """
)


def _convolution_bits(devices: int, threads: int | None) -> str:
  environment = {k: v for k, v in os.environ.items() if k not in ("PJRT_NPROC", "XLA_FLAGS")}
  environment["JAX_PLATFORMS"] = "cpu"
  if threads is not None:
    environment["PJRT_NPROC"] = str(threads)
  done = subprocess.run(
    [sys.executable, "-c", _CONVOLUTION, str(devices)],
    env=environment,
    capture_output=True,
    text=True,
    timeout=120,
    check=True,
  )
  return done.stdout.strip()


def test_the_pool_is_the_larger_of_the_processors_and_the_devices(monkeypatch):
  devices = len(jax.devices("cpu"))
  monkeypatch.setenv("PJRT_NPROC", "1")
  assert sharding.cpu_threads() == max(1, devices)
  monkeypatch.setenv("PJRT_NPROC", str(devices + 3))
  assert sharding.cpu_threads() == devices + 3
  monkeypatch.delenv("PJRT_NPROC")
  assert sharding.cpu_threads() == max(len(os.sched_getaffinity(0)), devices)
  assert sharding.pinned_cpu_threads(6) == {"PJRT_NPROC": "6"}


def test_one_device_with_the_pool_of_eight_computes_the_bits_of_eight_devices():
  eight = _convolution_bits(8, None)
  assert _convolution_bits(1, 8) == eight
  # The control: one device with a pool of its own size rounds otherwise, so
  # the equality above is the pool's doing.
  assert _convolution_bits(1, 1) != eight
