"""Starts N processes of one training command on this machine, joined by jax.distributed.

    python -m easgd.launch --processes 2 -- train.py --config configs/default.py --workdir runs/x

runs `python train.py ... --coordinator_address=127.0.0.1:PORT --num_processes=2
--process_id=i` for i = 0, 1: the development stand-in for a cluster
scheduler (SLURM's srun, mpirun), which starts one such process per host.
Each process's output is passed through, each line prefixed with
`[process i]`.

Faults: if a process dies (a signal, or a non-zero exit), the launcher
names it, gives the others `--grace` seconds to stop on their own (the
survivors of a lost peer abort when its heartbeats stop, see
easgd.infra.distributed), kills what is left and exits non-zero. SIGTERM or
SIGINT to the launcher is passed on to every process (a preemption: each
finishes its step, checkpoints and exits 0).
"""

import argparse
import os
import random
import signal
import socket
import subprocess
import sys
import threading
import time

from easgd import arguments

_POLL_SECONDS = 0.1
# The flags the launcher gives each process itself.
_OWN_FLAGS = ("--coordinator_address", "--num_processes", "--process_id")


# `ray start`'s worker processes take ports 10002-19999 (--min/max-worker-port).
_FIRST_FREE_PORT = 20000
_EPHEMERAL_RANGE = "/proc/sys/net/ipv4/ip_local_port_range"


def _ephemeral_start() -> int:
  """The first port of the range the kernel hands out on its own (bind to port 0,
  a connection's local end): 32768 where the kernel does not say (Linux's default;
  other systems' ranges start higher)."""
  try:
    with open(_EPHEMERAL_RANGE) as handle:
      return int(handle.read().split()[0])
  except (OSError, ValueError, IndexError):
    return 32768


def free_ports(share: int = 0, shares: int = 1, start: int | None = None):
  """TCP ports that a server could listen on when each is yielded
  (arguments.port_problem), each once, from `start` (None: a random one) on.

  A port is chosen well before its server binds it (the coordinator binds it
  after process 0's imports, seconds later), and meanwhile the kernel may hand a
  port of its ephemeral range to any process. So the ports lie between
  `ray start`'s worker ports and that range, in part `share` of `shares` equal
  parts of it: parallel choosers, one part each, never choose the same. It yields
  nothing where the kernel's range leaves no such ports."""
  if not 0 <= share < shares:
    raise ValueError(f"share {share} is not one of {shares} shares")
  size = (_ephemeral_start() - _FIRST_FREE_PORT) // shares
  first = _FIRST_FREE_PORT + share * size
  if start is None:
    offset = random.SystemRandom().randrange(size) if size > 0 else 0
  elif first <= start < first + size:
    offset = start - first
  else:
    raise ValueError(f"start {start} is not in share {share}: [{first}, {first + size})")
  for index in range(size):
    port = first + (offset + index) % size
    if arguments.port_problem(port) is None:
      yield port


def free_port() -> int:
  """A TCP port that a server could listen on now: one of free_ports, or, where
  there is none, one the kernel gives."""
  port = next(free_ports(), None)
  if port is not None:
    return port
  with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
    probe.bind(("127.0.0.1", 0))
    return probe.getsockname()[1]


def describe(code: int) -> str:
  """'exit status 3' or 'killed by SIGKILL' for a Popen return code."""
  if code < 0:
    return f"killed by {signal.Signals(-code).name}"
  if code == 134:
    return "exit status 134 (aborted)"
  return f"exit status {code}"


def _pass_through(index: int, stream) -> None:
  for line in iter(stream.readline, b""):
    sys.stderr.buffer.write(b"[process %d] " % index + line)
    sys.stderr.buffer.flush()


def _say(message: str) -> None:
  print(f"launch: {message}", file=sys.stderr, flush=True)


def launch(processes: int, command: list[str], port: int, grace: float) -> int:
  """Runs `command` as `processes` processes; returns the launcher's exit status."""
  address = f"127.0.0.1:{port or free_port()}"
  children = []
  for index in range(processes):
    argv = [
      sys.executable,
      *command,
      f"--coordinator_address={address}",
      f"--num_processes={processes}",
      f"--process_id={index}",
    ]
    child = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    threading.Thread(target=_pass_through, args=(index, child.stdout), daemon=True).start()
    children.append(child)
    _say(f"process {index} (pid {child.pid}) started, coordinator {address}")

  def forward(signum, _frame):
    _say(f"{signal.Signals(signum).name}: passing it on to every process")
    for child in children:
      if child.poll() is None:
        child.send_signal(signum)

  signal.signal(signal.SIGTERM, forward)
  signal.signal(signal.SIGINT, forward)

  lost_at = None
  reported: set[int] = set()
  while any(child.poll() is None for child in children):
    for index, child in enumerate(children):
      code = child.poll()
      if code is None or code == 0 or index in reported:
        continue
      reported.add(index)
      if lost_at is None:
        lost_at = time.monotonic()
        _say(f"process {index} (pid {child.pid}) was lost: {describe(code)}")
        _say(f"waiting up to {grace:g} s for the other processes to stop")
      else:
        _say(f"process {index} stopped: {describe(code)}")
    if lost_at is not None and time.monotonic() - lost_at > grace:
      for index, child in enumerate(children):
        if child.poll() is None:
          _say(f"process {index} (pid {child.pid}) still runs; killing it")
          child.kill()
      break
    time.sleep(_POLL_SECONDS)
  codes = [child.wait() for child in children]
  for index, code in enumerate(codes):
    if code != 0 and index not in reported:
      _say(f"process {index} stopped: {describe(code)}")
  failed = [code for code in codes if code != 0]
  if not failed:
    return 0
  first = failed[0]
  return first if first > 0 else 128 - first


def main(argv: list[str] | None = None) -> int:
  parser = arguments.ArgumentParser(
    prog="python -m easgd.launch",
    description="Runs a training command as N jax.distributed processes on this machine.",
  )
  parser.add_argument(
    "--processes", type=arguments.integer(1), required=True, help="number of processes (>= 1)"
  )
  parser.add_argument(
    "--port", type=arguments.integer(0), default=0, help="coordinator port (0: a free one)"
  )
  parser.add_argument(
    "--grace",
    type=arguments.number(0),
    default=30.0,
    help="seconds the others get to stop on their own after one is lost",
  )
  parser.add_argument("command", nargs=argparse.REMAINDER, help="-- script.py [its flags]")
  args = parser.parse_args(argv)
  command = args.command[1:] if args.command[:1] == ["--"] else args.command
  if args.port > 65535:
    parser.error(f"argument --port: {args.port} is invalid: must be a port in [0, 65535]")
  if not command:
    arguments.fail("no command given: python -m easgd.launch --processes N -- train.py")
  if not os.path.isfile(command[0]):
    arguments.fail(f"{command[0]!r} is not a file: the command is a Python script")
  if _is_config_file(command[0]):
    arguments.fail(
      f"{command[0]!r} is a config file, not a program: python -m easgd.launch "
      f"--processes {args.processes} -- train.py --config {command[0]}"
    )
  for flag in _OWN_FLAGS:
    if any(arg == flag or arg.startswith(f"{flag}=") for arg in command[1:]):
      arguments.fail(f"the command sets {flag}: the launcher sets it for each process")
  # Process 0 serves the coordinator on the port; one in use crashes it (a
  # segfault in jax.distributed.initialize after its timeout): refused now,
  # before any process starts.
  problem = args.port and arguments.port_problem(args.port)
  if problem:
    arguments.fail(
      f"--port {args.port} cannot take the coordinator: {problem.lower()} on this machine; "
      "pick another port, or 0 for a free one"
    )
  return launch(args.processes, command, args.port, args.grace)


def _is_config_file(path: str) -> bool:
  """Whether `path` is a config file (a get_config() and no main), not a program."""
  try:
    with open(path, encoding="utf-8", errors="replace") as script:
      text = script.read(1_000_000)
  except OSError:
    return False
  return "def get_config(" in text and "__main__" not in text


if __name__ == "__main__":
  sys.exit(main())
