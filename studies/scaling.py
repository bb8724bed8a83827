"""Strong and weak scaling from the timing model, measured points, accuracy against P, and SC17.

    python studies/scaling.py --workdir runs/scaling [--parts model,measured,accuracy,sc17]
        [--workers 1,2,4,8,16,32,64] [--steps 300] [--rounds 5]
        [--accuracy_rules sync_easgd,async_easgd,sync_sgd,async_sgd]

Writes docs/scaling_tables.md and docs/scaling.png. Its parts:
  model     speed-up over one worker that never communicates, and efficiency
            (speed-up / P), for P in --workers (1, 2, 4, ..., 64) of every
            rule family (FAMILIES, chosen by the rules' declarations), from the
            rules' own clocks (easgd/sim/clocks.py) simulated for --steps (300)
            local steps: weak scaling with 32 images a worker, strong scaling
            with 256 images a step shared by the P workers (a worker's
            compute time proportional to its batch). The cluster is the
            default config's (10 ms for a step of 32 images, 10% jitter,
            1 Gbit/s, 0.5 ms latency, 1 ms master) with equal workers and
            LeNet-5's 247 KB.
  measured  the same speed-ups of sync_easgd measured on this machine's
            virtual CPU devices (P <= 8, one process), the best of --rounds
            (5) rounds of 30 steps.
  accuracy  final center test accuracy of Sync and Async EASGD and of Sync
            and Async SGD (--accuracy_rules: some of them) on mnist5k at
            each P (--steps local steps a worker, beta = P * alpha = 0.9),
            trained in <workdir>/<rule>/P<P>.
  sc17      SC17's system-level comparison (8 GPUs, a 249 MB AlexNet) from
            the model: Sync EASGD's tree all-reduce against the original
            round-robin master, with the bandwidths stated in the table.
"""

import argparse
import dataclasses
import os
import re
import time

import jax
import matplotlib

matplotlib.use("Agg")  # files only, no display
import matplotlib.pyplot as plt  # noqa: E402

from easgd import arguments, assembly, rules, steps, sweep  # noqa: E402
from easgd.configs import default  # noqa: E402
from easgd.data import batches, datasets  # noqa: E402
from easgd.errors import TrainingDiverged  # noqa: E402
from easgd.infra import checkpoint, sharding  # noqa: E402
from easgd.sim import sizing, ticks, timing  # noqa: E402
from easgd.sim.clocks import Policy  # noqa: E402
from easgd.studies import harness  # noqa: E402
from easgd.train import trainer  # noqa: E402

WORKERS = (1, 2, 4, 8, 16, 32, 64)
MEASURED_WORKERS = (1, 2, 4, 8)
BATCH, GLOBAL_BATCH, STEPS, TAU = 32, 256, 300, 4


# The rules compared, from the registry's declarations: an elastic rule under each
# master policy (synchronous, round robin, first come first served, lock-free), and
# the plain-SGD baselines, synchronous and first come first served.
SYNC_ELASTIC, ROUND_ROBIN_ELASTIC, ASYNC_ELASTIC, LOCK_FREE_ELASTIC = (
  rules.plain(policy=policy, elastic=True)
  for policy in (None, Policy.ROUND_ROBIN, Policy.FCFS, Policy.HOGWILD)
)
SYNC_SGD, ASYNC_SGD = (rules.plain(policy=policy, elastic=False) for policy in (None, Policy.FCFS))
# (label, rule, all-reduce); the all-reduce only matters to the synchronous rules.
RING, TREE = timing.Allreduce.RING, timing.Allreduce.TREE
FAMILIES = (
  (f"{SYNC_SGD} (ring)", SYNC_SGD, RING),
  (f"{SYNC_ELASTIC} (ring)", SYNC_ELASTIC, RING),
  (f"{SYNC_ELASTIC} (tree)", SYNC_ELASTIC, TREE),
  *(
    (name, name, RING)
    for name in (ROUND_ROBIN_ELASTIC, ASYNC_ELASTIC, LOCK_FREE_ELASTIC, ASYNC_SGD)
  ),
)
ACCURACY_RULES = (SYNC_ELASTIC, ASYNC_ELASTIC, SYNC_SGD, ASYNC_SGD)
LENET_BYTES = 61_706 * 4


def base_cluster() -> timing.Cluster:
  cluster = timing.Cluster.from_config(default.get_config().cluster)
  return dataclasses.replace(cluster, speed_spread=0.0)


def hyper(rule_workers: int) -> rules.Hyper:
  config = default.get_config()
  config.workers, config.outer.comm_period = rule_workers, TAU
  config.outer.moving_rate = 0.9 / rule_workers
  return rules.Hyper.from_config(config)


def simulated_images_per_sec(rule_name, allreduce, workers, batch, compute_time, steps) -> float:
  """Images/s of `workers` workers under the rule's clock, over `steps` local steps each."""
  cluster = dataclasses.replace(base_cluster(), allreduce=allreduce, compute_time=compute_time)
  clock = rules.make_rule(rule_name, hyper(workers)).make_clock(cluster, LENET_BYTES, seed=0)
  while clock.worker_steps.min() < steps:
    clock.next_tick()
  return clock.worker_steps.sum() * batch / clock.time


def model_scaling(workers: tuple[int, ...], steps: int) -> dict:
  """{(mode, label): [speed-up at each P of `workers`]}, mode weak or strong."""
  base_time = base_cluster().compute_time  # for BATCH images
  table = {}
  for label, rule_name, allreduce in FAMILIES:
    weak = [
      simulated_images_per_sec(rule_name, allreduce, p, BATCH, base_time, steps) for p in workers
    ]
    strong = [
      simulated_images_per_sec(
        rule_name, allreduce, p, GLOBAL_BATCH // p, base_time * GLOBAL_BATCH / p / BATCH, steps
      )
      for p in workers
    ]
    # Speed-up over one worker that never communicates: BATCH images per base_time.
    alone = BATCH / base_time
    table["weak", label] = [x / alone for x in weak]
    table["strong", label] = [x / alone for x in strong]
  return table


def measured_images_per_sec(workers: int, batch: int, rounds: int, num_steps: int = 30) -> float:
  """SYNC_ELASTIC on `workers` virtual CPU devices of this machine, one worker each."""
  config = default.get_config()
  config.workers, config.run.devices, config.data.batch_size = workers, workers, batch
  config.outer.moving_rate = 0.9 / workers
  dataset = datasets.load_dataset("mnist5k")
  mesh = sharding.make_mesh(workers)
  config.algorithm = SYNC_ELASTIC
  built = assembly.for_dataset(config, dataset)
  params = jax.jit(built.init_params)(jax.random.PRNGKey(0))  # one program, as train.py's
  rule = assembly.rule(config)
  state = steps.init_state(rule, params, jax.random.PRNGKey(1), mesh)
  images, labels = batches.place_partitions(
    mesh, dataset.train_images, dataset.train_labels, workers, 0
  )
  step = steps.build_train_step(rule, built.loss_fn, mesh, state, batch)
  tick = rule.tick_inputs(ticks.Tick.empty(workers))
  state, out = step(state, images, labels, tick)  # compile and warm up
  jax.block_until_ready(out)
  best = 0.0
  for _ in range(rounds):  # the best round: the machine is shared
    start = time.perf_counter()
    for _ in range(num_steps):
      state, out = step(state, images, labels, tick)
    jax.block_until_ready((state, out))
    best = max(best, workers * batch * num_steps / (time.perf_counter() - start))
  return best


def measured_scaling(workers: tuple[int, ...], rounds: int) -> dict:
  """The measured speed-ups at each P of `workers` (at most the 8 virtual devices)."""
  weak = [measured_images_per_sec(p, BATCH, rounds) for p in workers]
  strong = [measured_images_per_sec(p, GLOBAL_BATCH // p, rounds) for p in workers]
  return {
    ("weak", "measured"): [x / weak[0] for x in weak],
    ("strong", "measured"): [x / strong[0] for x in strong],
    "images_per_sec": {"weak": weak, "strong": strong},
  }


def final_accuracy(workdir: str, rule_name: str, workers: int, steps: int) -> dict:
  """Trains (or reuses) one run of `steps` local steps; returns its final center accuracy and
  simulated time."""
  config = default.get_config()
  config.algorithm, config.workers = rule_name, workers
  config.run.devices = min(workers, 8)
  config.outer.moving_rate = 0.9 / workers
  config.run.total_steps, config.run.log_every, config.run.eval_every = steps, steps, steps
  config.run.checkpoint_every = steps
  # A run of another length has a folder of its own: a reused run is always `steps` long.
  name = f"P{workers}" if steps == STEPS else f"P{workers}_{steps}steps"
  run_dir = os.path.join(workdir, rule_name, name)
  if checkpoint.saved_step(run_dir) != steps:
    try:
      trainer.train_and_evaluate(config, run_dir)
    except TrainingDiverged as error:  # a result too: the rule is unstable at this P
      # The first step the message names: the loss's, or the state's at a checkpoint.
      return {"diverged": "diverged at step " + re.search(r"step (\d+)", str(error))[1]}
  return sweep.final_scalars(run_dir)


def sc17() -> dict:
  """SC17's 8-GPU comparison in the timing model; see docs/scaling.md for the setting."""
  workers, model_bytes = 8, 249e6
  pcie = dict(latency=1e-5, bandwidth=1e10)  # PCIe 3.0 x16, about 10 GB/s each way
  # Original EASGD: the center lives in host memory; each exchange copies the
  # model GPU -> host and back, and the host updates it in about three passes
  # over 249 MB at 10 GB/s.
  master_time = 3 * model_bytes / 1e10
  original = timing.Cluster(master_time=master_time, **pcie)
  sync = timing.Cluster(allreduce=TREE, **pcie)
  ring = timing.Cluster(allreduce=RING, **pcie)

  # The rule each column simulates, and its steady-state family.
  rule_of = {
    "original": ROUND_ROBIN_ELASTIC,
    "sync (tree)": SYNC_ELASTIC,
    "sync (ring)": SYNC_ELASTIC,
  }
  cluster_of = {"original": original, "sync (tree)": sync, "sync (ring)": ring}

  def timings(work):  # work = tau * t_c, seconds of computing between exchanges
    return {
      name: sizing.Timing(
        cluster_of[name], model_bytes, work, 1, sizing.family_of(rules.RULES[rule].policy)
      )
      for name, rule in rule_of.items()
    }

  # One unknown, the computing between exchanges: fit it to one of SC17's
  # communication shares, then the other share and the speed-up follow.
  rows = {}
  for fitted_to, family, share in (
    ("original 87%", "original", 0.87),
    ("sync 14%", "sync (tree)", 0.14),
  ):
    low, high = 1e-6, 1e3
    for _ in range(200):  # bisection on the share, which falls as the work grows
      middle = (low * high) ** 0.5
      too_much_comm = timings(middle)[family].comm_share(workers) > share
      low, high = (middle, high) if too_much_comm else (low, middle)
    work = (low * high) ** 0.5
    result = timings(work)
    simulated = {}
    for name, steady in result.items():
      config = default.get_config()
      config.workers, config.outer.comm_period, config.outer.moving_rate = workers, 1, 0.1
      config.algorithm = rule_of[name]
      clock = assembly.rule(config).make_clock(
        dataclasses.replace(steady.cluster, compute_time=work), model_bytes, 0
      )
      while clock.worker_steps.min() < 200:
        clock.next_tick()
      simulated[name] = clock.time / clock.worker_steps.mean()
    rows[fitted_to] = {
      "work": work,
      "shares": {name: t.comm_share(workers) for name, t in result.items()},
      "step": {name: t.step_time(workers) for name, t in result.items()},
      "simulated": simulated,
    }
  return rows


def _row(cells) -> str:
  return "| " + " | ".join(str(cell) for cell in cells) + " |"


def scaling_table(table: dict, mode: str, workers: tuple[int, ...]) -> list[str]:
  labels = [label for kind, label in table if kind == mode]
  lines = [_row(["rule", *(f"P={p}" for p in workers)]), _row(["---"] * (len(workers) + 1))]
  for label in labels:
    values = table[mode, label]
    lines.append(
      _row(
        [label, *(f"{x:.2f}x ({100 * x / p:.0f}%)" for x, p in zip(values, workers, strict=False))]
      )
    )
  return lines


def plot(table: dict, path: str, workers: tuple[int, ...]) -> None:
  figure, axes = plt.subplots(1, 2, figsize=(12, 4.5))
  for axis, mode in zip(axes, ("weak", "strong"), strict=True):
    axis.plot(workers, workers, "k:", label="ideal")
    for (kind, label), values in table.items():
      if kind != mode:
        continue
      if label == "measured":
        measured = f"measured: {SYNC_ELASTIC}, 2-core CPU"
        axis.plot(workers[: len(values)], values, "ko-", label=measured)
      else:
        axis.plot(workers[: len(values)], values, ".-", label=label)
    axis.set_xscale("log", base=2)
    axis.set_yscale("log", base=2)
    axis.set_xlabel("workers P")
    axis.set_ylabel("speed-up over one worker alone")
    axis.set_title(
      f"{mode} scaling ("
      + (f"{BATCH} images a worker" if mode == "weak" else f"{GLOBAL_BATCH} images a step")
      + ")"
    )
    axis.grid(True, alpha=0.3)
  axes[0].legend(fontsize=8)
  figure.tight_layout()
  figure.savefig(path, dpi=110)


def sc17_lines(rows: dict) -> list[str]:
  lines = [
    _row(
      [
        "fitted to",
        "tau t_c (s)",
        "original: comm",
        "sync tree: comm",
        "sync ring: comm",
        "tree speed-up over original",
        "ring speed-up",
        "simulated tree speed-up",
      ]
    ),
    _row(["---"] * 8),
  ]
  for fitted_to, row in rows.items():
    shares, step, simulated = row["shares"], row["step"], row["simulated"]
    lines.append(
      _row(
        [
          fitted_to,
          f"{row['work']:.3g}",
          f"{100 * shares['original']:.0f}%",
          f"{100 * shares['sync (tree)']:.0f}%",
          f"{100 * shares['sync (ring)']:.0f}%",
          f"{step['original'] / step['sync (tree)']:.2f}x",
          f"{step['original'] / step['sync (ring)']:.2f}x",
          f"{simulated['original'] / simulated['sync (tree)']:.2f}x",
        ]
      )
    )
  return lines


def worker_counts(text: str) -> tuple[int, ...]:
  """--workers: increasing worker counts from 1 (the speed-ups are over one worker), each
  dividing GLOBAL_BATCH."""
  try:
    counts = tuple(int(p) for p in text.split(","))
  except ValueError:
    counts = ()
  if (
    not counts
    or counts[0] != 1
    or any(p < 1 or GLOBAL_BATCH % p for p in counts)
    or list(counts) != sorted(set(counts))
  ):
    raise argparse.ArgumentTypeError(
      f"{text!r} is invalid: give increasing worker counts from 1 that divide {GLOBAL_BATCH}, "
      "e.g. 1,2,4,8"
    )
  return counts


def main():
  parser = arguments.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--workdir", default="runs/scaling", type=arguments.directory("--workdir"))
  parser.add_argument("--parts", default="model,measured,accuracy,sc17")
  parser.add_argument(
    "--out",
    type=arguments.directory("--out"),
    default="docs",
    help="where the table and the plot go",
  )
  parser.add_argument(
    "--workers",
    type=worker_counts,
    default=WORKERS,
    help="the P compared, increasing, each dividing the strong scaling's step of "
    f"{GLOBAL_BATCH} images (measured: those up to {max(MEASURED_WORKERS)})",
  )
  parser.add_argument("--steps", type=arguments.integer(1), default=STEPS, help="local steps")
  parser.add_argument(
    "--rounds", type=arguments.integer(1), default=5, help="the measured part's timed rounds"
  )
  parser.add_argument(
    "--accuracy_rules",
    type=arguments.some_of(ACCURACY_RULES),
    default=ACCURACY_RULES,
    help="the accuracy part's rules",
  )
  args = parser.parse_args()
  workers = args.workers
  harness.check_outputs(args.out, "scaling", "scaling_tables.md", "scaling.png")
  harness.quiet()
  # The measured part's virtual devices, before JAX starts its backend.
  jax.config.update("jax_num_cpu_devices", max(MEASURED_WORKERS))
  parts = set(args.parts.split(","))
  unknown = parts - {"model", "measured", "accuracy", "sc17"}
  if unknown:
    arguments.fail(
      f"--parts {','.join(sorted(unknown))} unknown; valid: model, measured, accuracy, sc17"
    )
  os.makedirs(args.out, exist_ok=True)
  command = harness.command("scaling")
  lines = [f"Made by `{command}`.", ""]
  table = model_scaling(workers, args.steps) if "model" in parts else {}
  measured_workers = tuple(p for p in workers if p <= max(MEASURED_WORKERS))
  if "measured" in parts:
    measured = measured_scaling(measured_workers, args.rounds)
    table.update({key: value for key, value in measured.items() if key != "images_per_sec"})
  for mode in ("weak", "strong"):
    if any(kind == mode for kind, _ in table):
      lines += [f"## {mode.capitalize()} scaling: speed-up (efficiency)", ""]
      lines += scaling_table(table, mode, workers) + [""]
  if "measured" in parts:
    per_sec = measured["images_per_sec"]
    lines += [
      f"Measured images/s ({SYNC_ELASTIC}, tau {TAU}, this machine's virtual CPU devices): weak "
      + ", ".join(f"P={p}: {x:.0f}" for p, x in zip(measured_workers, per_sec["weak"], strict=True))
      + "; strong "
      + ", ".join(
        f"P={p}: {x:.0f}" for p, x in zip(measured_workers, per_sec["strong"], strict=True)
      )
      + ".",
      "",
    ]
  if table:
    plot(table, os.path.join(args.out, "scaling.png"), workers)
  if "accuracy" in parts:
    lines += [
      f"## Final center test accuracy on mnist5k, {args.steps} local steps a worker",
      "",
      _row(["rule", *(f"P={p}" for p in workers)]),
      _row(["---"] * (len(workers) + 1)),
    ]
    for rule_name in args.accuracy_rules:
      results = [final_accuracy(args.workdir, rule_name, p, args.steps) for p in workers]
      cells = [
        f"{r['eval/center_accuracy']:.3f}" if "diverged" not in r else r["diverged"]
        for r in results
      ]
      lines.append(_row([rule_name, *cells]))
    lines.append("")
  if "sc17" in parts:
    lines += ["## SC17's 8-GPU setting in the timing model", "", *sc17_lines(sc17()), ""]
  path = os.path.join(args.out, "scaling_tables.md")
  with open(path, "w") as f:
    f.write("\n".join(lines))
  print("\n".join(lines))


if __name__ == "__main__":
  main()
