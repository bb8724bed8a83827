"""The center family, the streaming rules and their relatives on mnist5k: accuracy at
equal simulated time and at equal bytes sent, and the peak bytes a step sends.

    python studies/outer.py --workdir runs/outer [--total_steps 400] [--seeds 3]
        [--runs sync_sgd,diloco,streaming_diloco-F2,...] [--compressed bfloat16,int8,int4]
        [--feedback diloco,...] [--add_to_table] [--set FIELD=VALUE ...]
        [--parallel N [--point_cpus C] [--point_gpus G] [--ray_address HOST:PORT]]

--parallel N trains N runs at a time, each a Ray Tune trial in a process of its own
(easgd.executor, as sweep.py's points): the same runs, the same table.

Trains each run (RUNS below: a rule and its recipe) on LeNet-5, 8 workers of
batch 32, the default timing model, one run per name and seed in
<workdir>/<run>/<dtype>/seed_<n> (finished runs are reused, so the study
resumes). Then the two runs with the best accuracy at equal simulated time
among those float32 runs run again with each compressed exchange they can send
(bfloat16, int8; int4 for the center family and the streaming rules;
--compressed chooses some of them), and the runs of --feedback (diloco and
streaming_diloco-F2 by default, those of them --runs chose) with the low-bit
exchanges, int4 and int2, each without and with error feedback (LOW_BIT). Writes
docs/outer_table.md (means over the seeds) and docs/outer.png (center test
accuracy against simulated seconds and against megabytes sent per worker).

"Equal simulated time" compares the runs at the simulated second the
fastest-finishing of them reached; "equal bytes" at the megabytes per worker
the most frugal of them sent: each run's last evaluation (every 25 steps)
within that budget.

--add_to_table puts the rows of --runs (and of their low-bit exchanges) into the
table already in --docs instead, read at that table's budgets, each in place of
the row of the same run and exchange; its other rows stay, the best two are not
chosen again, a note below the table names the command and the date, and the
plot of these runs alone goes to docs/outer_added.png.
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

DTYPES = ("bfloat16", "int8", "int4")
# The low-bit exchanges of --feedback's runs: each dtype without and with error feedback
# (an exchange "<dtype>+EF").
LOW_BIT = ("int4", "int4+EF", "int2", "int2+EF")
FEEDBACK = "+EF"
EVERY = 25
# DiLoCo's optimizers: AdamW inside, the outer Nesterov SGD at 0.7 and 0.9 (the default's).
DILOCO = {"optimizer.name": "adamw", "optimizer.learning_rate": 1e-3}
# PALSGD in DiLoCo's recipe, with its reference code's p = 0.2 and a pull rate that
# moves a pulling worker a quarter of the way to the center (eta/p*eta_pull = 0.25),
# as its own defaults do at the default config's SGD at 0.1.
PALSGD = {**DILOCO, "outer.pull_probability": 0.2, "outer.pull_rate": 50.0}
# The study's runs: a name each, its rule, and its recipe over the default config
# (SGD at 0.1, tau = 4, alpha = 0.9/8). The streaming rules send one of F fragments
# every 4/F steps, each overlapped with one inner step.
RUNS = {
  "sync_sgd": ("sync_sgd", {}),
  "sync_easgd": ("sync_easgd", {}),
  "local_sgd": ("local_sgd", {}),
  "diloco": ("diloco", DILOCO),
  # Lookahead's paper default: slow weights move half way.
  "lookahead": ("lookahead", {"outer.learning_rate": 0.5}),
  "streaming_diloco-F2": (
    "streaming_diloco",
    {**DILOCO, "outer.fragments": 2, "outer.sync_delay": 1},
  ),
  "streaming_diloco-F4": (
    "streaming_diloco",
    {**DILOCO, "outer.fragments": 4, "outer.sync_delay": 1},
  ),
  "streaming_easgd-F2": ("streaming_easgd", {"outer.fragments": 2, "outer.sync_delay": 1}),
  # PALSGD: diloco's recipe with pulls toward the last synchronised center.
  "palsgd": ("palsgd", PALSGD),
  # NoLoCo: DiLoCo's AdamW inside, its reference code's outer SGD (0.7, heavy-ball
  # momentum 0.5: its own defaults) in pairs drawn anew at every outer step.
  "noloco": ("noloco", {**DILOCO, "outer.momentum": 0.5, "outer.nesterov": False}),
  # Asynchronous Local SGD with Delayed Nesterov (N = 8) on the same cluster, SGD at 0.1
  # inside (with AdamW its outer momentum diverged: docs/outer.md).
  "async_local_sgd-DN": ("async_local_sgd", {"outer.momentum_period": 8}),
}


def config_for(run: str, exchange: str, total_steps: int, seed: int, overrides: dict):
  """`run`'s config sending `exchange`: a dtype, or "<dtype>+EF" with error feedback."""
  rule, recipe = RUNS[run]
  config = default.get_config()
  config.algorithm = rule
  config.seed = seed
  config.update_from_flattened_dict(recipe)
  dtype = exchange.removesuffix(FEEDBACK)
  config.outer.exchange_dtype = dtype
  if dtype != exchange:
    config.outer.error_feedback = True
  config.run.total_steps = total_steps
  config.run.log_every = config.run.eval_every = EVERY
  config.run.checkpoint_every = 0
  config.update_from_flattened_dict(overrides)
  return config


def dtypes_of(run: str, dtypes: tuple[str, ...] = DTYPES) -> tuple[str, ...]:
  """The compressed exchanges of `dtypes` that `run` can send (int4: the center family and
  the streaming rules)."""
  return tuple(dtype for dtype in dtypes if dtype in rules.RULES[RUNS[run][0]].exchange_dtypes)


def workdir_of(args, run: str, dtype: str, seed: int) -> str:
  return os.path.join(args.workdir, run, dtype, f"seed_{seed}")


def check(args, run: str, dtype: str, overrides: dict) -> None:
  """Every seed of `run` sending `dtype` is valid, and any workdir it finds is its own."""
  for seed in range(args.seeds):
    config = config_for(run, dtype, args.total_steps, seed, overrides)
    trainer.check(config)
    workdir = workdir_of(args, run, dtype, seed)
    validation.check_checkpoint(config, workdir)


def train(pairs, args, overrides, parallel, label: str) -> dict:
  """The mean curves of each (run, dtype) of `pairs` over the seeds, training what is
  missing (`check` has accepted them all) as `harness.train_all` does."""
  missing = []
  for run, dtype in pairs:
    for seed in range(args.seeds):
      workdir = workdir_of(args, run, dtype, seed)
      saved = checkpoint.saved_config(workdir)
      if not harness.finished(saved, workdir, args.total_steps):
        config = config_for(run, dtype, args.total_steps, seed, overrides)
        missing.append((f"{run} ({dtype}), seed {seed}", config, workdir))
  harness.train_all(missing, parallel, args.workdir, label)
  results = {}
  for run, dtype in pairs:
    seeds = [scalars.read(workdir_of(args, run, dtype, s)) for s in range(args.seeds)]
    curves = harness.mean_curves(seeds)
    curves["megabytes"] = [(s, v / 1e6) for s, v in curves["comm/bytes_per_worker"]]
    results[run, dtype] = curves
  return results


def peak_kilobytes(curves: dict) -> str:
  """The peak bytes a step sends, in kB; "-" for runs from before it was logged."""
  if "comm/peak_bytes_per_step" not in curves:
    return "-"
  return f"{harness.final(curves, 'comm/peak_bytes_per_step') / 1e3:.1f}"


def row(run: str, exchange: str, curves: dict, time_budget: float, byte_budget: float) -> str:
  """The table's line of `run` sending `exchange`."""
  return (
    f"| {run} | {exchange} | {harness.at_budget(curves, 'sim/time', time_budget):.3f} "
    f"| {harness.at_budget(curves, 'megabytes', byte_budget):.3f} "
    f"| {harness.final(curves, 'eval/center_accuracy'):.3f} "
    f"| {harness.final(curves, 'sim/time'):.2f} "
    f"| {harness.final(curves, 'megabytes'):.2f} "
    f"| {peak_kilobytes(curves)} |"
  )


def write_table(results, path, command, args, time_budget, byte_budget):
  lines = [
    "# The center family, the streaming rules and their relatives at equal simulated time "
    "and equal bytes",
    "",
    f"Made by `{command}`: LeNet-5 on mnist5k, 8 workers x batch 32, {args.total_steps} "
    "steps (ticks) each, the default config's timing model (10 ms steps, the slowest worker "
    "1.5x slower, 10% jitter, 1 Gbit/s ring all-reduce), tau = 4. Recipes in "
    "studies/outer.py: SGD at 0.1 inside every rule but diloco (AdamW at 1e-3, outer "
    "Nesterov SGD 0.7/0.9); sync_easgd alpha = 0.9/8; local_sgd outer SGD at 1; lookahead "
    "slow-weight rate 0.5; streaming_diloco-F<F> is diloco's recipe in F fragments, each "
    "overlapped with one inner step (merge 1), streaming_easgd-F2 sync_easgd's in 2; "
    "palsgd is diloco's recipe with pulls (p = 0.2, eta/p*eta_pull = 0.25); noloco "
    "diloco's AdamW inside and outer SGD 0.7 with heavy-ball momentum 0.5, in random pairs; "
    "async_local_sgd-DN Delayed Nesterov (0.7, 0.9, N = 8) over SGD at 0.1. An exchange "
    "<dtype>+EF is sent with error feedback. The peak is the most bytes a worker sends in "
    f"one step. Means over {args.seeds} seeds; accuracy is the center's on the 1,000 test "
    "digits (noloco's: the mean of its workers' outer weights), read at the last "
    f"evaluation (every {EVERY} steps) within each budget.",
    "",
    f"| run | exchange | acc. at {time_budget:.2f} sim s | acc. at {byte_budget:.1f} MB "
    "| final acc. | final sim s | MB sent per worker | peak kB sent in a step |",
    "|---|---|---|---|---|---|---|---|",
  ]
  for (run, dtype), curves in results.items():
    lines.append(row(run, dtype, curves, time_budget, byte_budget))
  with open(path, "w") as table:
    table.write("\n".join(lines) + "\n")


STYLES = {"float32": "-", "bfloat16": "--", "int8": ":", "int4": "-.", "int2": "-."}


def plot(results, path, title):
  figure, (by_time, by_bytes) = plt.subplots(1, 2, figsize=(13, 5), sharey=True)
  colors = {run: plt.get_cmap("tab20").colors[n % 20] for n, run in enumerate(RUNS)}
  for (run, dtype), curves in results.items():
    accuracy = dict(curves["eval/center_accuracy"])
    steps = sorted(accuracy)
    values = [accuracy[s] for s in steps]
    style, color = STYLES[dtype.removesuffix(FEEDBACK)], colors.get(run)
    label = run if dtype == "float32" else f"{run} ({dtype})"
    time, sent = dict(curves["sim/time"]), dict(curves["megabytes"])
    by_time.plot([time[s] for s in steps], values, style, color=color, label=label)
    by_bytes.plot([sent[s] for s in steps], values, style, color=color, label=label)
  by_time.set_xlabel("simulated seconds")
  by_bytes.set_xlabel("megabytes sent per worker (log)")
  by_bytes.set_xscale("log")
  by_time.set_ylabel("center test accuracy")
  for axes in (by_time, by_bytes):
    axes.set_ylim(0.8, 1.0)
    axes.grid(alpha=0.3)
  by_bytes.legend(fontsize=8, loc="lower right")
  figure.suptitle(title)
  figure.tight_layout()
  figure.savefig(path, dpi=110)


def main():
  harness.use_cpu_devices()
  parser = harness.parser(__doc__, overrides=True)
  parser.add_argument("--total_steps", type=arguments.integer(1), default=400)
  parser.add_argument("--seeds", type=arguments.integer(1), default=3)
  parser.add_argument("--runs", default=",".join(RUNS), help="comma-separated runs (RUNS)")
  parser.add_argument(
    "--add_to_table",
    action="store_true",
    help="put these runs' rows into the table in --docs, read at its budgets",
  )
  parser.add_argument(
    "--compressed",
    type=arguments.some_of(DTYPES),
    default=DTYPES,
    help="the compressed exchanges the best two float32 runs run again with",
  )
  parser.add_argument(
    "--feedback",
    default="diloco,streaming_diloco-F2",
    help="comma-separated runs (of --runs) trained with int4 and int2, each without and "
    "with error feedback ('': none)",
  )
  executor.add_arguments(parser)
  args = parser.parse_args()
  table = os.path.join(args.docs, "outer_table.md")
  plot_name = "outer_added.png" if args.add_to_table else "outer.png"
  harness.check_outputs(args.docs, "outer", "outer_table.md", plot_name)
  if args.add_to_table and not os.path.isfile(table):
    arguments.fail(f"--add_to_table: no table {table!r} to add rows to; run the study without it")
  harness.quiet()
  chosen = args.runs.split(",")
  try:
    unknown = [run for run in chosen if run not in RUNS]
    if unknown:
      raise ConfigError(f"--runs: unknown {', '.join(unknown)}; allowed: {', '.join(RUNS)}")
    named = [run for run in args.feedback.split(",") if run]
    unknown = [run for run in named if run not in RUNS]
    if unknown:
      raise ConfigError(f"--feedback: unknown {', '.join(unknown)}; allowed: {', '.join(RUNS)}")
    low_bit = [(run, exchange) for run in named if run in chosen for exchange in LOW_BIT]
    overrides = harness.parse_overrides(args.set)
    parallel = executor.from_arguments(args)
    # Before anything trains: a bad setting or another study's workdir is one line
    # now, not a traceback hours in.
    for run in chosen:
      for dtype in ("float32", *dtypes_of(run, args.compressed)):
        check(args, run, dtype, overrides)
    for run, exchange in low_bit:
      check(args, run, exchange, overrides)
  except (ValueError, TypeError) as error:
    arguments.fail(str(error))

  # Each chosen run in float32, then the best two with each compressed dtype, then the
  # low-bit exchanges of --feedback's runs with and without error feedback.
  with harness.connected(parallel):
    results = train([(run, "float32") for run in chosen], args, overrides, parallel, "float32")
    time_budget = min(harness.final(s, "sim/time") for s in results.values())
    float32 = {n: results[n, "float32"] for n in chosen}
    best = sorted(chosen, key=lambda n: -harness.at_budget(float32[n], "sim/time", time_budget))
    compressed = [(run, dtype) for run in best[:2] for dtype in dtypes_of(run, args.compressed)]
    if not args.add_to_table:  # the table's best two stay
      results |= train(compressed, args, overrides, parallel, "compressed")
    low_bit = [pair for pair in low_bit if pair not in results]
    results |= train(low_bit, args, overrides, parallel, "low-bit")
  title = f"LeNet-5 on mnist5k, 8 workers, tau = 4 (mean of {args.seeds} seeds)"
  if args.add_to_table:
    time_budget, byte_budget = harness.budgets_of(harness.table_parts(table)[0])
    rows = {pair: row(*pair, curves, time_budget, byte_budget) for pair, curves in results.items()}
    note = (
      "read at the same budgets, their recipes in studies/outer.py (RUNS; an exchange "
      "<dtype>+EF is sent with error feedback); the other rows come from the command of "
      "the first line. The plot of these rows is outer_added.png."
    )
    harness.add_rows(table, rows, harness.command("outer"), note)
    plot(results, os.path.join(args.docs, plot_name), title + ", the rows added")
    harness.print_table(table)
    return
  time_budget = min(harness.final(s, "sim/time") for s in results.values())
  byte_budget = min(harness.final(s, "megabytes") for s in results.values())
  os.makedirs(args.docs, exist_ok=True)
  write_table(results, table, harness.command("outer"), args, time_budget, byte_budget)
  plot(results, os.path.join(args.docs, "outer.png"), title)
  harness.print_table(table)


if __name__ == "__main__":
  main()
