"""Ray as this project joins it: where the cluster is (an address from a flag, a
config field or RAY_ADDRESS, checked before anything starts, its token
authentication included), Ray started without noise a user would read as an error
and ended without leftovers, and Ray's pages about a lost process in the project's
own words.

Light on purpose (no JAX; Ray imported where it is used): train.py's runtime=ray
and the parallel sweeps check an address this way before they write anything.
"""

import contextlib
import os
import re
import socket
import warnings
from collections.abc import Callable

from easgd import ownership
from easgd.errors import ConfigError

# Seconds to reach a cluster's address before it is called unreachable.
CONNECT_TIMEOUT = 5.0

ALLOWED = (
  "give HOST:PORT of a running Ray head (ray start --head), 'auto' for the cluster this "
  "node joined, or leave it empty for a Ray on this machine"
)


def resolve(given: str, named: str) -> tuple[str, str]:
  """(address, where it came from): `given` (the setting called `named`), else
  $RAY_ADDRESS, as Ray reads it; ('', named) for a Ray on this machine."""
  if given or not os.environ.get("RAY_ADDRESS"):
    return given, named
  return os.environ["RAY_ADDRESS"], "RAY_ADDRESS"


# What a client sends first on an HTTP/2 connection (RFC 9113, 3.4): the preface,
# then its SETTINGS frame (here empty: length 0, type 4, no flags, stream 0).
HTTP2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + bytes([0, 0, 0, 4, 0, 0, 0, 0, 0])
HTTP2_SETTINGS = 4  # the type of the frame an HTTP/2 server must answer with first


def check(address: str, named: str) -> None:
  """ConfigError (one line naming `named`, where the address came from) unless
  `address` is empty, 'auto' or a HOST:PORT that accepts a connection and answers
  as gRPC does within CONNECT_TIMEOUT seconds.

  A Ray head's address (its GCS, or Ray Client's ray://) is a gRPC server, which
  answers an HTTP/2 preface with its SETTINGS frame at once. ray.init, given a
  port that accepts connections but is not Ray's, retries for minutes."""
  if not address or address == "auto":
    return
  host, colon, port = address.removeprefix("ray://").rpartition(":")
  if not (colon and host and port.isdigit()):
    raise ConfigError(f"{named}={address!r} is not HOST:PORT: {ALLOWED}")
  try:
    connection = socket.create_connection((host, int(port)), timeout=CONNECT_TIMEOUT)
  except (OSError, ValueError) as error:
    raise ConfigError(
      f"{named}={address!r} is unreachable ({type(error).__name__}: {error}): {ALLOWED}"
    ) from None
  with connection:
    if os.environ.get("RAY_USE_TLS", "0").lower() in ("1", "true"):
      return  # a TLS port answers a plain preface with nothing; Ray's own check follows
    header = b""
    try:
      connection.sendall(HTTP2_PREFACE)
      while len(header) < 9:  # a frame's header: length (3), type (1), flags, stream
        received = connection.recv(9 - len(header))
        if not received:
          break
        header += received
    except OSError:  # a timeout among them: it said nothing
      pass
  if len(header) < 9 or header[3] != HTTP2_SETTINGS:
    raise ConfigError(
      f"{named}={address!r} accepts connections but does not answer as a Ray head "
      f"(gRPC) within {CONNECT_TIMEOUT:g} s: {ALLOWED}"
    )
  _check_token(f"{host}:{port}", named, address)


# Where Ray looks for the token of a cluster with token authentication, in its order
# (its AuthenticationTokenLoader): the variable, the file it names, the default file.
TOKEN_VARIABLE, TOKEN_PATH_VARIABLE = "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH"
DEFAULT_TOKEN = os.path.join("~", ".ray", "auth_token")
AUTH_MODE_VARIABLE = "RAY_AUTH_MODE"
TOKEN_ADVICE = (
  "copy the head's token (`ray get-auth-token` on the head prints it) into "
  f"{DEFAULT_TOKEN}, or name its file in {TOKEN_PATH_VARIABLE}, or set {TOKEN_VARIABLE}"
)
# A method of the GCS that every client calls first, and asks nothing of it.
_PROBE = "/ray.rpc.NodeInfoGcsService/GetClusterId"


def local_token() -> tuple[str | None, str]:
  """(this machine's Ray token, where it was found), as Ray finds it; (None, where
  Ray looked) if there is none."""
  if os.environ.get(TOKEN_VARIABLE):
    return os.environ[TOKEN_VARIABLE].strip(), TOKEN_VARIABLE
  path = os.environ.get(TOKEN_PATH_VARIABLE) or os.path.expanduser(DEFAULT_TOKEN)
  where = f"{TOKEN_PATH_VARIABLE}={path}" if os.environ.get(TOKEN_PATH_VARIABLE) else path
  try:
    with open(path) as handle:
      return handle.read().strip() or None, where
  except OSError:
    return None, f"{TOKEN_VARIABLE}, {TOKEN_PATH_VARIABLE} or {DEFAULT_TOKEN}"


def _refused(target: str, token: str | None) -> bool | None:
  """Whether the GCS at `target` refuses a request with `token` (None: no token) as
  unauthenticated; None if it did not answer the request at all."""
  import grpc  # noqa: PLC0415 (only a cluster's address is probed)

  metadata = [("authorization", f"Bearer {token}")] if token else None
  with grpc.insecure_channel(target) as channel:
    try:
      channel.unary_unary(_PROBE)(b"", timeout=CONNECT_TIMEOUT, metadata=metadata)
    except grpc.RpcError as error:
      if error.code() == grpc.StatusCode.UNAUTHENTICATED:
        return True
      return None if error.code() == grpc.StatusCode.UNAVAILABLE else False
  return False


def _check_token(target: str, named: str, address: str) -> None:
  """Ray 2.60's heads use token authentication where a token was on the head's
  machine when it started (a local Ray run writes one), and Ray presents a token to
  an address given explicitly only when told to. A head that refuses a request
  without a token is presented this machine's: if it takes it, this process and its
  children present it from now on (RAY_AUTH_MODE=token, as Ray does for 'auto'); if
  it refuses it, or there is none, ConfigError in one line naming the token."""
  if not _refused(target, None):
    return
  if os.environ.get(AUTH_MODE_VARIABLE, "").lower() == "disabled":
    raise ConfigError(
      f"{named}={address!r}: the Ray head there uses token authentication, and "
      f"{AUTH_MODE_VARIABLE}=disabled here: unset it, and {TOKEN_ADVICE}"
    )
  token, where = local_token()
  if token is None:
    raise ConfigError(
      f"{named}={address!r}: the Ray head there uses token authentication, and this "
      f"machine has no token ({where}): {TOKEN_ADVICE}"
    )
  if _refused(target, token):
    raise ConfigError(
      f"{named}={address!r}: the Ray head there uses token authentication and refused "
      f"this machine's token (from {where}): {TOKEN_ADVICE}"
    )
  os.environ[AUTH_MODE_VARIABLE] = "token"


def system_config() -> dict:
  """What a Ray this project starts is told (a new dict each time: Ray adds its
  session's settings to the one it is given).

  Ray starts its worker processes at nice 15, below its own, so that it stays
  responsive; here those processes are the training (runtime=ray's workers and
  servers, a parallel sweep's points), and at nice 15 beside any busy process of
  the machine they get a few percent of a CPU and all but stop. They run at the
  priority of the process that started them. A cluster started by `ray start` is
  told the same by RAY_worker_niceness=0 in each node's environment."""
  return {"worker_niceness": 0}


# The watchers (easgd.ownership.reap_ray_agents) of the Rays this process started.
_WATCHERS: list = []


def init(**options) -> None:
  """ray.init(**options); a new Ray on this machine (address "local") with
  `system_config()`, whose processes end with this process however it ends (see
  easgd.ownership: its agents did not). Ray starts its own processes (fork, then
  exec at once), and a process where JAX has started warns at every fork that
  forking a multithreaded program may deadlock; a fork followed by exec runs none of
  the parent's code, so that warning, which reads as an error, is left out here. A
  cluster that `check` found to take this machine's token is presented it."""
  import ray  # noqa: PLC0415

  local = options.get("address") == "local"
  if local:
    options = {"_system_config": system_config(), **options}
  elif os.environ.get(AUTH_MODE_VARIABLE) == "token":
    # Set by `check`, maybe after Ray read its configuration: read again, as Ray
    # itself does where it turns token authentication on.
    from ray._private.authentication import authentication_token_setup  # noqa: PLC0415

    authentication_token_setup._enable_token_auth()
  with warnings.catch_warnings():
    warnings.filterwarnings("ignore", message=r"os\.fork\(\) was called", category=RuntimeWarning)
    ray.init(**options)
  if local:
    raylet = _child_named("raylet")
    if raylet is not None:
      watcher = ownership.reap_ray_agents(raylet)
      if watcher is not None:
        _WATCHERS.append(watcher)


def shutdown() -> None:
  """ray.shutdown() of a Ray this process started or joined; what a Ray it started
  leaves of itself is ended."""
  import ray  # noqa: PLC0415

  ray.shutdown()
  while _WATCHERS:
    watcher = _WATCHERS.pop()
    watcher.stdin.close()
    watcher.wait()
    watcher.stdout.close()


def _child_named(name: str) -> int | None:
  """The pid of this process's child whose command is `name` (Linux), or None."""
  for entry in os.listdir("/proc") if os.path.isdir("/proc") else ():
    if not entry.isdigit():
      continue
    with contextlib.suppress(OSError, IndexError, ValueError):
      with open(f"/proc/{entry}/stat") as handle:
        stat = handle.read()
      command, rest = stat[stat.index("(") + 1 : stat.rindex(")")], stat[stat.rindex(")") + 2 :]
      if command == name and int(rest.split()[1]) == os.getpid():
        return int(entry)
  return None


# What the raylet's page about a lost process begins with, and its line on a retry.
_LOST = "A worker died or was killed"
_RETRY = re.compile(r"There are (\d+) retries remaining")


@contextlib.contextmanager
def lost_processes_in_our_words(retried: Callable[[int], None] | None = None):
  """While inside: Ray's driver prints each message of the raylet as it comes,
  among them a page for each lost process ("A worker died or was killed ...",
  with advice on the OOM killer) and, for a task, a traceback for each retry. The
  project says what a loss means in a line of its own (a worker that rejoins or
  leaves, a run that Ray runs again), so the page is left out, and a retry is
  handed to `retried` (the retries left) instead of printed. Other messages are
  Ray's own. Ray offers no switch for these: the hook is its driver's printer,
  and without one (another Ray) its pages are printed as they were."""
  from ray._private import worker  # noqa: PLC0415

  printer = getattr(worker, "print_to_stdstream", None)
  if printer is None:
    yield
    return

  def in_our_words(data, *args, **kwargs):
    text = "\n".join(data.get("lines", ())) if data.get("pid") == "raylet" else ""
    retry = _RETRY.search(text)
    if retry and retried is not None:
      retried(int(retry[1]))
    elif _LOST not in text and not retry:
      printer(data, *args, **kwargs)

  worker.print_to_stdstream = in_our_words
  try:
    yield
  finally:
    worker.print_to_stdstream = printer
