"""runtime=ray for a synchronous rule: runtime=threads' rounds, each worker's steps in a
process of its own. A worker's process killed is absent from the round it was in
(rejoin: back in the next; continue: in none after), a process killed before a cut
takes its steps again, and the trace replays under runtime=threads to the same bits."""

import os
import signal

import numpy as np
import pytest

from easgd.train import trainer
from easgd.train.runtimes import trace
from runs import assert_same_bits, config_with, steps_saved

ray = pytest.importorskip("ray")
ray_rounds = pytest.importorskip("easgd.train.runtimes.ray.rounds")

# sync_easgd at 3 of 4 worker processes, worker 3 four times slower; rounds end at
# steps 4, 8, 12, 16; checkpoints at 5, 10 and 15 fall inside rounds.
RUN = {
  "algorithm": "sync_easgd",
  "runtime": "ray",
  "model": "mlp",
  "workers": 4,
  "run.devices": 2,
  "outer.quorum": 3,
  "cluster.stragglers": (3,),
  "cluster.straggler_slowdowns": (4.0,),
  "run.total_steps": 16,
  "run.log_every": 8,
  "run.eval_every": 0,
  "run.checkpoint_every": 5,
}


def _killing(monkeypatch, kills: dict[int, int]):
  """Kills worker j's process (SIGKILL) as its steps from tick t begin: kills[t] = j."""
  work = ray_rounds.RayRoundsTrainee._work
  killed = []

  def kill_then_work(self, j, start, end, gate):
    if kills.get(start) == j and (start, j) not in killed:
      pid, *_ = ray.get(self.actors[j].where.remote())
      os.kill(pid, signal.SIGKILL)
      killed.append((start, j))
    return work(self, j, start, end, gate)

  monkeypatch.setattr(ray_rounds.RayRoundsTrainee, "_work", kill_then_work)
  return killed


def _replays_to_its_bits(tmp_path, config, real):
  """The trace in `real` replayed under runtime=threads: every checkpoint kept, the same
  bits."""
  config = config.copy_and_resolve_references()
  config.runtime = "threads"
  config.cluster.on_worker_loss = config_with().cluster.on_worker_loss  # only ray reads it
  config.cluster.replay = str(real / trace.FILE)
  trainer.train_and_evaluate(config, str(tmp_path / "replay"))
  for step in steps_saved(real):
    assert_same_bits(real, tmp_path / "replay", step)


@pytest.mark.e2e
@pytest.mark.parametrize("policy", ["rejoin", "continue"])
def test_a_killed_worker_process_is_absent_from_its_round_and_the_run_replays(
  tmp_path, monkeypatch, embedded_ray, policy
):
  """rejoin: worker 2's process killed before the cut at 5 takes its steps again on its
  restarted process; worker 1's killed in the round that ends at 8 is absent from it,
  and takes its steps to the cut at 10 on its restarted process. continue: worker 1's
  killed before the cut at 5 takes no step from tick 4 on and is in no round after."""
  kills = {4: 2, 5: 1} if policy == "rejoin" else {4: 1}
  killed = _killing(monkeypatch, kills)
  config = config_with({**RUN, "cluster.on_worker_loss": policy})
  real = tmp_path / "real"
  result = trainer.train_and_evaluate(config, str(real))
  assert sorted(killed) == sorted(kills.items())
  recorded = trace.read(str(real / trace.FILE))
  members = {r["tick"]: r["members"] for r in recorded.rounds}
  assert sorted(members) == [3, 7, 11, 15] and all(sum(m) >= 3 for m in members.values())
  processes = [record["worker"] for record in recorded.processes]
  if policy == "rejoin":
    assert not members[7][1]
    # Both restarted, each traced where it runs again (a cut waits for its process).
    assert sorted(processes) == [0, 1, 1, 2, 2, 3]
    assert result.metrics["cluster/live_workers"] == 4
  else:
    assert recorded.gone == {1: 4}
    assert not any(members[tick][1] for tick in (7, 11, 15))
    assert result.metrics["cluster/live_workers"] == 3
    # Each round sets a worker that missed it to the round's step, as the replay does.
    assert np.asarray(result.state.worker_steps).tolist() == [16] * 4
  _replays_to_its_bits(tmp_path, config, real)
