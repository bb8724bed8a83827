"""The asynchronous rules against the synchronous ones on heterogeneous workers: time
to 95% center accuracy, and the accuracy at a fixed simulated time.

    python studies/heterogeneous.py --workdir runs/heterogeneous [--total_steps 600]
        [--seeds 3] [--runs async_easgd,async_local_sgd-DN,...] [--set FIELD=VALUE ...]
        [--parallel N [--point_cpus C] [--point_gpus G] [--ray_address HOST:PORT]]

--parallel N trains N runs at a time, each a Ray Tune trial in a process of its own
(easgd.executor, as sweep.py's points): the same runs, the same table.

Trains each run (RUNS below: a rule and its recipe) on LeNet-5, 8 workers of
batch 32, on the default timing model made heterogeneous (CLUSTER: worker 6
twice as slow as worker 0, worker 7 four times, the others spread between),
one run per name and seed in <workdir>/<run>/seed_<n> (finished runs are
reused, so the study resumes). Writes docs/heterogeneous_table.md (means over
the seeds) and docs/heterogeneous.png (center test accuracy against simulated
seconds).

"At a fixed simulated time" reads each run's last evaluation (every 25 steps)
at or before the simulated second where the first of the runs ended; "time to
95%" is the simulated second of a seed's first evaluation at or above 0.95,
averaged over the seeds that reached it.
"""

import os

import matplotlib

matplotlib.use("Agg")  # files only, no display
import matplotlib.pyplot as plt  # noqa: E402

from easgd import arguments, executor  # noqa: E402
from easgd.config import validation  # noqa: E402
from easgd.configs import default  # noqa: E402
from easgd.errors import ConfigError  # noqa: E402
from easgd.infra import checkpoint, scalars  # noqa: E402
from easgd.studies import harness  # noqa: E402
from easgd.train import trainer  # noqa: E402

EVERY = 25
# Worker i's mean step is c*(1 + s*i/7) [* k for worker 7]: s = 7/6 makes worker 6
# twice as slow as worker 0, and k = 24/13 makes worker 7 four times as slow.
CLUSTER = {
  "cluster.speed_spread": 7 / 6,
  "cluster.stragglers": (7,),
  "cluster.straggler_slowdown": 24 / 13,
}
# Every run's workers take the default config's SGD at 0.1 (async_measgd its own
# momentum SGD), so that the runs differ in how they communicate; diloco and
# async_local_sgd's master take DiLoCo's outer Nesterov SGD at 0.7 and 0.9. (With
# DiLoCo's AdamW at 1e-3 inside, async_local_sgd's outer momentum diverged here, with
# Delayed Nesterov or without: docs/outer.md, "Heterogeneous workers".) With
# Nesterov at every push (N = 1) each push moves the center by eta_o times its
# pseudo-gradient: eta_o = 0.7/8 makes that the step Delayed Nesterov takes for a
# push (eta_o/N with N = 8), where 0.7 diverges.
NESTEROV_EVERY_PUSH = {"outer.momentum_period": 1, "outer.learning_rate": 0.7 / 8}
DELAYED = {"outer.momentum_period": 8}
DYLU = {"outer.dynamic_local_steps": True}
RUNS = {
  "sync_easgd": ("sync_easgd", {}),
  "diloco": ("diloco", {}),
  "async_easgd": ("async_easgd", {}),
  # EAMSGD's look-ahead momentum at its rule's defaults (mu 0.9, eta 0.01).
  "async_measgd": (
    "async_measgd",
    {"optimizer.momentum": 0.9, "optimizer.nesterov": True, "optimizer.learning_rate": 0.01},
  ),
  "async_local_sgd": ("async_local_sgd", NESTEROV_EVERY_PUSH),
  "async_local_sgd-DN": ("async_local_sgd", DELAYED),
  "async_local_sgd-DyLU": ("async_local_sgd", {**NESTEROV_EVERY_PUSH, **DYLU}),
  "async_local_sgd-DN-DyLU": ("async_local_sgd", {**DELAYED, **DYLU}),
}


def config_for(run: str, total_steps: int, seed: int, overrides: dict):
  rule, recipe = RUNS[run]
  config = default.get_config()
  config.algorithm = rule
  config.seed = seed
  config.update_from_flattened_dict({**CLUSTER, **recipe})
  config.run.total_steps = total_steps
  config.run.log_every = config.run.eval_every = EVERY
  config.run.checkpoint_every = 0
  config.update_from_flattened_dict(overrides)
  return config


def workdir_of(args, run: str, seed: int) -> str:
  return os.path.join(args.workdir, run, f"seed_{seed}")


def missing(run: str, args, overrides: dict) -> list[tuple[str, object, str]]:
  """The seeds of `run` not trained yet, as `harness.train_all` takes them."""
  runs = []
  for seed in range(args.seeds):
    workdir = workdir_of(args, run, seed)
    saved = checkpoint.saved_config(workdir)
    if saved is None or harness.saved_total_steps(saved) != args.total_steps:
      runs.append(
        (f"{run}, seed {seed}", config_for(run, args.total_steps, seed, overrides), workdir)
      )
  return runs


def time_to_target(runs: list[dict]) -> tuple[float | None, int]:
  """The mean simulated seconds to 0.95 over the seeds that reached it, and how many did."""
  reached = [r for r in (harness.first_reaching(run) for run in runs) if r is not None]
  if not reached:
    return None, 0
  return sum(time for time, _ in reached) / len(reached), len(reached)


def write_table(rows, path, command, args, time_budget):
  lines = [
    "# The asynchronous and synchronous rules on heterogeneous workers",
    "",
    f"Made by `{command}`: LeNet-5 on mnist5k, 8 workers x batch 32, {args.total_steps} "
    "steps (ticks) each, the default config's timing model (10 ms steps, 10% jitter, "
    "1 Gbit/s links, a 1 ms master) with worker 6 twice and worker 7 four times as slow as "
    "worker 0 (the others spread between), tau = H = 4. Recipes in studies/heterogeneous.py. "
    f"Means over {args.seeds} seeds; accuracy is the center's on the 1,000 test digits.",
    "",
    f"| run | time to 0.95 (sim s) | acc. at {time_budget:.2f} sim s | final acc. "
    "| final sim s | mean local steps | MB sent per worker |",
    "|---|---|---|---|---|---|---|",
  ]
  for run, (curves, (seconds, reached)) in rows.items():
    if seconds is None:
      to_target = f"not reached (0/{args.seeds})"
    else:
      note = "" if reached == args.seeds else f" ({reached}/{args.seeds} seeds)"
      to_target = f"{seconds:.2f}{note}"
    lines.append(
      f"| {run} | {to_target} | {harness.at_budget(curves, 'sim/time', time_budget):.3f} "
      f"| {harness.final(curves, 'eval/center_accuracy'):.3f} "
      f"| {harness.final(curves, 'sim/time'):.2f} "
      f"| {harness.final(curves, 'sim/worker_steps_mean'):.0f} "
      f"| {harness.final(curves, 'comm/bytes_per_worker') / 1e6:.2f} |"
    )
  with open(path, "w") as table:
    table.write("\n".join(lines) + "\n")


def plot(rows, path, title, time_budget):
  figure, axes = plt.subplots(figsize=(8, 5))
  for n, (run, (curves, _)) in enumerate(rows.items()):
    accuracy, time = dict(curves["eval/center_accuracy"]), dict(curves["sim/time"])
    steps = sorted(accuracy)
    style = "--" if RUNS[run][0] in ("sync_easgd", "diloco") else "-"
    color = plt.get_cmap("tab10").colors[n % 10]
    axes.plot([time[s] for s in steps], [accuracy[s] for s in steps], style, color=color, label=run)
  axes.axvline(time_budget, color="grey", linewidth=0.8)
  axes.axhline(harness.TARGET, color="grey", linewidth=0.8, linestyle=":")
  axes.set_xlabel("simulated seconds")
  axes.set_ylabel("center test accuracy")
  axes.set_ylim(0.8, 1.0)
  axes.grid(alpha=0.3)
  axes.legend(fontsize=8, loc="lower right")
  axes.set_title(title)
  figure.tight_layout()
  figure.savefig(path, dpi=110)


def main():
  harness.use_cpu_devices()
  parser = harness.parser(__doc__, overrides=True)
  parser.add_argument("--total_steps", type=arguments.integer(1), default=600)
  parser.add_argument("--seeds", type=arguments.integer(1), default=3)
  parser.add_argument("--runs", default=",".join(RUNS), help="comma-separated runs (RUNS)")
  executor.add_arguments(parser)
  args = parser.parse_args()
  harness.check_outputs(args.docs, "heterogeneous", "heterogeneous_table.md", "heterogeneous.png")
  harness.quiet()
  chosen = args.runs.split(",")
  try:
    unknown = [run for run in chosen if run not in RUNS]
    if unknown:
      raise ConfigError(f"--runs: unknown {', '.join(unknown)}; allowed: {', '.join(RUNS)}")
    overrides = harness.parse_overrides(args.set)
    parallel = executor.from_arguments(args)
    # Before anything trains: a bad setting or another study's workdir is one line
    # now, not a traceback an hour in.
    for run in chosen:
      for seed in range(args.seeds):
        config = config_for(run, args.total_steps, seed, overrides)
        trainer.check(config)
        validation.check_checkpoint(config, workdir_of(args, run, seed))
  except (ValueError, TypeError) as error:
    arguments.fail(str(error))

  to_train = [entry for run in chosen for entry in missing(run, args, overrides)]
  with harness.connected(parallel):
    harness.train_all(to_train, parallel, args.workdir, "heterogeneous")
  rows = {}
  for run in chosen:
    runs = [scalars.read(workdir_of(args, run, seed)) for seed in range(args.seeds)]
    rows[run] = (harness.mean_curves(runs), time_to_target(runs))
  time_budget = min(harness.final(curves, "sim/time") for curves, _ in rows.values())
  os.makedirs(args.docs, exist_ok=True)
  table = os.path.join(args.docs, "heterogeneous_table.md")
  write_table(rows, table, harness.command("heterogeneous"), args, time_budget)
  title = f"LeNet-5 on mnist5k, 8 heterogeneous workers (mean of {args.seeds} seeds)"
  plot(rows, os.path.join(args.docs, "heterogeneous.png"), title, time_budget)
  harness.print_table(table)


if __name__ == "__main__":
  main()
