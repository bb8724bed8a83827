"""runtime=threads for a synchronous rule: rounds closed at a quorum on the workers'
real arrivals, a run preempted inside a round and resumed, and its replay to the same
bits."""

import numpy as np
import pytest

from easgd.infra import scalars
from easgd.train import loop, trainer
from easgd.train.runtimes import trace
from runs import assert_same_bits, config_with, steps_saved

# sync_easgd (the MLP) at 3 of 4 workers, a worker that misses a round late (runtime=ray's
# test drops it), worker 3 twice as slow, on 2 devices; rounds end at steps 4, 8, ...;
# checkpoints at 10 and 30 fall inside rounds.
RUN = {
  "algorithm": "sync_easgd",
  "runtime": "threads",
  "model": "mlp",
  "workers": 4,
  "outer.quorum": 3,
  "outer.missed": "late",
  "cluster.stragglers": (3,),
  "cluster.straggler_slowdowns": (2.0,),
  "run.devices": 2,
  "run.total_steps": 40,
  "run.log_every": 10,
  "run.eval_every": 20,
  "run.checkpoint_every": 10,
}


@pytest.mark.e2e
def test_rounds_at_a_quorum_train_resume_and_replay_to_the_same_bits(tmp_path, monkeypatch):
  """A preemption notice at the loop's step 9, inside the round that ends at 12, stops
  the run at 10, the checkpoint before the round's end, and saves it; resumed from there
  to 40, it reaches the default band, traces each round's members and logs what the
  rounds did. The replay of its trace (never stopped) ends with its bits at every
  checkpoint kept and logs its values."""
  real_watch = loop.preemption.PreemptionWatch

  class Notice(real_watch):
    def should_stop(self, step):
      self.noticed = step == 9
      return self.noticed

  monkeypatch.setattr(loop.preemption, "PreemptionWatch", Notice)
  real, replay = tmp_path / "real", tmp_path / "replay"
  assert trainer.train_and_evaluate(config_with(RUN), str(real)).preempted
  assert steps_saved(real) == [10]
  monkeypatch.setattr(loop.preemption, "PreemptionWatch", real_watch)
  result = trainer.train_and_evaluate(config_with(RUN), str(real))
  metrics = result.metrics
  assert not result.preempted and metrics["eval/center_accuracy"] >= 0.7

  recorded = trace.read(str(real / trace.FILE))
  assert [r["tick"] for r in recorded.rounds] == list(range(3, 40, 4)) and recorded.ticks == 40
  members = np.array([r["members"] for r in recorded.rounds])
  late = np.array([r["late"] for r in recorded.rounds])
  assert (members.sum(axis=1) >= 3).all() and (late == ~members).all()
  for record in recorded.rounds:  # a member arrived by the close, a late one after it
    for arrival, member in zip(record["arrivals"], record["members"], strict=True):
      assert arrival is not None and (arrival <= record["closed"]) == member
  # A round takes its members' messages and the last round's late ones.
  assert metrics["rounds/contributions_per_round"] == (members.sum() + late[:-1].sum()) / 10
  assert metrics["rounds/late"] == late.sum() and metrics["rounds/dropped"] == 0
  assert "rounds/wait_saved_seconds" not in metrics  # nothing here measures it

  # The replay waits for each round's members, whatever their pace.
  config = config_with({**RUN, "cluster.replay": str(real / trace.FILE)})
  trainer.train_and_evaluate(config, str(replay))
  kept = steps_saved(real)
  assert 30 in kept and 40 in kept  # one inside a round, one at its end
  for step in kept:
    assert_same_bits(real, replay, step)
  logged = [scalars.without_wall_clock(scalars.read(str(d))) for d in (real, replay)]
  for values in logged:
    values.pop("sim/time")  # the replay's seconds are its own
  assert logged[0] == logged[1] and "train/loss" in logged[0]
