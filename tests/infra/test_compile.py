"""Training programs compile with the platform's options, and without them if rejected."""

import os

import jax
import jax.numpy as jnp
import numpy as np
from absl import logging as absl_logging
from jax.experimental.compilation_cache import compilation_cache

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


def test_the_cache_folder_is_the_flag_s_else_jax_s_variable_else_the_user_s_cache(monkeypatch):
  monkeypatch.setenv("XDG_CACHE_HOME", "/cache/home")
  monkeypatch.delenv(compile_lib.CACHE_VARIABLE, raising=False)
  assert compile_lib.cache_dir(None) == "/cache/home/easgd/jax"
  monkeypatch.setenv(compile_lib.CACHE_VARIABLE, "/elsewhere")
  assert compile_lib.cache_dir(None) == "/elsewhere"
  assert compile_lib.cache_dir("") == ""  # off, whatever the variable says
  monkeypatch.setenv("HOME", "/home/user")
  assert compile_lib.cache_dir("~/cache") == "/home/user/cache"
  assert compile_lib.cache_dir("relative") == os.path.join(os.getcwd(), "relative")


def test_a_compiled_program_is_kept_in_the_cache_folder_and_off_means_off(tmp_path):
  names = ("jax_enable_compilation_cache", "jax_compilation_cache_dir")
  before = {name: getattr(jax.config, name) for name in names}
  program = jax.jit(lambda x: jnp.tanh(x) * 3.0 + 1.0).lower(jnp.ones((7, 5)))
  try:
    compile_lib.use_persistent_cache(str(tmp_path / "on"))
    compile_lib.compile_program(program, "cpu")
    assert os.listdir(tmp_path / "on")
    # What the processes a run starts are given (runtime=ray's actors): the same folder.
    given = compile_lib.cache_environment()
    assert given[compile_lib.CACHE_VARIABLE] == str(tmp_path / "on")
    assert given["JAX_ENABLE_COMPILATION_CACHE"] == "true"
    compile_lib.use_persistent_cache("")
    assert not jax.config.jax_enable_compilation_cache
    assert compile_lib.cache_environment() == {"JAX_ENABLE_COMPILATION_CACHE": "false"}
  finally:  # the tests' cache again (tests/conftest.py)
    for name, value in before.items():
      jax.config.update(name, value)
    compilation_cache.reset_cache()
