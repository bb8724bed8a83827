"""Test setup: 8 virtual CPU devices, and collectives that fail fast instead of hanging."""

import os
import sys

# Must be set before JAX starts its backends.
os.environ["XLA_FLAGS"] = " ".join(
  [
    os.environ.get("XLA_FLAGS", ""),
    "--xla_force_host_platform_device_count=8",
    "--xla_cpu_collective_call_warn_stuck_timeout_seconds=3",
    "--xla_cpu_collective_call_terminate_timeout_seconds=8",
  ]
)
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jax  # noqa: E402

assert len(jax.devices()) == 8, jax.devices()
