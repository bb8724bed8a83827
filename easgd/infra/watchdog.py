"""A watchdog that stops a process whose training makes no progress.

JAX's heartbeats come from a background thread: a process whose main thread
hangs (a stuck read, a deadlocked collective) goes on sending them, and the
other processes wait for it forever. The loop therefore tells the watchdog
which phase it is in (a training step, the steps' results
awaited, the scalars logged, an evaluation, the events written, a
checkpoint); a daemon thread checks every `poll` seconds, and a
phase that has run for longer than its limit ends the process: one line
names the phase, the step and how long it has made no progress, and the
process exits with status EXIT_HUNG (3) at once, without waiting for
anything. The other processes of the run then stop when its heartbeats do
(--heartbeat_timeout), and the same command resumes from the last checkpoint.

Limits (--step_timeout):
  * S > 0: every phase must end within S seconds;
  * 0 (the default): a phase's limit is derived from the run, the larger of
    AUTO_FLOOR seconds and AUTO_FACTOR times the longest that phase has taken
    so far in this process.
The first time a phase runs in a process it may compile its program (JAX
compiles on the first call): compilation is not progress that a limit can
judge, so that first occurrence gets COMPILE_ALLOWANCE seconds more.
"""

import contextlib
import dataclasses
import os
import sys
import threading
import time
from collections.abc import Callable

from absl import flags, logging

_STEP_TIMEOUT = flags.DEFINE_float(
  "step_timeout",
  0.0,
  "Seconds a phase of the loop (a training step, its results, logging, evaluation, "
  "event write, checkpoint) may make no progress before the process stops with "
  "status 3 (0: derived from the run; the first of each, which may compile, gets "
  "30 minutes more).",
)

EXIT_HUNG = 3
AUTO_FLOOR = 600.0
AUTO_FACTOR = 50.0
COMPILE_ALLOWANCE = 1800.0


def configured_timeout() -> float:
  """--step_timeout, or 0 (derived) where the flags were not parsed (a library call)."""
  return _STEP_TIMEOUT.value if flags.FLAGS.is_parsed() else 0.0


def check_timeout(value: float) -> str | None:
  """Why --step_timeout=value cannot be used, or None."""
  if not (value >= 0 and value != float("inf")):
    return (
      f"--step_timeout={value} is invalid: must be a finite number of seconds >= 0 (0: derived)"
    )
  return None


@dataclasses.dataclass
class _Current:
  phase: str
  step: int
  started: float
  limit: float


def _stop(message: str) -> None:
  """Ends the process now, with one line: nothing it waits on can be trusted to return."""
  logging.flush()
  print(f"error: {message}", file=sys.stderr, flush=True)
  os._exit(EXIT_HUNG)


class Watchdog:
  """Phases entered and left by the loop; a thread that stops the process when one hangs."""

  def __init__(
    self,
    timeout: float = 0.0,
    poll: float = 1.0,
    clock: Callable[[], float] = time.monotonic,
    stop: Callable[[str], None] = _stop,
  ):
    self.timeout = timeout
    self._clock, self._stop, self._poll = clock, stop, poll
    self._longest: dict[str, float] = {}  # each phase's longest completed duration
    self._current: _Current | None = None
    self._closed = threading.Event()
    self._thread = None

  def start(self) -> "Watchdog":
    self._thread = threading.Thread(target=self._watch, name="watchdog", daemon=True)
    self._thread.start()
    return self

  def limit(self, phase: str) -> float:
    """How long `phase` may run now."""
    seen = phase in self._longest
    if self.timeout > 0:
      limit = self.timeout
    else:
      limit = max(AUTO_FLOOR, AUTO_FACTOR * self._longest.get(phase, 0.0))
    return limit if seen else limit + COMPILE_ALLOWANCE

  @contextlib.contextmanager
  def phase(self, name: str, step: int):
    """Watches the body as phase `name` of step `step`."""
    started = self._clock()
    self._current = _Current(name, step, started, self.limit(name))
    try:
      yield
    finally:
      self._current = None
      elapsed = self._clock() - started
      self._longest[name] = max(self._longest.get(name, 0.0), elapsed)

  def check(self) -> None:
    """Stops the process if the current phase has run past its limit."""
    current = self._current
    if current is None:
      return
    elapsed = self._clock() - current.started
    if elapsed > current.limit:
      self._stop(
        f"no progress in the {current.phase} of step {current.step} for {elapsed:.0f} s "
        f"(limit {current.limit:.0f} s, --step_timeout); stopping this process (exit "
        f"{EXIT_HUNG}): the others stop when its heartbeats do; run the same command to "
        "resume from the last checkpoint"
      )

  def _watch(self) -> None:
    while not self._closed.wait(self._poll):
      self.check()

  def close(self) -> None:
    self._closed.set()
    if self._thread is not None:
      self._thread.join(timeout=5)
