"""The measured clock of runtime=threads and runtime=ray."""

import numpy as np

from easgd.sim.clocks import RoundTotals, RunTotals
from easgd.sim.events import TickPacker


class LiveClock(RunTotals):
  """The measured counterpart of easgd.sim.clocks.Clock: the run's totals (time:
  seconds of training, over every resumption) and everything the threads
  runtime needs to continue from a checkpoint."""

  def __init__(self, num_workers: int, groups: int = 0):
    """groups: two-tier servers' groups (easgd.rules.tiers), 0 for one master."""
    super().__init__(num_workers)
    self.packer = TickPacker(num_workers, groups)
    self.missed = [0] * num_workers  # writes by others since each worker's last read
    self.version = 0  # writes to the center (to any group's, with two tiers)
    self.turn = 0  # round robin: whose request is next
    self.events = 0  # lines in the trace after its header
    # Two tiers: each group's round-robin turn (a position among its workers), its
    # requests since its last merge, and its send's phase: IDLE, SENT (to be applied
    # by the global server), APPLIED (its reply to be merged).
    self.groups = groups
    self.turns = [0] * groups
    self.since_merge = [0] * groups
    self.phase = [IDLE] * groups

  def state_dict(self) -> dict:
    tiers = {}
    if self.groups:
      tiers = {"turns": self.turns, "since_merge": self.since_merge, "phase": self.phase}
    return {
      **super().state_dict(),
      "missed": list(self.missed),
      "version": self.version,
      "turn": self.turn,
      "events": self.events,
      **{name: list(values) for name, values in tiers.items()},
      **self.packer.state_dict(),
    }

  def load_state_dict(self, state: dict) -> None:
    super().load_state_dict(state)
    self.missed = [int(n) for n in state["missed"]]
    self.version = int(state["version"])
    self.turn = int(state["turn"])
    self.events = int(state["events"])
    if self.groups:
      self.turns = [int(n) for n in state["turns"]]
      self.since_merge = [int(n) for n in state["since_merge"]]
      self.phase = [int(n) for n in state["phase"]]
    self.packer.load_state_dict(state)


# A two-tier group server's send: none in flight, sent (the global server is to apply
# it), applied (its reply is to be merged).
IDLE, SENT, APPLIED = 0, 1, 2


class MeasuredRoundTotals(RoundTotals):
  """A threads run's rounds: RoundTotals less the wait saved, which nothing measures
  here (a dropped worker stops at the round's close; when it would have arrived is
  never seen)."""

  def scalars(self) -> dict[str, float]:
    values = super().scalars()
    del values["rounds/wait_saved_seconds"]
    return values


class RoundsClock(RunTotals):
  """The measured clock of a synchronous rule under runtime=threads
  (easgd.train.runtimes.threads.rounds): the run's totals, its rounds', and the
  lines of its trace after the header (a resume cuts the trace back to them), and the
  workers late for the last round, whose messages the next one takes."""

  def __init__(self, num_workers: int):
    super().__init__(num_workers)
    self.round_totals = MeasuredRoundTotals()
    self.events = 0
    self.held = np.zeros(num_workers, bool)

  def state_dict(self) -> dict:
    return {
      **super().state_dict(),
      "rounds": self.round_totals.state_dict(),
      "events": self.events,
      "held": self.held.tolist(),
    }

  def load_state_dict(self, state: dict) -> None:
    super().load_state_dict(state)
    self.round_totals.load_state_dict(state["rounds"])
    self.events = int(state["events"])
    self.held = np.array(state["held"], bool)
