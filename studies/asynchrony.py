"""All rules on one simulated cluster: accuracy against simulated time and steps.

    python studies/asynchrony.py --workdir runs/asynchrony [--total_steps 600] [--seeds 3]
        [--rules sync_easgd,async_easgd,...] [--set cluster.bandwidth=1.25e7 ...] [--name NAME]
        [--parallel N [--point_cpus C] [--point_gpus G] [--ray_address HOST:PORT]]

--parallel N trains N runs at a time, each a Ray Tune trial in a process of its own
(easgd.executor, as sweep.py's points): the same runs, the same table.

Trains every registered rule but the center family's reset rules and the
streaming rules (those have studies/outer.py) and async_local_sgd (which has
studies/heterogeneous.py): the synchronous ones and the parameter-server family, on
mnist5k with 8 workers under the default config's timing model, one run per
rule and seed in <workdir>/<rule>/seed_<n> (finished runs are reused, so the
study resumes), and writes
docs/asynchrony_table.md (means over the seeds) and docs/asynchrony.png (mean
center test accuracy against simulated seconds and against mean local steps
per worker). The seed changes the initial parameters, the data order and the
timing model's jitter. `--set` overrides config fields by their grouped names
(e.g. cluster.bandwidth=1.25e7, outer.comm_period=8) for every run; `--name`
names the outputs (docs/<name>_table.md, docs/<name>.png).

Settings (the same for every rule, so that the rules differ only in how they
communicate): learning rate 0.05; the rules that require momentum use
mu = 0.9 with learning rate 0.005 (the same eta / (1 - mu)); elastic rules
tau = 4 and alpha = 0.9 / 8; Downpour n_sync = 4 with an SGD master.
"""

import os

import matplotlib

matplotlib.use("Agg")  # files only, no display
import matplotlib.pyplot as plt  # noqa: E402

from easgd import arguments, executor, rules
from easgd.config import validation
from easgd.configs import default
from easgd.errors import ConfigError
from easgd.infra import scalars
from easgd.sim import sizing
from easgd.studies import harness
from easgd.train import trainer

TARGET = harness.TARGET
LEARNING_RATE, MOMENTUM = 0.05, 0.9


def config_for(rule: str, total_steps: int, every: int, seed: int, overrides: dict):
  config = default.get_config()
  config.algorithm = rule
  config.seed = seed
  config.optimizer.learning_rate = LEARNING_RATE
  if rules.RULES[rule].momentum == rules.Momentum.REQUIRED:
    config.optimizer.momentum = MOMENTUM
    config.optimizer.learning_rate = LEARNING_RATE * (1 - MOMENTUM)
  config.run.total_steps = total_steps
  config.run.log_every = config.run.eval_every = every
  config.run.checkpoint_every = 0
  # Last, so that an override wins over the study's own settings.
  config.update_from_flattened_dict(overrides)
  return config


def summarize(rule: str, runs: list[dict], common_time: float) -> dict:
  """Means over seeds; times to the target over the seeds that reached it."""
  curves = harness.mean_curves(runs)
  accuracy = dict(curves["eval/center_accuracy"])
  time = dict(curves["sim/time"])
  reached = [r for r in (harness.first_reaching(run) for run in runs) if r is not None]
  at_common = [accuracy[s] for s in sorted(accuracy) if time[s] <= common_time]
  last = max(accuracy)
  staleness = dict(curves.get("async/staleness_mean", []))
  return {
    "rule": rule,
    "reached": len(reached),
    "seeds": len(runs),
    "time_to_target": sum(t for t, _ in reached) / len(reached) if reached else None,
    "steps_to_target": sum(s for _, s in reached) / len(reached) if reached else None,
    "accuracy_at_common_time": at_common[-1] if at_common else None,
    "final_accuracy": accuracy[last],
    "final_time": time[last],
    "final_steps": dict(curves["sim/worker_steps_mean"])[last],
    "megabytes_per_worker": dict(curves["comm/bytes_per_worker"])[last] / 1e6,
    "staleness": sum(staleness.values()) / len(staleness) if staleness else None,
  }


def _reached(row, value, digits):
  if value is None:
    return f"not reached (0/{row['seeds']})"
  note = "" if row["reached"] == row["seeds"] else f" ({row['reached']}/{row['seeds']} seeds)"
  return f"{value:.{digits}f}{note}"


def write_table(rows, path, command, common_time, total_steps, overrides):
  changed = ", ".join(f"{key}={value}" for key, value in overrides.items())
  lines = [
    "# The rules on one simulated cluster",
    "",
    f"Made by `{command}`: LeNet-5 on mnist5k, 8 workers x batch 32, {total_steps} steps "
    "(ticks) each, the default config's timing model (configs/default.py: 10 ms steps, "
    "the slowest worker 1.5x slower, 10% jitter, 1 Gbit/s, a 1 ms master)"
    + (f" with {changed}" if changed else "")
    + ". Settings in "
    "studies/asynchrony.py. Every number is a mean over the seeds. Simulated seconds and "
    "mean local steps per worker are those at each seed's first evaluation (every 25 "
    f"steps) with center accuracy >= {TARGET}, averaged over the seeds that reached it.",
    "",
    f"| rule | sim s to {TARGET} | worker steps to {TARGET} | acc. at {common_time:.2f} sim s "
    "| final acc. | final sim s | final worker steps | MB sent per worker | mean staleness |",
    "|---|---|---|---|---|---|---|---|---|",
  ]
  for row in rows:
    staleness = "" if row["staleness"] is None else f"{row['staleness']:.2f}"
    # None: no evaluation of the rule's fell within the common time (its first came later).
    at_common = row["accuracy_at_common_time"]
    at_common = "-" if at_common is None else f"{at_common:.3f}"
    lines.append(
      f"| {row['rule']} | {_reached(row, row['time_to_target'], 2)} "
      f"| {_reached(row, row['steps_to_target'], 0)} "
      f"| {at_common} | {row['final_accuracy']:.3f} "
      f"| {row['final_time']:.2f} | {row['final_steps']:.0f} "
      f"| {row['megabytes_per_worker']:.1f} | {staleness} |"
    )
  with open(path, "w") as table:
    table.write("\n".join(lines) + "\n")


# Line styles by how a rule's workers meet: in lockstep, at a master with a lock, or without one.
STYLES = {sizing.SYNC: "-", sizing.LOCKED: "-.", sizing.LOCK_FREE: "--"}


def plot(all_curves, path, title):
  figure, (by_time, by_steps) = plt.subplots(1, 2, figsize=(13, 5), sharey=True)
  colors = plt.get_cmap("tab20").colors
  for n, (rule, logged) in enumerate(all_curves.items()):
    accuracy = dict(logged["eval/center_accuracy"])
    steps = sorted(accuracy)
    time = dict(logged["sim/time"])
    worker_steps = dict(logged["sim/worker_steps_mean"])
    style = STYLES[sizing.family_of(rules.RULES[rule].policy)]
    values = [accuracy[s] for s in steps]
    color = colors[(2 * n) % 20 + (2 * n) // 20]
    by_time.plot([time[s] for s in steps], values, style, color=color, label=rule)
    by_steps.plot([worker_steps[s] for s in steps], values, style, color=color, label=rule)
  by_time.set_xlabel("simulated seconds")
  by_steps.set_xlabel("mean local steps per worker")
  by_time.set_ylabel("center test accuracy")
  for axes in (by_time, by_steps):
    axes.set_ylim(0.8, 1.0)
    axes.axhline(TARGET, color="grey", linewidth=0.5)
    axes.grid(alpha=0.3)
  by_steps.legend(fontsize=8, loc="lower right")
  figure.suptitle(title)
  figure.tight_layout()
  figure.savefig(path, dpi=110)


def main():
  harness.use_cpu_devices()
  parser = harness.parser(__doc__, overrides=True)
  parser.add_argument("--total_steps", type=arguments.integer(1), default=600)
  parser.add_argument("--seeds", type=arguments.integer(1), default=3)
  # The elastic and gradient-pushing rules, synchronous and asynchronous; the reset
  # rules of the center family and the streaming rules have their own study
  # (studies/outer.py), and async_local_sgd's outer optimizer has its own
  # (studies/heterogeneous.py).
  compared = [
    n
    for n in rules.names()
    if rules.Pull.RESET not in rules.RULES[n].pulls
    and "outer.fragments" not in rules.RULES[n].reads
    and "outer.momentum_period" not in rules.RULES[n].reads
  ]
  parser.add_argument("--rules", default=",".join(compared), help="comma-separated rules")
  parser.add_argument("--name", default="asynchrony")
  executor.add_arguments(parser)
  args = parser.parse_args()
  harness.check_outputs(args.docs, "asynchrony", f"{args.name}_table.md", f"{args.name}.png")
  harness.quiet()

  chosen = args.rules.split(",")
  try:
    unknown = [rule for rule in chosen if rule not in rules.RULES]
    if unknown:
      raise ConfigError(
        f"--rules: unknown rule(s) {', '.join(unknown)}; allowed: {', '.join(rules.names())}"
      )
    overrides = harness.parse_overrides(args.set)
    parallel = executor.from_arguments(args)
    runs = {}
    for rule in chosen:
      for seed in range(args.seeds):
        config = config_for(rule, args.total_steps, 25, seed, overrides)
        trainer.check(config)
        workdir = os.path.join(args.workdir, rule, f"seed_{seed}")
        saved = validation.check_checkpoint(config, workdir)
        runs[rule, seed] = config, workdir, saved
  except (ValueError, TypeError) as error:
    arguments.fail(str(error))

  missing = [
    (f"{rule}, seed {seed}", config, workdir)
    for (rule, seed), (config, workdir, saved) in runs.items()
    if not harness.finished(saved, workdir, args.total_steps)
  ]
  with harness.connected(parallel):
    harness.train_all(missing, parallel, args.workdir, "asynchrony")
  all_runs = {rule: [] for rule in chosen}
  for (rule, _), (_, workdir, _) in runs.items():
    all_runs[rule].append(scalars.read(workdir))
  all_curves = {rule: harness.mean_curves(runs) for rule, runs in all_runs.items()}
  common_time = min(max(v for _, v in s["sim/time"]) for s in all_curves.values())
  rows = [summarize(rule, runs, common_time) for rule, runs in all_runs.items()]
  os.makedirs(args.docs, exist_ok=True)
  table = os.path.join(args.docs, f"{args.name}_table.md")
  write_table(rows, table, harness.command("asynchrony"), common_time, args.total_steps, overrides)
  changed = ", ".join(f"{key}={value}" for key, value in overrides.items()) or "default"
  title = f"LeNet-5 on mnist5k, 8 workers, timing model: {changed} (mean of {args.seeds} seeds)"
  plot(all_curves, os.path.join(args.docs, f"{args.name}.png"), title)
  harness.print_table(table)


if __name__ == "__main__":
  main()
