"""runtime=ray against the replay of its trace, through train.py as a user runs them:
a worker process killed mid-run, the trace replayed in a new workdir, and every
checkpoint of the two compared leaf by leaf.

  python bench/ray_replay.py                       # the default config: 8 workers, 600 steps
  python bench/ray_replay.py --workers 4 --steps 20 --every 5 --kill_at 0 --algorithm async_easgd
  python bench/ray_replay.py --worker_gpus 0.125 --steps 300   # 8 processes share a GPU
  python bench/ray_replay.py --model mlp --workers 2 --steps 8   # a smaller network

The run is `train.py --config configs/default.py` with --algorithm (momentum
0.9 for the momentum rules), --model (LeNet-5 by default) and
--config.runtime=ray; as its log reaches step --kill_at, the process of worker
--kill_worker (whose pid the log names) is killed with SIGKILL, and under the
default cluster.on_worker_loss=rejoin it rejoins. The replay is the same
command with --config.cluster.replay= of the run's trace instead of
runtime=ray. Prints each one's wall time and final center accuracy, and for
every checkpoint step both hold, how many of the state's leaves hold the same
bytes and the largest difference of a value.

On one machine and XLA build a run on CPU workers and its replay hold the same
bytes (docs/runtimes.md, "The same trace, the same bits"); on GPU workers they
follow the same events, not the same bits ("On GPU workers").
"""

import os
import re
import signal
import subprocess
import sys
import tempfile
import time

import numpy as np
from absl import logging

from easgd.arguments import ArgumentParser, integer, number
from easgd.infra import checkpoint
from easgd.train.runtimes.ray.runtime import ray_rules

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# The rules whose momentum the default config leaves at 0 and that need one.
MOMENTUM_RULES = ("async_measgd", "async_msgd")


def _flags(args) -> list[str]:
  """The configuration both commands share."""
  flags = [
    "--config=configs/default.py",
    f"--config.algorithm={args.algorithm}",
    f"--config.model={args.model}",
    f"--config.workers={args.workers}",
    f"--config.run.total_steps={args.steps}",
  ]
  if args.algorithm in MOMENTUM_RULES:
    flags.append("--config.optimizer.momentum=0.9")
  if args.every:
    flags += [f"--config.run.{what}_every={args.every}" for what in ("checkpoint", "eval", "log")]
  return flags


def _train(workdir: str, flags: list[str], kill_worker: int, kill_at: int) -> tuple[float, str]:
  """Runs train.py; kills worker `kill_worker`'s process as the log reaches step
  `kill_at` (0: never). (seconds it took, its log)."""
  command = [sys.executable, "train.py", f"--workdir={workdir}", *flags]
  started = time.perf_counter()
  run = subprocess.Popen(
    command, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
  )
  lines, pid = [], None
  for line in run.stdout:
    lines.append(line)
    found = re.search(rf"worker {kill_worker} runs in process (\d+) on ", line)
    if found and pid is None:
      pid = int(found.group(1))
    step = re.search(r"\] step (\d+)/", line)
    if kill_at and pid is not None and step and int(step.group(1)) >= kill_at:
      try:
        os.kill(pid, signal.SIGKILL)
      except ProcessLookupError:  # the run went on faster than its log was read
        said = f"worker {kill_worker}'s process {pid} had ended; nothing killed"
      else:
        said = f"killed worker {kill_worker} (process {pid})"
      print(f"{said} at step {step.group(1)}", flush=True)
      kill_at = 0
    if "died at its local step" in line or "restarted)" in line:
      print(line.split("] ", 1)[-1].strip(), flush=True)
  seconds = time.perf_counter() - started
  log = "".join(lines)
  if run.wait():
    last = log.strip().splitlines()[-1] if log.strip() else ""
    if last.startswith("error: "):  # train.py refused its input: its one line
      sys.stderr.write(last + "\n")
      sys.exit(run.returncode)
    sys.exit(f"error: {' '.join(command)} exited {run.returncode}:\n{log[-3000:]}")
  return seconds, log


def _center_accuracy(log: str) -> str:
  found = re.search(r"done: .*eval/center_accuracy ([0-9.e+-]+)", log)
  return found.group(1) if found else "?"


def main():
  parser = ArgumentParser(prog="bench/ray_replay.py", description=__doc__.splitlines()[0])
  parser.add_argument("--algorithm", choices=ray_rules(), default="async_measgd")
  parser.add_argument("--model", choices=("lenet5", "mlp"), default="lenet5")
  parser.add_argument("--workers", type=integer(1), default=8)
  parser.add_argument("--steps", type=integer(1), default=600)
  parser.add_argument("--every", type=integer(0), default=0, help="checkpoints, evaluations, logs")
  parser.add_argument("--kill_worker", type=integer(0), default=3)
  parser.add_argument("--kill_at", type=integer(0), default=100, help="0: no kill")
  parser.add_argument("--worker_gpus", type=number(0), default=0.0)
  args = parser.parse_args()
  if args.kill_at and args.kill_worker >= args.workers:
    parser.error(
      f"--kill_worker={args.kill_worker} is invalid: the workers are 0..{args.workers - 1}"
    )
  flags = _flags(args)
  logging.set_verbosity(logging.ERROR)  # orbax's notes as it reads a checkpoint
  with tempfile.TemporaryDirectory() as root:
    real, replay = os.path.join(root, "real"), os.path.join(root, "replay")
    ray = [*flags, "--config.runtime=ray", f"--config.ray.worker_gpus={args.worker_gpus}"]
    run_seconds, run_log = _train(real, ray, args.kill_worker, args.kill_at)
    replayed = [*flags, f"--config.cluster.replay={os.path.join(real, 'trace.jsonl')}"]
    replay_seconds, replay_log = _train(replay, replayed, args.kill_worker, 0)
    print(f"# {time.strftime('%Y-%m-%d %H:%M')}, load {os.getloadavg()[0]:.2f}")
    print(f"run:    {run_seconds:6.1f} s, center accuracy {_center_accuracy(run_log)}")
    print(f"replay: {replay_seconds:6.1f} s, center accuracy {_center_accuracy(replay_log)}")
    steps = sorted(set(checkpoint.saved_steps(real)) & set(checkpoint.saved_steps(replay)))
    for step in steps:
      a, b = checkpoint.saved_leaves(real, step), checkpoint.saved_leaves(replay, step)
      pairs = list(zip(a, b, strict=True))
      same = sum(x.dtype == y.dtype and x.tobytes() == y.tobytes() for x, y in pairs)
      largest = max(
        float(np.max(np.abs(x.astype(np.float64) - y.astype(np.float64)))) if x.size else 0.0
        for x, y in pairs
      )
      print(f"step {step}: {same} of {len(a)} leaves hold the same bytes; ", end="")
      print(f"largest difference {largest:.3g}")


if __name__ == "__main__":
  main()
