"""python tests/signal_at.py PHASE STEP [--process=N] [--signal=NAME] [--to=parent] SCRIPT ARGS...

Runs SCRIPT (train.py) as `python SCRIPT ARGS` would, and the moment its training
loop ends PHASE of step STEP (a phase its watchdog names: "checkpoint", the
checkpoint of STEP is on disk; "event write", the points logged up to STEP are),
sends a signal: SIGKILL to its own process unless told.

A test that signals a run from outside, once a file or a log line appears, races
the run: a busy machine may give the test its turn only after the run has gone
past that point, or ended. Signalled from inside, at the end of a phase, a run
stops at the same point of its training on every machine and at every load.

--process=N: only in the process that easgd.launch starts with --process_id=N.
--signal=NAME: another signal (SIGTERM: a preemption notice).
--to=parent: to the process that started this one (easgd.launch's launcher)
    instead of this one.
SCRIPT's --workdir=DIR names the folder that its checkpoints go to.
"""

import contextlib
import os
import runpy
import signal
import sys
import time

from easgd.infra import checkpoint, watchdog


def main() -> None:
  phase, step, *rest = sys.argv[1:]
  options = {}
  while rest[0].startswith("--"):
    name, _, value = rest.pop(0)[2:].partition("=")
    options[name] = value
  process = options.get("process")
  number = getattr(signal, options.get("signal", "SIGKILL"))
  workdir = next(arg.split("=", 1)[1] for arg in rest if arg.startswith("--workdir="))
  original = watchdog.Watchdog.phase

  def phase_then_signal(self, name: str, at: int):
    with original(self, name, at):
      yield
    if name != phase or at != int(step):
      return
    if process is not None and f"--process_id={process}" not in sys.argv:
      return
    if name == "checkpoint":
      # Of a multi-process run's, process 0 commits the folder; the run goes on no
      # further than its next collective, which waits for this process.
      while at not in checkpoint.saved_steps(workdir):
        time.sleep(0.01)
    os.kill(os.getppid() if options.get("to") == "parent" else os.getpid(), number)

  watchdog.Watchdog.phase = contextlib.contextmanager(phase_then_signal)
  sys.argv = rest
  runpy.run_path(rest[0], run_name="__main__")


if __name__ == "__main__":
  main()
