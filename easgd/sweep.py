"""Sweeps: a config file's `get_sweep()` expanded into runs, and their summary.

A config file may define, beside `get_config()`,

    def get_sweep():
      return [{"optimizer.learning_rate": 0.05, "outer.moving_rate": 0.05}, ...]

a list of points, each a dict from config field (dotted, e.g.
"cluster.bandwidth"; a top-level field such as "seed" as it is) to its value
in that run. `product(...)` builds the grid of all combinations.
"""

import csv
import importlib.util
import itertools
import math
import os

import ml_collections
from tensorboard.backend.event_processing import event_accumulator

from easgd import schema, validation
from easgd.errors import ConfigError

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


def load_sweep(config_path: str) -> list[dict]:
  """The points of `get_sweep()` in the config file; raises ConfigError."""
  spec = importlib.util.spec_from_file_location("swept_config", config_path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  if not hasattr(module, "get_sweep"):
    raise ConfigError(f"{config_path} defines no get_sweep(); a sweep needs one")
  points = list(module.get_sweep())
  if not points:
    raise ConfigError(f"{config_path}: get_sweep() returned no points; a sweep needs at least one")
  if not all(isinstance(point, dict) and point for point in points):
    raise ConfigError(f"{config_path}: get_sweep() must return non-empty dicts of field -> value")
  return points


def check_points(
  points: list[dict], config: ml_collections.ConfigDict, fixed: set[str], each_valid: bool
) -> None:
  """Every point names existing fields, none set on the command line too, and (with
  `each_valid`) makes a valid config. Raises ConfigError naming the point.
  """
  known = schema.flatten(config.to_dict())
  for number, point in enumerate(points):
    for field in point:
      if field not in known:
        raise ConfigError(f"sweep point {number} ({name(point)}): {schema.hint(field)}")
      if field in fixed:
        raise ConfigError(
          f"config.{field} is both swept and set by --config.{field}; drop one of the two"
        )
    if not each_valid:
      continue
    try:
      validation.validate(apply(config, point))
    except (TypeError, ValueError) as error:
      raise ConfigError(f"sweep point {number} ({name(point)}): {error}") from None


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
  """The last value of each summary tag that the run wrote."""
  accumulator = event_accumulator.EventAccumulator(run_dir, size_guidance={"scalars": 0})
  accumulator.Reload()
  tags = set(accumulator.Tags().get("scalars", ()))
  return {tag: accumulator.Scalars(tag)[-1].value for tag in SUMMARY_TAGS if tag in tags}


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
