"""The rules on a cluster of groups (the two-level network): time to 95% center accuracy
and the bytes on each link, with the link between groups 1x, 10x and 100x slower.

    python studies/hierarchy.py --workdir runs/hierarchy [--total_steps 300] [--seeds 3]
        [--runs sync_easgd,...] [--ratios 1,10,100] [--set FIELD=VALUE ...]
        [--parallel N [--point_cpus C] [--point_gpus G] [--ray_address HOST:PORT]]

16 workers of batch 32 on LeNet-5 in 4 groups of 4 (cluster.groups): the link
inside a group is the default config's (0.5 ms, 1 Gbit/s), the link between
groups r times slower (r x the latency, 1/r of the bandwidth) for each ratio r.
One run per name, ratio and seed in <workdir>/<run>/ratio_<r>/seed_<n> (finished
runs are reused, so the study resumes). Writes docs/hierarchy_table.md (means
over the seeds) and docs/hierarchy.png (center test accuracy against simulated
seconds, at each ratio).

A synchronous rule's trajectory does not depend on the timing model (its workers
step together whatever the clock says): it is trained once per seed, at the
first ratio, and its clock (the rule's own, `Rule.make_clock`) is run again at
each other ratio for the simulated seconds and bytes of every step. The
parameter-server rules are trained at every ratio: the network orders their
requests.

"Time to 95%" is the simulated second of a seed's first evaluation (every 25
steps) at or above 0.95, averaged over the seeds that reached it; the bytes are
the whole cluster's, workers' and servers', inside groups and between them.
"""

import os

import jax
import matplotlib

matplotlib.use("Agg")  # files only, no display
import matplotlib.pyplot as plt  # noqa: E402

from easgd import arguments, assembly, executor  # noqa: E402
from easgd.config import validation  # noqa: E402
from easgd.configs import default  # noqa: E402
from easgd.data import datasets  # noqa: E402
from easgd.errors import ConfigError  # noqa: E402
from easgd.infra import checkpoint, scalars  # noqa: E402
from easgd.rules import exchange  # noqa: E402
from easgd.sim import timing  # noqa: E402
from easgd.studies import harness  # noqa: E402
from easgd.train import trainer  # noqa: E402

EVERY = 25
WORKERS = 16
GROUPS = (4, 4, 4, 4)
# The link between groups, r times slower than the link inside (the default config's).
INSIDE = {"latency": 5e-4, "bandwidth": 1.25e8}


def network(ratio: float) -> dict:
  return {
    "cluster.groups": GROUPS,
    "cluster.between_latency": ratio * INSIDE["latency"],
    "cluster.between_bandwidth": INSIDE["bandwidth"] / ratio,
  }


# Every rule's workers take the default config's SGD at 0.1; diloco and async_local_sgd's
# masters DiLoCo's outer Nesterov SGD at 0.7 and 0.9. The hierarchical rules' groups are
# the network's (4), averaged or pulled every 4 steps, all of them every 16.
HIERARCHY = {"outer.levels": ((4, 4), (16, 0))}
# async_local_sgd's Delayed Nesterov moves its momentum every 16 pushes, about one of each
# worker. On two tiers, each group server's every 4 (one of each of its workers), each
# sends every 4 of its requests, the global server adds a quarter of each group's change
# (its mean over the 4 groups), and a group server keeps half of its own at the merge.
TWO_TIER = {
  "outer.two_tier": True,
  "outer.momentum_period": 4,
  "outer.global_every": 4,
  "outer.global_learning_rate": 1 / 4,
  "outer.merge_weight": 0.5,
}
RUNS = {
  "sync_easgd": ("sync_easgd", {}),
  "local_sgd": ("local_sgd", {}),
  "diloco": ("diloco", {}),
  "hierarchical_local_sgd": ("hierarchical_local_sgd", HIERARCHY),
  "hierarchical_easgd": ("hierarchical_easgd", HIERARCHY),
  "async_local_sgd": ("async_local_sgd", {"outer.momentum_period": WORKERS}),
  "async_local_sgd-two-tier": ("async_local_sgd", TWO_TIER),
}


def config_for(run: str, ratio: float, total_steps: int, seed: int, overrides: dict):
  rule, recipe = RUNS[run]
  config = default.get_config()
  config.algorithm = rule
  config.workers = WORKERS
  config.seed = seed
  config.update_from_flattened_dict({**network(ratio), **recipe})
  config.run.total_steps = total_steps
  config.run.log_every = config.run.eval_every = EVERY
  config.run.checkpoint_every = 0
  config.update_from_flattened_dict(overrides)
  return config


def synchronous(run: str) -> bool:
  from easgd.rules import RULES  # noqa: PLC0415 (JAX after the devices are set)

  return not RULES[RUNS[run][0]].parameter_server()


def trained_ratio(run: str, ratio: float, ratios: list[float]) -> float:
  """The ratio whose run holds this one's trajectory: a synchronous rule's first."""
  return ratios[0] if synchronous(run) else ratio


def workdir_of(args, run: str, ratio: float, seed: int) -> str:
  return os.path.join(args.workdir, run, f"ratio_{ratio:g}", f"seed_{seed}")


def missing(args, ratios, overrides) -> list[tuple[str, object, str]]:
  """The runs not trained yet, as `harness.train_all` takes them."""
  runs = []
  for run in args.chosen:
    for ratio in sorted({trained_ratio(run, ratio, ratios) for ratio in ratios}):
      for seed in range(args.seeds):
        workdir = workdir_of(args, run, ratio, seed)
        saved = checkpoint.saved_config(workdir)
        if not harness.finished(saved, workdir, args.total_steps):
          config = config_for(run, ratio, args.total_steps, seed, overrides)
          runs.append((f"{run} at {ratio:g}x, seed {seed}", config, workdir))
  return runs


def retimed(config, curves: dict) -> dict:
  """A synchronous run's curves with the simulated seconds and bytes of `config`'s
  cluster: its rule's clock, run again for the run's steps."""
  rule = assembly.rule(config)
  shape = datasets.shape_of(config.data.dataset, config.run.data_dir)
  stand_in = assembly.Normalization.stand_in(shape.image_shape[-1])
  built = assembly.network(config, shape.num_classes, shape.image_shape, stand_in)
  params = jax.eval_shape(built.init_params, jax.random.PRNGKey(0))
  model_bytes, _ = exchange.sizes(params, config.outer.exchange_dtype, rule.hyper.average_stats)
  clock = rule.make_clock(timing.Cluster.from_config(config.cluster), model_bytes, config.seed)
  logged = sorted(step for step, _ in curves["sim/time"])
  times, inside, between = {}, {}, {}
  for step in range(1, logged[-1] + 1):
    clock.next_tick()
    if step in logged:
      times[step] = clock.time
      between[step] = float(clock.bytes_between.mean())
      inside[step] = float(clock.bytes_sent.mean()) - between[step]
  return {
    **curves,
    "sim/time": sorted(times.items()),
    "comm/bytes_inside_groups_per_worker": sorted(inside.items()),
    "comm/bytes_between_groups_per_worker": sorted(between.items()),
  }


def link_bytes(curves: dict) -> tuple[float, float]:
  """The whole cluster's bytes at the end, (inside groups, between groups): the workers'
  and the two-tier servers'."""
  inside = WORKERS * harness.final(curves, "comm/bytes_inside_groups_per_worker")
  between = WORKERS * harness.final(curves, "comm/bytes_between_groups_per_worker")
  if "comm/server_bytes_inside_groups" in curves:
    inside += harness.final(curves, "comm/server_bytes_inside_groups")
    between += harness.final(curves, "comm/server_bytes_between_groups")
  return inside, between


def write_table(rows, path, command, args, ratios):
  lines = [
    "# The rules on a cluster of groups: the link between groups 1x, 10x and 100x slower",
    "",
    f"Made by `{command}`: LeNet-5 on mnist5k, {WORKERS} workers x batch 32 in 4 groups of 4, "
    f"{args.total_steps} steps (ticks) each, the default config's timing model inside a group "
    "(10 ms steps, the slowest worker 1.5x slower, 10% jitter, 0.5 ms and 1 Gbit/s links), the "
    "link between groups r times slower (r x the latency, 1/r of the bandwidth). Recipes in "
    f"studies/hierarchy.py. Means over {args.seeds} seeds; accuracy is the center's on the "
    "1,000 test digits; bytes are the whole cluster's (workers' and servers') at the end.",
    "",
    "| run | between/inside | time to 0.95 (sim s) | final acc. | final sim s "
    "| MB inside groups | MB between groups |",
    "|---|---|---|---|---|---|---|",
  ]
  for run in args.chosen:
    for ratio in ratios:
      curves, (seconds, reached) = rows[run, ratio]
      if seconds is None:
        to_target = f"not reached (0/{args.seeds})"
      else:
        note = "" if reached == args.seeds else f" ({reached}/{args.seeds} seeds)"
        to_target = f"{seconds:.2f}{note}"
      inside, between = link_bytes(curves)
      lines.append(
        f"| {run} | {ratio:g}x | {to_target} "
        f"| {harness.final(curves, 'eval/center_accuracy'):.3f} "
        f"| {harness.final(curves, 'sim/time'):.2f} | {inside / 1e6:.1f} | {between / 1e6:.1f} |"
      )
  with open(path, "w") as table:
    table.write("\n".join(lines) + "\n")


def plot(rows, path, args, ratios):
  figure, axes = plt.subplots(1, len(ratios), figsize=(5 * len(ratios), 4.5), squeeze=False)
  for column, ratio in enumerate(ratios):
    ax = axes[0][column]
    for n, run in enumerate(args.chosen):
      curves, _ = rows[run, ratio]
      accuracy, time = dict(curves["eval/center_accuracy"]), dict(curves["sim/time"])
      steps = sorted(accuracy)
      style = "--" if synchronous(run) else "-"
      color = plt.get_cmap("tab10").colors[n % 10]
      ax.plot([time[s] for s in steps], [accuracy[s] for s in steps], style, color=color, label=run)
    ax.axhline(harness.TARGET, color="grey", linewidth=0.8, linestyle=":")
    ax.set_title(f"link between groups {ratio:g}x slower")
    ax.set_xlabel("simulated seconds")
    ax.set_ylim(0.8, 1.0)
    ax.grid(alpha=0.3)
  axes[0][0].set_ylabel("center test accuracy")
  axes[0][-1].legend(fontsize=8, loc="lower right")
  figure.suptitle(f"LeNet-5 on mnist5k, 16 workers in 4 groups (mean of {args.seeds} seeds)")
  figure.tight_layout()
  figure.savefig(path, dpi=100)


def main():
  harness.use_cpu_devices()
  parser = harness.parser(__doc__, overrides=True)
  parser.add_argument("--total_steps", type=arguments.integer(1), default=300)
  parser.add_argument("--seeds", type=arguments.integer(1), default=3)
  parser.add_argument("--runs", default=",".join(RUNS), help="comma-separated runs (RUNS)")
  parser.add_argument("--ratios", default="1,10,100", help="the link between groups' slowdowns")
  executor.add_arguments(parser)
  args = parser.parse_args()
  harness.check_outputs(args.docs, "hierarchy", "hierarchy_table.md", "hierarchy.png")
  harness.quiet()
  args.chosen = args.runs.split(",")
  try:
    unknown = [run for run in args.chosen if run not in RUNS]
    if unknown:
      raise ConfigError(f"--runs: unknown {', '.join(unknown)}; allowed: {', '.join(RUNS)}")
    try:
      ratios = [float(ratio) for ratio in args.ratios.split(",")]
    except ValueError:
      ratios = []
    if not ratios or any(ratio < 1 for ratio in ratios):
      raise ConfigError(f"--ratios={args.ratios!r}: expected numbers >= 1, e.g. 1,10,100")
    overrides = harness.parse_overrides(args.set)
    parallel = executor.from_arguments(args)
    # Before anything trains: a bad setting or another study's workdir is one line.
    for run in args.chosen:
      for ratio in ratios:
        for seed in range(args.seeds):
          config = config_for(run, ratio, args.total_steps, seed, overrides)
          trainer.check(config)
          validation.check_checkpoint(config, workdir_of(args, run, ratio, seed))
  except (ValueError, TypeError) as error:
    arguments.fail(str(error))

  with harness.connected(parallel):
    harness.train_all(missing(args, ratios, overrides), parallel, args.workdir, "hierarchy")
  rows = {}
  for run in args.chosen:
    for ratio in ratios:
      seeds = []
      for seed in range(args.seeds):
        trained = trained_ratio(run, ratio, ratios)
        curves = scalars.read(workdir_of(args, run, trained, seed))
        if trained != ratio:
          curves = retimed(config_for(run, ratio, args.total_steps, seed, overrides), curves)
        seeds.append(curves)
      reached = [r for r in map(harness.first_reaching, seeds) if r is not None]
      time = sum(t for t, _ in reached) / len(reached) if reached else None
      rows[run, ratio] = (harness.mean_curves(seeds), (time, len(reached)))
  os.makedirs(args.docs, exist_ok=True)
  table = os.path.join(args.docs, "hierarchy_table.md")
  write_table(rows, table, harness.command("hierarchy"), args, ratios)
  plot(rows, os.path.join(args.docs, "hierarchy.png"), args, ratios)
  harness.print_table(table)


if __name__ == "__main__":
  main()
