"""easgd.sim.events: an event never falls in a tick that can no longer take it."""

import pytest

from easgd.sim.events import TickPacker
from easgd.sim.ticks import OpKind


def test_no_event_falls_in_a_tick_a_cut_closed():
  packer = TickPacker(2)
  assert [packer.emit(0.1, 0, True), packer.emit(0.1, 1, True)] == [0, 0]
  # Worker 1's process lost at the cut of tick 0: its reset closes that tick.
  assert packer.emit(0.2, 1, False, OpKind.RESET, at_cut=0) == 0
  with pytest.raises(ValueError, match="worker 0's event falls in tick 0, closed by a cut"):
    packer.emit(0.3, 0, False, OpKind.EXCHANGE)


def test_no_event_falls_in_a_tick_already_released():
  packer = TickPacker(2)
  assert [packer.emit(0.1, 0, True), packer.emit(0.1, 1, True)] == [0, 0]
  assert packer.release().local.all()
  with pytest.raises(ValueError, match="worker 0's event falls in tick 0, already released"):
    packer.emit(0.3, 0, False, OpKind.EXCHANGE)
