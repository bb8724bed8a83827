"""Where a training step's time goes, per operation, in JAX (XLA:CPU) and in PyTorch.

    python bench/cpu/profile_step.py [--models lenet5,resnet20] [--steps 5] [--top 12]

For each network, batch 128, the plain SGD step of bench/cpu/peers.py:
  jax    compiled with the project's options and traced with jax.profiler.
         XLA:CPU runs a program as thunks; each is timed from its trace
         event, or, for those that finish asynchronously (Eigen's
         convolutions), from its start to its "end:" event. The thunks are
         grouped by kind (convolutions, matrix products, transposes,
         reductions, elementwise loops) and the largest are named with the
         layer that XLA's metadata gives them.
  torch  PyTorch's step in its faster layout (channels_last) under
         torch.profiler: each operator's own time.
Times are ms a step. Thunks on the two threads overlap, so a column's sum
can exceed the step's wall time.
"""

import collections
import glob
import gzip
import json
import os
import re
import sys
import tempfile
import time

import peer_steps  # bench/cpu/peer_steps.py, beside this file
import peers

from easgd import arguments


def _kind(name: str) -> str:
  if name.startswith(("convolution", "conv_general_dilated")):
    return "convolutions"
  if name.startswith(("ynn_fusion", "dot", "xnn_fusion")):
    return "matrix products"
  if "transpose" in name:
    return "transposes (and what XLA fused into them)"
  if "reduce-window" in name or "select-and-scatter" in name or "scatter" in name:
    return "reduce-window and scatter"
  if "reduce" in name:
    return "reductions"
  return "elementwise loops"


def _layers(hlo_text: str) -> dict[str, str]:
  """Instruction name -> the layer path in its op_name metadata."""
  layers = {}
  pattern = re.compile(r"%([\w.-]+) = .*?op_name=\"([^\"]+)\"")
  for match in pattern.finditer(hlo_text):
    path = match.group(2).split("/")
    direction = "backward" if any(p.startswith("transpose(") for p in path) else "forward"
    names = [p for p in path[1:] if not re.match(r"^(jvp|transpose|jit)\(", p)]
    layers[match.group(1)] = f"{'/'.join(names[:-1]) or '-'} ({direction})"
  return layers


def jax_profile(name: str, steps: int) -> tuple[float, dict, list]:
  """(ms a step, {kind: ms a step}, [(ms a step, thunk, layer)]) of the plain JAX step."""
  import jax  # noqa: PLC0415

  handlers = peer_steps.jax_variant({"kind": "plain", "devices": 1, "options": True}, name, 128)
  compiled = handlers["compiled"]
  handlers["run"](2)
  start = time.perf_counter()
  handlers["run"](steps)
  wall = 1e3 * (time.perf_counter() - start) / steps
  with tempfile.TemporaryDirectory() as trace_dir:
    jax.profiler.start_trace(trace_dir, create_perfetto_trace=True)
    handlers["run"](steps)
    jax.profiler.stop_trace()
    (path,) = glob.glob(os.path.join(trace_dir, "**", "*.trace.json.gz"), recursive=True)
    with gzip.open(path) as file:
      events = json.load(file)
  events = events["traceEvents"] if isinstance(events, dict) else events
  spans = [e for e in events if e.get("ph") == "X" and "name" in e]
  ends = collections.defaultdict(list)
  for event in spans:
    if event["name"].startswith("end: "):
      ends[event["name"][5:]].append(event["ts"])
  skip = ("ThunkExecutor", "Threadpool", "end: ", "$", "Pjit", "Common", "Slinky")
  per_thunk = collections.Counter()
  for event in spans:
    thunk = event["name"]
    if thunk.startswith(skip):
      continue
    later = [t for t in ends.get(thunk, []) if t >= event["ts"]]
    finish = min(later) if later else event["ts"] + event.get("dur", 0)
    per_thunk[thunk] += max(event.get("dur", 0), finish - event["ts"]) / 1e3 / steps
  by_kind = collections.Counter()
  for thunk, ms in per_thunk.items():
    by_kind[_kind(thunk)] += ms
  layers = _layers(compiled.as_text())
  top = [(ms, thunk, layers.get(thunk, "")) for thunk, ms in per_thunk.most_common()]
  return wall, dict(by_kind), top


def torch_profile(name: str, steps: int) -> tuple[float, list]:
  """(ms a step, [(ms a step, operator)]) of PyTorch's channels_last step."""
  import torch  # noqa: PLC0415

  handlers = peer_steps.torch_variant(
    {"kind": "torch", "layout": "channels_last", "threads": peers.xla_threads()}, name, 128
  )
  handlers["run"](2)
  start = time.perf_counter()
  handlers["run"](steps)
  wall = 1e3 * (time.perf_counter() - start) / steps
  with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as profile:
    handlers["run"](steps)
  table = [(event.self_cpu_time_total / 1e3 / steps, event.key) for event in profile.key_averages()]
  return wall, sorted(table, reverse=True)


def main():
  parser = arguments.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--models", default="lenet5,resnet20", type=peers.model_names)
  parser.add_argument("--steps", type=arguments.integer(1), default=5)
  parser.add_argument("--top", type=arguments.integer(1), default=12)
  args = parser.parse_args()
  print(time.strftime("%Y-%m-%d %H:%M"), f"load average {os.getloadavg()[0]:.2f}")
  for name in args.models:
    wall, by_kind, top = jax_profile(name, args.steps)
    print(f"\n{peers.TITLES[name]}, jax plain step: {wall:.1f} ms a step")
    print("| kind | ms a step |\n| --- | --- |")
    for kind, ms in sorted(by_kind.items(), key=lambda item: -item[1]):
      print(f"| {kind} | {ms:.1f} |")
    print("\n| thunk | layer | ms a step |\n| --- | --- | --- |")
    for ms, thunk, layer in top[: args.top]:
      print(f"| {thunk} | {layer} | {ms:.1f} |")
    if peers.torch_available():
      wall, table = torch_profile(name, args.steps)
      print(f"\n{peers.TITLES[name]}, torch channels_last step: {wall:.1f} ms a step")
      print("| operator | own ms a step |\n| --- | --- |")
      for ms, operator in table[: args.top]:
        print(f"| {operator} | {ms:.1f} |")
  sys.stdout.flush()


if __name__ == "__main__":
  main()
