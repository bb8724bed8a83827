"""What a process owns, and what it leaves behind when it is killed: one run a workdir,
children that die with it, and the Ray processes that would outlive it.

- **One run a workdir** (`hold`): a run takes an advisory lock (flock) on a file in its
  workdir before it writes there, and keeps it while it runs. The kernel releases it
  when the process ends, however it ends: a run killed with -9 leaves the file but
  not the lock, and the next run takes it. The file holds who took it last (process,
  host, command, time), so a second run on the workdir is refused in one line that
  names the one running there. On NFS, Linux emulates flock with NFS's byte-range
  locks, which every client sees.
- **Children that die with it** (`die_with_parent`): a child's `preexec_fn` that asks
  the kernel (Linux: prctl(PR_SET_PDEATHSIG)) to kill the child when this process
  ends, so that a killed sweep leaves no train.py writing into a folder that the next
  sweep resumes.
- **Ray's agents** (`reap_ray_agents`): a Ray that a process starts with `ray.init`
  dies with it (Ray starts its head processes so), but the raylet's two agents
  (DashboardAgent, RuntimeEnvAgent) are the raylet's children, not ours. When they
  find the raylet gone they report it to the driver through the GCS, which died too,
  and wait the report's 60 s timeout before they exit: a run killed with -9 left both
  running for a minute. A small watcher process, started beside the Ray, holds one
  end of a pipe from this process and keeps the raylet's children in view: when
  this process ends, however it ends, the pipe closes and the watcher kills what
  the raylet started that is left (its children then, and any process whose
  environment names the raylet, RAY_RAYLET_PID), then exits.

Light on purpose (no JAX, no Ray): the watcher runs this module.
"""

import contextlib
import ctypes
import datetime
import fcntl
import json
import os
import select
import signal
import socket
import subprocess
import sys

from easgd.errors import ConfigError

# The file of a workdir that its run holds locked while it runs.
RUN_LOCK = ".run.lock"
# The same for a sweep's workdir (a pipelined sweep's one train.py runs in it too).
SWEEP_LOCK = ".sweep.lock"

_PR_SET_PDEATHSIG = 1


class Held:
  """A lock taken by `hold`: released by `release()`, or by the kernel when the process
  ends."""

  def __init__(self, descriptor: int):
    self._descriptor = descriptor

  def release(self) -> None:
    if self._descriptor is not None:
      os.close(self._descriptor)  # closing the only descriptor releases the flock
      self._descriptor = None


def hold(workdir: str, name: str = RUN_LOCK, what: str = "run") -> Held:
  """Locks `workdir`/`name` for this process (making the folder if needed); ConfigError
  (one line naming the process that holds it) if another process holds it."""
  os.makedirs(workdir, exist_ok=True)
  path = os.path.join(workdir, name)
  descriptor = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
  try:
    fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
  except BlockingIOError:
    holder = _read_holder(descriptor)
    os.close(descriptor)
    raise _refusal(workdir, what, holder) from None
  os.ftruncate(descriptor, 0)
  holder = {
    "pid": os.getpid(),
    "host": socket.gethostname(),
    "command": " ".join([os.path.basename(sys.argv[0] or "python"), *sys.argv[1:]])[:500],
    "since": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
  }
  os.write(descriptor, (json.dumps(holder) + "\n").encode())
  return Held(descriptor)


def check_free(workdir: str, name: str = RUN_LOCK, what: str = "run") -> None:
  """`hold`'s refusal, if another process holds the lock, without making or taking
  anything: for a check before the work that comes before `hold`."""
  try:
    descriptor = os.open(os.path.join(workdir, name), os.O_RDONLY | os.O_CLOEXEC)
  except OSError:
    return  # no such file: nobody holds it
  try:
    fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
  except BlockingIOError:
    raise _refusal(workdir, what, _read_holder(descriptor)) from None
  finally:
    os.close(descriptor)


def _refusal(workdir: str, what: str, holder: str) -> ConfigError:
  return ConfigError(
    f"{workdir!r} is in use by {holder}: one {what} a workdir at a time; wait for it to "
    "end or stop it, or use another --workdir"
  )


def _read_holder(descriptor: int) -> str:
  """Who holds the lock, as its file says ("another process" if it says nothing)."""
  try:
    holder = json.loads(os.pread(descriptor, 4096, 0).decode() or "{}")
    return (
      f"process {holder['pid']} on {holder['host']} ({holder['command']}, since {holder['since']})"
    )
  except (OSError, ValueError, KeyError, TypeError):
    return "another process"


def die_with_parent():
  """A `preexec_fn` for a child that must not outlive this process (None where the
  kernel offers no such request: then the child is on its own, as before). prctl is
  looked up here, in the parent: between fork and exec the child only calls it."""
  if not sys.platform.startswith("linux"):
    return None
  prctl = ctypes.CDLL(None, use_errno=True).prctl
  prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]
  parent = os.getpid()

  def ask():
    prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != parent:  # the parent ended before the request
      os.kill(os.getpid(), signal.SIGKILL)

  return ask


# ---- Ray's agents ----

_RAYLET_VARIABLE = b"RAY_RAYLET_PID="
# Seconds between two looks at what the raylet has started.
_LOOK_EVERY = 0.5
# The agents every raylet starts (their process titles), and how long a start waits for
# the watcher to have seen them.
_AGENTS = ("ray::DashboardAgent", "ray::RuntimeEnvAgent")
_SEEN_WITHIN = 120.0


def reap_ray_agents(raylet_pid: int):
  """Starts the watcher of the Ray whose raylet is `raylet_pid` (started by this
  process); returns its process, whose stdin is the pipe this process holds (closing
  it, as `ray_connection.shutdown` does, has the watcher do its work now). None off
  Linux."""
  if not sys.platform.startswith("linux"):
    return None
  watcher = subprocess.Popen(
    [sys.executable, "-m", "easgd.ownership", str(raylet_pid)],
    stdin=subprocess.PIPE,
    stdout=subprocess.PIPE,
    stderr=subprocess.DEVNULL,
    start_new_session=True,  # a signal to this process's group is not its end
  )
  # The agents do not carry the raylet's pid in their environment: once the raylet has
  # ended, nothing names them. The watcher must have seen them as the raylet's children
  # before this process may end, so it is waited for (a guard against a hang only).
  ready, _, _ = select.select([watcher.stdout], [], [], _SEEN_WITHIN)
  if ready:
    watcher.stdout.readline()
  return watcher


def _stat(pid: int) -> tuple[int, int] | None:
  """(parent pid, start time) of `pid`, or None if it has ended."""
  try:
    with open(f"/proc/{pid}/stat") as handle:
      fields = handle.read().rsplit(")", 1)[1].split()
  except OSError:
    return None
  return int(fields[1]), int(fields[19])


def _processes_of(raylet_pid: int, by_environment: bool = True) -> dict[int, int]:
  """The processes that Ray's raylet `raylet_pid` started, and their start times: its
  children, and with `by_environment` those whose environment names it
  (RAY_RAYLET_PID; a process may write its title over it, and one whose raylet has
  ended is no one's child)."""
  marker = _RAYLET_VARIABLE + str(raylet_pid).encode() + b"\0"
  found = {}
  for entry in os.listdir("/proc"):
    if not entry.isdigit() or int(entry) == os.getpid():
      continue
    stat = _stat(int(entry))
    if stat is None:
      continue
    if stat[0] == raylet_pid:
      found[int(entry)] = stat[1]
      continue
    if not by_environment:
      continue
    with contextlib.suppress(OSError):
      with open(f"/proc/{entry}/environ", "rb") as handle:
        if marker in handle.read() + b"\0":
          found[int(entry)] = stat[1]
  return found


def _title(pid: int) -> str:
  """A process's title (its command line's first word), or "" if it has ended."""
  try:
    with open(f"/proc/{pid}/cmdline", "rb") as handle:
      return handle.read().split(b"\0", 1)[0].decode(errors="replace")
  except OSError:
    return ""


def _watch(raylet_pid: int) -> None:
  """The watcher: keeps what the raylet starts in view until the pipe closes, then kills
  each of them that is still the process it saw."""
  signal.signal(signal.SIGINT, signal.SIG_IGN)  # a Ctrl-C is for the run, not for this
  seen: dict[int, int] = {}
  said = False
  while True:
    seen |= _processes_of(raylet_pid, by_environment=False)
    if not said and set(_AGENTS) <= {_title(pid) for pid in seen}:
      said = True
      sys.stdout.write("seen\n")  # the agents are in view (reap_ray_agents waits for it)
      sys.stdout.flush()
    ready, _, _ = select.select([0], [], [], _LOOK_EVERY if said else 0.02)
    if ready and not os.read(0, 4096):
      break
  seen |= _processes_of(raylet_pid)
  for pid, started in seen.items():
    stat = _stat(pid)
    if stat is not None and stat[1] == started:
      with contextlib.suppress(OSError):
        os.kill(pid, signal.SIGKILL)


if __name__ == "__main__":
  _watch(int(sys.argv[1]))
