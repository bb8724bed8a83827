"""Progress in the log and in TensorBoard.

Events are written by process 0 only, with tensorboardX's event-file writer
and summary builders (TensorBoard's own writers need TensorFlow), in the
training thread as they come: not through tensorboardX's SummaryWriter,
whose background thread may still hold queued events when flush() returns.
Here flush() puts every event written so far on disk (an fsync), so the
loop can make a run's history durable before it commits a checkpoint.

A run resumed from the checkpoint of step s may have logged later steps
before it stopped. Its new event file opens with a SessionLog START at step
s + 1: TensorBoard then hides the earlier files' points from step s + 1 on
(the run logs those steps again; its reader also purges a tag's later points
when that tag's steps go backwards), and the history shows each step once,
as an uninterrupted run's would (tests/infra/test_history.py). An event file cut
off mid-record by a kill is read up to its last whole record; such a record
is always past the last checkpoint, and so among the hidden ones.
"""

import os
import time

import jax
import numpy as np
from absl import logging

# Histogram bucket edges as tensorboardX's SummaryWriter makes them by default
# (TensorFlow's: +-1e-12 growing by 10% up to 1e20, and 0).
_EDGES = 1e-12 * 1.1 ** np.arange(int(np.ceil(np.log(1e32) / np.log(1.1))))
_BUCKETS = np.concatenate([-_EDGES[::-1], [0.0], _EDGES]).tolist()


class MetricWriter:
  """Writes scalars to TensorBoard under `workdir` and logs them."""

  def __init__(
    self, workdir: str, label: str = "", resumed_at: int | None = None, suffix: str = ""
  ):
    """`label` prefixes the log lines (e.g. the pipeline's model_3); `resumed_at` is
    the step of the checkpoint the run resumed from, or None for a new run; `suffix`
    ends the event file's name (a file's name has the second it was made in: two
    writers of one folder in one second need two suffixes)."""
    self._prefix = f"{label} " if label else ""
    self._events = None
    if jax.process_index() == 0:
      # Imported on process 0 only.
      from tensorboardX.event_file_writer import EventsWriter  # noqa: PLC0415
      from tensorboardX.proto import event_pb2  # noqa: PLC0415

      self._event = event_pb2.Event
      os.makedirs(workdir, exist_ok=True)
      self._events = EventsWriter(os.path.join(workdir, "events"), suffix)
      if resumed_at is not None:
        start = event_pb2.SessionLog(status=event_pb2.SessionLog.START)
        self._write(resumed_at + 1, session_log=start)

  def _write(self, step: int, **fields) -> None:
    self._events.write_event(self._event(wall_time=time.time(), step=step, **fields))

  def scalars(self, step: int, values: dict[str, float]) -> None:
    if self._events is not None:
      from tensorboardX import summary  # noqa: PLC0415 (process 0 only)

      for tag, value in values.items():
        self._write(step, summary=summary.scalar(tag, value))
    # Every scalar at the verbosity of --v=1; the loop's progress line has the
    # ones a user watches (easgd.train.loop.Progress).
    logging.debug(
      "%sstep %d: %s",
      self._prefix,
      step,
      ", ".join(f"{tag} {value:.6g}" for tag, value in values.items()),
    )

  def histogram(self, step: int, tag: str, values) -> None:
    if self._events is not None and len(values):
      from tensorboardX import summary  # noqa: PLC0415 (process 0 only)

      self._write(step, summary=summary.histogram(tag, np.asarray(values), _BUCKETS))

  def text(self, tag: str, text: str, step: int = 0) -> None:
    if self._events is not None:
      from tensorboardX import summary  # noqa: PLC0415 (process 0 only)

      self._write(step, summary=summary.text(tag, text))

  def hparams(self, values: dict) -> None:
    """Lists this run in TensorBoard's HParams dashboard with `values` (str, bool or number).

    Only the session summaries are written, no experiment summary: the
    dashboard then builds the experiment from all runs' hyper-parameters and
    takes every scalar tag as a metric.
    """
    if self._events is not None:
      from tensorboardX import summary  # noqa: PLC0415 (process 0 only)

      _, session_start, session_end = summary.hparams(values, {})
      self._write(0, summary=session_start)
      self._write(0, summary=session_end)

  def flush(self) -> None:
    """Puts every event written so far on disk."""
    if self._events is not None:
      self._events.flush()

  def close(self) -> None:
    if self._events is not None:
      self._events.close()
      self._events = None
