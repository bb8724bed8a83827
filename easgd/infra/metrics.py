"""Progress in the log and in TensorBoard.

Events are written with tensorboardX (TensorBoard's own writers need
TensorFlow), by process 0 only.
"""

import jax
import numpy as np
from absl import logging


class MetricWriter:
  """Writes scalars to TensorBoard under `workdir` and logs them."""

  def __init__(self, workdir: str, label: str = ""):
    """`label` prefixes the log lines (e.g. the pipeline's model_3)."""
    self._prefix = f"{label} " if label else ""
    self._writer = None
    if jax.process_index() == 0:
      from tensorboardX import SummaryWriter  # noqa: PLC0415 (process 0 only)

      self._writer = SummaryWriter(logdir=workdir)

  def scalars(self, step: int, values: dict[str, float]) -> None:
    if self._writer is not None:
      for tag, value in values.items():
        self._writer.add_scalar(tag, value, global_step=step)
    logging.info(
      "%sstep %d: %s",
      self._prefix,
      step,
      ", ".join(f"{tag} {value:.6g}" for tag, value in values.items()),
    )

  def histogram(self, step: int, tag: str, values) -> None:
    if self._writer is not None and len(values):
      self._writer.add_histogram(tag, np.asarray(values), global_step=step)

  def text(self, tag: str, text: str) -> None:
    if self._writer is not None:
      self._writer.add_text(tag, text, global_step=0)

  def hparams(self, values: dict) -> None:
    """Lists this run in TensorBoard's HParams dashboard with `values` (str, bool or number).

    Only the session summaries are written, no experiment summary: the
    dashboard then builds the experiment from all runs' hyper-parameters and
    takes every scalar tag as a metric.
    """
    if self._writer is not None:
      from tensorboardX.summary import hparams  # noqa: PLC0415 (process 0 only)

      _, session_start, session_end = hparams(values, {})
      self._writer.file_writer.add_summary(session_start)
      self._writer.file_writer.add_summary(session_end)

  def flush(self) -> None:
    if self._writer is not None:
      self._writer.flush()

  def close(self) -> None:
    if self._writer is not None:
      self._writer.close()
