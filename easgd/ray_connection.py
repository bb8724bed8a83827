"""Ray as this project joins it: where the cluster is (an address from a flag, a
config field or RAY_ADDRESS, checked before anything starts), Ray started without
noise a user would read as an error, and Ray's pages about a lost process in the
project's own words.

Light on purpose (no JAX; Ray imported where it is used): train.py's runtime=ray
and the parallel sweeps check an address this way before they write anything.
"""

import contextlib
import os
import re
import socket
import warnings
from collections.abc import Callable

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


def init(**options) -> None:
  """ray.init(**options); a new Ray on this machine (address "local") with
  `system_config()`. Ray starts its own processes (fork, then exec at once), and a
  process where JAX has started warns at every fork that forking a multithreaded
  program may deadlock; a fork followed by exec runs none of the parent's code, so
  that warning, which reads as an error, is left out here."""
  import ray  # noqa: PLC0415

  if options.get("address") == "local":
    options = {"_system_config": system_config(), **options}
  with warnings.catch_warnings():
    warnings.filterwarnings("ignore", message=r"os\.fork\(\) was called", category=RuntimeWarning)
    ray.init(**options)


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
