"""The asynchronous rules against the synchronous ones on heterogeneous workers: time
to 95% center accuracy, and the accuracy at a fixed simulated time.

    python studies/heterogeneous.py --workdir runs/heterogeneous [--total_steps 600]
        [--seeds 3] [--runs async_easgd,async_local_sgd-DN,...]
        [--add_to_table [--added_plot heterogeneous_added.png]]
        [--set FIELD=VALUE ...]
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

--add_to_table puts the rows of --runs into the table already in --docs instead,
read at that table's fixed time, each in place of the row of the same run; its
other rows stay, a note below the table names the command and the date, and the
plot of these runs alone goes to docs/heterogeneous_added.png (or --added_plot).
"""

import os

import matplotlib

matplotlib.use("Agg")  # files only, no display
import matplotlib.pyplot as plt  # noqa: E402

from easgd import arguments, executor, rules  # noqa: E402
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
# The synchronous rounds at a quorum of 6 of the 8 workers (easgd.sim.rounds): closed at
# the sixth arrival, the two slowest dropped (torchft's heal) or late (their messages
# in the next round, weighted 1/sqrt(2)).
QUORUM = {"outer.quorum": 6}
LATE = {**QUORUM, "outer.missed": "late"}
RUNS = {
  "sync_easgd": ("sync_easgd", {}),
  "diloco": ("diloco", {}),
  "sync_easgd-q6-drop": ("sync_easgd", QUORUM),
  "sync_easgd-q6-late": ("sync_easgd", LATE),
  "diloco-q6-drop": ("diloco", QUORUM),
  "diloco-q6-late": ("diloco", LATE),
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
  # PALSGD at its own defaults (p = 0.2, eta_pull = 0.5: a pull moves a quarter of the
  # way to the center), with diloco's outer optimizer.
  "palsgd": ("palsgd", {"outer.pull_probability": 0.2, "outer.pull_rate": 0.5}),
  # NoLoCo at its own defaults: its reference code's outer SGD (0.7, heavy-ball 0.5),
  # in random pairs.
  "noloco": ("noloco", {"outer.momentum": 0.5, "outer.nesterov": False}),
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
    if not harness.finished(saved, workdir, args.total_steps):
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


def row(run: str, curves: dict, to_target, seeds: int, time_budget: float) -> str:
  """The table's line of `run`: its mean curves, its (time to 0.95, seeds that reached it)."""
  seconds, reached = to_target
  if seconds is None:
    to_target = f"not reached (0/{seeds})"
  else:
    note = "" if reached == seeds else f" ({reached}/{seeds} seeds)"
    to_target = f"{seconds:.2f}{note}"
  return (
    f"| {run} | {to_target} | {harness.at_budget(curves, 'sim/time', time_budget):.3f} "
    f"| {harness.final(curves, 'eval/center_accuracy'):.3f} "
    f"| {harness.final(curves, 'sim/time'):.2f} "
    f"| {harness.final(curves, 'sim/worker_steps_mean'):.0f} "
    f"| {harness.final(curves, 'comm/bytes_per_worker') / 1e6:.2f} |"
  )


def write_table(rows, path, command, args, time_budget):
  lines = [
    "# The asynchronous and synchronous rules on heterogeneous workers",
    "",
    f"Made by `{command}`: LeNet-5 on mnist5k, 8 workers x batch 32, {args.total_steps} "
    "steps (ticks) each, the default config's timing model (10 ms steps, 10% jitter, "
    "1 Gbit/s links, a 1 ms master) with worker 6 twice and worker 7 four times as slow as "
    "worker 0 (the others spread between), tau = H = 4. Recipes in studies/heterogeneous.py. "
    f"Means over {args.seeds} seeds; accuracy is the center's on the 1,000 test digits "
    "(noloco's: the mean of its workers' outer weights).",
    "",
    f"| run | time to 0.95 (sim s) | acc. at {time_budget:.2f} sim s | final acc. "
    "| final sim s | mean local steps | MB sent per worker |",
    "|---|---|---|---|---|---|---|",
  ]
  for run, (curves, to_target) in rows.items():
    lines.append(row(run, curves, to_target, args.seeds, time_budget))
  with open(path, "w") as table:
    table.write("\n".join(lines) + "\n")


def plot(rows, path, title, time_budget):
  figure, axes = plt.subplots(figsize=(8, 5))
  for n, (run, (curves, _)) in enumerate(rows.items()):
    accuracy, time = dict(curves["eval/center_accuracy"]), dict(curves["sim/time"])
    steps = sorted(accuracy)
    style = "-" if rules.RULES[RUNS[run][0]].parameter_server() else "--"
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
  parser.add_argument(
    "--add_to_table",
    action="store_true",
    help="put these runs' rows into the table in --docs, read at its fixed time",
  )
  parser.add_argument(
    "--added_plot",
    type=arguments.file_name(".png"),
    default="heterogeneous_added.png",
    help="with --add_to_table: the file in --docs that plots the rows added",
  )
  executor.add_arguments(parser)
  args = parser.parse_args()
  table = os.path.join(args.docs, "heterogeneous_table.md")
  plot_name = args.added_plot if args.add_to_table else "heterogeneous.png"
  harness.check_outputs(args.docs, "heterogeneous", "heterogeneous_table.md", plot_name)
  if args.add_to_table and not os.path.isfile(table):
    arguments.fail(f"--add_to_table: no table {table!r} to add rows to; run the study without it")
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
  title = f"LeNet-5 on mnist5k, 8 heterogeneous workers (mean of {args.seeds} seeds)"
  if args.add_to_table:
    (time_budget,) = harness.budgets_of(harness.table_parts(table)[0])
    lines = {
      (run,): row(run, curves, to_target, args.seeds, time_budget)
      for run, (curves, to_target) in rows.items()
    }
    note = (
      "read at the same time, their recipes in studies/heterogeneous.py (RUNS); the other "
      f"rows come from the command of the first line. The plot of these rows is {plot_name}."
    )
    harness.add_rows(table, lines, harness.command("heterogeneous"), note)
    plot(rows, os.path.join(args.docs, plot_name), title + ", the rows added", time_budget)
    harness.print_table(table)
    return
  time_budget = min(harness.final(curves, "sim/time") for curves, _ in rows.values())
  os.makedirs(args.docs, exist_ok=True)
  write_table(rows, table, harness.command("heterogeneous"), args, time_budget)
  plot(rows, os.path.join(args.docs, "heterogeneous.png"), title, time_budget)
  harness.print_table(table)


if __name__ == "__main__":
  main()
