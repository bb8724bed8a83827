"""Sweeps: a config file's `get_sweep()` expanded into runs, and their summary.

A config file may define, beside `get_config()`,

    def get_sweep():
      return [{"optimizer.learning_rate": 0.05, "outer.moving_rate": 0.05}, ...]

a list of points, each a dict from config field (dotted, e.g.
"cluster.bandwidth"; a top-level field such as "seed" as it is) to its value
in that run. `product(...)` builds the grid of all combinations.
"""

import csv
import itertools
import math
import os

import ml_collections

from easgd import arguments, executor
from easgd.config import hyperparameters, validation
from easgd.errors import ConfigError
from easgd.infra import checkpoint, scalars
from easgd.train import trainer

# The final scalars of a run that the summary shows, when the run has them.
SUMMARY_TAGS = (
  "eval/center_accuracy",
  "eval/worker_accuracy",
  "train/loss",
  "sim/time",
  "comm/bytes_per_worker",
)


# The files a sweep writes into its workdir, and how the first bytes of each begin:
# a file of that name that does not is someone else's, and is not overwritten.
SUMMARY_FILES = {"summary.md": b"| run |", "summary.csv": b"run,"}


def product(axes: dict | None = None, **more) -> list[dict]:
  """product({"optimizer.learning_rate": [0.05, 0.1]}, seed=[0, 1]) -> the 4 points of the grid.

  Dotted fields go in the dict, top-level ones may also be keywords.
  """
  axes = {**(axes or {}), **more}
  fields = list(axes)
  return [dict(zip(fields, values, strict=True)) for values in itertools.product(*axes.values())]


# What get_sweep() may return, said in every refusal of what it returned.
ALLOWED = (
  "get_sweep() must return a non-empty list of dicts of config fields, "
  'e.g. [{"optimizer.learning_rate": 0.05}, {"optimizer.learning_rate": 0.1}]'
)
# The longest folder name most file systems take, in bytes: each point's run folder.
_NAME_BYTES = 255


def _kind(value) -> str:
  return "None" if value is None else f"a {type(value).__name__} ({_short(value)})"


def _short(value, limit: int = 60) -> str:
  text = repr(value)
  return text if len(text) <= limit else text[: limit - 3] + "..."


def load_sweep(config_path: str) -> list[dict]:
  """The points of `get_sweep()` in the config file: a non-empty list (or tuple) of
  non-empty dicts from config field names (strings) to values. Anything else,
  and a file that does not load or whose get_sweep() fails, raises ConfigError
  naming the file, what was found and what is allowed (one line)."""
  if not os.path.isfile(config_path):
    raise ConfigError(f"{config_path} is not a file: give a config file with a get_sweep()")
  module = arguments.load_file(config_path, "swept_config")
  try:
    module.__loader__.exec_module(module)
  except Exception as error:  # noqa: BLE001 (any failure of the user's file)
    raise ConfigError(f"{config_path} does not load: {arguments.first_line(error)}") from None
  if not hasattr(module, "get_sweep"):
    raise ConfigError(f"{config_path} defines no get_sweep(); a sweep needs one: {ALLOWED}")
  if not callable(module.get_sweep):
    raise ConfigError(f"{config_path}: get_sweep is {_kind(module.get_sweep)}; {ALLOWED}")
  try:
    points = module.get_sweep()
  except Exception as error:  # noqa: BLE001 (any failure of the user's function)
    raise ConfigError(f"{config_path}: get_sweep() raised {arguments.first_line(error)}") from None
  if not isinstance(points, (list, tuple)):
    raise ConfigError(f"{config_path}: get_sweep() returned {_kind(points)}; {ALLOWED}")
  if not points:
    raise ConfigError(
      f"{config_path}: get_sweep() returned no points; a sweep needs at least one: {ALLOWED}"
    )
  for number, point in enumerate(points):
    if not isinstance(point, dict):
      raise ConfigError(
        f"{config_path}: get_sweep()'s point {number} is {_kind(point)}, not a dict; {ALLOWED}"
      )
    if not point:
      raise ConfigError(f"{config_path}: get_sweep()'s point {number} is an empty dict; {ALLOWED}")
    for field in point:
      if not isinstance(field, str):
        raise ConfigError(
          f"{config_path}: get_sweep()'s point {number} has the key {_short(field)}, "
          f"not a config field's name (a string); {ALLOWED}"
        )
  return list(points)


def check_points(
  points: list[dict],
  config: ml_collections.ConfigDict,
  fixed: set[str],
  each_valid: bool,
  source: str | None = None,
  workdir: str | None = None,
  changing: tuple[str, ...] = (),
) -> None:
  """Every point names existing fields, none set on the command line too, takes
  values of the fields' types and differs from the others; with `each_valid`
  (each point a run of its own) its run folder's name is one folder name, its
  config is valid and, under `workdir`, its folder holds no run of another
  config (train.py would refuse it; of the fields `changing`, population-based
  training's, it may hold other values). Raises ConfigError naming the point (and
  `source`, the sweep's file, when given).
  """
  where = f"{source}: " if source else ""
  known = hyperparameters.flatten(config.to_dict())
  folders = {}
  for number, point in enumerate(points):
    label = f"{where}sweep point {number} ({name(point)})"
    for field in point:
      if field not in known:
        raise ConfigError(
          f"{label}: {hyperparameters.hint(field)} "
          "(get_sweep() returns a list of dicts of config fields)"
        )
      if field in fixed:
        raise ConfigError(
          f"config.{field} is both swept and set by --config.{field}; drop one of the two"
        )
    folder = name(point)
    too_long = len(folder.encode()) > _NAME_BYTES
    if each_valid and (os.sep in folder or "\0" in folder or too_long):
      raise ConfigError(
        f"{label}: its run folder name (field=value,...) must be one folder name of at most "
        f"{_NAME_BYTES} bytes without {os.sep!r}; sweep fewer fields or simpler values"
      )
    if folder in folders:
      raise ConfigError(
        f"{label} is point {folders[folder]} again: each point is one run; drop one of the two"
      )
    folders[folder] = number
    run_dir = os.path.join(workdir, folder) if workdir and each_valid else None
    try:
      swept = apply(config, point)
      # As train.py takes them: the checkpoint's values where it resumes one.
      saved = checkpoint.saved_config(run_dir) if run_dir else None
      hyperparameters.with_rule_defaults(swept, set(point) | fixed, saved)
      if each_valid:
        trainer.check(swept)
      if run_dir:
        validation.check_checkpoint(swept, run_dir, changing)
    except (TypeError, ValueError) as error:
      raise ConfigError(f"{label}: {error}") from None


# The scalars a scheduler may read, and whether more is better.
METRICS = {
  "eval/center_accuracy": "max",
  "eval/worker_accuracy": "max",
  "eval/consensus_distance": "min",
  "train/loss": "min",
  "train/accuracy": "max",
}
SCHEDULERS = ("asha", "pbt")


def schedule(
  scheduler: str | None,
  options: dict,
  points: list[dict],
  config: ml_collections.ConfigDict,
  parallel,
) -> executor.Schedule | None:
  """The Tune scheduler of the sweep's flags (`options`: metric, mode, grace_steps,
  reduction_factor, pbt_fields, perturbation_steps, pbt_seed; None where not given),
  or None without --scheduler. ConfigError (one line naming the flag or field and
  what is allowed) for what the points could not be scheduled by."""
  given = [f"--{name}" for name, value in options.items() if value not in (None, [])]
  if scheduler is None:
    if given:
      raise ConfigError(
        f"{' and '.join(given)} set a scheduler's options, but no --scheduler is given: "
        f"give --scheduler={'|'.join(SCHEDULERS)}, or drop them"
      )
    return None
  if parallel is None:
    raise ConfigError(
      f"--scheduler={scheduler} runs the points as Ray Tune's trials: give --parallel N "
      "(or --ray_address) too"
    )
  others = {
    "asha": ("pbt_fields", "perturbation_steps", "pbt_seed"),
    "pbt": ("grace_steps", "reduction_factor"),
  }
  other = [f"--{name}" for name in others[scheduler] if options.get(name) not in (None, [])]
  if other:
    raise ConfigError(f"{' and '.join(other)} are not options of --scheduler={scheduler}")
  metric = options.get("metric") or "eval/center_accuracy"
  if metric not in METRICS:
    raise ConfigError(f"--metric={metric!r} is invalid: give one of {', '.join(METRICS)}")
  mode = options.get("mode") or METRICS[metric]
  runs = [apply(config, point) for point in points]
  totals = {run.run.total_steps for run in runs}
  if len(totals) > 1:
    raise ConfigError(
      f"--scheduler={scheduler}: the points train {sorted(totals)} steps; a scheduler "
      "compares points at the same steps: sweep run.total_steps apart"
    )
  total = totals.pop()
  every_name = "eval_every" if metric.startswith("eval/") else "log_every"
  every_field = f"run.{every_name}"
  everies = {run.run[every_name] for run in runs}
  every = everies.pop() if len(everies) == 1 else 0
  if every <= 0:
    raise ConfigError(
      f"--metric={metric}: the points must log it at the same steps (config.{every_field} "
      "> 0, the same for every point)"
    )

  def on_log(flag: str, step: int, what: str) -> None:
    if not 1 <= step < total:
      raise ConfigError(f"{flag}={step} is invalid: must be in [1, {total}) steps")
    if step % every:
      raise ConfigError(
        f"{flag}: {what} {step} is not a step where the runs log {metric} (every {every} "
        f"steps, config.{every_field}): give a multiple of {every}"
      )

  if scheduler == "asha":
    factor = options.get("reduction_factor") or 3
    if factor < 2:
      raise ConfigError(f"--reduction_factor={factor} is invalid: must be an integer >= 2")
    grace = options.get("grace_steps") or every
    rungs = []
    while grace * factor ** len(rungs) < total:
      on_log("--grace_steps", grace * factor ** len(rungs), "ASHA's rung at step")
      rungs.append(grace * factor ** (len(rungs)))
    if not rungs:
      on_log("--grace_steps", grace, "ASHA's first rung at step")
    return executor.Schedule("asha", metric, mode, (*rungs, total), reduction_factor=factor)
  fields = _pbt_fields(options.get("pbt_fields") or [], points, config)
  interval = options.get("perturbation_steps") or every
  on_log("--perturbation_steps", interval, "a perturbation at step")
  steps = (*range(interval, total, interval), total)
  seed = options.get("pbt_seed") or 0
  return executor.Schedule("pbt", metric, mode, steps, fields=fields, seed=seed)


def _pbt_fields(named: list[str], points: list[dict], config) -> tuple:
  """(field, its values in the sweep) for each field PBT explores; ConfigError unless
  each is one a run can change mid-run, read by the points' algorithm and swept, and
  the points differ in nothing else."""
  if not named:
    raise ConfigError(
      "--scheduler=pbt explores the fields --pbt_fields names (e.g. --pbt_fields="
      "outer.moving_rate,outer.comm_period): give them"
    )
  hyperparameters.check_mid_run(named, "--pbt_fields")
  if len(points) < 2:
    raise ConfigError("--scheduler=pbt needs a population: a sweep of at least 2 points")
  for point in points:
    run = apply(config, point)
    if run.runtime != "simulated":
      raise ConfigError(
        f"--scheduler=pbt: config.runtime={run.runtime!r}; PBT copies one point's "
        "checkpoint into another, which only runtime=simulated resumes: a threads or ray "
        "run's trace follows its own run alone"
      )
    for field in named:
      if not hyperparameters.shapes_trajectory(field, run.algorithm, run.optimizer):
        raise ConfigError(f"--pbt_fields: {run.algorithm} does not read config.{field}")
      if field not in point:
        raise ConfigError(
          f"--pbt_fields: config.{field} is not swept; PBT explores a field over the values "
          "get_sweep() gives it: sweep it"
        )
  varied = sorted(
    {field for point in points for field in point if field not in named}
    - {field for field in points[0] if all(p.get(field) == points[0][field] for p in points)}
  )
  if varied:
    raise ConfigError(
      f"--pbt_fields: the points differ in {', '.join(f'config.{f}' for f in varied)} too; "
      "PBT copies one point's run into another, so its points may differ only in the "
      f"fields it explores ({', '.join(named)})"
    )
  fields = []
  for field in named:
    values = sorted({point[field] for point in points})
    if len(values) < 2:
      raise ConfigError(f"--pbt_fields: config.{field} takes one value in the sweep: sweep more")
    fields.append((field, tuple(values)))
  return tuple(fields)


def apply(config: ml_collections.ConfigDict, point: dict) -> ml_collections.ConfigDict:
  """A copy of `config` with the point's values."""
  config = ml_collections.ConfigDict(config.to_dict())
  config.update_from_flattened_dict(point)
  return config


def flag_value(value) -> str:
  """A value as a --config.FIELD= flag takes it."""
  return str(tuple(value)) if isinstance(value, (tuple, list)) else str(value)


def name(point: dict) -> str:
  """The point's run name, e.g. optimizer.learning_rate=0.05,outer.moving_rate=0.1."""
  return ",".join(f"{field}={flag_value(value)}" for field, value in point.items())


def final_scalars(run_dir: str) -> dict[str, float]:
  """The last value of each summary tag that the run wrote (none if it wrote no folder)."""
  logged = scalars.read(run_dir)
  return {tag: logged[tag][-1][1] for tag in SUMMARY_TAGS if tag in logged}


def write_summary(rows: list[dict], fields: list[str], workdir: str) -> str:
  """Writes summary.md and summary.csv in `workdir`, best center accuracy first; returns the md."""

  def accuracy(row):
    value = row.get("eval/center_accuracy", math.nan)
    return -value if math.isfinite(value) else math.inf

  rows = sorted(rows, key=accuracy)
  tags = [tag for tag in SUMMARY_TAGS if any(tag in row for row in rows)]
  columns = ["run", *fields, "status", *tags]

  def cell(row, column):
    value = row.get(column, "")
    return f"{value:.4g}" if isinstance(value, float) else str(value)

  with open(os.path.join(workdir, "summary.csv"), "w", newline="") as handle:
    writer = csv.DictWriter(handle, fieldnames=columns, extrasaction="ignore")
    writer.writeheader()
    writer.writerows(rows)
  lines = [
    "| " + " | ".join(columns) + " |",
    "|" + "---|" * len(columns),
    *("| " + " | ".join(cell(row, column) for column in columns) + " |" for row in rows),
  ]
  markdown = "\n".join(lines) + "\n"
  with open(os.path.join(workdir, "summary.md"), "w") as handle:
    handle.write(markdown)
  return markdown
