"""Training programs compile with the platform's options, and without them if rejected."""

import jax
import jax.numpy as jnp
import numpy as np
from absl import logging as absl_logging

from easgd.infra import compile as compile_lib


def _lowered():
  x = jnp.arange(12.0).reshape(3, 4)
  return jax.jit(lambda x: jnp.tanh(x) @ x.T).lower(x), x


def test_the_cpu_options_are_accepted_and_change_no_result(caplog):
  lowered, x = _lowered()
  with caplog.at_level("WARNING", logger=absl_logging.get_absl_logger().name):
    compiled = compile_lib.compile_program(lowered, "cpu")
  assert "rejected" not in caplog.text
  assert np.array_equal(compiled(x), lowered.compile()(x))
  assert compile_lib.options_for("cpu") and compile_lib.options_for("gpu") == {}


def test_a_rejected_option_falls_back_to_the_default_with_one_line(caplog):
  lowered, x = _lowered()
  rejected = {"xla_cpu_experimental_ynn_fusion_type": "NO_SUCH_FUSION_TYPE"}
  with caplog.at_level("WARNING", logger=absl_logging.get_absl_logger().name):
    compiled = compile_lib.compile_program(lowered, "cpu", rejected)
    again = compile_lib.compile_program(lowered, "cpu", rejected)
  warnings = [r for r in caplog.records if "rejected" in r.getMessage()]
  assert len(warnings) == 1
  assert "xla_cpu_experimental_ynn_fusion_type=NO_SUCH_FUSION_TYPE" in warnings[0].getMessage()
  assert np.array_equal(compiled(x), again(x))
