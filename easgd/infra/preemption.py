"""Stopping cleanly on SIGTERM, the notice cluster schedulers give before preempting a job.

One process: a SIGTERM handler notes the signal, and the training loop ends
after the step it is in, writes a checkpoint and returns (train.py exits 0).
A run in a thread of a process that another owns (a sweep's point trained in its
Ray process) is given its notice as an event instead.

Several processes: jax.distributed's preemption service owns SIGTERM. A
notice to any process is shared with all, and they agree on the step at
which every process stops (multihost_utils.reached_preemption_sync_point,
asked after every step by every process), so that all save the same step.

A run may also be asked to stop after a given step (train.py --stop_after: a
sweep's scheduler trains a point in segments): it stops there as a notice
stops it, with a checkpoint, in every process alike.
"""

import signal
import threading

import jax
from absl import logging
from jax.experimental import multihost_utils


class PreemptionWatch:
  """Says after which step a run should stop for a preemption notice."""

  def __init__(self, stop_after: int | None = None, notice: threading.Event | None = None):
    self.stop_after = stop_after
    self._event = notice
    self._noticed = False
    self.noticed = False  # whether a notice (not --stop_after) stopped the run
    self._previous = None
    # Asked after every step: the process count is looked up once.
    self._several = jax.process_count() > 1
    if not self._several and threading.current_thread() is threading.main_thread():
      self._previous = signal.signal(signal.SIGTERM, self._notice)

  def _notice(self, signum, _frame) -> None:
    del signum
    self._noticed = True

  def should_stop(self, step: int) -> bool:
    """Whether to checkpoint and stop after `step`; call after every step."""
    if self._several:
      stop = multihost_utils.reached_preemption_sync_point(step)
    else:
      stop = self._noticed or (self._event is not None and self._event.is_set())
    if stop:
      self.noticed = True
      logging.warning("preemption notice (SIGTERM): stopping after step %d", step)
    elif self.reached(step):
      logging.info("stopping after step %d, as asked (--stop_after)", step)
      return True
    return stop

  def reached(self, step: int) -> bool:
    """Whether the run was asked to stop at or before `step` (--stop_after)."""
    return self.stop_after is not None and step >= self.stop_after

  def close(self) -> None:
    """Gives SIGTERM back to the handler it had before."""
    if self._previous is not None:
      signal.signal(signal.SIGTERM, self._previous)
      self._previous = None
