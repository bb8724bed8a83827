"""Compiling the training programs with the compiler options that help on the backend in use.

On the CPU (jaxlib 0.10), XLA hands convolutions to YNNPACK fusions by
default, and YNNPACK computes a convolution's filter gradient (which XLA
rewrites as a batch-folded convolution) many times slower than Eigen's
convolution does (bench/conv_grad.py). Asking for YNNPACK fusions of dot
products only sends the convolutions back to Eigen. The option is given to
each program as it is compiled, not through XLA_FLAGS, so that nothing else
in the process changes.

On GPUs and TPUs no option is given (XLA:GPU's determinism is a flag of
XLA_FLAGS, set by easgd.infra.platform).

A jaxlib that does not know an option rejects it; the program is then
compiled without it and one line says so.
"""

from absl import logging

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
