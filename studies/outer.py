"""The center family on mnist5k: accuracy at equal simulated time and at equal bytes sent.

    python studies/outer.py --workdir runs/outer [--total_steps 400] [--seeds 3]
        [--rules sync_sgd,sync_easgd,local_sgd,diloco,lookahead] [--set FIELD=VALUE ...]

Trains each rule with its recipe (RECIPES below) on LeNet-5, 8 workers of
batch 32, the default timing model, one run per rule and seed in
<workdir>/<rule>/<dtype>/seed_<n> (finished runs are reused, so the study
resumes). Then the two rules with the best accuracy at equal simulated time
among those float32 runs run again with each compressed exchange (bfloat16, int8). Writes
docs/outer_table.md (means over the seeds) and docs/outer.png (center test
accuracy against simulated seconds and against megabytes sent per worker).

"Equal simulated time" compares the rules at the simulated second the
fastest-finishing of them reached; "equal bytes" at the megabytes per worker
the most frugal of them sent: each rule's last evaluation (every 25 steps)
within that budget.
"""

import itertools
import os
import sys

import asynchrony  # the sibling study's run and curve helpers (sets 8 CPU devices)
import matplotlib.pyplot as plt
from absl import logging as absl_logging

from easgd import arguments, rules
from easgd.config import validation
from easgd.configs import default
from easgd.errors import ConfigError
from easgd.infra import checkpoint
from easgd.train import trainer

RULES = ("sync_sgd", "sync_easgd", "local_sgd", "diloco", "lookahead")
DTYPES = ("bfloat16", "int8")
EVERY = 25
# Each rule's recipe, over the default config (SGD at 0.1, tau = 4, alpha = 0.9/8).
RECIPES = {
  "sync_sgd": {},
  "sync_easgd": {},
  "local_sgd": {},
  # DiLoCo's: AdamW inside, the outer Nesterov SGD at 0.7 and 0.9 (the default's).
  "diloco": {"optimizer.name": "adamw", "optimizer.learning_rate": 1e-3},
  # Lookahead's paper default: slow weights move half way.
  "lookahead": {"outer.learning_rate": 0.5},
}


def config_for(rule: str, dtype: str, total_steps: int, seed: int, overrides: dict):
  config = default.get_config()
  config.algorithm = rule
  config.seed = seed
  config.update_from_flattened_dict(RECIPES.get(rule, {}))
  config.outer.exchange_dtype = dtype
  config.run.total_steps = total_steps
  config.run.log_every = config.run.eval_every = EVERY
  config.run.checkpoint_every = 0
  config.update_from_flattened_dict(overrides)
  return config


def workdir_of(args, rule: str, dtype: str, seed: int) -> str:
  return os.path.join(args.workdir, rule, dtype, f"seed_{seed}")


def check(args, rule: str, dtype: str, overrides: dict) -> None:
  """Every run of `rule` sending `dtype` is valid, and any workdir it finds is its own."""
  for seed in range(args.seeds):
    config = config_for(rule, dtype, args.total_steps, seed, overrides)
    trainer.check(config)
    workdir = workdir_of(args, rule, dtype, seed)
    validation.check_workdir(config, workdir)


def train(rule, dtype, args, overrides, progress: str) -> list[dict]:
  """The curves of each seed's run of `rule` sending `dtype`, training what is missing
  (`check` has accepted them all); `progress` says which of the study's rules this is."""
  curves = []
  for seed in range(args.seeds):
    config = config_for(rule, dtype, args.total_steps, seed, overrides)
    workdir = workdir_of(args, rule, dtype, seed)
    saved = checkpoint.saved_config(workdir)
    if saved is None or asynchrony.saved_total_steps(saved) != args.total_steps:
      print(f"{progress}: training {rule} ({dtype}), seed {seed} ...", flush=True)
      trainer.train_and_evaluate(config, workdir)
    curves.append(asynchrony.curves(workdir))
  return curves


def at_budget(scalars: dict, tag: str, budget: float) -> float:
  """Center accuracy at the last evaluation whose `tag` is within `budget`."""
  accuracy, used = dict(scalars["eval/center_accuracy"]), dict(scalars[tag])
  within = [step for step in sorted(accuracy) if used[step] <= budget * (1 + 1e-9)]
  return accuracy[within[-1]] if within else float("nan")


def final(scalars: dict, tag: str) -> float:
  values = dict(scalars[tag])
  return values[max(values)]


def write_table(results, path, command, args, time_budget, byte_budget):
  lines = [
    "# The center family at equal simulated time and equal bytes",
    "",
    f"Made by `{command}`: LeNet-5 on mnist5k, 8 workers x batch 32, {args.total_steps} "
    "steps each, the default config's timing model (10 ms steps, the slowest worker 1.5x "
    "slower, 10% jitter, 1 Gbit/s ring all-reduce), tau = 4. Recipes in studies/outer.py: "
    "SGD at 0.1 inside every rule but diloco (AdamW at 1e-3, outer Nesterov SGD 0.7/0.9); "
    "sync_easgd alpha = 0.9/8; local_sgd outer SGD at 1; lookahead slow-weight rate 0.5. "
    f"Means over {args.seeds} seeds; accuracy is the center's on the 1,000 test digits, "
    f"read at the last evaluation (every {EVERY} steps) within each budget.",
    "",
    f"| rule | exchange | acc. at {time_budget:.2f} sim s | acc. at {byte_budget:.1f} MB "
    "| final acc. | final sim s | MB sent per worker |",
    "|---|---|---|---|---|---|---|",
  ]
  for (rule, dtype), scalars in results.items():
    lines.append(
      f"| {rule} | {dtype} | {at_budget(scalars, 'sim/time', time_budget):.3f} "
      f"| {at_budget(scalars, 'megabytes', byte_budget):.3f} "
      f"| {final(scalars, 'eval/center_accuracy'):.3f} | {final(scalars, 'sim/time'):.2f} "
      f"| {final(scalars, 'megabytes'):.2f} |"
    )
  with open(path, "w") as table:
    table.write("\n".join(lines) + "\n")


STYLES = {"float32": "-", "bfloat16": "--", "int8": ":"}


def plot(results, path, title):
  figure, (by_time, by_bytes) = plt.subplots(1, 2, figsize=(13, 5), sharey=True)
  colors = {rule: plt.get_cmap("tab10").colors[n] for n, rule in enumerate(RULES)}
  for (rule, dtype), scalars in results.items():
    accuracy = dict(scalars["eval/center_accuracy"])
    steps = sorted(accuracy)
    values = [accuracy[s] for s in steps]
    style, color = STYLES[dtype], colors.get(rule)
    label = rule if dtype == "float32" else f"{rule} ({dtype})"
    time, sent = dict(scalars["sim/time"]), dict(scalars["megabytes"])
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
  parser = arguments.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--workdir", required=True, type=arguments.directory("--workdir"))
  parser.add_argument("--total_steps", type=arguments.integer(1), default=400)
  parser.add_argument("--seeds", type=arguments.integer(1), default=3)
  parser.add_argument("--rules", default=",".join(RULES), help="comma-separated rules")
  parser.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE")
  parser.add_argument(
    "--docs",
    type=arguments.directory("--docs"),
    default=os.path.join(os.path.dirname(__file__), "..", "docs"),
  )
  args = parser.parse_args()
  for name, made_by in (
    ("outer_table.md", b"Made by `python studies/outer.py"),
    ("outer.png", b"matplotlib"),
  ):
    arguments.check_overwritable(os.path.join(args.docs, name), made_by)
  absl_logging.set_verbosity(absl_logging.WARNING)
  chosen = args.rules.split(",")
  try:
    unknown = [rule for rule in chosen if rule not in rules.RULES or rules.RULES[rule].policy]
    if unknown:
      synchronous = ", ".join(rules.names(parameter_server=False))
      raise ConfigError(
        f"--rules: not a synchronous rule: {', '.join(unknown)}; allowed: {synchronous}"
      )
    overrides = asynchrony.parse_overrides(args.set)
    # Before anything trains: a bad setting or another study's workdir is one line
    # now, not a traceback hours in.
    for rule in chosen:
      for dtype in ("float32", *DTYPES):
        check(args, rule, dtype, overrides)
  except (ValueError, TypeError) as error:
    arguments.fail(str(error))

  results = {}
  # Each chosen rule in float32, then the best two with each compressed dtype.
  total = len(chosen) + min(2, len(chosen)) * len(DTYPES)
  for number, rule in enumerate(chosen):
    curves = train(rule, "float32", args, overrides, f"{number + 1}/{total}")
    results[rule, "float32"] = asynchrony.mean_curves(curves)
  for scalars in results.values():
    scalars["megabytes"] = [(s, v / 1e6) for s, v in scalars["comm/bytes_per_worker"]]
  time_budget = min(final(s, "sim/time") for s in results.values())
  best = sorted(chosen, key=lambda r: -at_budget(results[r, "float32"], "sim/time", time_budget))
  for number, (rule, dtype) in enumerate(itertools.product(best[:2], DTYPES), len(chosen) + 1):
    scalars = asynchrony.mean_curves(train(rule, dtype, args, overrides, f"{number}/{total}"))
    scalars["megabytes"] = [(s, v / 1e6) for s, v in scalars["comm/bytes_per_worker"]]
    results[rule, dtype] = scalars
  time_budget = min(final(s, "sim/time") for s in results.values())
  byte_budget = min(final(s, "megabytes") for s in results.values())
  os.makedirs(args.docs, exist_ok=True)
  command = " ".join(["python studies/outer.py", *sys.argv[1:]])
  table = os.path.join(args.docs, "outer_table.md")
  write_table(results, table, command, args, time_budget, byte_budget)
  title = f"LeNet-5 on mnist5k, 8 workers, tau = 4 (mean of {args.seeds} seeds)"
  plot(results, os.path.join(args.docs, "outer.png"), title)
  with open(table) as written:
    print(written.read())


if __name__ == "__main__":
  main()
