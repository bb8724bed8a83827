"""The command-line programs, each run as a new process that starts with its libraries imported.

A program answers wrong usage before it computes anything, so most of the
2 s that `python train.py ...` takes to refuse a flag goes on importing JAX,
Flax, optax and orbax. A starter process (this file, run as a script)
imports those libraries once, and no module of this project, so that each
program still defines its own flags and reads its own files. For each
command it forks a child: a new process with the command's arguments,
folder and standard streams, which runs the program as `python ARGV` would
(`runpy`) and ends as the interpreter ends it (its exit status, its
traceback, its exit handlers and the wait for its threads).

The libraries read their environment variables when imported, so a starter
serves one environment, fixed when it starts.
"""

import contextlib
import json
import os
import runpy
import signal
import subprocess
import sys
import tempfile
import threading

# How long the starter may take to import the libraries and fork.
START_SECONDS = 120


class Starter:
  """Runs `python *argv` commands as children of one starter process (see the module's doc)."""

  def __init__(self, environment: dict[str, str]):
    # The starter's own messages (a failed import); each child writes to its own files.
    self._errors = tempfile.NamedTemporaryFile("w+", prefix="starter-", suffix=".log")
    self._process = subprocess.Popen(
      [sys.executable, os.path.abspath(__file__)],
      stdin=subprocess.PIPE,
      stdout=subprocess.PIPE,
      stderr=self._errors,
      env=environment,
      text=True,
    )

  def _answer(self, timeout: float, on_timeout) -> int:
    """The starter's next line, a number; `on_timeout()` is called if none comes in `timeout` s."""
    timer = threading.Timer(timeout, on_timeout)
    timer.daemon = True
    timer.start()
    try:
      line = self._process.stdout.readline()
    finally:
      timer.cancel()
    if not line:
      self._errors.seek(0)
      raise RuntimeError(
        f"the starter stopped (status {self._process.wait()}): {self._errors.read()[-2000:]}"
      )
    return int(line)

  def run(self, argv: list[str], cwd, timeout: float = 120) -> tuple[int, str, str]:
    """Runs `python *argv` in `cwd`: (exit status, stdout, stderr). A program still
    running after `timeout` s is killed, and the call raises TimeoutError."""
    with tempfile.TemporaryDirectory() as streams:
      out, err = os.path.join(streams, "out"), os.path.join(streams, "err")
      for path in (out, err):
        open(path, "w").close()
      request = {"argv": list(argv), "cwd": str(cwd), "out": out, "err": err}
      self._process.stdin.write(json.dumps(request) + "\n")
      self._process.stdin.flush()
      pid = self._answer(START_SECONDS, self._process.kill)
      timed_out = threading.Event()

      def stop():
        timed_out.set()
        with contextlib.suppress(ProcessLookupError):  # it ended meanwhile
          os.kill(pid, signal.SIGKILL)

      code = self._answer(timeout, stop)
      if timed_out.is_set():
        raise TimeoutError(f"python {' '.join(argv)} ran past {timeout} s")
      with open(out) as stdout, open(err) as stderr:
        return code, stdout.read(), stderr.read()

  def close(self) -> None:
    self._process.stdin.close()  # the starter's loop ends
    try:
      self._process.wait(30)
    except subprocess.TimeoutExpired:
      self._process.kill()
      self._process.wait()
    self._errors.close()


def _become(argv: list[str], cwd: str, out: str, err: str) -> None:
  """In a forked child: the process `python *argv` started in `cwd` would be, its
  stdout and stderr written to the files `out` and `err`.

  Whatever ends the program (SystemExit, an exception, its return: exit status
  0) propagates out of the starter's loop, so the interpreter ends the child as
  it ends any program.
  """
  os.chdir(cwd)
  streams = ((0, os.devnull, os.O_RDONLY), (1, out, os.O_WRONLY), (2, err, os.O_WRONLY))
  for fd, path, mode in streams:
    os.dup2(os.open(path, mode), fd)
  if argv[0] == "-m":  # the current folder first on the path, as `python -m` puts it
    sys.argv, sys.path[0] = [argv[1], *argv[2:]], cwd
    runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
  else:  # the script's folder first on the path, as `python SCRIPT` puts it
    sys.argv, sys.path[0] = list(argv), os.path.dirname(os.path.abspath(argv[0]))
    runpy.run_path(argv[0], run_name="__main__")
  sys.exit(0)


def _serve() -> None:
  """The starter: one request a line on stdin (argv, cwd and the files for stdout
  and stderr), and two lines back on stdout for each: the child's pid, then its
  exit status (negative: the signal that ended it)."""
  # The slow imports, made once for every child.
  import absl.app  # noqa: F401, PLC0415
  import flax  # noqa: F401, PLC0415
  import jax  # noqa: F401, PLC0415
  import ml_collections  # noqa: F401, PLC0415
  import optax  # noqa: F401, PLC0415
  import orbax.checkpoint  # noqa: F401, PLC0415

  for line in sys.stdin:
    pid = os.fork()
    if pid == 0:
      _become(**json.loads(line))
    print(pid, flush=True)
    _, status = os.waitpid(pid, 0)
    print(os.waitstatus_to_exitcode(status), flush=True)


if __name__ == "__main__":
  _serve()
