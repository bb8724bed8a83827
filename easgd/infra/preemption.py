"""Stopping cleanly on SIGTERM, the notice cluster schedulers give before preempting a job.

One process: a SIGTERM handler notes the signal, and the training loop ends
after the step it is in, writes a checkpoint and returns (train.py exits 0).

Several processes: jax.distributed's preemption service owns SIGTERM. A
notice to any process is shared with all, and they agree on the step at
which every process stops (multihost_utils.reached_preemption_sync_point,
asked after every step by every process), so that all save the same step.
"""

import signal
import threading

import jax
from absl import logging
from jax.experimental import multihost_utils


class PreemptionWatch:
  """Says after which step a run should stop for a preemption notice."""

  def __init__(self):
    self._noticed = False
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
      stop = self._noticed
    if stop:
      logging.warning("preemption notice (SIGTERM): stopping after step %d", step)
    return stop

  def close(self) -> None:
    """Gives SIGTERM back to the handler it had before."""
    if self._previous is not None:
      signal.signal(signal.SIGTERM, self._previous)
      self._previous = None
