"""This project beside PyTorch: the same network, batch and SGD step on this CPU.

    python bench/cpu/peers.py [--models lenet5,resnet20] [--batch_size 128] [--steps N]
                          [--rounds 5] [--split] [--only PARTS]

Every variant runs in a process of its own (so that no framework's threads
or allocator disturb another's), started once, compiled and warmed up, then
timed in rounds that alternate between the processes: round r times every
variant once, in an order rotated by r. Beside each figure it prints the
machine's 1-minute load average at the times that variant was measured.

Variants, for LeNet-5 (28x28x1 images) and ResNet-20 (32x32x3), batch 128:
  torch NCHW, T threads / torch channels_last, T threads
                       PyTorch's plain step (zero_grad, forward, backward, SGD
                       step) in both layouts, with T = the threads XLA:CPU
                       uses here (the larger of the cores and the devices),
  torch NCHW, 1 thread / torch channels_last, 1 thread,
  jax plain, XLA defaults
                       a minimal jit-compiled SGD step (value_and_grad + update)
                       on 1 device, compiled as jax.jit compiles it,
  jax plain, 1 device  the same compiled with the project's options
                       (easgd/infra/compile.py),
  jax plain, 2 devices the same with the batch split over 2 CPU devices,
  sync_easgd, 1 device / sync_easgd, 2 devices
                       this project's compiled train step (batch drawn on
                       device, tau = 4) with 1 worker, and with 2 workers of
                       batch/2 on 2 CPU devices.
It prints the median images/s, the ratio to PyTorch's best layout at T
threads, and the fraction of the float32 matmul peak (a 2048^3 jnp.dot,
measured by a process of its own before every round; the best is used) that
the step reaches, counting the FLOPs of XLA's cost analysis of the plain
step for every row, PyTorch's included (the same arithmetic).

With --split it also times the forward pass alone and forward + backward
without the update, in every process: where a step's time goes.

`pip install torch==2.13.0` (any build: it runs on the CPU) is not among the
project's requirements. Without it the torch rows are left out.
"""

import argparse
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import time

import peer_steps  # bench/cpu/peer_steps.py, beside this file
from peer_steps import SHAPES

from easgd import arguments

TITLES = {"lenet5": "LeNet-5 (28x28x1)", "resnet20": "ResNet-20 (32x32x3)"}
# Steps a round, by default: about a second or more of every variant.
STEPS = {"lenet5": 30, "resnet20": 5}


def xla_threads(devices: int = 2) -> int:
  """The threads of XLA:CPU's pool in a process of `devices` devices."""
  return max(len(os.sched_getaffinity(0)), devices)


def variants(threads: int) -> dict[str, dict]:
  """Label -> the worker's arguments."""
  return {
    f"torch NCHW, {threads} threads": {"kind": "torch", "layout": "nchw", "threads": threads},
    f"torch channels_last, {threads} threads": {
      "kind": "torch",
      "layout": "channels_last",
      "threads": threads,
    },
    "torch NCHW, 1 thread": {"kind": "torch", "layout": "nchw", "threads": 1},
    "torch channels_last, 1 thread": {"kind": "torch", "layout": "channels_last", "threads": 1},
    "jax plain, XLA defaults": {"kind": "plain", "devices": 1, "options": False},
    "jax plain, 1 device": {"kind": "plain", "devices": 1, "options": True},
    "jax plain, 2 devices": {"kind": "plain", "devices": 2, "options": True},
    "sync_easgd, 1 device": {"kind": "sync_easgd", "devices": 1},
    "sync_easgd, 2 devices": {"kind": "sync_easgd", "devices": 2},
  }


class Worker:
  """A variant's process and its line-by-line protocol."""

  def __init__(self, spec, name, batch_size):
    env = dict(os.environ)
    if spec["kind"] == "torch":
      env["OMP_NUM_THREADS"] = str(spec["threads"])
    self.process = subprocess.Popen(
      [sys.executable, os.path.abspath(__file__), "--worker", json.dumps(spec)]
      + ["--models", name, "--batch_size", str(batch_size)],
      stdin=subprocess.PIPE,
      stdout=subprocess.PIPE,
      text=True,
      env=env,
    )
    self.ready = self._reply()

  def _reply(self) -> dict:
    line = self.process.stdout.readline()
    if not line:
      raise SystemExit(f"a benchmark process ended early (exit {self.process.wait()})")
    return json.loads(line)

  def ask(self, command: str) -> dict:
    self.process.stdin.write(command + "\n")
    self.process.stdin.flush()
    return self._reply()

  def close(self):
    """Asks the process to exit, if it still runs, and waits for it."""
    if self.process.poll() is None:
      try:
        self.process.stdin.write("exit\n")
        self.process.stdin.flush()
      except OSError:  # it ended meanwhile
        pass
    self.process.wait()


def torch_available() -> str | None:
  spec = importlib.util.find_spec("torch")
  return None if spec is None else spec.name


def chosen_variants(only: str) -> dict[str, dict]:
  """The variants to time: those --only names (all by default) that can run here."""
  chosen = {
    label: spec
    for label, spec in variants(xla_threads()).items()
    if (spec["kind"] != "torch" or torch_available())
    and (not only or any(part in label for part in only.split(";")))
  }
  if not chosen:
    arguments.fail(
      f"--only={only!r} matches no variant that can run here; they are: "
      + "; ".join(variants(xla_threads()))
      + ("" if torch_available() else " (the torch ones need torch)")
    )
  return chosen


def measure(name, args, peak_worker, steps):
  """Starts every variant of network `name`, times them in alternating rounds,
  and returns {label: {"rates": [...], "loads": [...], "split": {...}}} and the peak."""
  chosen = chosen_variants(args.only)
  workers = {}
  try:
    for label, spec in chosen.items():
      print(f"  starting {label}", file=sys.stderr, flush=True)
      workers[label] = Worker(spec, name, args.batch_size)
    results = {label: {"rates": [], "loads": []} for label in workers}
    peaks = []
    labels = list(workers)
    for round_index in range(args.rounds):
      peaks.append(peak_worker.ask("peak")["flops_per_second"])
      shift = round_index % len(labels)
      for label in labels[shift:] + labels[:shift]:
        results[label]["loads"].append(os.getloadavg()[0])
        seconds = workers[label].ask(f"run {steps}")["seconds"]
        results[label]["rates"].append(steps * args.batch_size / seconds)
    if args.split:
      for label, worker in workers.items():
        results[label]["split"] = worker.ask(f"split {steps}")
    # The plain step's FLOPs for every row; another JAX step's if it was left out.
    plain = workers.get("jax plain, 1 device")
    jax_workers = [plain] if plain else [w for w in workers.values() if "flops_per_step" in w.ready]
    flops = jax_workers[0].ready["flops_per_step"] if jax_workers else 0.0
  finally:
    for worker in workers.values():
      worker.close()  # never raises: a crashed worker's own message stays the last word
  return results, max(peaks), flops


def print_table(name, args, steps, results, peak, flops_per_step):
  threads = xla_threads()
  torch_best = max(
    (
      statistics.median(r["rates"])
      for label, r in results.items()
      if label.startswith("torch") and label.endswith(f"{threads} threads")
    ),
    default=None,
  )
  print(
    f"\n{TITLES[name]}, batch {args.batch_size}: medians of {args.rounds} rounds of "
    f"{steps} steps; matmul peak {peak / 1e9:.1f} GFLOP/s; "
    f"{flops_per_step / 1e9:.3f} GFLOP a step"
  )
  print("| variant | images/s | vs torch's best | of peak | load |")
  print("| --- | --- | --- | --- | --- |")
  for label, result in results.items():
    rate = statistics.median(result["rates"])
    ratio = f"{rate / torch_best:.2f}x" if torch_best else "-"
    # Without a JAX row there is no FLOP count to go by.
    fraction = f"{flops_per_step * rate / args.batch_size / peak:.1%}" if flops_per_step else "-"
    loads = result["loads"]
    print(f"| {label} | {rate:.0f} | {ratio} | {fraction} | {min(loads):.2f}-{max(loads):.2f} |")
  if args.split:
    print("\n| variant | forward ms | forward + backward ms | whole step ms |")
    print("| --- | --- | --- | --- |")
    for label, result in results.items():
      if not result.get("split"):
        continue
      whole = 1e3 * args.batch_size / statistics.median(result["rates"])
      cells = " | ".join(
        f"{1e3 * result['split'][part] / steps:.2f}" for part in ("forward", "forward+backward")
      )
      print(f"| {label} | {cells} | {whole:.2f} |")


def model_names(text: str) -> list[str]:
  if not text:
    raise argparse.ArgumentTypeError("is empty; choose from " + ",".join(SHAPES))
  names = text.split(",")
  unknown = [name for name in names if name not in SHAPES]
  if unknown:
    raise argparse.ArgumentTypeError(
      f"{','.join(unknown)} is not a network here; choose from {','.join(SHAPES)}"
    )
  return names


def main():
  parser = arguments.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--models", default="lenet5,resnet20", type=model_names)
  parser.add_argument("--batch_size", type=arguments.integer(2), default=128)
  parser.add_argument("--steps", type=arguments.integer(1), help="steps a round (default: STEPS)")
  parser.add_argument("--rounds", type=arguments.integer(1), default=5)
  parser.add_argument("--split", action="store_true", help="time forward and backward apart")
  parser.add_argument(
    "--only", default="", help="the variants whose labels contain one of these ;-separated parts"
  )
  parser.add_argument("--worker", help=argparse.SUPPRESS)
  args = parser.parse_args()
  if args.batch_size > peer_steps.PARTITION:
    parser.error(
      f"--batch_size={args.batch_size} is invalid: sync_easgd draws it from "
      f"{peer_steps.PARTITION} resident images a worker; use at most that"
    )
  if args.batch_size % 2:
    parser.error(
      f"--batch_size={args.batch_size} is invalid: the 2-device rows halve it; use an even number"
    )
  if args.worker:
    peer_steps.worker_main(json.loads(args.worker), args.models[0], args.batch_size)
    return
  chosen_variants(args.only)  # a bad --only stops here, before any process starts
  print(time.strftime("%Y-%m-%d %H:%M"), f"load average {os.getloadavg()[0]:.2f}")
  if torch_available():
    print(f"torch found; XLA:CPU and torch's first rows use {xla_threads()} threads")
  else:
    print("torch is not installed: pip install torch==2.13.0 to compare")
  peak_worker = Worker({"kind": "peak"}, "lenet5", args.batch_size)
  try:
    for name in args.models:
      steps = args.steps or STEPS[name]
      results, peak, flops = measure(name, args, peak_worker, steps)
      print_table(name, args, steps, results, peak, flops)
  finally:
    peak_worker.close()


if __name__ == "__main__":
  main()
