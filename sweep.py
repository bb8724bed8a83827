"""Runs a config file's sweep: python sweep.py --config configs/X.py --workdir runs/X.

Every point of `get_sweep()` (easgd/sweep.py) becomes one train.py run in
<workdir>/<point> with its own TensorBoard run; --config.FIELD=VALUE
overrides apply to every point. Finished points are skipped, so a stopped
sweep is resumed by running the same command. The sweep ends with
<workdir>/summary.md and summary.csv, best final center accuracy first.

With --pipeline the sweep runs as one pipelined multi-model run instead
(config.algorithm=pipeline, one model per point, <workdir>/model_<k>): the
swept fields must be among the pipeline's per-model values.
"""

import os
import subprocess
import sys

from absl import app, flags, logging
from ml_collections import config_flags

from easgd import arguments, cli, sweep
from easgd.errors import ConfigError
from easgd.infra import checkpoint
from easgd.pipeline import programs
from easgd.train import trainer

TRAIN = os.path.join(os.path.dirname(os.path.abspath(__file__)), "train.py")

_CONFIG = cli.define_config(None, "Config file with get_sweep().")
_WORKDIR = flags.DEFINE_string("workdir", None, "Where the runs and the summary go.")
_PIPELINE = flags.DEFINE_bool("pipeline", False, "Run the sweep as one pipelined run.")
flags.mark_flags_as_required(["config", "workdir"])


def _train(workdir: str, overrides: list[str]) -> int:
  """Runs train.py with the sweep's config file and `overrides`; returns its exit code."""
  config_file = config_flags.get_config_filename(flags.FLAGS["config"])
  command = [sys.executable, TRAIN, f"--config={config_file}"]
  return subprocess.run([*command, *overrides, f"--workdir={workdir}"], check=False).returncode


def _finished(workdir: str, total_steps: int) -> bool:
  return checkpoint.saved_step(workdir) == total_steps


def _status(code: int) -> str:
  return {0: "done", 1: "diverged"}.get(code, f"failed (exit {code})")


def run_points(points, config, user_flags, workdir) -> list[dict]:
  rows = []
  for number, point in enumerate(points):
    run_dir = os.path.join(workdir, sweep.name(point))
    row = {"run": sweep.name(point), **point}
    if _finished(run_dir, sweep.apply(config, point).run.total_steps):
      print(f"sweep: point {number + 1}/{len(points)} {row['run']} is finished", flush=True)
      row["status"] = "done"
    else:
      print(f"sweep: point {number + 1}/{len(points)} {row['run']}", flush=True)
      point_flags = [f"--config.{field}={sweep.flag_value(v)}" for field, v in point.items()]
      row["status"] = _status(_train(run_dir, [*user_flags, *point_flags]))
    rows.append(row | sweep.final_scalars(run_dir))
  return rows


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
    f"pipeline.per_model.{per_model_of[field]}": tuple(point[field] for point in points)
    for field in fields
  }
  models = {"algorithm": "pipeline", "pipeline.models": len(points)}
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
  if not _finished(workdir, pipelined.run.total_steps):
    status = _status(_train(workdir, [*user_flags, *pipeline_flags]))
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
    source = config_flags.get_config_filename(flags.FLAGS["config"])
    points = sweep.load_sweep(source)
    sweep.check_points(points, config, fixed, each_valid=not _PIPELINE.value, source=source)
    plan = pipeline_plan(points, config) if _PIPELINE.value else None
    os.makedirs(_WORKDIR.value, exist_ok=True)
    if plan:
      rows = run_pipeline(points, plan, user_flags, _WORKDIR.value)
    else:
      rows = run_points(points, config, user_flags, _WORKDIR.value)
  except ConfigError as error:
    cli.fail(str(error))
  fields = list(dict.fromkeys(field for point in points for field in point))
  print(sweep.write_summary(rows, fields, _WORKDIR.value))


if __name__ == "__main__":
  cli.run(main)
