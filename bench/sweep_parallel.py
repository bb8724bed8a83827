"""A sweep's points one after another against the same points in parallel on Ray.

    python bench/sweep_parallel.py [--config configs/sweep_example.py] [--parallel 2]
        [--nodes 2] [--steps 300]

Runs `python sweep.py` three times on the same points, each into a fresh
folder, and times each command whole (Ray's start, every point's train.py,
the summary):

  serial    one point after another (no flag);
  parallel  --parallel N on a Ray that the sweep starts on this machine;
  cluster   --parallel N on a Ray cluster of --nodes simulated nodes
            (ray.cluster_utils, one CPU each), through --ray_address; the
            cluster is started before the clock starts, as a user's would be;
  pipelined with --pipeline, the points as one pipelined run (sweep.py
            --pipeline), for a sweep of per-model values only
            (configs/sweep_pipeline.py).

Prints each time, its ratio to the serial sweep's in this run, and whether the
parallel summaries equal the serial one (they must: the same train.py runs;
exit 1 if one does not).
On a machine of C cores a point's train.py uses them all while it compiles and
trains, so the ceiling is below min(N, C)x: what parallel points win is the
time each spends in one core (starting Python, importing JAX, compiling,
evaluating, writing).
"""

import os
import shutil
import subprocess
import sys
import tempfile
import time

from easgd import arguments, ray_connection

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def sweep(config: str, workdir: str, steps: int, *flags: str) -> float:
  """Seconds of one `python sweep.py` command, with a compilation cache of its own
  (JAX_COMPILATION_CACHE_DIR, which the sweep's points are given): no sweep reuses
  another's compiles. Exits with the sweep's last line if it fails."""
  command = [
    sys.executable,
    os.path.join(REPO, "sweep.py"),
    f"--config={config}",
    f"--workdir={workdir}",
    f"--config.run.total_steps={steps}",
    *flags,
  ]
  environment = {**os.environ, "JAX_COMPILATION_CACHE_DIR": workdir + "-cache"}
  began = time.perf_counter()
  done = subprocess.run(
    command, cwd=REPO, env=environment, capture_output=True, text=True, check=False
  )
  seconds = time.perf_counter() - began
  if done.returncode != 0:
    last = (done.stderr.strip().splitlines() or ["(no output)"])[-1]
    arguments.fail(f"{' '.join(command)} failed: {last}", 1)
  return seconds


def summary(workdir: str) -> str:
  with open(os.path.join(workdir, "summary.csv")) as handle:
    return handle.read()


def main():
  parser = arguments.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument(
    "--config",
    default=os.path.join(REPO, "configs", "sweep_example.py"),
    help="a config file with get_sweep()",
  )
  parser.add_argument("--parallel", type=arguments.integer(1), default=2)
  parser.add_argument("--nodes", type=arguments.integer(1), default=2)
  parser.add_argument("--steps", type=arguments.integer(1), default=300)
  parser.add_argument("--pipeline", action="store_true", help="time sweep.py --pipeline too")
  args = parser.parse_args()
  if not os.path.isfile(args.config):
    arguments.fail(f"--config={args.config!r} is not a file: give a config file with get_sweep()")

  from ray.cluster_utils import Cluster  # noqa: PLC0415 (after the arguments)

  root = tempfile.mkdtemp(prefix="sweep-parallel-")
  try:
    times = {}
    if args.pipeline:  # first: a sweep --pipeline refuses is refused before the long ones
      times["pipelined"] = sweep(
        args.config, os.path.join(root, "pipelined"), args.steps, "--pipeline"
      )
    times["serial"] = sweep(args.config, os.path.join(root, "serial"), args.steps)
    parallel = f"--parallel={args.parallel}"
    times["parallel"] = sweep(args.config, os.path.join(root, "parallel"), args.steps, parallel)
    cluster = Cluster(
      initialize_head=True,
      head_node_args={"num_cpus": 1, "_system_config": ray_connection.system_config()},
    )
    try:
      for _ in range(args.nodes - 1):
        cluster.add_node(num_cpus=1)
      times["cluster"] = sweep(
        args.config,
        os.path.join(root, "cluster"),
        args.steps,
        parallel,
        f"--ray_address={cluster.address}",
      )
    finally:
      cluster.shutdown()
    serial = summary(os.path.join(root, "serial"))
    print(f"| sweep ({args.steps} steps a point) | seconds | serial / this |")
    print("|---|---|---|")
    for name in ("serial", "parallel", "cluster", "pipelined")[: len(times)]:
      seconds = times[name]
      how = {
        "serial": "one after another",
        "parallel": f"--parallel {args.parallel}, this machine",
        "cluster": f"--parallel {args.parallel}, {args.nodes} simulated nodes of 1 CPU",
        "pipelined": "--pipeline, one pipelined run",
      }[name]
      print(f"| {how} | {seconds:.1f} | {times['serial'] / seconds:.2f}x |")
    differ = []
    for name in ("parallel", "cluster"):
      same = summary(os.path.join(root, name)) == serial
      print(f"{name} summary equals the serial one: {'yes' if same else 'NO'}")
      differ += [] if same else [name]
  finally:
    shutil.rmtree(root, ignore_errors=True)
  if differ:  # the same train.py runs must give the same summary
    sys.exit(1)


if __name__ == "__main__":
  main()
