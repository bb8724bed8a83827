"""Which backend a run expects before JAX starts, and the settings made for it."""

import importlib.metadata
import importlib.util
import logging as std_logging
import os

import pytest

from easgd.infra import platform


class _Entry:
  def __init__(self, name):
    self.name = name


@pytest.mark.parametrize(
  "requested,plugins,backend",
  [
    ("", [], "cpu"),  # nothing asked, no accelerator installed
    ("", ["cuda"], "gpu"),  # jax-cuda12-plugin's entry point
    ("", ["xla_cuda13"], "gpu"),  # a module of the jax_plugins namespace
    ("", ["rocm"], "gpu"),
    ("", ["libtpu"], "tpu"),
    ("cpu", ["cuda"], "cpu"),  # asked for: the CPU, a plugin or not
    ("cuda", [], "gpu"),
    ("tpu,cpu", [], "tpu"),  # the first choice decides
    ("cpu,cuda", ["cuda"], "cpu"),
  ],
)
def test_the_backend_is_expected_as_jax_will_choose_it(monkeypatch, requested, plugins, backend):
  monkeypatch.setenv("JAX_PLATFORMS", requested)
  # (This process's JAX was told "cpu" before it started: the variable alone decides here.)
  monkeypatch.setattr(platform, "_configured_platforms", lambda: None)
  # What jax discovers a plugin by: entry points of the group jax_plugins, and libtpu.
  entries = [_Entry(name) for name in plugins if name != "libtpu"]
  monkeypatch.setattr(
    importlib.metadata, "entry_points", lambda group: entries if group == "jax_plugins" else []
  )
  find_spec = importlib.util.find_spec
  present = {"libtpu"} & set(plugins)
  monkeypatch.setattr(
    importlib.util,
    "find_spec",
    lambda name, *rest: (
      object()
      if name in present
      else None
      if name in ("libtpu", "jax_plugins")
      else find_spec(name, *rest)
    ),
  )
  assert platform.expected_backend() == backend


def test_gpu_determinism_is_asked_for_once_and_a_users_choice_kept(monkeypatch):
  monkeypatch.setenv("XLA_FLAGS", "--xla_gpu_autotune_level=2")
  platform.make_gpu_deterministic()
  platform.make_gpu_deterministic()
  assert os.environ["XLA_FLAGS"] == "--xla_gpu_autotune_level=2 --xla_gpu_deterministic_ops=true"
  monkeypatch.setenv("XLA_FLAGS", "--xla_gpu_deterministic_ops=false")
  platform.make_gpu_deterministic()
  assert os.environ["XLA_FLAGS"] == "--xla_gpu_deterministic_ops=false"


def test_only_the_absent_tpu_s_info_line_is_kept_out_of_the_log():
  record = std_logging.LogRecord
  absent_tpu = record(
    "x", std_logging.INFO, "", 0, "Unable to initialize backend 'tpu': no", (), None
  )
  absent_cuda = record(
    "x", std_logging.INFO, "", 0, "Unable to initialize backend 'cuda': no", (), None
  )
  failing_tpu = record(
    "x", std_logging.ERROR, "", 0, "Unable to initialize backend 'tpu'", (), None
  )
  assert not platform._not_an_absent_tpu(absent_tpu)
  assert platform._not_an_absent_tpu(absent_cuda) and platform._not_an_absent_tpu(failing_tpu)
  platform.quiet_absent_backends()
  assert not std_logging.getLogger("jax._src.xla_bridge").filter(absent_tpu)
