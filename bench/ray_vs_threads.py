"""runtime=ray against runtime=threads: the same workers, devices and steps.

For each network and tau (outer.comm_period) it trains async_easgd for
--steps ticks under both runtimes, alternately, and prints each one's local
steps a second (the measured train/images_per_sec over the batch size) and
the ratio ray/threads, measured in the same run. Then, for 1 and 2 servers,
the time of one exchange against the bytes it moves: the trace's service
time, which under ray is the whole operation (the row from the worker's
process to every server, their master programs, their answers ready). With 1
among --taus, the 1-server exchange is read from the last tau = 1 ray run above
(the same config) instead of a run of its own.

  python bench/ray_vs_threads.py                      # LeNet-5 and ResNet-20, tau 1 and 4
  python bench/ray_vs_threads.py --models lenet5 --steps 100

On a CPU each worker has a CPU device of its own under both runtimes. On a
machine with a GPU the workers share one GPU: runtime=threads runs them all
on its first, runtime=ray gives each process a 1/P share of one
(ray.worker_gpus); both take the GPU's memory as they need it, as
runtime=ray does on a GPU.

Goal: ResNet-20 at tau = 4 under ray at >= 0.8x of threads (bench/README.md has the figures).
"""

import json
import os
import tempfile
import time

import numpy as np

from easgd import ray_connection
from easgd.arguments import ArgumentParser, integer
from easgd.configs import default
from easgd.infra import platform, sharding
from easgd.train import trainer
from easgd.train.runtimes import trace
from easgd.train.runtimes.ray.runtime import RayRuntime

# The backend the runs use, asked before JAX starts (main makes its settings).
BACKEND = platform.expected_backend()


def _config(model: str, tau: int, runtime: str, steps: int, workers: int, servers: int = 1):
  config = default.get_config()
  config.update_from_flattened_dict(
    {
      "algorithm": "async_easgd",
      "model": model,
      "workers": workers,
      "run.devices": 1 if BACKEND == "gpu" else workers,
      "outer.comm_period": tau,
      "run.total_steps": steps,
      "run.log_every": 0,
      "run.eval_every": 0,
      "run.checkpoint_every": 0,
      "cluster.speed_spread": 0.0,  # equal workers: the runtimes' own costs alone
      "runtime": runtime,
    }
  )
  if runtime == "ray":
    config.ray.servers = servers
    if BACKEND == "gpu":
      config.ray.worker_gpus = 1.0 / workers
  return config


def _run(config) -> tuple[float, list, float]:
  """(local steps a second of training, the trace's events, bytes a request sends)."""
  with tempfile.TemporaryDirectory() as workdir:
    result = trainer.train_and_evaluate(config, workdir)
    events = trace.read(os.path.join(workdir, trace.FILE)).events
  metrics = result.metrics
  rate = metrics["train/images_per_sec"] / config.data.batch_size
  sent = metrics["comm/bytes_per_worker"] / max(metrics["comm/exchanges_per_worker"], 1.0)
  return rate, events, sent


def main() -> None:
  parser = ArgumentParser(prog="bench/ray_vs_threads.py", description=__doc__.splitlines()[0])
  parser.add_argument("--models", default="lenet5,resnet20")
  parser.add_argument("--taus", default="1,4")
  parser.add_argument("--steps", type=integer(1), default=60)
  parser.add_argument("--workers", type=integer(1), default=2)
  parser.add_argument("--repeats", type=integer(1), default=2)
  args = parser.parse_args()
  # What train.py sets before JAX starts, for the backend in use.
  settings = RayRuntime.environment(_config("lenet5", 1, "ray", 1, args.workers), BACKEND)
  for name, value in settings.items():
    os.environ.setdefault(name, value)
  if BACKEND == "gpu":
    platform.make_gpu_deterministic()
  else:
    sharding.configure_cpu_devices(args.workers)  # threads: a device a worker, as ray has

  ray_connection.init(  # a Ray of its own, not the one `ray start` last started here
    address="local", include_dashboard=False, log_to_driver=False, logging_level="ERROR"
  )
  when = time.strftime("%Y-%m-%d %H:%M")
  print(f"# {when}, load {os.getloadavg()[0]:.2f}, {os.cpu_count()} cores, {BACKEND} workers")
  rows = []
  exchanges = {}  # (model, servers) -> (the trace's events, bytes a request sends), tau 1
  for model in args.models.split(","):
    for tau in (int(t) for t in args.taus.split(",")):
      rates = {"threads": [], "ray": []}
      for _ in range(args.repeats):
        for runtime in ("threads", "ray"):
          config = _config(model, tau, runtime, args.steps, args.workers)
          rate, events, sent = _run(config)
          rates[runtime].append(rate)
          if runtime == "ray" and tau == 1:  # the config of the 1-server exchange below
            exchanges[model, 1] = events, sent
      threads, ray_rate = np.median(rates["threads"]), np.median(rates["ray"])
      rows.append((model, tau, threads, ray_rate, ray_rate / threads))
      print(
        f"{model:9s} tau={tau}: threads {threads:7.1f} steps/s, ray {ray_rate:7.1f} steps/s, "
        f"ray/threads {ray_rate / threads:.2f}",
        flush=True,
      )
  print("\n# one exchange (async_easgd, tau=1), by servers")
  for model in args.models.split(","):
    for servers in (1, 2):
      if (model, servers) not in exchanges:
        config = _config(model, 1, "ray", args.steps, args.workers, servers)
        exchanges[model, servers] = _run(config)[1:]
      events, sent = exchanges[model, servers]
      service = [e.service for e in events if e.op == "exchange"]
      print(
        f"{model:9s} servers={servers}: {sent / 1e6:.2f} MB a request, one exchange "
        f"{1e3 * np.median(service):.2f} ms (median of {len(service)}), "
        f"{sent / np.median(service) / 1e6:.0f} MB/s",
        flush=True,
      )
  print(json.dumps({"rows": [list(map(str, row)) for row in rows]}))
  ray_connection.shutdown()


if __name__ == "__main__":
  main()
