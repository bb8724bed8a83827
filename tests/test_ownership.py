"""easgd.ownership: one run a workdir (a lock that a killed holder does not keep), a child
that dies with its parent, and a Ray whose agents end with the process that started
it, killed with -9. Each looks for survivors."""

import os
import signal
import subprocess
import sys
import time

import pytest

from easgd import ownership
from easgd.errors import ConfigError

# A hang guard only: each wait below ends as soon as what it waits for is seen.
BOUND = 120.0


def _python(code: str, **options) -> subprocess.Popen:
  return subprocess.Popen(
    [sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, **options
  )


def _gone(pid: int) -> bool:
  """Whether `pid` has ended (a zombie, dead but not yet reaped, has)."""
  try:
    with open(f"/proc/{pid}/stat") as handle:
      return handle.read().rsplit(")", 1)[1].split()[0] == "Z"
  except OSError:
    return True


def _wait_until(done, what: str, bound: float = BOUND) -> None:
  bound = time.monotonic() + bound
  while not done():
    assert time.monotonic() < bound, what
    time.sleep(0.05)


def test_a_second_holder_is_refused_naming_the_first_until_it_is_killed(tmp_path):
  holder = _python(
    f"from easgd import ownership; ownership.hold({str(tmp_path)!r}); print('held', flush=True)"
    "; import time; time.sleep(600)"
  )
  try:
    assert holder.stdout.readline() == "held\n"
    for attempt in (ownership.check_free, ownership.hold):
      with pytest.raises(ConfigError) as error:
        attempt(str(tmp_path))
      said = str(error.value)
      assert f"is in use by process {holder.pid} on " in said and "(-c, since " in said
      assert "one run a workdir at a time" in said and "\n" not in said
  finally:
    holder.kill()
    holder.wait()
  # Its lock ended with it (the file stays): the next run takes it at once.
  ownership.hold(str(tmp_path)).release()
  assert sorted(os.listdir(tmp_path)) == [ownership.RUN_LOCK]


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="prctl is Linux's")
def test_a_child_dies_with_its_parent_killed_with_9():
  parent = _python(
    "import subprocess, sys, time; from easgd import ownership\n"
    "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)'],"
    " preexec_fn=ownership.die_with_parent())\n"
    "print(child.pid, flush=True); time.sleep(600)"
  )
  child = int(parent.stdout.readline())
  parent.kill()
  parent.wait()
  _wait_until(lambda: _gone(child), "the child outlived its parent")


@pytest.mark.e2e  # a Ray of its own
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc is Linux's")
def test_a_ray_started_by_a_process_killed_with_9_leaves_no_process(tmp_path):
  """Ray's agents, left alone, outlive such a process by a minute (they report the
  raylet's end to a GCS that ended too, with a 60 s timeout)."""
  started = _python(
    "import time\nfrom easgd import ray_connection\n"
    "ray_connection.init(address='local', num_cpus=1, include_dashboard=False,"
    " log_to_driver=False, logging_level='ERROR')\n"
    "print(ray_connection._child_named('raylet'), flush=True); time.sleep(600)",
    start_new_session=True,
    env={**os.environ, "HOME": str(tmp_path)},  # where Ray writes its token
  )
  raylet = int(started.stdout.readline())
  # Its two agents, at least (the raylet starts them as it starts).
  _wait_until(lambda: len(ownership._processes_of(raylet)) >= 2, "no agents started")
  ours = ownership._processes_of(raylet)
  started.send_signal(signal.SIGKILL)
  started.wait()
  # Within half of the agents' own minute: the watcher's work takes a fraction of a second.
  try:
    everything_ended = lambda: all(_gone(pid) for pid in [raylet, *ours])  # noqa: E731
    _wait_until(everything_ended, "a process of its Ray lived on", bound=30)
  finally:
    for pid in [raylet, *ours]:
      if not _gone(pid):
        os.kill(pid, signal.SIGKILL)
