"""What the runtimes' tests share: one embedded Ray for a module's runs."""

import pytest

from easgd import ray_connection


@pytest.fixture(scope="module")
def embedded_ray():
  """A Ray of the module's own (not the one `ray start` last started here), started by its
  first run and ended after its last, as a cluster the runs connect to is."""
  ray = pytest.importorskip("ray")
  ray_connection.init(
    address="local", include_dashboard=False, log_to_driver=False, logging_level="ERROR"
  )
  yield
  ray.shutdown()
