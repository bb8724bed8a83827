"""The measured clock of runtime=threads."""

import numpy as np

from easgd.sim.events import TickPacker


class LiveClock:
  """The measured counterpart of easgd.sim.clocks.Clock: the run's totals and
  everything the threads runtime needs to continue from a checkpoint."""

  def __init__(self, num_workers: int):
    self.time = 0.0  # seconds of training, over every resumption
    self.worker_steps = np.zeros(num_workers, np.int64)
    self.requests = np.zeros(num_workers, np.int64)
    self.bytes_sent = np.zeros(num_workers)
    self.packer = TickPacker(num_workers)
    self.missed = [0] * num_workers  # writes by others since each worker's last read
    self.version = 0  # writes to the center
    self.turn = 0  # round robin: whose request is next
    self.events = 0  # events in the trace

  def state_dict(self) -> dict:
    return {
      "time": self.time,
      "worker_steps": self.worker_steps.tolist(),
      "requests": self.requests.tolist(),
      "bytes_sent": self.bytes_sent.tolist(),
      "missed": list(self.missed),
      "version": self.version,
      "turn": self.turn,
      "events": self.events,
      **self.packer.state_dict(),
    }

  def load_state_dict(self, state: dict) -> None:
    self.time = float(state["time"])
    self.worker_steps = np.array(state["worker_steps"], np.int64)
    self.requests = np.array(state["requests"], np.int64)
    self.bytes_sent = np.array(state["bytes_sent"], np.float64)
    self.missed = [int(n) for n in state["missed"]]
    self.version = int(state["version"])
    self.turn = int(state["turn"])
    self.events = int(state["events"])
    self.packer.load_state_dict(state)
