"""The planner's predictions against measurement on this machine.

    python bench/plan_check.py [--batches 256,1024,2048] [--models lenet5,mlp] [--steps 10]

For each model and batch (sync_easgd, one worker on one device, mnist5k):
  * memory: the planner's total (XLA's memory analysis of the compiled step:
    data + S1 + S2 + S3) against the process's measured peak resident memory
    growth from just before the state and data are placed to the end of the
    steps (Linux VmHWM, reset after compilation); on a device with memory
    statistics (GPUs) its peak_bytes_in_use is used instead;
  * time: the step time predicted from the step's FLOPs (XLA's cost
    analysis) at one FLOP rate, measured on the first point only, against
    the measured step time of every point.
Each point runs in a fresh process so that one point's peak cannot hide
another's. The float32 matmul rate of this machine is printed beside the
achieved FLOP/s.
"""

import argparse
import gc
import json
import re
import statistics
import subprocess
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

from easgd import plan, steps
from easgd.arguments import ArgumentParser, integer
from easgd.configs import default
from easgd.data import batches
from easgd.infra import sharding


def config_for(model: str, batch_size: int):
  config = default.get_config()
  config.model, config.data.batch_size = model, batch_size
  config.workers, config.run.devices, config.outer.moving_rate = 1, 1, 0.5
  return config


def _proc_status(field: str) -> int:
  with open("/proc/self/status") as f:
    return int(re.search(rf"{field}:\s+(\d+) kB", f.read()).group(1)) * 1024


def measure(model_name: str, batch_size: int, num_steps: int) -> dict:
  """Runs the step in this process; returns its peak memory growth and step times."""
  config = config_for(model_name, batch_size)
  mesh = sharding.make_mesh(1)
  compiler = plan.StepCompiler(config, mesh)
  compiled = compiler.compile(batch_size)
  device = jax.devices()[0]
  shape = compiler.shape
  params = jax.jit(compiler.init_params)(jax.random.PRNGKey(0))  # the planned network's
  state = steps.init_state(compiler.rule, params, jax.random.PRNGKey(1), mesh)
  rng = np.random.default_rng(0)
  images = rng.integers(0, 256, (shape.train_examples, *shape.image_shape), dtype=np.uint8)
  labels = rng.integers(0, 10, shape.train_examples).astype(np.int32)
  train_images, train_labels = batches.place_partitions(mesh, images, labels, 1, 0)
  arguments = sum(x.nbytes for x in jax.tree.leaves((state, train_images, train_labels)))
  del images, labels
  gc.collect()
  # The baseline holds the arguments; what the steps add on top is measured.
  on_device = device.memory_stats() is not None
  if on_device:
    before = device.memory_stats()["bytes_in_use"]
  else:
    before = _proc_status("VmRSS")
    with open("/proc/self/clear_refs", "w") as f:
      f.write("5")  # resets VmHWM to the current resident size
  tick = compiler.tick
  times = []
  for _ in range(num_steps + 1):  # the first is a warm-up
    start = time.perf_counter()
    state, metrics = compiled(state, train_images, train_labels, tick)
    jax.block_until_ready((state, metrics))
    times.append(time.perf_counter() - start)
  if on_device:
    peak = device.memory_stats()["peak_bytes_in_use"] - before
  else:
    peak = _proc_status("VmHWM") - before
  return {
    "arguments": arguments,
    "peak_bytes": peak,
    "step_seconds": statistics.median(times[1:]),
    "flops": float(compiled.cost_analysis()["flops"]),
    "source": "peak_bytes_in_use" if on_device else "VmHWM",
  }


def predicted_bytes(model_name: str, batch_size: int) -> tuple[float, float]:
  """The planner's total, and its part beyond the step's arguments (S1 + S3)."""
  config = config_for(model_name, batch_size)
  compiler = plan.StepCompiler(config, sharding.make_mesh(1))
  memory = plan.measure_memory(compiler, batch_size)
  return memory.total(batch_size), memory.activations(batch_size) + memory.fixed


def matmul_flops() -> float:
  """Measured float32 FLOP/s of a 2048x2048 jnp.dot on the first device."""
  a = jnp.ones((2048, 2048), jnp.float32)
  dot = jax.jit(jnp.dot)
  dot(a, a).block_until_ready()
  start, rounds = time.perf_counter(), 10
  for _ in range(rounds):
    dot(a, a).block_until_ready()
  return rounds * 2 * 2048**3 / (time.perf_counter() - start)


def main():
  parser = ArgumentParser(prog="bench/plan_check.py", description=__doc__.splitlines()[0])
  parser.add_argument("--batches", default="256,1024,2048")
  parser.add_argument("--models", default="lenet5,mlp")
  parser.add_argument("--steps", type=integer(1), default=10)
  parser.add_argument("--measure", nargs=2, metavar=("MODEL", "BATCH"), help=argparse.SUPPRESS)
  args = parser.parse_args()
  if args.measure:
    print(json.dumps(measure(args.measure[0], int(args.measure[1]), args.steps)))
    return
  points = [(m, int(b)) for m in args.models.split(",") for b in args.batches.split(",")]
  rows = []
  for model_name, batch_size in points:
    command = [sys.executable, __file__, "--measure", model_name, str(batch_size)]
    command += ["--steps", str(args.steps)]
    result = subprocess.run(command, check=True, capture_output=True, text=True)
    measured = json.loads(result.stdout.strip().splitlines()[-1])
    rows.append((model_name, batch_size, predicted_bytes(model_name, batch_size), measured))
  peak = matmul_flops()
  # The FLOP rate a step sustains depends on the network: calibrate it on each
  # model's first batch and predict the others from their FLOPs.
  rates = {}
  for model_name, _, _, measured in rows:
    rates.setdefault(model_name, measured["flops"] / measured["step_seconds"])
  print(
    f"memory measured as {rows[0][3]['source']} growth over the placed arguments; "
    f"float32 matmul here: {peak / 1e9:.3g} GFLOP/s; step time predicted from the "
    "FLOPs at the rate measured on each model's first batch"
  )
  print()
  print(
    "| model | batch | total MB predicted | measured | ratio | S1+S3 MB predicted | measured "
    "| step ms predicted | measured | error | GFLOP/s | of matmul |"
  )
  print("|" + " --- |" * 12)
  for model_name, batch_size, (total, temporaries), measured in rows:
    seconds, growth = measured["step_seconds"], measured["peak_bytes"]
    measured_total = measured["arguments"] + growth
    predicted_seconds = measured["flops"] / rates[model_name]
    achieved = measured["flops"] / seconds
    print(
      f"| {model_name} | {batch_size} | {total / 1e6:.1f} | {measured_total / 1e6:.1f} "
      f"| {measured_total / total:.2f} | {temporaries / 1e6:.1f} | {growth / 1e6:.1f} "
      f"| {1e3 * predicted_seconds:.1f} | {1e3 * seconds:.1f} "
      f"| {100 * (predicted_seconds / seconds - 1):+.0f}% "
      f"| {achieved / 1e9:.1f} | {100 * achieved / peak:.0f}% |"
    )
  print()
  first = next(iter(rates))
  for name, rate in rates.items():
    print(
      f"{name}: {rate / 1e9:.3g} GFLOP/s sustained on its first batch; "
      f"{first}'s rate would put its step time off by {100 * (rate / rates[first] - 1):+.0f}%"
    )


if __name__ == "__main__":
  main()
