"""Where a Ray cluster is: an address from a flag, a config field or RAY_ADDRESS,
checked before anything starts.

Light on purpose (no JAX, no Ray): train.py's runtime=ray and the parallel
sweeps check an address this way before they write anything.
"""

import os
import socket

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


def check(address: str, named: str) -> None:
  """ConfigError (one line naming `named`, where the address came from) unless
  `address` is empty, 'auto' or a HOST:PORT that accepts a connection within
  CONNECT_TIMEOUT seconds."""
  if not address or address == "auto":
    return
  host, colon, port = address.removeprefix("ray://").rpartition(":")
  if not (colon and host and port.isdigit()):
    raise ConfigError(f"{named}={address!r} is not HOST:PORT: {ALLOWED}")
  try:
    socket.create_connection((host, int(port)), timeout=CONNECT_TIMEOUT).close()
  except (OSError, ValueError) as error:
    raise ConfigError(
      f"{named}={address!r} is unreachable ({type(error).__name__}: {error}): {ALLOWED}"
    ) from None
