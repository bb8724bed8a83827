"""The clock of a replay (config.cluster.replay): the ticks of a recorded run
(easgd.train.runtimes.trace.check_replay) in place of the timing model's."""

from easgd.sim import clocks, timing
from easgd.sim.ticks import OpKind, Tick


class ReplayClock(clocks.Clock):
  """The ticks of a recorded run (`check_replay`), in place of the timing model's;
  with two-tier servers (`groups` of them) it counts as the run counted: each
  request a level-0 exchange, each send a level-1 one, and a send's change and its
  reply the model's bytes each, between groups for a group outside
  cluster.server_group."""

  def __init__(
    self, ticks: list[Tick], cluster: timing.Cluster, model_bytes, seed, sent_bytes, groups=0
  ):
    super().__init__(cluster, len(ticks[0].local), model_bytes, seed, sent_bytes)
    for tick in ticks:
      tick.bytes_sent = tick.requests * self.sent_bytes  # what each request carried
      if not groups:
        continue
      for kind, index in tick.ops:
        if kind in (OpKind.EXCHANGE, OpKind.READ):
          tick.levels.append(0)
        if kind == OpKind.SEND:
          tick.levels.append(1)
        if kind in (OpKind.SEND, OpKind.MERGE):
          tick.server_bytes = tick.server_bytes or [0.0, 0.0]
          tick.server_bytes[int(index != cluster.server_group)] += model_bytes
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
