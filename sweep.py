"""Runs a config file's sweep: python sweep.py --config configs/X.py --workdir runs/X.

Every point of `get_sweep()` (easgd/sweep.py) becomes one train.py run in
<workdir>/<point> with its own TensorBoard run; --config.FIELD=VALUE
overrides apply to every point. Finished points are skipped, so a stopped
sweep is resumed by running the same command. The sweep ends with
<workdir>/summary.md and summary.csv, best final center accuracy first.

With --parallel N the points run N at a time as Ray Tune's trials
(easgd.tuning), each with the resources it asks for (--point_cpus,
--point_gpus: a GPU or a fraction of one), on this machine or on the Ray cluster
at --ray_address (or $RAY_ADDRESS), whose nodes must share the workdir. Each
point is the same train.py run, to the same bits, its output in
<workdir>/<point>/train.log; a point whose process is lost is run again
(--point_retries) and resumes from its checkpoint; a killed sweep run again
restores Tune's experiment (<workdir>/tune). --scheduler=asha stops the points
that fall behind early (ASHA); --scheduler=pbt trains them as a population
(population-based training over --pbt_fields). A sweep with failed points exits
1 once the others are done.

One sweep a workdir at a time. SIGTERM stops the sweep where it is: each running
point saves its step, and the sweep exits 0 saying what to run to resume it.

With --pipeline the sweep runs as one pipelined multi-model run instead
(config.algorithm=pipeline, one model per point, <workdir>/model_<k>): the
swept fields must be among the pipeline's per-model values.
"""

import os
import shlex
import sys

from absl import app, flags, logging
from ml_collections import config_flags

from easgd import arguments, cli, executor, ownership, sweep
from easgd.config import hyperparameters
from easgd.errors import ConfigError
from easgd.infra import checkpoint
from easgd.pipeline import algorithm as pipeline
from easgd.pipeline import programs
from easgd.train import trainer

TRAIN = os.path.join(os.path.dirname(os.path.abspath(__file__)), "train.py")

_CONFIG = cli.define_config(None, "Config file with get_sweep().")
_WORKDIR = flags.DEFINE_string("workdir", None, "Where the runs and the summary go.")
_PIPELINE = flags.DEFINE_bool("pipeline", False, "Run the sweep as one pipelined run.")
_PARALLEL = flags.DEFINE_integer(
  "parallel", None, "Run this many points at once on Ray Tune (default: one after another)."
)
_POINT_CPUS = flags.DEFINE_float("point_cpus", None, "CPUs a point asks Ray for (default 1).")
_POINT_GPUS = flags.DEFINE_float(
  "point_gpus",
  None,
  "GPUs a point asks Ray for: 0 (default), a fraction in (0, 1) or a whole number.",
)
_RAY_ADDRESS = flags.DEFINE_string(
  "ray_address",
  "",
  "A running Ray cluster's HOST:PORT or 'auto' (default: $RAY_ADDRESS, or "
  "a Ray on this machine); implies --parallel.",
)
_POINT_RETRIES = flags.DEFINE_integer(
  "point_retries", None, "Times a point whose process is lost is run again (default 3)."
)
_SCHEDULER = flags.DEFINE_enum(
  "scheduler",
  None,
  list(sweep.SCHEDULERS),
  "Ray Tune's scheduler over the points (with --parallel): asha stops those that fall "
  "behind early; pbt trains them as a population (population-based training).",
)
_METRIC = flags.DEFINE_string(
  "metric", None, "The logged scalar the scheduler compares (default eval/center_accuracy)."
)
_MODE = flags.DEFINE_enum("mode", None, ["max", "min"], "Whether more of --metric is better.")
_GRACE_STEPS = flags.DEFINE_integer(
  "grace_steps", None, "ASHA: the first rung's step (default: the first evaluation's)."
)
_REDUCTION_FACTOR = flags.DEFINE_integer(
  "reduction_factor", None, "ASHA: 1 in this many points goes on at each rung (default 3)."
)
_PBT_FIELDS = flags.DEFINE_list(
  "pbt_fields", [], "PBT: the fields it explores, over the values the sweep gives them."
)
_PERTURBATION_STEPS = flags.DEFINE_integer(
  "perturbation_steps", None, "PBT: steps between two rounds (default: run.eval_every)."
)
_PBT_SEED = flags.DEFINE_integer("pbt_seed", None, "PBT: the seed of its draws (default 0).")
flags.mark_flags_as_required(["config", "workdir"])


def _command(workdir: str, overrides: list[str]) -> list[str]:
  """The train.py command of the sweep's config file with `overrides` into `workdir`."""
  config_file = config_flags.get_config_filename(flags.FLAGS["config"])
  return [sys.executable, TRAIN, f"--config={config_file}", *overrides, f"--workdir={workdir}"]


def _finished(workdir: str, total_steps: int) -> bool:
  return checkpoint.saved_step(workdir) == total_steps


def run_points(points, config, user_flags, workdir, parallel=None, schedule=None) -> list[dict]:
  """Runs the points not finished yet (in parallel on Ray Tune with `parallel`, all of
  them: Tune's experiment knows which are); their rows."""
  rows, jobs = [], {}
  for number, point in enumerate(points):
    run_dir = os.path.join(workdir, sweep.name(point))
    label = f"point {number + 1}/{len(points)} {sweep.name(point)}"
    rows.append({"run": sweep.name(point), **point, "status": "done"})
    total_steps = sweep.apply(config, point).run.total_steps
    if parallel is None and _finished(run_dir, total_steps):
      print(f"sweep: {label} is finished", flush=True)
      continue
    point_flags = [f"--config.{field}={sweep.flag_value(v)}" for field, v in point.items()]
    command = _command(run_dir, [*user_flags, *point_flags])
    jobs[number] = executor.Job(
      label, run_dir, total_steps, tuple(command), values=tuple(point.items())
    )
  outcomes = executor.run(list(jobs.values()), parallel, workdir, "sweep", schedule=schedule)
  for number, outcome in zip(jobs, outcomes, strict=True):
    # Population-based training's last values of the fields it explored.
    rows[number] |= {**outcome.values, "status": outcome.status}
  return [row | sweep.final_scalars(os.path.join(workdir, row["run"])) for row in rows]


def pipeline_plan(points, config) -> tuple[list[str], object]:
  """The flags and the config of the one pipelined run of `points`; raises ConfigError."""
  fields = list(dict.fromkeys(field for point in points for field in point))
  per_model_of = {source: field for field, source in programs.PER_MODEL_SOURCE.items()}
  outside = [field for field in fields if field not in per_model_of]
  if outside:
    raise ConfigError(
      f"--pipeline: the sweep sets {', '.join(outside)}; a pipelined sweep can only vary "
      f"{', '.join(per_model_of)} (one model per point, same model and data)"
    )
  if any(set(point) != set(fields) for point in points):
    raise ConfigError("--pipeline: every sweep point must set the same fields")
  per_model = {
    pipeline.PER_MODEL[per_model_of[field]].path: tuple(point[field] for point in points)
    for field in fields
  }
  models = {"algorithm": pipeline.PIPELINE.name, pipeline.MODELS.path: len(points)}
  try:
    pipelined = sweep.apply(config, models | per_model)
  except (TypeError, ValueError) as error:
    raise ConfigError(f"--pipeline: {error}") from None
  trainer.check(pipelined)
  pipeline_flags = [f"--config.{field}={value}" for field, value in (models | per_model).items()]
  return pipeline_flags, pipelined


def run_pipeline(points, plan, user_flags, workdir) -> list[dict]:
  pipeline_flags, pipelined = plan
  status = "done"
  total_steps = pipelined.run.total_steps
  if not _finished(workdir, total_steps):
    command = _command(workdir, [*user_flags, *pipeline_flags])
    job = executor.Job("the pipelined run", workdir, total_steps, tuple(command))
    [outcome] = executor.run([job], None, workdir, "sweep")
    status = outcome.status
  return [
    {"run": f"model_{m}", **point, "status": status}
    | sweep.final_scalars(os.path.join(workdir, f"model_{m}"))
    for m, point in enumerate(points)
  ]


def user_overrides(argv: list[str]) -> list[str]:
  """The command line's --config.FIELD overrides, each as --config.FIELD=VALUE (also
  when given as --config.FIELD VALUE, or a boolean as --config.FIELD or
  --noconfig.FIELD), for every point's train.py."""
  overrides = []
  for index, arg in enumerate(argv):
    name, equals, value = arg.lstrip("-").partition("=")
    if not arg.startswith(("--config.", "--noconfig.")):
      continue
    field = name.partition(".")[2]
    if equals:
      overrides.append(f"--config.{field}={value}")
    elif cli.takes_value(name, flags.FLAGS):
      overrides.append(f"--config.{field}={argv[index + 1]}")  # parse_flags saw a value
    else:
      overrides.append(f"--config.{field}={not name.startswith('no')}")
  return overrides


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {' '.join(argv[1:])}")
  logging.set_verbosity(logging.WARNING)  # the runs log; the sweep says only where it is
  # Each point takes its own rule's defaults (sweep.check_points; its train.py
  # run does the same): not those of the file's algorithm.
  config = _CONFIG.value
  cli.check_workdir(_WORKDIR.value, inputs={"config.run.data_dir": config.run.data_dir})
  for name, made_by in sweep.SUMMARY_FILES.items():
    arguments.check_overwritable(os.path.join(_WORKDIR.value, name), made_by, at_start=True)
  user_flags = user_overrides(sys.argv[1:])
  fixed = cli.given_fields(user_flags)
  try:
    parallel = executor.parallel_of(
      _PARALLEL.value,
      _POINT_CPUS.value,
      _POINT_GPUS.value,
      _RAY_ADDRESS.value,
      _POINT_RETRIES.value,
    )
    if parallel and _PIPELINE.value:
      raise ConfigError("--pipeline is one run of one process: drop --parallel and --ray_address")
    source = config_flags.get_config_filename(flags.FLAGS["config"])
    points = sweep.load_sweep(source)
    options = {
      "metric": _METRIC.value,
      "mode": _MODE.value,
      "grace_steps": _GRACE_STEPS.value,
      "reduction_factor": _REDUCTION_FACTOR.value,
      "pbt_fields": _PBT_FIELDS.value,
      "perturbation_steps": _PERTURBATION_STEPS.value,
      "pbt_seed": _PBT_SEED.value,
    }
    scheduled = _SCHEDULER.value or any(value not in (None, []) for value in options.values())
    if _PIPELINE.value and scheduled:
      raise ConfigError("--pipeline is one run: drop --scheduler and its options")
    # Population-based training changes these fields in the points' runs on purpose.
    changing = tuple(_PBT_FIELDS.value) if _SCHEDULER.value == "pbt" else ()
    hyperparameters.check_mid_run(changing, "--pbt_fields")
    sweep.check_points(
      points,
      config,
      fixed,
      each_valid=not _PIPELINE.value,
      source=source,
      workdir=_WORKDIR.value,
      changing=changing,
    )
    schedule = sweep.schedule(_SCHEDULER.value, options, points, config, parallel)
    plan = pipeline_plan(points, config) if _PIPELINE.value else None
    # One sweep a workdir: refused before a Ray starts, taken once Ray has checked
    # what it can (a refusal of Ray's leaves no workdir).
    ownership.check_free(_WORKDIR.value, ownership.SWEEP_LOCK, "sweep")
    lock = None
    try:
      with executor.maybe_connected(parallel):
        if parallel and parallel.address:
          executor.check_shared(_WORKDIR.value, parallel)
        lock = ownership.hold(_WORKDIR.value, ownership.SWEEP_LOCK, "sweep")
        if plan:
          rows = run_pipeline(points, plan, user_flags, _WORKDIR.value)
        else:
          rows = run_points(points, config, user_flags, _WORKDIR.value, parallel, schedule)
    finally:
      if lock is not None:
        lock.release()
  except ConfigError as error:
    cli.fail(str(error))
  except executor.Stopped as stopped:
    print(
      f"sweep: stopped by a preemption notice ({stopped}); run the same command to resume: "
      f"{shlex.join(['python', *sys.argv])}",
      flush=True,
    )
    return
  fields = list(dict.fromkeys(field for point in points for field in point))
  print(sweep.write_summary(rows, fields, _WORKDIR.value))
  failed = [row["run"] for row in rows if row["status"].startswith("failed")]
  if failed:
    cli.fail(f"{len(failed)} of {len(rows)} points failed: {', '.join(failed)}", code=1)


if __name__ == "__main__":
  cli.run(main)
