"""The planner's step time for S parameter servers against runtime=ray runs.

    python bench/plan_servers.py [--model lenet5] [--workers 2] [--tau 4] [--steps 80] [--repeats 2]

async_easgd (first come first served, under a lock) at tau = --tau on --workers
worker processes, a CPU device each, trains under runtime=ray with 1 server
and with 2, alternately. The planner's model of the parameter-server rules
(easgd.sim.sizing, `python -m easgd.plan`) is given what the 1-server runs
measured:
  * t_c: the median compute seconds of a local step without a request (the
    trace's `compute`; a step with a request has none of its own, so tau > 1);
  * the servers' seconds a request: the median whole exchange as the run's
    process saw it (the trace's `service`: the row to the servers, their master
    programs, the answers back), as cluster.master_time, with no latency or
    bandwidth terms (one machine's loopback);
and predicts a worker's seconds a local step, T(P) = max(tau t_c + s, P s)/tau
with s = master_time/S, for S = 1 and 2. Each prediction is printed beside the
measured seconds a local step of a worker (P over the run's local steps a
second) and the error, (predicted - measured)/measured.
"""

import os
import tempfile
import time

import numpy as np

from easgd import ray_connection
from easgd.arguments import ArgumentParser, integer
from easgd.configs import default
from easgd.infra import sharding
from easgd.sim import sizing, timing
from easgd.train import trainer
from easgd.train.runtimes import trace


def _config(model: str, workers: int, tau: int, servers: int, steps: int):
  config = default.get_config()
  config.update_from_flattened_dict(
    {
      "algorithm": "async_easgd",
      "model": model,
      "workers": workers,
      "run.devices": workers,
      "outer.comm_period": tau,
      "run.total_steps": steps,
      "run.log_every": 0,
      "run.eval_every": 0,
      "run.checkpoint_every": 0,
      "cluster.speed_spread": 0.0,  # equal workers, as the planner's steady state has
      "runtime": "ray",
      "ray.servers": servers,
    }
  )
  return config


def _run(config) -> tuple[float, float, float]:
  """(measured seconds a local step of a worker, median compute seconds, median
  exchange seconds)."""
  with tempfile.TemporaryDirectory() as workdir:
    result = trainer.train_and_evaluate(config, workdir)
    events = trace.read(os.path.join(workdir, trace.FILE)).events
  steps_per_second = result.metrics["train/images_per_sec"] / config.data.batch_size
  compute = np.median([e.compute for e in events if e.local and e.compute > 0])
  service = np.median([e.service for e in events if e.op == "exchange"])
  return config.workers / steps_per_second, float(compute), float(service)


def predicted(workers: int, tau: int, servers: int, compute: float, service: float) -> float:
  """The planner's T(P) for `servers` servers, from one server's measured service."""
  cluster = timing.Cluster(
    compute_time=compute, jitter=0.0, master_time=service, servers=servers, latency=0.0
  )
  steady = sizing.Timing(
    cluster=cluster,
    model_bytes=0.0,  # the exchange's bytes are inside the measured service
    compute_time=compute,
    period=tau,
    family=sizing.LOCKED,
  )
  return steady.step_time(workers)


def main() -> None:
  parser = ArgumentParser(prog="bench/plan_servers.py", description=__doc__.splitlines()[0])
  parser.add_argument("--model", default="lenet5")
  parser.add_argument("--workers", type=integer(1), default=2)
  # t_c is measured on the steps without a request: tau > 1 (the module docstring).
  parser.add_argument("--tau", type=integer(2), default=4)
  parser.add_argument("--steps", type=integer(1), default=80)
  parser.add_argument("--repeats", type=integer(1), default=2)
  args = parser.parse_args()
  sharding.configure_cpu_devices(args.workers)

  ray_connection.init(  # a Ray of its own, not the one `ray start` last started here
    address="local", include_dashboard=False, log_to_driver=False, logging_level="ERROR"
  )
  when = time.strftime("%Y-%m-%d %H:%M")
  print(f"# {when}, load {os.getloadavg()[0]:.2f}, {os.cpu_count()} cores", flush=True)
  runs = {1: [], 2: []}
  for _ in range(args.repeats):
    for servers, taken in runs.items():
      taken.append(_run(_config(args.model, args.workers, args.tau, servers, args.steps)))
  measured = {servers: float(np.median([r[0] for r in rs])) for servers, rs in runs.items()}
  compute = float(np.median([r[1] for r in runs[1]]))
  service = float(np.median([r[2] for r in runs[1]]))
  print(
    f"{args.model}, {args.workers} workers, tau {args.tau}: t_c {1e3 * compute:.2f} ms, "
    f"one exchange with 1 server {1e3 * service:.2f} ms (the planner's master_time)"
  )
  for servers, seconds in measured.items():
    guess = predicted(args.workers, args.tau, servers, compute, service)
    error = (guess - seconds) / seconds
    exchanges = float(np.median([r[2] for r in runs[servers]]))
    print(
      f"S={servers}: predicted {1e3 * guess:.2f} ms a step, measured {1e3 * seconds:.2f} ms "
      f"(error {100 * error:+.0f}%); one exchange measured {1e3 * exchanges:.2f} ms, "
      f"the planner's s {1e3 * service / servers:.2f} ms",
      flush=True,
    )
  ray_connection.shutdown()


if __name__ == "__main__":
  main()
