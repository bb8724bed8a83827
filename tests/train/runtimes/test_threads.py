"""runtime=threads: workers in threads of their own, the trace they record, and its
replay by the simulated runtime to the same bits."""

import json
import shutil
import threading

import numpy as np
import pytest
from tensorboard.backend.event_processing import event_accumulator

from easgd.errors import ConfigError, WorkerFailed
from easgd.train import trainer
from easgd.train.runtimes import trace
from easgd.train.runtimes.threads import workers
from runs import (
  REPO,
  assert_same_bits,
  assert_same_scalars,
  config_with,
  read_state,
  steps_saved,
)

# 24 ticks of the MLP, checkpoints at 12 and 24.
RUN = {
  "model": "mlp",
  "outer.moving_rate": 0.2,
  "run.total_steps": 24,
  "run.log_every": 12,
  "run.eval_every": 12,
  "run.checkpoint_every": 12,
}


def _config(algorithm, workers, **overrides):
  values = {**RUN, "run.devices": workers, **overrides}
  return config_with(values, algorithm=algorithm, workers=workers)


def _record_and_replay(tmp_path, config):
  """Trains `config` under runtime=threads, then replays its trace; returns both
  workdirs."""
  real, replay = tmp_path / "real", tmp_path / "replay"
  config.runtime = "threads"
  trainer.train_and_evaluate(config, str(real))
  config.runtime = "simulated"
  config.cluster.replay = str(real / trace.FILE)
  trainer.train_and_evaluate(config, str(replay))
  return real, replay


@pytest.mark.e2e
@pytest.mark.parametrize(
  ("algorithm", "workers", "straggler"),
  [
    ("async_easgd", 2, False),  # first come first served
    ("original_easgd", 2, False),  # round robin (a straggler holds up every round)
    ("hogwild_sgd", 2, True),  # no lock: a pushed gradient
    ("async_local_sgd", 2, True),  # Delayed Nesterov, and DyLU's H of each worker's own
  ],
)
def test_a_recorded_run_replays_to_the_same_bits(tmp_path, algorithm, workers, straggler):
  """A run under runtime=threads and the replay of its trace: every checkpoint the same
  bits, every logged value the same. The other rules' programs are runtime=threads'
  too in runtime=ray's worker processes, whose recorded runs replay to their bits
  (tests/train/runtimes/test_ray.py): Hogwild's elastic step, EAMSGD's look-ahead,
  the master's momentum and a schedule, LeNet-5's convolutions."""
  overrides = {"cluster.stragglers": (1,), "cluster.straggler_slowdown": 3.0} if straggler else {}
  if algorithm == "async_local_sgd":
    # The straggler, 3 times slower, pushes after every step, worker 0 after 4.
    overrides |= {
      "outer.comm_period": 4,
      "outer.momentum_period": 2,
      "outer.momentum_activation": 0.25,
      "outer.dynamic_local_steps": True,
    }
  config = _config(algorithm, workers, **overrides)
  real, replay = _record_and_replay(tmp_path, config)
  for step in (12, 24):  # every checkpoint is a cut of the same tick
    assert_same_bits(real, replay, step)
  assert_same_scalars(real, replay)
  recorded = trace.read(str(real / trace.FILE))
  local_steps = np.bincount([e.worker for e in recorded.events if e.local], minlength=workers)
  saved = read_state(real / "checkpoints" / "24" / "state")
  worker_steps = next(leaf for leaf in saved if leaf.shape == (workers,) and leaf.dtype == np.int32)
  np.testing.assert_array_equal(local_steps, worker_steps)
  if straggler:
    # Three times slower for real: it takes fewer steps in the same ticks.
    assert worker_steps[1] < worker_steps.max()
  if algorithm == "async_local_sgd":
    pushes = np.bincount([e.worker for e in recorded.events if e.op != "local"], minlength=2)
    np.testing.assert_array_equal(pushes, [local_steps[0] // 4, local_steps[1]])
  if algorithm == "hogwild_sgd":
    _assert_every_master_operation_in_order(real, recorded, local_steps)


def _assert_every_master_operation_in_order(workdir, recorded, local_steps):
  """The trace of a no-lock run (a push after every local step) in `workdir`: each
  request a READ, then its WRITE, in the order the master saw them; TensorBoard has
  the simulated runtime's tags, measured."""
  assert recorded.ticks == 24
  assert recorded.header["config"]["model"] == "mlp"  # the run's, not the default's
  writes = [e.wrote for e in recorded.events if e.wrote is not None]
  assert writes == list(range(1, len(writes) + 1))  # each write makes the next version
  reads = [e for e in recorded.events if e.op == "read"]
  writes_of = [e for e in recorded.events if e.op == "write"]
  # Every request: a READ, then its WRITE; every local step pushes (period 1).
  np.testing.assert_array_equal(np.bincount([e.worker for e in reads], minlength=2), local_steps)
  assert len(reads) == len(writes_of) > 0
  for event in reads:
    assert event.staleness >= 0 and event.wait >= 0 and event.read is not None
  times = [e.time for e in recorded.events]
  assert times == sorted(times)
  # The measured scalars have the simulated runtime's tags.
  accumulator = event_accumulator.EventAccumulator(str(workdir), size_guidance={"histograms": 0})
  accumulator.Reload()
  tags = accumulator.Tags()["scalars"]
  assert "async/staleness" in accumulator.Tags()["histograms"]
  for tag in ("sim/time", "async/staleness_mean", "async/queue_wait", "sim/worker_steps_min"):
    assert tag in tags


@pytest.mark.e2e
def test_a_failing_worker_stops_the_run_naming_it(tmp_path, monkeypatch):
  local_step = workers.Workers._local_step

  def failing(self, j, step):
    if j == 1 and step == 5:
      raise FloatingPointError("injected")
    return local_step(self, j, step)

  monkeypatch.setattr(workers.Workers, "_local_step", failing)
  config = _config("async_easgd", 2, **{"run.total_steps": 200})
  config.runtime = "threads"
  failed = r"^worker 1 failed at its local step 5: FloatingPointError: injected$"
  with pytest.raises(WorkerFailed, match=failed):
    trainer.train_and_evaluate(config, str(tmp_path))
  assert not [t for t in threading.enumerate() if t.name.startswith("worker-")]


def _trace_of(tmp_path):
  config = _config("async_easgd", 2, **{"run.total_steps": 8, "run.checkpoint_every": 0})
  config.runtime = "threads"
  trainer.train_and_evaluate(config, str(tmp_path / "recorded"))
  return config, tmp_path / "recorded" / trace.FILE


@pytest.mark.e2e  # records a run
def test_bad_replays_and_runtimes_are_refused_in_one_line(tmp_path):
  config, path = _trace_of(tmp_path)
  lines = path.read_text().splitlines(keepends=True)

  def refused(config, pattern):
    with pytest.raises(ConfigError, match=pattern) as error:
      trainer.check(config)  # the fields, then the runtime's own checks (the replay's too)
    assert "\n" not in str(error.value)

  replay = config.copy_and_resolve_references()
  replay.runtime = "simulated"
  replay.cluster.replay = str(path)
  trace.check_replay(replay)  # the trace of this configuration is accepted

  missing = replay.copy_and_resolve_references()
  missing.cluster.replay = str(tmp_path / "nowhere.jsonl")
  refused(missing, r"does not exist")
  # The checksums refuse a line changed, added or moved (tests/train/runtimes/test_trace.py
  # has the structural checks behind them, and every other kind of bad file).
  damaged = "is damaged at line {}: it does not follow from the line before"
  worker_1 = next(n for n, line in enumerate(lines, 1) if '"worker": 1' in line)
  reordered = [lines[0], *lines[2:-1][::-1], lines[1], lines[-1]]

  def rechained(lines):
    """`lines` with their sums computed again, as a writer with a bug would write
    them: the checks of the events themselves remain."""
    chain = trace.Chain()
    bodies = [trace.SUM.sub("}", line.removesuffix("\n")) for line in lines]
    return "".join(chain.seal(json.loads(body)) for body in bodies)

  for name, text, pattern in [
    ("no_end.jsonl", "".join(lines[:-1]), "is truncated"),
    ("cut.jsonl", "".join(lines)[:-30], f"is cut at line {len(lines)}"),
    ("empty.jsonl", "", "trace header"),
    ("not_a_trace.jsonl", '{"kind": "end"}\n', "trace header"),
    ("a_list.jsonl", "".join(lines[:1]) + "[1, 2]\n" + "".join(lines[1:]), damaged.format(2)),
    ("bad_op.jsonl", "".join(lines).replace('"op": "local"', '"op": "fly"', 1), damaged.format(2)),
    (
      "bad_worker.jsonl",
      "".join(lines).replace('"worker": 1', '"worker": 7', 1),
      damaged.format(worker_1),
    ),
    (
      "no_ticks.jsonl",
      "".join(lines[:-1]) + '{"kind": "end", "events": 1}\n',
      damaged.format(len(lines)),
    ),
    ("reordered.jsonl", "".join(reordered), damaged.format(2)),
    ("reordered_rechained.jsonl", rechained(reordered), "packs into|inconsistent"),
    ("binary.jsonl", "".join(lines[:2]) + "\udcff\n", "is not UTF-8 text at line 3"),
  ]:
    (tmp_path / name).write_text(text, errors="surrogateescape")
    bad = replay.copy_and_resolve_references()
    bad.cluster.replay = str(tmp_path / name)
    refused(bad, pattern)
  other = replay.copy_and_resolve_references()
  other.outer.moving_rate = 0.1
  refused(other, r"recorded with config.outer.moving_rate=0.2, this run has 0.1")
  longer = replay.copy_and_resolve_references()
  longer.run.total_steps = 9
  refused(longer, r"holds 8 ticks; set run.total_steps=8")
  # The timing model and the runtime are not part of what a trace is checked against.
  faster = replay.copy_and_resolve_references()
  faster.cluster.compute_time = 1.0
  trace.check_replay(faster)

  sync = _config("sync_sgd", 2)
  sync.runtime = "threads"
  refused(sync, r"^config.runtime='threads' is invalid: threads runs the parameter-server rules")
  pipeline = _config("pipeline", 2)
  pipeline.runtime = "threads"
  refused(pipeline, r"^config.runtime='threads' is invalid")
  both = _config("async_easgd", 2)
  both.runtime = "threads"
  both.cluster.replay = str(path)
  refused(both, r"^config.cluster.replay=.* a parameter-server rule's trace replays under")
  sync_replay = _config("sync_easgd", 2)
  sync_replay.cluster.replay = str(path)
  refused(sync_replay, r"sync_easgd has none \(a synchronous rule's rounds replay under")
  # A synchronous rule's trace replays under runtime=threads: a trace of requests does not.
  sync_replay.runtime = "threads"
  refused(sync_replay, r"recorded with config.algorithm='async_easgd', this run has 'sync_easgd'")
  unknown = _config("async_easgd", 2)
  unknown.runtime = "processes"
  refused(unknown, r"^config.runtime='processes' is invalid: valid: simulated, threads")


@pytest.mark.e2e
def test_train_py_refuses_a_missing_trace_writing_nothing(tmp_path, starter):
  workdir = tmp_path / "run"
  argv = [
    "train.py",
    f"--workdir={workdir}",
    "--config=configs/default.py",
    "--config.algorithm=async_easgd",
    f"--config.cluster.replay={tmp_path / 'missing.jsonl'}",
  ]
  code, stdout, stderr = starter.run(argv, REPO)
  assert code == 2 and stdout == ""
  assert stderr.strip().splitlines()[-1].startswith("error: cluster.replay=")
  assert not workdir.exists()


@pytest.mark.e2e
def test_two_tier_servers_preempted_at_the_next_log_and_mid_run_replay_to_the_same_bits(
  tmp_path, monkeypatch
):
  """async_local_sgd on HALoS's two tiers (two groups of two, a send every 2nd request,
  half merged, the global server's momentum). A preemption notice at the loop's step 13
  comes with every worker parked at the limit, the tick before the next log (24): the
  run stops at that cut, logs, evaluates and saves step 24 as a run never stopped does.
  Resumed, a notice at step 25 stops it at the first cut the workers reach, sends
  maybe in flight. Resumed again, the run has logged and saved what the replay of its
  trace does, every group server's send, apply and merge in it."""
  from easgd.train import loop  # noqa: PLC0415
  from easgd.train.runtimes.threads import runtime as threads  # noqa: PLC0415

  pools = []
  made = threads.ThreadsTrainee.__init__

  def keep_the_pool(self, *args, **kwargs):
    made(self, *args, **kwargs)
    pools.append(self.pool)

  real_watch = loop.preemption.PreemptionWatch
  parked = {13: True, 25: False}  # the loop's steps of the notices: with the workers parked?

  class Notice(real_watch):
    def should_stop(self, step):
      if step not in parked:
        return False
      if parked[step]:
        pool = pools[-1]
        with pool.cond:
          pool.wait(pool.parked)  # no clock: the workers reach the limit, then the notice
      self.noticed = True
      return True

  monkeypatch.setattr(threads.ThreadsTrainee, "__init__", keep_the_pool)
  monkeypatch.setattr(loop.preemption, "PreemptionWatch", Notice)
  tiers = {"outer.two_tier": True, "cluster.groups": (2, 2), "outer.global_every": 2}
  tiers |= {"outer.merge_weight": 0.5, "outer.global_momentum": 0.5}
  tiers |= {"outer.comm_period": 2, "outer.momentum_period": 2, "cluster.stragglers": (3,)}
  config = _config("async_local_sgd", 4, **tiers, **{"run.total_steps": 48}, runtime="threads")
  real = tmp_path / "real"
  assert trainer.train_and_evaluate(config, str(real)).preempted
  assert steps_saved(real) == [12, 24]
  stopped = tmp_path / "stopped"  # its step 24, which later checkpoints push out (3 kept)
  shutil.copytree(real / "checkpoints" / "24", stopped / "checkpoints" / "24")
  assert trainer.train_and_evaluate(config, str(real)).preempted
  assert 24 < steps_saved(real)[-1] <= 36  # never past the next checkpoint
  monkeypatch.setattr(loop.preemption, "PreemptionWatch", real_watch)
  assert not trainer.train_and_evaluate(config, str(real)).preempted
  config.runtime = "simulated"
  config.cluster.replay = str(real / trace.FILE)
  replay = tmp_path / "replay"
  trainer.train_and_evaluate(config, str(replay))
  assert steps_saved(replay) == [24, 36, 48]
  assert_same_bits(stopped, replay, 24)
  for step in (36, 48):
    assert_same_bits(real, replay, step)
  assert_same_scalars(real, replay)
  recorded = trace.read(str(real / trace.FILE))
  assert recorded.header["groups"] == [2, 2]
  for op in ("send", "apply", "merge"):
    assert {e.worker for e in recorded.events if e.op == op} == {0, 1}, op
