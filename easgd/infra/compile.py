"""Compiling the training programs with the compiler options that help on the backend in use.

On the CPU, XLA hands convolutions to YNNPACK fusions by default, and under
jaxlib 0.10 YNNPACK computed a convolution's filter gradient (which XLA
rewrites as a batch-folded convolution) many times slower than Eigen's
convolution did (bench/cpu/conv_grad.py). Asking for YNNPACK fusions of dot
products only sends the convolutions back to Eigen; under jaxlib 0.11 that
still makes ResNet-20's step about 9% faster (bench/cpu/README.md). The
option is given to each program as it is compiled, not through XLA_FLAGS, so
that nothing else in the process changes.

On GPUs and TPUs no option is given (XLA:GPU's determinism is a flag of
XLA_FLAGS, set by easgd.infra.platform).

A jaxlib that does not know an option rejects it; the program is then
compiled without it and one line says so.

Compiled programs are kept on disk by JAX's persistent compilation cache
(`use_persistent_cache`, on by default in train.py, and so in every sweep's
points); the processes a run starts (runtime=ray's workers and servers) are
given the same (`cache_environment`).
"""

import os

import jax
from absl import logging
from jax.experimental.compilation_cache import compilation_cache

# Per platform: the options every training program is compiled with.
OPTIONS: dict[str, dict[str, str]] = {
  "cpu": {"xla_cpu_experimental_ynn_fusion_type": "LIBRARY_FUSION_TYPE_INDIVIDUAL_DOT"},
}

_rejected: set[tuple] = set()


def options_for(platform: str) -> dict[str, str]:
  """The compiler options of `platform`'s training programs ({} for none)."""
  return dict(OPTIONS.get(platform, {}))


def compile_program(lowered, platform: str, options: dict[str, str] | None = None):
  """`lowered.compile()` with `options` (default: `options_for(platform)`); without them,
  and with one logged line, if the compiler rejects them."""
  options = options_for(platform) if options is None else options
  if not options:
    return lowered.compile()
  key = tuple(sorted(options.items()))
  if key not in _rejected:
    try:
      return lowered.compile(compiler_options=options)
    except Exception as error:  # noqa: BLE001 (XLA reports a rejected option in several ways)
      if not any(name in str(error) for name in options):
        raise  # a failure of the program, not of the options
      _rejected.add(key)
      logging.warning(
        "the compiler rejected %s (%s); compiling without them, at the default speed",
        ", ".join(f"{name}={value}" for name, value in options.items()),
        str(error).splitlines()[0][:200],
      )
  return lowered.compile()


# JAX's own variable for its persistent compilation cache, which a user's setting
# of it moves (or, set to "", turns off).
CACHE_VARIABLE = "JAX_COMPILATION_CACHE_DIR"


def default_cache_dir() -> str:
  """Where compiled programs are kept unless told: the user's cache folder
  ($XDG_CACHE_HOME, else ~/.cache), under easgd/jax."""
  base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
  return os.path.join(base, "easgd", "jax")


def cache_dir(directory: str | None) -> str:
  """The folder compiled programs are kept in, absolute ("" for none): `directory`
  ("" for none), or for None JAX_COMPILATION_CACHE_DIR if it is set, else
  `default_cache_dir()`."""
  if directory is None:
    directory = os.environ.get(CACHE_VARIABLE, default_cache_dir())
  return os.path.abspath(os.path.expanduser(directory)) if directory else ""


def use_persistent_cache(directory: str) -> None:
  """Keeps compiled programs in `directory` (`cache_dir`'s answer; "" turns the cache
  off), so that a sweep's points, a rerun and a resumed run compile each program
  once. An entry is keyed by the program's HLO, the compiler options and the
  backend: a cached program computes the same bits as a compiled one. Nothing
  is evicted (JAX's size limit needs the filelock package): the folder grows
  with every new program, and deleting it is safe."""
  # JAX opens its cache at the first compilation and keeps it: closed here, it is
  # opened again, under these settings, at the next.
  compilation_cache.reset_cache()
  if not directory:
    jax.config.update("jax_enable_compilation_cache", False)
    return
  jax.config.update("jax_enable_compilation_cache", True)
  jax.config.update("jax_compilation_cache_dir", directory)


def cache_environment() -> dict[str, str]:
  """The environment variables that give a process this process's persistent cache:
  its folder and its threshold, or the cache turned off. A process a run starts
  (a runtime=ray worker restarted after a failure, the next run's) then loads the
  programs already compiled instead of compiling them again; on another node the
  folder is that node's own."""
  if not (jax.config.jax_enable_compilation_cache and jax.config.jax_compilation_cache_dir):
    return {"JAX_ENABLE_COMPILATION_CACHE": "false"}
  return {
    "JAX_ENABLE_COMPILATION_CACHE": "true",
    CACHE_VARIABLE: jax.config.jax_compilation_cache_dir,
    "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": str(
      jax.config.jax_persistent_cache_min_compile_time_secs
    ),
  }
