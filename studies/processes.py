"""The asynchronous rules across processes: runtime=ray against sync_easgd on
jax.distributed, Downpour's speed-up, and the timing model's error.

    python studies/processes.py --workdir runs/processes [--seeds 0,1,2] [--total_steps 400]
        [--rules async_easgd,async_measgd,hogwild_easgd] [--n_syncs 1,4,16]
        [--downpour_workers 1,2,4] [--set FIELD=VALUE ...]

Every run is LeNet-5 on mnist5k, each worker a process of its own with one CPU
device, evaluated every 25 steps; wall-clock time is seconds of training (the
evaluations and checkpoints left out).

A. Four worker processes, worker 2 two times and worker 3 four times slower
   (cluster.stragglers=(2, 3), cluster.straggler_slowdowns=(2, 4): each
   slowed worker sleeps that many times its measured step, as runtime=threads
   and ray do): async_easgd, async_measgd (EAMSGD's momentum 0.9) and
   hogwild_easgd under runtime=ray with one server, against sync_easgd on
   four processes started by easgd.launch (jax.distributed). A lock-step run
   waits for its slowest worker at every step; jax.distributed's processes do
   not sleep for a straggler, so sync_easgd's time is its measured time plus,
   for every step, the 4x straggler's extra 3 t_c (t_c: the ray runs' median
   local step). Time to 95% center test accuracy, for each seed.
B. Downpour (GPU A-SGD) with n_sync = 1, 4 and 16 on 1, 2 and 4 equal worker
   processes under runtime=ray: the speed-up over one worker at equal
   accuracy, the time of one worker to the highest center accuracy every
   Downpour run reached (at most 95%) over that of P, beside Paine et al.'s
   "up to 3.2x from more GPU clients" (first seed only).
C. Each run again under the timing model (runtime=simulated), given what the
   run measured: t_c, the median seconds of a local step without a request
   as the run's process saw it (the device's compute and the host's work:
   the call to the worker's process, the loss fetched back), its lognormal
   spread, and the median whole exchange (the trace's service seconds: the
   row to the server, its master program, the answer back) as the master's
   time, on a network of no latency and no bandwidth limit (one machine's
   loopback; the exchange's transfer is inside the measured service).
   sync_easgd is predicted from the ray runs' t_c. The prediction's error:
   (predicted - measured) / measured, of the time to 95%.

--rules, --n_syncs and --downpour_workers choose some of part A's rules and
part B's settings (sync_easgd is always part A's baseline, one worker part B's,
and an n_sync above 1 gives n_sync = 1 its t_c). sync_easgd's straggler is then
timed from the chosen rules' t_c. `--set` overrides config fields by their grouped
names for every run (e.g. model='mlp', a smaller network than LeNet-5).

Writes docs/processes_table.md and docs/processes.png (accuracy against
seconds, measured and predicted, for the first seed of part A).
"""

import os
import subprocess
import sys
import time

import jax
import matplotlib

matplotlib.use("Agg")  # files only, no display
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from easgd import arguments, ray_connection  # noqa: E402
from easgd.configs import default  # noqa: E402
from easgd.errors import ConfigError  # noqa: E402
from easgd.infra import scalars  # noqa: E402
from easgd.studies import harness  # noqa: E402
from easgd.train import trainer  # noqa: E402
from easgd.train.runtimes import trace  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TARGET = harness.TARGET
EVERY = 25
ASYNC_RULES = ("async_easgd", "async_measgd", "hogwild_easgd")
STRAGGLERS, SLOWDOWNS = (2, 3), (2.0, 4.0)
N_SYNCS = (1, 4, 16)
DOWNPOUR_WORKERS = (1, 2, 4)


def overrides(rule: str, workers: int, seed: int, total_steps: int, stragglers: bool) -> dict:
  """The config fields of one run (the default config's otherwise)."""
  values = {
    "algorithm": rule,
    "workers": workers,
    "seed": seed,
    "run.devices": workers,
    "run.total_steps": total_steps,
    "run.log_every": EVERY,
    "run.eval_every": EVERY,
    "run.checkpoint_every": 0,
    "cluster.speed_spread": 0.0,
    "cluster.jitter": 0.0,
    "cluster.latency": 0.0,
    "cluster.master_time": 0.0,
    "cluster.bandwidth": float("inf"),
    "cluster.stragglers": STRAGGLERS if stragglers else (),
    "cluster.straggler_slowdowns": SLOWDOWNS if stragglers else (),
  }
  if rule == "async_measgd":
    values["optimizer.momentum"] = 0.9
  return values


def config_of(values: dict):
  config = default.get_config()
  config.update_from_flattened_dict(values)
  return config


def measure_ray(values: dict, workdir: str) -> dict:
  """Trains under runtime=ray; returns its accuracy and seconds at each evaluation,
  and what the timing model needs (easgd.sim.timing)."""
  config = config_of({**values, "runtime": "ray"})
  trainer.train_and_evaluate(config, workdir)
  logged = scalars.by_step(workdir)
  events = trace.read(os.path.join(workdir, trace.FILE)).events
  fast = [w for w in range(config.workers) if w not in config.cluster.stragglers]
  # A step without a request carries its own time; the first ones compile and warm up.
  local = [e.compute for e in events if e.op == "local" and e.worker in fast and e.step >= 5]
  service = [e.service for e in events if e.service > 0]
  return {
    "accuracy": logged["eval/center_accuracy"],
    "seconds": logged["sim/time"],
    "compute": local,
    "service": float(np.median(service)) if service else 0.0,
  }


def measure_sync(values: dict, workdir: str, compute_time: float) -> dict:
  """Trains sync_easgd on `workers` processes of easgd.launch; its seconds: each log
  window's measured seconds, plus the slowest worker's extra compute at every step."""
  # The timing model's fields change nothing a lock-step run does for real.
  flags = [f"--config.{f}={v}" for f, v in values.items() if not f.startswith("cluster.")]
  command = [sys.executable, "-m", "easgd.launch", "--processes", str(values["workers"])]
  command += ["--", "train.py", "--config", "configs/default.py", "--workdir", workdir, *flags]
  environment = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
  done = subprocess.run(
    command, check=False, cwd=REPO, env=environment, capture_output=True, text=True
  )
  if done.returncode != 0:
    tail = "\n".join(done.stderr.splitlines()[-15:])
    raise SystemExit(f"the sync_easgd launch failed ({done.returncode}):\n{tail}")
  logged = scalars.by_step(workdir)
  rate = logged["train/images_per_sec"]
  batch = config_of(values).data.batch_size
  extra = (max(SLOWDOWNS) - 1.0) * compute_time if values["cluster.stragglers"] else 0.0
  seconds, total, last = {}, 0.0, 0
  for step in sorted(rate):
    window = step - last
    total += window * values["workers"] * batch / rate[step] + window * extra
    seconds[step], last = total, step
  return {"accuracy": logged["eval/center_accuracy"], "seconds": seconds}


def predict(values: dict, compute: list[float], service: float, workdir: str) -> dict:
  """Trains the same run under the timing model given what was measured."""
  config = config_of(
    {
      **values,
      "runtime": "simulated",
      "cluster.compute_time": float(np.median(compute)),
      "cluster.jitter": float(np.std(np.log(compute))),
      "cluster.master_time": service,
    }
  )
  trainer.train_and_evaluate(config, workdir)
  logged = scalars.by_step(workdir)
  return {"accuracy": logged["eval/center_accuracy"], "seconds": logged["sim/time"]}


def time_to_target(run: dict, target: float = TARGET) -> float | None:
  reached = [step for step in sorted(run["accuracy"]) if run["accuracy"][step] >= target]
  return run["seconds"][reached[0]] if reached else None


def common_target(runs) -> float:
  """The highest accuracy every run reached, at most TARGET, down to a half percent."""
  reached = min(max(run["measured"]["accuracy"].values()) for run in runs)
  return min(TARGET, np.floor(reached * 200) / 200)


def _seconds(value: float | None) -> str:
  return "not reached" if value is None else f"{value:.1f}"


def _error(measured: float | None, predicted: float | None) -> str:
  if measured is None or predicted is None:
    return "-"
  return f"{(predicted - measured) / measured:+.0%}"


def _mean(values) -> str:
  reached = [v for v in values if v is not None]
  if len(reached) < len(values):
    return f"{len(reached)} of {len(values)} reached" + (
      f", mean {np.mean(reached):.1f}" if reached else ""
    )
  return f"{np.mean(reached):.1f} (+- {np.std(reached):.1f})"


def write_table(part_a, part_b, path: str, command: str) -> None:
  when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
  lines = [
    f"Made by `{command}` ({when}, load average {os.getloadavg()[0]:.2f} at the end, "
    f"{os.cpu_count()} CPU cores). LeNet-5 on mnist5k, each worker a process with one CPU "
    f"device; seconds of training to {TARGET:.0%} center test accuracy (evaluated every "
    f"{EVERY} steps); predicted: the timing model given the run's measured local step "
    "(device and host), its spread and the whole exchange (studies/processes.py says how).",
    "",
    "A. 4 workers, worker 2 2x and worker 3 4x slower.",
    "",
    "| rule | runtime | seeds | to 95%, measured (s), each seed | mean | predicted (s), each "
    "seed | error, each seed | t_c (ms) | exchange (ms) |",
    "|---|---|---|---|---|---|---|---|---|",
  ]
  for rule, runs in part_a.items():
    measured = [time_to_target(run["measured"]) for run in runs]
    predicted = [time_to_target(run["predicted"]) for run in runs]
    runtime = "jax.distributed (easgd.launch)" if rule == "sync_easgd" else "ray, 1 server"
    errors = [_error(m, p) for m, p in zip(measured, predicted, strict=True)]
    lines.append(
      f"| {rule} | {runtime} | {len(runs)} | {', '.join(map(_seconds, measured))} | "
      f"{_mean(measured)} | {', '.join(map(_seconds, predicted))} | {', '.join(errors)} | "
      f"{1e3 * np.mean([run['compute_time'] for run in runs]):.2f} | "
      f"{1e3 * np.mean([run['service'] for run in runs]):.2f} |"
    )
  target = common_target(part_b.values())
  lines += [
    "",
    f"B. Downpour, equal workers, first seed: seconds to {target:.1%} center test accuracy "
    "(the highest every Downpour run reached, at most 95%), and the speed-up over one worker "
    "of the same n_sync (the paper: up to 3.2x from more GPU clients).",
    "",
    f"| n_sync | workers | to {target:.1%}, measured (s) | speed-up | predicted (s) | error | "
    "t_c (ms) | exchange (ms) |",
    "|---|---|---|---|---|---|---|---|",
  ]
  for (n_sync, workers), run in part_b.items():
    measured = time_to_target(run["measured"], target)
    alone = time_to_target(part_b[n_sync, 1]["measured"], target)
    speed_up = f"{alone / measured:.2f}x" if measured and alone else "-"
    predicted = time_to_target(run["predicted"], target)
    lines.append(
      f"| {n_sync} | {workers} | {_seconds(measured)} | {speed_up} | {_seconds(predicted)} | "
      f"{_error(measured, predicted)} | {1e3 * run['compute_time']:.2f} | "
      f"{1e3 * run['service']:.2f} |"
    )
  with open(path, "w") as file:
    file.write("\n".join(lines) + "\n")


def plot(part_a, path: str) -> None:
  figure, axis = plt.subplots(figsize=(7, 4.5))
  colors = (*ASYNC_RULES, "sync_easgd")  # a rule's color whatever --rules chose
  for rule, runs in part_a.items():
    for key, style in (("measured", "-"), ("predicted", "--")):
      run = runs[0][key]
      steps = sorted(run["accuracy"])
      axis.plot(
        [run["seconds"][s] for s in steps],
        [run["accuracy"][s] for s in steps],
        style,
        color=f"C{colors.index(rule)}",
        label=f"{rule} {key}",
      )
  axis.axhline(TARGET, color="grey", linewidth=0.5)
  axis.set_ylim(0.8, 1.0)
  axis.set_xlabel("seconds of training")
  axis.set_ylabel("center test accuracy")
  axis.set_title("4 worker processes, one 2x and one 4x slower (first seed)")
  axis.legend(fontsize=7)
  figure.tight_layout()
  figure.savefig(path, dpi=110)


def main():
  parser = harness.parser(__doc__, overrides=True)
  parser.add_argument("--seeds", default="0,1,2")
  parser.add_argument("--total_steps", type=arguments.integer(EVERY), default=400)
  parser.add_argument("--rules", type=arguments.some_of(ASYNC_RULES), default=ASYNC_RULES)
  parser.add_argument("--n_syncs", type=arguments.some_of(N_SYNCS), default=N_SYNCS)
  parser.add_argument(
    "--downpour_workers",
    type=arguments.some_of(DOWNPOUR_WORKERS),
    default=DOWNPOUR_WORKERS,
  )
  args = parser.parse_args()
  if 1 not in args.downpour_workers:
    parser.error("--downpour_workers needs 1: part B's speed-ups are over one worker")
  if max(args.n_syncs) == 1:
    parser.error("--n_syncs needs one above 1: its local steps give n_sync = 1 its t_c")
  try:
    changed = harness.parse_overrides(args.set)
  except ConfigError as error:
    arguments.fail(str(error))
  # The run's process: a CPU device a worker (the simulated predictions' layout too).
  jax.config.update("jax_num_cpu_devices", max(DOWNPOUR_WORKERS))
  seeds = [int(seed) for seed in args.seeds.split(",")]
  harness.check_outputs(args.docs, "processes", "processes_table.md", "processes.png")
  harness.quiet()
  if os.path.exists(args.workdir):
    arguments.fail(f"--workdir: {args.workdir} exists; give a new --workdir")

  ray_connection.init(  # a Ray of its own, not the one `ray start` last started here
    address="local", include_dashboard=False, log_to_driver=False, logging_level="ERROR"
  )

  def run_dir(*parts) -> str:
    return os.path.join(args.workdir, *map(str, parts))

  def values_of(rule: str, workers: int, seed: int, stragglers: bool) -> dict:
    # --set last, so that an override wins over the study's own settings.
    return {**overrides(rule, workers, seed, args.total_steps, stragglers), **changed}

  part_a: dict[str, list[dict]] = {rule: [] for rule in (*args.rules, "sync_easgd")}
  for seed in seeds:
    for rule in args.rules:
      print(f"A: {rule}, seed {seed} ...", flush=True)
      values = values_of(rule, 4, seed, stragglers=True)
      measured = measure_ray(values, run_dir(rule, seed, "measured"))
      predicted = predict(
        values, measured["compute"], measured["service"], run_dir(rule, seed, "predicted")
      )
      part_a[rule].append(
        {
          "measured": measured,
          "predicted": predicted,
          "compute_time": float(np.median(measured["compute"])),
          "service": measured["service"],
        }
      )
    # The ray runs' local step on this machine, for the lock-step run's straggler.
    compute_time = float(np.median([part_a[rule][-1]["compute_time"] for rule in args.rules]))
    print(f"A: sync_easgd, seed {seed} ...", flush=True)
    values = values_of("sync_easgd", 4, seed, stragglers=True)
    measured = measure_sync(values, run_dir("sync_easgd", seed, "measured"), compute_time)
    predicted = predict(values, [compute_time], 0.0, run_dir("sync_easgd", seed, "predicted"))
    part_a["sync_easgd"].append(
      {"measured": measured, "predicted": predicted, "compute_time": compute_time, "service": 0.0}
    )

  part_b: dict[tuple[int, int], dict] = {}
  for n_sync in args.n_syncs:
    for workers in args.downpour_workers:
      print(f"B: downpour, n_sync {n_sync}, {workers} workers ...", flush=True)
      values = values_of("downpour", workers, seeds[0], stragglers=False)
      values["downpour.n_sync"] = n_sync
      measured = measure_ray(values, run_dir("downpour", n_sync, workers, "measured"))
      part_b[n_sync, workers] = {"measured": measured}
  for (n_sync, workers), run in part_b.items():
    measured = run["measured"]
    # With n_sync = 1 every step carries a request: its t_c is the largest n_sync's, of as
    # many workers.
    compute = measured["compute"] or part_b[max(args.n_syncs), workers]["measured"]["compute"]
    values = values_of("downpour", workers, seeds[0], stragglers=False)
    values["downpour.n_sync"] = n_sync
    run["predicted"] = predict(
      values, compute, measured["service"], run_dir("downpour", n_sync, workers, "predicted")
    )
    run["compute_time"], run["service"] = float(np.median(compute)), measured["service"]
  ray_connection.shutdown()

  os.makedirs(args.docs, exist_ok=True)
  table = os.path.join(args.docs, "processes_table.md")
  write_table(part_a, part_b, table, harness.command("processes"))
  plot(part_a, os.path.join(args.docs, "processes.png"))
  harness.print_table(table)


if __name__ == "__main__":
  main()
