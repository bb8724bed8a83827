"""train_and_evaluate: the whole run, from configuration to final accuracy, written
once for every runtime (easgd.train.runtimes)."""

import json
import os
import threading
from collections.abc import Sequence

import jax
import ml_collections
from absl import logging

from easgd.config import hyperparameters, validation
from easgd.infra import checkpoint, metrics, preemption
from easgd.train import loop
from easgd.train import setup as setup_lib
from easgd.train.runtimes import registry as runtimes
from easgd.train.runtimes.base import Runtime

# The file of a workdir that lists the deliberate changes of its configuration, one
# JSON line each ({"step", "fields": {field: [old, new]}}), oldest first.
CHANGES_FILE = "config_changes.jsonl"
# The TensorBoard text of each change, and the scalar prefix of the changed values.
CHANGES_TAG, CHANGED_VALUE_PREFIX = "config_changes", "config/"


def check(config: ml_collections.ConfigDict) -> type[Runtime]:
  """Every check of `config` alone, its runtime's included (and what it asks of the
  model); returns the runtime that runs it. Raises ConfigError; writes nothing."""
  validation.validate(config)
  runtime = runtimes.select(config)
  runtime.check_model(config, lambda: setup_lib.model_shapes(config))
  return runtime


def train_and_evaluate(
  config: ml_collections.ConfigDict,
  workdir: str,
  runtime_class: type[Runtime] | None = None,
  *,
  stop_after: int | None = None,
  changing: Sequence[str] = (),
  notice: threading.Event | None = None,
) -> loop.TrainResult:
  """Trains `config` in `workdir`, resuming from its newest checkpoint.

  `runtime_class`: what `check(config)` returned, when the caller has checked
  it; else it is checked here. Either way it is checked once, and the run
  reads a frozen copy of it from then on. `stop_after`: stop after this step with a
  checkpoint, as a preemption notice stops the run (train.py --stop_after).
  `changing`: fields whose values may differ from the checkpoint's, a deliberate
  change that the run records (`record_changes`; train.py --changed_fields).
  `notice`: an event that, set, is a preemption notice (for a run in a thread of a
  process whose SIGTERM is not the run's).
  """
  if runtime_class is None:
    runtime_class = check(config)
  config = ml_collections.FrozenConfigDict(config)
  setup = setup_lib.setup(
    config, workdir, runtime_class, runtimes.others(config, runtime_class), changing
  )
  try:
    runtime = runtime_class(setup)
    setup.log_run(runtime.describe())
    state = runtime.init_state()
    checkpointer = setup.checkpointer
    resumed = clock_state = None
    if checkpointer.latest_step() is not None:
      resumed, state, clock_state = checkpointer.restore(state)
      logging.info("resumed from the checkpoint of step %d", resumed)
      if changing:
        record_changes(config, workdir, resumed, changing, checkpointer)
    trainee = runtime.trainee(state, clock_state, resumed)
    if resumed is None:
      trainee.write_config()
    watch = preemption.PreemptionWatch(stop_after, notice)
    start = int(jax.device_get(state.step))
    final, preempted = loop.run(config, trainee, start, checkpointer, watch)
  finally:
    setup.release()
  return loop.TrainResult(trainee.state, final, preempted, noticed=watch.noticed)


def record_changes(config, workdir: str, step: int, changing: Sequence[str], checkpointer):
  """Records where the fields of `changing` differ from the checkpoint of `step` that
  the run resumed: in the checkpoints from now on (their history of changes), in
  <workdir>/config_changes.jsonl, and in TensorBoard (a text at `step`, and each
  number changed as a scalar config/FIELD, its value before the first change at
  step 0); a log line says it. Nothing for fields that did not change."""
  saved = hyperparameters.grouped(checkpoint.config_at(workdir, step) or {})
  current = hyperparameters.flatten(config.to_dict())
  fields = {
    field: [saved.get(field), current.get(field)]
    for field in changing
    if saved.get(field) != current.get(field)
  }
  if not fields:
    return
  record = {"step": step, "fields": fields}
  first = {field for field in fields if not any(field in r["fields"] for r in checkpointer.changes)}
  checkpointer.changes.append(record)
  said = ", ".join(f"config.{field} {old!r} -> {new!r}" for field, (old, new) in fields.items())
  logging.info("resumed at step %d with a deliberate change (--changed_fields): %s", step, said)
  if jax.process_index() != 0:
    return
  path = os.path.join(workdir, CHANGES_FILE)
  line = json.dumps(record)
  try:
    with open(path) as handle:
      written = handle.read().splitlines()
  except FileNotFoundError:
    written = []
  if not written or written[-1] != line:  # a run resumed again from the same checkpoint
    with open(path, "a") as handle:
      handle.write(line + "\n")
  writer = metrics.MetricWriter(workdir, suffix=".config_changes")
  try:
    rows = "".join(f"| config.{f} | {old!r} | {new!r} |\n" for f, (old, new) in fields.items())
    table = f"At step {step}:\n\n| field | was | is |\n|---|---|---|\n{rows}"
    writer.text(CHANGES_TAG, table, step)
    for field, (old, new) in fields.items():
      if _number(new):
        if field in first and _number(old):
          writer.scalars(0, {CHANGED_VALUE_PREFIX + field: float(old)})
        writer.scalars(step, {CHANGED_VALUE_PREFIX + field: float(new)})
    writer.flush()
  finally:
    writer.close()


def _number(value) -> bool:
  return isinstance(value, (int, float)) and not isinstance(value, bool)
