"""The measured clock of runtime=threads and runtime=ray."""

from easgd.sim.clocks import RunTotals
from easgd.sim.events import TickPacker


class LiveClock(RunTotals):
  """The measured counterpart of easgd.sim.clocks.Clock: the run's totals (time:
  seconds of training, over every resumption) and everything the threads
  runtime needs to continue from a checkpoint."""

  def __init__(self, num_workers: int):
    super().__init__(num_workers)
    self.packer = TickPacker(num_workers)
    self.missed = [0] * num_workers  # writes by others since each worker's last read
    self.version = 0  # writes to the center
    self.turn = 0  # round robin: whose request is next
    self.events = 0  # lines in the trace after its header

  def state_dict(self) -> dict:
    return {
      **super().state_dict(),
      "missed": list(self.missed),
      "version": self.version,
      "turn": self.turn,
      "events": self.events,
      **self.packer.state_dict(),
    }

  def load_state_dict(self, state: dict) -> None:
    super().load_state_dict(state)
    self.missed = [int(n) for n in state["missed"]]
    self.version = int(state["version"])
    self.turn = int(state["turn"])
    self.events = int(state["events"])
    self.packer.load_state_dict(state)
