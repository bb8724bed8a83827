"""The clock of a replay (config.cluster.replay): the ticks of a recorded run
(easgd.train.runtimes.trace.check_replay) in place of the timing model's."""

from easgd.sim import clocks, timing
from easgd.sim.ticks import Tick


class ReplayClock(clocks.Clock):
  """The ticks of a recorded run (`check_replay`), in place of the timing model's."""

  def __init__(self, ticks: list[Tick], cluster: timing.Cluster, model_bytes, seed, sent_bytes):
    super().__init__(cluster, len(ticks[0].local), model_bytes, seed, sent_bytes)
    for tick in ticks:
      tick.bytes_sent = tick.requests * self.sent_bytes  # what each request carried
    self._ticks = ticks
    self._position = 0

  def _advance(self) -> Tick:
    tick = self._ticks[self._position]
    self._position += 1
    tick.time = max(tick.time, self.time)
    return tick

  def state_dict(self):
    return {**super().state_dict(), "position": self._position}

  def load_state_dict(self, state):
    super().load_state_dict(state)
    self._position = int(state["position"])
