"""What every study shares: its command line (--workdir, --docs, --set), the
overwrite checks of the files it writes, its runs (trained one after another or in
parallel on Ray, a bad setting or a failed run ending it in one line), the curves
read back from them, and the table it prints.
"""

import ast
import contextlib
import datetime
import logging
import os
import re
import sys

import jax
from absl import logging as absl_logging

from easgd import arguments, executor
from easgd.config import hyperparameters
from easgd.configs import default
from easgd.errors import ConfigError
from easgd.infra import checkpoint

# The center test accuracy a study times its runs to.
TARGET = 0.95
# CPU devices a study's process has: one a worker.
CPU_DEVICES = 8
DOCS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "docs")


def use_cpu_devices(count: int = CPU_DEVICES) -> None:
  """Gives JAX `count` CPU devices, one a worker: the first thing a study's `main` does,
  before anything touches a device (importing a study does not)."""
  jax.config.update("jax_num_cpu_devices", count)


def parser(doc: str, *, overrides: bool = False) -> arguments.ArgumentParser:
  """A study's parser: its description (the first line of `doc`), --workdir (its runs,
  required), --docs (where its table and plot go) and, with `overrides`, --set."""
  parsed = arguments.ArgumentParser(description=doc.splitlines()[0])
  parsed.add_argument("--workdir", required=True, type=arguments.directory("--workdir"))
  parsed.add_argument("--docs", type=arguments.directory("--docs"), default=DOCS)
  if overrides:
    parsed.add_argument(
      "--set", action="append", default=[], metavar="FIELD=VALUE", help="a config override"
    )
  return parsed


def check_outputs(folder: str, script: str, table: str, plot: str) -> None:
  """Refuses (one line, exit 2) to write over a `table` or `plot` in `folder` that
  `python studies/<script>.py` did not make."""
  arguments.check_overwritable(
    os.path.join(folder, table), f"Made by `python studies/{script}.py".encode()
  )
  arguments.check_overwritable(os.path.join(folder, plot), b"matplotlib")


def quiet() -> None:
  """Leaves absl's per-run lines out of a study's output (its warnings stay)."""
  absl_logging.set_verbosity(absl_logging.WARNING)
  logging.getLogger("absl").setLevel(logging.WARNING)


def command(script: str) -> str:
  """The command line that ran the study, as its table quotes it."""
  return " ".join([f"python studies/{script}.py", *sys.argv[1:]])


def print_table(path: str) -> None:
  with open(path) as written:
    print(written.read())


def parse_overrides(assignments: list[str]) -> dict:
  """["cluster.bandwidth=1.25e7"] -> {"cluster.bandwidth": 12500000.0}; raises ConfigError."""
  known = hyperparameters.flatten(default.get_config().to_dict())
  overrides = {}
  for assignment in assignments:
    field, equals, value = assignment.partition("=")
    if equals and field not in known and hyperparameters.moved(field) in known:
      raise ConfigError(f"--set {assignment!r}: {hyperparameters.hint(field)}")
    if not equals or field not in known:
      raise ConfigError(
        f"--set {assignment!r}: expected FIELD=VALUE with FIELD a config field "
        "(e.g. cluster.bandwidth=1.25e7, outer.comm_period=8)"
      )
    try:
      overrides[field] = ast.literal_eval(value)
    except (ValueError, SyntaxError):
      raise ConfigError(
        f"--set {assignment!r}: {value!r} is not a Python literal (a number, string or tuple)"
      ) from None
  return overrides


def saved_total_steps(saved: dict):
  """run.total_steps of a checkpoint's config (whose fields may have the old flat names)."""
  return hyperparameters.grouped(saved).get("run.total_steps")


def finished(saved: dict | None, workdir: str, total_steps: int) -> bool:
  """Whether the run in `workdir` (`saved`: its checkpoint's config) trained all of its
  `total_steps`: a run stopped before its end (SIGTERM saves a checkpoint) is not."""
  if saved is None or saved_total_steps(saved) != total_steps:
    return False
  return checkpoint.saved_step(workdir) == total_steps


@contextlib.contextmanager
def connected(parallel):
  """The Ray of `parallel` (nothing for runs one after another) for a study's runs: a
  Ray that cannot start, or whose nodes cannot place a run, ends the study in one
  line (exit 2) before anything trains."""
  try:
    with executor.maybe_connected(parallel):
      yield
  except ConfigError as error:
    arguments.fail(str(error))


def train_all(runs: list[tuple[str, object, str]], parallel, workdir: str, label: str) -> None:
  """Trains `runs` ((name, config, workdir) each): one after another in this process,
  or in parallel as Ray Tune trials (easgd.executor; --parallel). A run that diverges or
  fails ends the study in one line (exit 1) once the others are done."""
  try:
    jobs = executor.config_jobs(runs, CPU_DEVICES)
    outcomes = executor.run(jobs, parallel, workdir, label=label)
  except ConfigError as error:
    arguments.fail(str(error))
  except executor.Stopped:  # a preemption notice: that run saved where it was
    print(f"{label}: stopped; run the same command to resume", flush=True)
    sys.exit(0)
  pairs = zip(jobs, outcomes, strict=True)
  failed = [f"{job.name} {outcome.status}" for job, outcome in pairs if outcome.code != 0]
  if failed:
    arguments.fail(
      f"{label}: {len(failed)} of {len(jobs)} runs did not finish: " + "; ".join(failed), code=1
    )


def mean_curves(runs: list[dict]) -> dict[str, list[tuple[int, float]]]:
  """Per tag, the mean over seeds at each step that every seed logged."""
  result = {}
  for tag in set.intersection(*(set(run) for run in runs)):
    by_step = [dict(run[tag]) for run in runs]
    common = sorted(set.intersection(*(set(values) for values in by_step)))
    result[tag] = [(step, sum(v[step] for v in by_step) / len(runs)) for step in common]
  return result


def first_reaching(curves: dict):
  """(sim seconds, mean worker steps) at the first evaluation >= TARGET, or None."""
  accuracy = dict(curves["eval/center_accuracy"])
  reached = [step for step in sorted(accuracy) if accuracy[step] >= TARGET]
  if not reached:
    return None
  return dict(curves["sim/time"])[reached[0]], dict(curves["sim/worker_steps_mean"])[reached[0]]


def at_budget(curves: dict, tag: str, budget: float) -> float:
  """Center accuracy at the last evaluation whose `tag` is within `budget`."""
  accuracy, used = dict(curves["eval/center_accuracy"]), dict(curves[tag])
  within = [step for step in sorted(accuracy) if used[step] <= budget * (1 + 1e-9)]
  return accuracy[within[-1]] if within else float("nan")


def final(curves: dict, tag: str) -> float:
  """A tag's last logged value."""
  values = dict(curves[tag])
  return values[max(values)]


def table_parts(path: str) -> tuple[list[str], list[str], list[str]]:
  """A study's table in `path` as (its lines through the header's |---| line, its rows,
  the lines after them)."""
  with open(path) as table:
    lines = table.read().splitlines()
  start = next(n for n, line in enumerate(lines) if line.startswith("|---")) + 1
  end = start
  while end < len(lines) and lines[end].startswith("| "):
    end += 1
  return lines[:start], lines[start:end], lines[end:]


def budgets_of(head: list[str]) -> list[float]:
  """The budgets a table's header reads its runs at: the X of each "acc. at X sim s" and
  "acc. at X MB", in order."""
  return [float(value) for value in re.findall(r"acc\. at ([\d.]+) (?:sim s|MB)", head[-2])]


def add_rows(path: str, rows: dict[tuple[str, ...], str], command: str, note: str) -> None:
  """Writes `rows` (the cells that name a row -> its line) into the table in `path`: each
  in place of the row of the same name, or after the others; the other rows stay as they
  are. Below the table a note says which rows `command` put in on which day, and
  `note`; it replaces the note of an earlier run of the same command."""
  head, old, tail = table_parts(path)
  width = len(next(iter(rows)))
  merged, left = [], dict(rows)
  for line in old:
    key = tuple(cell.strip() for cell in line.strip("|").split("|")[:width])
    merged.append(left.pop(key, line))
  merged += left.values()
  by = f"put in by `{command}`"
  names = ", ".join(" ".join(name) for name in rows)
  said = f"Rows {by} on {today()}: {names}; {note}"
  tail = [line for line in tail if by not in line]
  while tail and not tail[-1]:
    tail.pop()
  with open(path, "w") as table:
    table.write("\n".join([*head, *merged, *tail, "", said]) + "\n")


def today() -> str:
  """Today's date (UTC), as a note of rows added to a table names it."""
  return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d")
