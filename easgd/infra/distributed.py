"""Joining a multi-process run with JAX's own runtime (jax.distributed).

A process joins when it is told to: by the flags --coordinator_address,
--num_processes and --process_id (what `python -m easgd.launch` passes), or
by the environment of a cluster scheduler that JAX detects itself (SLURM,
Open MPI) or JAX_COORDINATOR_ADDRESS. Otherwise the run is one process.

Every process then sees the global device list; the mesh spans all of them
and each process places only its own devices' shards (easgd.infra.sharding).

A lost peer: the coordination service expects a heartbeat from every
process every --heartbeat_timeout seconds (JAX's default is 100 s). When one
stops, the survivors abort (exit status 134) with a message naming the
missing task, so --heartbeat_timeout bounds how long a dead process keeps
the others waiting.
"""

import os

import jax
from absl import flags, logging

from easgd.errors import ConfigError

_COORDINATOR = flags.DEFINE_string(
  "coordinator_address", "", "host:port of process 0's coordination service (multi-process)."
)
_NUM_PROCESSES = flags.DEFINE_integer("num_processes", 0, "Processes in the run (0: detect).")
_PROCESS_ID = flags.DEFINE_integer("process_id", -1, "This process's index (-1: detect).")
_HEARTBEAT = flags.DEFINE_integer(
  "heartbeat_timeout", 10, "Seconds without a heartbeat before a process counts as lost."
)
_INIT_TIMEOUT = flags.DEFINE_integer(
  "initialization_timeout", 120, "Seconds to wait for every process to join."
)

# Environment variables in which a scheduler says how many processes it started.
_SCHEDULER_SIZES = ("SLURM_NTASKS", "OMPI_COMM_WORLD_SIZE")


def _scheduler_size(environ) -> int:
  for name in _SCHEDULER_SIZES:
    value = environ.get(name, "")
    if value.isdigit():
      return int(value)
  return 1


def requested(coordinator: str, num_processes: int, environ) -> bool:
  """Whether the flags' values or the environment ask for a multi-process run."""
  if coordinator or num_processes > 1:
    return True
  return bool(environ.get("JAX_COORDINATOR_ADDRESS")) or _scheduler_size(environ) > 1


def process_count(coordinator: str, num_processes: int, process_id: int, environ) -> int:
  """How many processes the run has (1: no multi-process run); raises ConfigError
  for values that cannot describe a run."""
  if num_processes < 0:
    raise ConfigError(f"--num_processes={num_processes} is invalid: must be >= 1 (0: detect)")
  if num_processes and not 0 <= process_id < num_processes:
    raise ConfigError(f"--process_id={process_id} is invalid: must be in [0, {num_processes})")
  if not requested(coordinator, num_processes, environ):
    return 1
  count = num_processes or _scheduler_size(environ)
  if count == 1 and not num_processes:
    raise ConfigError(
      "--num_processes is needed: a coordinator address is set and no scheduler "
      f"({', '.join(_SCHEDULER_SIZES)}) says how many processes there are"
    )
  return count


def requested_processes() -> int:
  """The number of processes the flags and the environment ask for (1: one process).

  Connects to nothing; raises ConfigError for flags that cannot describe a run.
  """
  if _HEARTBEAT.value < 1:
    raise ConfigError(f"--heartbeat_timeout={_HEARTBEAT.value} is invalid: must be >= 1 second")
  return process_count(_COORDINATOR.value, _NUM_PROCESSES.value, _PROCESS_ID.value, os.environ)


def initialize(count: int) -> None:
  """Joins the run of `count` processes (requested_processes()); nothing for 1.

  Must run before JAX starts its backends (before the first jax.devices()),
  which is why the count comes from the flags or the scheduler, not from JAX.
  """
  if count == 1:
    return
  jax.distributed.initialize(
    coordinator_address=_COORDINATOR.value or None,
    num_processes=count,
    process_id=_PROCESS_ID.value if _PROCESS_ID.value >= 0 else None,
    initialization_timeout=_INIT_TIMEOUT.value,
    heartbeat_timeout_seconds=_HEARTBEAT.value,
  )
  logging.info("joined a run of %d processes (heartbeat timeout %d s)", count, _HEARTBEAT.value)
