"""runtime=ray: each worker a process of its own (a Ray actor), the center on server
actors; the trace it records replays to the same bits, a worker process killed
mid-run leaves or stops the run, a killed server stops it in one line. (train.py
with runtime=ray, a worker killed there rejoining: test_ray_cluster.py.)

The runs share one embedded Ray (started by the first, ended after the last),
as a cluster the runs connect to does."""

import os
import signal

import numpy as np
import pytest

from easgd.errors import ConfigError, WorkerFailed
from easgd.infra import compile as compile_lib
from easgd.infra import scalars, sharding
from easgd.train import trainer
from easgd.train.runtimes import trace
from easgd.train.runtimes.ray import runtime as ray_runtime
from easgd.train.runtimes.ray import workers as ray_workers
from runs import assert_same_bits, assert_same_scalars, config_with, steps_saved

ray = pytest.importorskip("ray")

# 24 ticks of the MLP on 2 workers, checkpoints at 12 and 24.
RUN = {
  "model": "mlp",
  "outer.moving_rate": 0.2,
  "run.total_steps": 24,
  "run.log_every": 12,
  "run.eval_every": 12,
  "run.checkpoint_every": 12,
}


def _config(algorithm, workers=2, **overrides):
  values = {**RUN, "run.devices": workers, **overrides}
  return config_with(values, algorithm=algorithm, workers=workers)


def _replay(config, real, replay):
  """Replays the trace recorded in `real` into `replay`, under runtime=simulated;
  returns its TrainResult."""
  config = config.copy_and_resolve_references()
  config.runtime = "simulated"
  for field in ("ray.servers", "cluster.on_worker_loss"):  # only runtime=ray reads them
    group, name = field.split(".")
    config[group][name] = config_with()[group][name]
  config.cluster.replay = str(real / trace.FILE)
  return trainer.train_and_evaluate(config, str(replay))


@pytest.mark.e2e
def test_a_recorded_run_on_two_servers_replays_to_the_same_bits(tmp_path, embedded_ray):
  """async_msgd: the master's momentum split over two servers, a schedule whose rate
  differs from step to step, on LeNet-5: its convolutions split their sums by the
  size of XLA:CPU's thread pool, which a process sizes by the larger of its
  processors and its devices. Each worker process, of one device, sizes its pool as
  this process of 8 does (sharding.cpu_threads), so that the replay on 2 of this
  process's devices reaches the workers' bits. (Hogwild's READ and WRITE, EAMSGD's
  look-ahead: the other tests here; round robin: test_threads.py.)"""
  workers = 2
  overrides = {"model": "lenet5", "optimizer.momentum": 0.9, "optimizer.schedule": "warmup_cosine"}
  overrides |= {"optimizer.warmup_steps": 5, "run.total_steps": 12, "run.log_every": 4}
  overrides |= {"run.eval_every": 6, "run.checkpoint_every": 6}
  config = _config("async_msgd", workers, **{"runtime": "ray", "ray.servers": 2, **overrides})
  real, replay = tmp_path / "real", tmp_path / "replay"
  run = trainer.train_and_evaluate(config, str(real))
  replayed = _replay(config, real, replay)
  every = config.run.checkpoint_every
  for step in (every, 2 * every):
    assert_same_bits(real, replay, step)
  assert_same_scalars(real, replay)  # as TensorBoard holds them (float32)
  # The last values, as the run computed them (float64).
  assert scalars.without_wall_clock(run.metrics) == scalars.without_wall_clock(replayed.metrics)
  recorded = trace.read(str(real / trace.FILE))
  # Each worker ran in a process of its own, not this one.
  pids = {p["worker"]: p["pid"] for p in recorded.processes}
  assert sorted(pids) == list(range(workers)) and len(set(pids.values())) == workers
  assert os.getpid() not in pids.values()
  assert {e.op for e in recorded.events} >= {"local"}


def _killing(monkeypatch, worker: int, at_step: int):
  """Kills worker `worker`'s process (SIGKILL) as it is about to take local step
  `at_step`."""
  local_step = ray_workers.RayWorkers._local_step
  killed = []

  def kill_then_step(self, j, step):
    if j == worker and step == at_step and not killed:
      pid, *_ = ray.get(self.actors[j].where.remote())
      os.kill(pid, signal.SIGKILL)
      killed.append(pid)
    return local_step(self, j, step)

  monkeypatch.setattr(ray_workers.RayWorkers, "_local_step", kill_then_step)
  return killed


# Cuts of each kind at their own steps: a log at 4, an evaluation at 6, a
# checkpoint at 10 (then 12, 20, 24, 30 for two or three at once).
CUTS = {
  "run.total_steps": 30,
  "run.log_every": 4,
  "run.eval_every": 6,
  "run.checkpoint_every": 10,
}


def _killing_at_cuts(monkeypatch, kills: dict[int, int], restarted_first=()):
  """Kills worker processes (SIGKILL) with the run at a cut: kills[s] = j, worker j's
  process, as the run fetches the cut of step s. For a step in `restarted_first`,
  the fetch waits until Ray has started the process again (holding its
  constructor's row), so that the cut's call reaches a live process of another
  incarnation. Returns the (step, pid) killed."""
  fetch = ray_workers.RayWorkers.fetch_cut
  killed = []

  def kill_then_fetch(self):
    step = self.limit + 1
    if step in kills and step not in dict(killed):
      actor = self.actors[kills[step]]
      pid, *_ = ray.get(actor.where.remote())
      os.kill(pid, signal.SIGKILL)
      killed.append((step, pid))
      for _ in range(600 if step in restarted_first else 0):  # a bound to fail, not a timing
        try:
          if ray.get(actor.where.remote(), timeout=1)[0] != pid:
            break  # its new process answers
        except (ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError):
          pass  # not yet restarted
      else:
        assert step not in restarted_first, "Ray did not restart the process"
    return fetch(self)

  monkeypatch.setattr(ray_workers.RayWorkers, "fetch_cut", kill_then_fetch)
  return killed


def _replays_to_its_bits(config, real, replay):
  _replay(config, real, replay)
  assert steps_saved(real)[-1] == config.run.total_steps
  for step in steps_saved(real):
    assert_same_bits(real, replay, step)
  assert_same_scalars(real, replay)


@pytest.mark.e2e
def test_workers_killed_at_a_log_an_evaluation_and_a_checkpoint_cut_rejoin_there(
  tmp_path, embedded_ray, monkeypatch
):
  """Each cut needs every worker's row: one lost there joins as the last operation of
  the cut's own tick, from the cut's center, and the cut's log, evaluation or
  checkpoint holds it so. At the evaluation cut, Ray has restarted the process
  before the run asks it for its row: its answer, from its constructor's row,
  is not taken for the row of the process that died. The workers step in EAMSGD's
  form, the gradient at the look-ahead point."""
  eamsgd = {"optimizer.momentum": 0.9, "optimizer.nesterov": True}
  config = _config(
    "async_measgd", **{"runtime": "ray", **eamsgd, "cluster.on_worker_loss": "rejoin", **CUTS}
  )
  killed = _killing_at_cuts(monkeypatch, {4: 1, 6: 0, 10: 1}, restarted_first=(6,))
  # Later, worker 0's process killed as it computes an exchange step whose request
  # was served in a cut's last tick: its join, after Ray restarts it, would fall
  # past the cut, so the cut restarts it.
  exchange_step = ray_workers.RayWorkers._exchange_local_step
  late = []

  def kill_then_exchange(self, j, step):
    if j == 0 and not late and self.limit >= 12 and self._last(j) == self.limit:
      pid, *_ = ray.get(self.actors[j].where.remote())
      os.kill(pid, signal.SIGKILL)
      late.append((self.limit, step))
    return exchange_step(self, j, step)

  monkeypatch.setattr(ray_workers.RayWorkers, "_exchange_local_step", kill_then_exchange)
  real, replay = tmp_path / "real", tmp_path / "replay"
  result = trainer.train_and_evaluate(config, str(real))
  assert [step for step, _ in killed] == [4, 6, 10] and len(late) == 1
  assert np.isfinite(result.metrics["eval/center_accuracy"])
  recorded = trace.read(str(real / trace.FILE))
  joins = [(e.worker, e.tick) for e in recorded.events if e.op == "join"]
  (tick, step), *_ = late
  assert joins == [(1, 3), (0, 5), (1, 9), (0, tick)]
  assert all(e.cut for e in recorded.events if e.op == "join")
  assert recorded.unvalued == [(0, step)]  # its step's values died with it
  # Both went on stepping after their last join.
  assert {e.worker for e in recorded.events if e.op != "join" and e.tick > tick} == {0, 1}
  monkeypatch.undo()
  _replays_to_its_bits(config, real, replay)


@pytest.mark.e2e
def test_workers_killed_at_cuts_or_mid_step_leave_under_continue_and_the_run_replays(
  tmp_path, embedded_ray, monkeypatch
):
  """Hogwild's READ and WRITE on the servers, a straggler, 5 workers: worker 4's
  process killed at its local step 2 (it leaves, in its own tick or at the cut it
  would fall past), 1's at the log cut, 2's at the evaluation cut, 3's at the
  checkpoint cut (each leaves as the last operation of the cut's tick), and 0
  goes on alone. The trace replays to the same bits."""
  config = _config(
    "hogwild_easgd",
    workers=5,
    **{
      "runtime": "ray",
      "ray.servers": 2,
      "cluster.stragglers": (1,),
      "cluster.straggler_slowdown": 3.0,
      "cluster.on_worker_loss": "continue",
      "outer.moving_rate": 0.1,  # beta = 5 x 0.1 < 1
      **CUTS,
    },
  )
  mid_step = _killing(monkeypatch, worker=4, at_step=2)
  killed = _killing_at_cuts(monkeypatch, {4: 1, 6: 2, 10: 3})
  real, replay = tmp_path / "real", tmp_path / "replay"
  result = trainer.train_and_evaluate(config, str(real))
  assert mid_step and [step for step, _ in killed] == [4, 6, 10]
  assert np.isfinite(result.metrics["eval/center_accuracy"])
  recorded = trace.read(str(real / trace.FILE))
  assert {"read", "write"} <= {e.op for e in recorded.events}
  leaves = {e.worker: (e.tick, e.cut) for e in recorded.events if e.op == "leave"}
  assert sorted(leaves) == [1, 2, 3, 4]
  assert sorted(p["worker"] for p in recorded.processes) == [0, 1, 2, 3, 4]  # none restarted
  assert [leaves[j] for j in (1, 2, 3)] == [(3, True), (5, True), (9, True)]
  assert {e.worker for e in recorded.events if e.tick > 9} == {0}
  monkeypatch.undo()
  _replays_to_its_bits(config, real, replay)
  # The log of step s follows ticks 0 .. s - 1: a worker that left at tick T is
  # gone from it when T < s.
  live = scalars.read(str(real))["cluster/live_workers"]
  ticks = [tick for tick, _ in leaves.values()]
  assert live == [(step, 5 - sum(tick < step for tick in ticks)) for step, _ in live]
  assert live[-1][1] == 1


@pytest.mark.e2e
def test_a_killed_worker_under_stop_and_a_killed_server_stop_the_run_in_one_line(
  tmp_path, embedded_ray, monkeypatch
):
  """A worker's process killed at its local step, then a worker's and a server's as the
  run fetches a cut: each stops the run in one line. (A server's killed as it serves a
  request: a group server's, in the two-tier test below; the same door.)"""
  config = _config(
    "async_easgd", **{"runtime": "ray", "cluster.on_worker_loss": "stop", "run.total_steps": 400}
  )
  _killing(monkeypatch, worker=0, at_step=5)
  with pytest.raises(WorkerFailed, match=r"^worker 0's process died at its local step 5 ") as error:
    trainer.train_and_evaluate(config, str(tmp_path / "worker"))
  assert "\n" not in str(error.value)
  monkeypatch.undo()

  # At a cut: worker 1, then server 1, killed as the run fetches the checkpoint cut of
  # step 20 (every kind of cut is the same fetch). Each stops the run in one line,
  # the checkpoint before it kept.
  config = _config(
    "async_easgd",
    **{"runtime": "ray", "ray.servers": 2, "cluster.on_worker_loss": "stop", **CUTS},
  )
  _killing_at_cuts(monkeypatch, {20: 1})
  with pytest.raises(
    WorkerFailed, match=r"^worker 1's process died at the cut of step 20 "
  ) as error:
    trainer.train_and_evaluate(config, str(tmp_path / "worker_at_cut"))
  assert "\n" not in str(error.value)
  assert steps_saved(tmp_path / "worker_at_cut") == [10]
  monkeypatch.undo()
  fetch = ray_workers.RayWorkers.fetch_cut

  def kill_server_then_fetch(self):
    if self.limit + 1 == 20:
      pid, *_ = ray.get(self.servers[1].where.remote())
      os.kill(pid, signal.SIGKILL)
    return fetch(self)

  monkeypatch.setattr(ray_workers.RayWorkers, "fetch_cut", kill_server_then_fetch)
  with pytest.raises(WorkerFailed, match=r"^server 1's process died") as error:
    trainer.train_and_evaluate(config, str(tmp_path / "server_at_cut"))
  assert "\n" not in str(error.value)
  assert steps_saved(tmp_path / "server_at_cut") == [10]
  monkeypatch.undo()


def _refused(config, pattern):
  with pytest.raises(ConfigError, match=pattern) as error:
    trainer.check(config)
  assert "\n" not in str(error.value)


def test_ray_is_refused_for_what_it_does_not_run():
  sync = _config("sync_sgd", runtime="ray")
  _refused(sync, r"^config.runtime='ray' is invalid: ray runs the parameter-server rules")
  pipeline = _config("pipeline", runtime="ray")
  _refused(pipeline, r"^config.runtime='ray' is invalid")
  two_tier = {"outer.two_tier": True, "ray.servers": 2}
  _refused(_config("async_easgd", runtime="ray", **two_tier), r"^config.ray.servers=2 .* two-tier")
  replay = _config("async_easgd", runtime="ray", **{"cluster.replay": "trace.jsonl"})
  _refused(replay, r"runtime=ray records a new one")
  unreachable = _config("async_easgd", runtime="ray", **{"ray.address": "127.0.0.1:1"})
  _refused(unreachable, r"^config.ray.address='127.0.0.1:1' is unreachable \(ConnectionRefused")
  for field, value in [("ray.servers", 2), ("ray.address", "auto"), ("ray.worker_gpus", 1.0)]:
    threads = _config("async_easgd", runtime="threads", **{field: value})
    _refused(threads, rf"^config.{field}=.* only the ray runtime reads it")
  _refused(_config("async_easgd", runtime="ray", **{"ray.servers": 0}), r"^config.ray.servers=0")
  # The servers split the center by blocks: checked from the model's shapes, before a run.
  too_many = _config("async_easgd", runtime="ray", **{"ray.servers": 7})
  _refused(too_many, r"^config.ray.servers=7 is invalid: .* mlp has 6: at most 6 servers")
  trainer.check(_config("async_easgd", runtime="ray", **{"ray.servers": 6}))
  bad_policy = _config("async_easgd", runtime="ray", **{"cluster.on_worker_loss": "retry"})
  _refused(bad_policy, r"^config.cluster.on_worker_loss='retry' is invalid")


def test_more_gpus_than_the_machine_has_are_refused_before_a_run_starts(monkeypatch):
  """With an empty ray.address the run starts a Ray on this machine: its GPUs, as
  Ray would find them, are checked with the other checks, starting nothing."""
  monkeypatch.setattr(ray_runtime, "local_gpus", lambda: 2)
  monkeypatch.setattr(ray, "is_initialized", lambda: False)  # whatever another test started
  monkeypatch.setattr(ray_runtime, "connect", lambda config: pytest.fail("a Ray was asked"))
  trainer.check(_config("async_easgd", runtime="ray", **{"ray.worker_gpus": 1.0}))
  trainer.check(_config("async_easgd", workers=4, runtime="ray", **{"ray.worker_gpus": 0.5}))
  _refused(
    _config("async_easgd", workers=4, runtime="ray", **{"ray.worker_gpus": 1.0}),
    r"^config.ray.worker_gpus=1.0 is invalid: 4 workers would take 4 GPUs; this machine, "
    r"whose Ray the run starts, has 2",
  )


def test_the_processes_environments_match_the_replay_and_share_a_gpu():
  """A CPU worker or server process sizes XLA:CPU's pool as this process does, so
  that its convolutions round as the replay's, and keeps its programs in this
  process's compilation cache; servers run on a CPU whatever the workers run on;
  a GPU process asks for deterministic ops; processes that share a GPU, the
  driver's among them, take its memory as they need it."""
  on_cpu = ray_runtime._actor_environment(0)
  assert on_cpu["JAX_PLATFORMS"] == "cpu"
  # This process has 8 CPU devices: its pool, and so theirs, has at least 8 threads.
  assert int(on_cpu["PJRT_NPROC"]) == sharding.cpu_threads() >= 8
  assert ray_runtime.PREALLOCATE_VARIABLE not in on_cpu
  assert "xla_gpu_deterministic_ops" not in on_cpu["XLA_FLAGS"]
  cache = compile_lib.cache_environment()  # this process's cache, or the cache off
  assert {name: on_cpu.get(name) for name in cache} == cache
  shared = ray_runtime._actor_environment(0.25)
  assert shared[ray_runtime.PREALLOCATE_VARIABLE] == "false"
  assert "--xla_gpu_deterministic_ops=true" in shared["XLA_FLAGS"].split()
  assert "JAX_PLATFORMS" not in shared and "PJRT_NPROC" not in shared
  assert ray_runtime.PREALLOCATE_VARIABLE not in ray_runtime._actor_environment(1)
  config = _config("async_easgd", runtime="ray")
  assert ray_runtime.RayRuntime.environment(config, "gpu") == {
    ray_runtime.PREALLOCATE_VARIABLE: "false"
  }


@pytest.mark.e2e
def test_two_tier_servers_as_processes_replay_through_a_rejoin_and_a_lost_group_server_stops(
  tmp_path, embedded_ray, monkeypatch
):
  """async_local_sgd on HALoS's two tiers, each group server and the global server a
  process of its own: worker 2's process killed at its local step 5 rejoins from its
  group's center (its anchor there too), and the run replays to its bits, every
  group's send, apply and merge in the trace. Group server 1's process killed stops
  the run in one line."""
  tiers = {"outer.two_tier": True, "cluster.groups": (2, 2), "outer.global_every": 2}
  tiers |= {"outer.merge_weight": 0.5, "outer.global_momentum": 0.5}
  # The two tiers of test_threads.py and test_tiers.py: one compilation of their programs.
  tiers |= {"outer.comm_period": 2, "outer.momentum_period": 2}
  config = _config("async_local_sgd", 4, **{"runtime": "ray", **tiers})
  killed = _killing(monkeypatch, worker=2, at_step=5)
  real, replay = tmp_path / "real", tmp_path / "replay"
  trainer.train_and_evaluate(config, str(real))
  assert killed
  _replays_to_its_bits(config, real, replay)
  recorded = trace.read(str(real / trace.FILE))
  assert [e.op for e in recorded.events if e.worker == 2 and e.op == "join"] == ["join"]
  for op in ("send", "apply", "merge"):
    assert {e.worker for e in recorded.events if e.op == op} == {0, 1}, op
  monkeypatch.undo()

  operate = ray_workers.RayWorkers._master_operation

  def kill_group_server_then_operate(self, j, op, tick, *numbers):
    if tick >= 6 and not getattr(self, "killed", False):
      self.killed = True
      pid, *_ = ray.get(self.servers[1].where.remote())
      os.kill(pid, signal.SIGKILL)
    return operate(self, j, op, tick, *numbers)

  monkeypatch.setattr(ray_workers.RayWorkers, "_master_operation", kill_group_server_then_operate)
  stopped = {**tiers, "runtime": "ray", "cluster.on_worker_loss": "stop", "run.total_steps": 400}
  with pytest.raises(WorkerFailed, match=r"^group 1's server's process died") as error:
    trainer.train_and_evaluate(_config("async_local_sgd", 4, **stopped), str(tmp_path / "lost"))
  assert "\n" not in str(error.value)
