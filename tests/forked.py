"""The command-line programs, each run as a new process that starts with its libraries imported.

A program answers wrong usage before it computes anything, so most of the
2 s that `python train.py ...` takes to refuse a flag goes on importing JAX,
Flax, optax and orbax. A starter process imports those libraries once, and
no module of this project, so that each program still defines its own flags
and reads its own files. For each command it forks a child: a new process
with the command's arguments, folder and standard streams, which runs the
program as `python ARGV` would (`runpy`) and exits with its status.

The libraries read their environment variables when imported, so a starter
serves one environment, fixed when it starts.
"""

import json
import os
import signal
import subprocess
import sys
import tempfile
import threading

# Run by the starter: `python -c _STARTER`. One request a line on stdin
# (argv, cwd, the two files for stdout and stderr); two lines back on stdout
# for each: the child's pid, then its exit status (negative: the signal that
# ended it).
_STARTER = r"""
import atexit, json, os, runpy, sys

import absl.app, flax, jax, ml_collections, optax, orbax.checkpoint  # the slow imports

def run_program(argv, cwd, out, err):
  os.chdir(cwd)
  streams = ((0, os.devnull, os.O_RDONLY), (1, out, os.O_WRONLY), (2, err, os.O_WRONLY))
  for fd, path, mode in streams:
    os.dup2(os.open(path, mode), fd)
  code = 0
  try:
    if argv[0] == "-m":  # the current folder first on the path, as `python -m` puts it
      sys.argv, sys.path[0] = [argv[1], *argv[2:]], cwd
      runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
    else:  # the script's folder first on the path, as `python SCRIPT` puts it
      sys.argv, sys.path[0] = list(argv), os.path.dirname(os.path.abspath(argv[0]))
      runpy.run_path(argv[0], run_name="__main__")
  except SystemExit as stop:  # what the interpreter does with it
    if stop.code is None or isinstance(stop.code, int):
      code = stop.code or 0
    else:
      print(stop.code, file=sys.stderr)
      code = 1
  except BaseException:
    sys.excepthook(*sys.exc_info())
    code = 1
  atexit._run_exitfuncs()
  sys.stdout.flush()
  sys.stderr.flush()
  os._exit(code)

for line in sys.stdin:
  request = json.loads(line)
  pid = os.fork()
  if pid == 0:
    run_program(**request)
  print(pid, flush=True)
  _, status = os.waitpid(pid, 0)
  print(os.waitstatus_to_exitcode(status), flush=True)
"""


class Starter:
  """Runs `python *argv` commands as children of one starter process (see the module's doc)."""

  def __init__(self, environment: dict[str, str]):
    self._process = subprocess.Popen(
      [sys.executable, "-c", _STARTER],
      stdin=subprocess.PIPE,
      stdout=subprocess.PIPE,
      env=environment,
      text=True,
    )

  def _line(self) -> str:
    line = self._process.stdout.readline()
    if not line:
      raise RuntimeError(f"the starter exited with status {self._process.wait()}")
    return line

  def run(self, argv: list[str], cwd, timeout: float = 120) -> tuple[int, str, str]:
    """Runs `python *argv` in `cwd`: (exit status, stdout, stderr)."""
    with tempfile.TemporaryDirectory() as streams:
      out, err = os.path.join(streams, "out"), os.path.join(streams, "err")
      for path in (out, err):
        open(path, "w").close()
      request = {"argv": list(argv), "cwd": str(cwd), "out": out, "err": err}
      self._process.stdin.write(json.dumps(request) + "\n")
      self._process.stdin.flush()
      pid = int(self._line())
      # A program that hangs is killed, and reported as such.
      killer = threading.Timer(timeout, os.kill, (pid, signal.SIGKILL))
      killer.start()
      code = int(self._line())
      killer.cancel()
      if code == -signal.SIGKILL:
        raise TimeoutError(f"python {' '.join(argv)} ran past {timeout} s")
      with open(out) as stdout, open(err) as stderr:
        return code, stdout.read(), stderr.read()

  def close(self) -> None:
    self._process.stdin.close()
    self._process.wait(30)
