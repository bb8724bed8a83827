"""Which backend a run will use, and its settings that must be made before JAX starts it.

XLA reads its flags, and JAX's CPU client its device count and thread pool,
once, when the backends start: train.py makes these settings first, for the
backend that will run and for no other:
  cpu  virtual devices (easgd.infra.sharding.configure_cpu_devices); the
       planner makes them too;
  gpu  XLA:GPU's deterministic ops (`make_gpu_deterministic`);
  tpu  nothing;
and what the run's runtime asks for on that backend
(easgd.train.runtimes.base.Runtime.environment: with config.deterministic_sums
XLA:CPU's thread pool sized by the run; under runtime=ray on a GPU, the GPU's
memory taken as needed).
"""

import importlib.metadata
import importlib.util
import logging
import os
import pkgutil

import jax

# XLA:GPU's run-to-run determinism: a flag of XLA_FLAGS (the per-program compiler
# option of the same name is refused by XLA:GPU).
GPU_DETERMINISM = "xla_gpu_deterministic_ops"
# How JAX names platforms (JAX_PLATFORMS) and its plugins, by backend.
_GPU_NAMES = ("cuda", "rocm", "gpu")
_TPU_NAMES = ("tpu",)


def expected_backend() -> str:
  """ "cpu", "gpu" or "tpu": the backend JAX will run on, asked before it starts.

  JAX_PLATFORMS (or jax_platforms) decides if set, by its first choice;
  otherwise JAX takes an accelerator whose plugin is installed (a PJRT plugin
  in the `jax_plugins` namespace or entry points, as jax discovers them, or
  libtpu), else the CPU. A plugin installed on a machine without its device
  leaves JAX on the CPU without the virtual devices: a run then has its
  workers on one CPU device, and one that asks for more devices
  (run.devices) is refused in one line naming the devices there are.
  """
  requested = _requested_platforms()
  names = [requested.split(",")[0].strip()] if requested else _accelerator_plugins()
  for backend, markers in (("gpu", _GPU_NAMES), ("tpu", _TPU_NAMES)):
    if any(marker in name.lower() for name in names for marker in markers):
      return backend
  return "cpu"


def _requested_platforms() -> str:
  """The platforms the user asked JAX for, in its order of preference ("" for none):
  JAX_PLATFORMS, or jax_platforms set in the program."""
  return os.environ.get("JAX_PLATFORMS") or _configured_platforms() or ""


def _configured_platforms() -> str | None:
  return jax.config.jax_platforms


def _accelerator_plugins() -> list[str]:
  """The installed PJRT plugins and TPU runtime that JAX would load, by name."""
  found = []
  if importlib.util.find_spec("jax_plugins") is not None:
    import jax_plugins  # noqa: PLC0415 (a namespace package, present with a plugin only)

    found += [name for _, name, _ in pkgutil.iter_modules(jax_plugins.__path__)]
  found += [entry.name for entry in importlib.metadata.entry_points(group="jax_plugins")]
  if importlib.util.find_spec("libtpu") is not None:
    found.append("libtpu")
  return found


def make_gpu_deterministic() -> None:
  """Asks XLA:GPU for deterministic ops (XLA_FLAGS), before JAX starts its backends.

  Why: XLA:GPU picks each convolution's cuDNN algorithm by timing candidates
  as it compiles, and some of them add in a nondeterministic order. Measured
  on an H200 (jax 0.11.2): two runs of the same LeNet-5 config from the same
  seed ended 20 steps later with weights up to 0.1 apart, and a run resumed
  from a checkpoint did not end as the run that never stopped; with this flag
  all were bit for bit equal (tests/test_gpu.py). Its cost in speed is not
  measured yet (bench/gpu.py --nondeterministic leaves it out). A value the
  user gave in XLA_FLAGS is kept.
  """
  flags = os.environ.get("XLA_FLAGS", "")
  if GPU_DETERMINISM not in flags:
    os.environ["XLA_FLAGS"] = f"{flags} --{GPU_DETERMINISM}=true".strip()


def _not_an_absent_tpu(record: logging.LogRecord) -> bool:
  return not (
    record.levelno < logging.WARNING and "Unable to initialize backend 'tpu'" in record.getMessage()
  )


def quiet_absent_backends() -> None:
  """Keeps out of the log JAX's INFO line that it could not start the TPU backend
  (libtpu.so on a machine without a TPU): nothing is wrong with the run. A GPU's
  backend that fails to start is still said."""
  logging.getLogger("jax._src.xla_bridge").addFilter(_not_an_absent_tpu)
