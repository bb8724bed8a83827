"""The timing model against reality: measured runs beside the model's predictions.

    python studies/reality.py --workdir runs/reality [--total_steps 1000]
        [--rules async_easgd,hogwild_easgd,sync_easgd] [--set FIELD=VALUE ...]

On this machine's 2 devices (one per core), 2 workers of LeNet-5 on mnist5k,
with and without worker 1 slowed 2x:
  * async_easgd and hogwild_easgd train under runtime=threads (measured: wall
    seconds of training, staleness and worker steps from the trace);
  * sync_easgd trains in lock-step on the devices (the simulated runtime's
    program is a real lock-step step), each step timed, the straggler's extra
    time slept after it (every step of a lock-step run waits for the slowest);
then each is trained again under the timing model (runtime=simulated) with
what the measured run measured: the median compute seconds of worker 0's
local steps and their lognormal spread, the master's mean service seconds,
and a network of no latency and no bandwidth limit (the devices share host
memory). The study writes docs/reality_table.md (time to 95% center test
accuracy, staleness, worker steps, with the prediction error) and
docs/reality.png (accuracy against seconds, measured and predicted). `--set`
overrides config fields by their grouped names for every run (e.g. model='mlp',
a smaller network than LeNet-5).
"""

import itertools
import os
import time

import jax

jax.config.update("jax_num_cpu_devices", 2)

import matplotlib  # noqa: E402

matplotlib.use("Agg")  # files only, no display
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from easgd import arguments, assembly  # noqa: E402
from easgd.configs import default  # noqa: E402
from easgd.errors import ConfigError  # noqa: E402
from easgd.infra import scalars  # noqa: E402
from easgd.sim import timing  # noqa: E402
from easgd.studies import harness  # noqa: E402
from easgd.train import trainer  # noqa: E402
from easgd.train.runtimes import trace  # noqa: E402
from easgd.train.runtimes.simulated import runtime as simulated  # noqa: E402

TARGET = harness.TARGET
RULES = ("async_easgd", "hogwild_easgd", "sync_easgd")
STRAGGLER, SLOWDOWN = 1, 2.0
EVERY = 25


def config_for(rule: str, total_steps: int, straggler: bool, overrides: dict):
  config = default.get_config()
  config.algorithm = rule
  config.workers = 2
  config.run.devices = 2
  config.run.total_steps = total_steps
  config.run.log_every = config.run.eval_every = EVERY
  config.run.checkpoint_every = 0
  cluster = config.cluster
  cluster.speed_spread = cluster.jitter = cluster.latency = cluster.master_time = 0.0
  cluster.bandwidth = float("inf")
  cluster.stragglers = (STRAGGLER,) if straggler else ()
  cluster.straggler_slowdown = SLOWDOWN
  # Last, so that an override wins over the study's own settings.
  config.update_from_flattened_dict(overrides)
  return config


class LockStepClock:
  """Times each step of a synchronous run as it executes, sleeping a straggler's extra
  time after it: the wall seconds of a lock-step run, step by step."""

  def __init__(self, slowdown: float):
    self.slowdown, self.seconds, self.step_seconds = slowdown, {}, []
    self._step = simulated.SimulatedTrainee.step

  def __enter__(self):
    clock = self

    def timed(trainee):
      started = time.perf_counter()
      result = clock._step(trainee)
      jax.block_until_ready(trainee.state)
      seconds = time.perf_counter() - started
      clock.step_seconds.append(seconds)
      time.sleep((clock.slowdown - 1.0) * seconds)
      total = (clock.seconds[len(clock.seconds)] if clock.seconds else 0.0) + (
        time.perf_counter() - started
      )
      clock.seconds[len(clock.seconds) + 1] = total
      return result

    simulated.SimulatedTrainee.step = timed
    return self

  def __exit__(self, *exc):
    simulated.SimulatedTrainee.step = self._step


def measure(rule: str, config, workdir: str) -> dict:
  """Trains the measured run; returns its accuracy curve against seconds and what it measured."""
  if rule == "sync_easgd":
    slowdown = SLOWDOWN if config.cluster.stragglers else 1.0
    with LockStepClock(slowdown) as clock:
      trainer.train_and_evaluate(config, workdir)
    values = scalars.by_step(workdir)
    compute = np.asarray(clock.step_seconds[5:])  # after the first steps' warm-up
    return {
      "accuracy": values["eval/center_accuracy"],
      "seconds": clock.seconds,
      "compute": compute,
      "service": 0.0,
      "staleness": [],
      "worker_steps": [config.run.total_steps] * 2,  # every worker, every step
    }
  config.runtime = "threads"
  trainer.train_and_evaluate(config, workdir)
  values = scalars.by_step(workdir)
  recorded = trace.read(os.path.join(workdir, trace.FILE))
  compute = np.asarray([e.compute for e in recorded.events if e.op == "local" and e.worker == 0])
  services = [e.service for e in recorded.events if e.service > 0]
  steps = np.bincount([e.worker for e in recorded.events if e.local], minlength=2)
  return {
    "accuracy": values["eval/center_accuracy"],
    "seconds": values["sim/time"],
    "compute": compute[5:],  # after the first steps' warm-up
    "service": float(np.mean(services)) if services else 0.0,
    "staleness": [e.staleness for e in recorded.events if e.staleness >= 0],
    "worker_steps": steps.tolist(),
  }


def predict(config, measured: dict, workdir: str) -> dict:
  """Trains the same run under the timing model fitted to what was measured."""
  config.runtime = "simulated"
  compute = measured["compute"]
  config.cluster.compute_time = float(np.median(compute))
  config.cluster.jitter = float(np.std(np.log(compute)))
  config.cluster.master_time = measured["service"]
  trainer.train_and_evaluate(config, workdir)
  # The model's order of requests, from its clock alone (it depends on no parameter;
  # with a free network the model's size does not count).
  rule = assembly.rule(config)
  clock = rule.make_clock(timing.Cluster.from_config(config.cluster), 0.0, config.seed)
  staleness = []
  for _ in range(config.run.total_steps):
    staleness += clock.next_tick().staleness
  values = scalars.by_step(workdir)
  return {
    "accuracy": values["eval/center_accuracy"],
    "seconds": values["sim/time"],
    "staleness": staleness,
    "worker_steps": [
      int(values[f"sim/worker_steps_{end}"][config.run.total_steps]) for end in ("max", "min")
    ],
    "compute_time": config.cluster.compute_time,
    "jitter": config.cluster.jitter,
  }


def step_to_target(run: dict) -> int | None:
  reached = [step for step in sorted(run["accuracy"]) if run["accuracy"][step] >= TARGET]
  return reached[0] if reached else None


def time_to_target(run: dict) -> float | None:
  step = step_to_target(run)
  return None if step is None else run["seconds"][step]


def seconds_per_step(run: dict) -> float:
  last = max(run["seconds"])
  return run["seconds"][last] / last


def _seconds(value) -> str:
  return "not reached" if value is None else f"{value:.2f}"


def write_table(rows, path, command):
  lines = [
    f"Made by `{command}` ({time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, "
    f"load average {os.getloadavg()[0]:.2f}). 2 workers on 2 CPU devices, LeNet-5 on "
    f"mnist5k, time to {TARGET:.0%} center test accuracy (evaluated every {EVERY} steps); "
    "measured: runtime=threads (sync_easgd: a timed lock-step run); predicted: the "
    "timing model given the measured compute time (median, lognormal spread) and "
    "master service time.",
    "",
    "| rule | worker 1 | compute / step (ms) | measured (s) | predicted (s) | error | "
    "step reached, measured / predicted | ms a step, measured / predicted | "
    "staleness measured | staleness predicted | worker steps measured | predicted |",
    "|---|---|---|---|---|---|---|---|---|---|---|---|",
  ]
  for row in rows:
    measured, predicted = row["measured_time"], row["predicted_time"]
    error = (
      f"{(predicted - measured) / measured:+.0%}" if measured and predicted is not None else "-"
    )
    lines.append(
      f"| {row['rule']} | {row['straggler']} | {row['compute'] * 1e3:.2f} | "
      f"{_seconds(measured)} | {_seconds(predicted)} | {error} | {row['steps_reached']} | "
      f"{row['step_ms']} | {row['staleness_measured']} | "
      f"{row['staleness_predicted']} | {row['steps_measured']} | {row['steps_predicted']} |"
    )
  with open(path, "w") as file:
    file.write("\n".join(lines) + "\n")


def _staleness(values) -> str:
  if not values:
    return "-"
  counts = np.bincount(values)
  shares = ", ".join(f"{n}: {c / len(values):.0%}" for n, c in enumerate(counts) if c)
  return f"{np.mean(values):.2f} ({shares})"


def plot(results, path, rules):
  figure, axes = plt.subplots(1, 2, figsize=(11, 4), sharey=True)
  for axis, straggler in zip(axes, (False, True), strict=True):
    for rule in rules:
      measured, predicted = results[rule, straggler]
      color = f"C{RULES.index(rule)}"  # a rule's color whatever --rules chose
      for run, style, what in ((measured, "-", "measured"), (predicted, "--", "predicted")):
        steps = sorted(run["accuracy"])
        axis.plot(
          [run["seconds"][s] for s in steps],
          [run["accuracy"][s] for s in steps],
          style,
          color=color,
          label=f"{rule} {what}",
        )
    axis.axhline(TARGET, color="grey", linewidth=0.5)
    axis.set_ylim(0.8, 1.0)
    axis.set_xlabel("seconds of training")
    axis.set_title(f"worker 1 {SLOWDOWN:g}x slower" if straggler else "equal workers")
  axes[0].set_ylabel("center test accuracy")
  axes[1].legend(fontsize=7)
  figure.tight_layout()
  figure.savefig(path, dpi=110)


def main():
  parser = harness.parser(__doc__, overrides=True)
  parser.add_argument("--total_steps", type=arguments.integer(EVERY), default=1000)
  parser.add_argument("--rules", type=arguments.some_of(RULES), default=RULES)
  args = parser.parse_args()
  try:
    overrides = harness.parse_overrides(args.set)
  except ConfigError as error:
    arguments.fail(str(error))
  harness.check_outputs(args.docs, "reality", "reality_table.md", "reality.png")
  harness.quiet()

  results, rows = {}, []
  for number, (straggler, rule) in enumerate(itertools.product((False, True), args.rules), 1):
    name = f"{rule}_{'straggler' if straggler else 'equal'}"
    print(f"{number}/{2 * len(args.rules)}: measuring {name} ...", flush=True)
    real = os.path.join(args.workdir, name, "measured")
    model = os.path.join(args.workdir, name, "predicted")
    for workdir in (real, model):
      if os.path.exists(workdir):
        arguments.fail(f"--workdir: {workdir} exists; give a new --workdir")
    measured = measure(rule, config_for(rule, args.total_steps, straggler, overrides), real)
    predicted = predict(config_for(rule, args.total_steps, straggler, overrides), measured, model)
    results[rule, straggler] = measured, predicted
    rows.append(
      {
        "rule": rule,
        "straggler": f"{SLOWDOWN:g}x slower" if straggler else "equal",
        "compute": float(np.median(measured["compute"])),
        "measured_time": time_to_target(measured),
        "predicted_time": time_to_target(predicted),
        "steps_reached": f"{step_to_target(measured)} / {step_to_target(predicted)}",
        "step_ms": f"{seconds_per_step(measured) * 1e3:.2f} / "
        f"{seconds_per_step(predicted) * 1e3:.2f}",
        "staleness_measured": _staleness(measured["staleness"]),
        "staleness_predicted": _staleness(predicted["staleness"]),
        "steps_measured": measured["worker_steps"],
        "steps_predicted": predicted["worker_steps"],
      }
    )
  os.makedirs(args.docs, exist_ok=True)
  table = os.path.join(args.docs, "reality_table.md")
  write_table(rows, table, harness.command("reality"))
  plot(results, os.path.join(args.docs, "reality.png"), args.rules)
  harness.print_table(table)


if __name__ == "__main__":
  main()
