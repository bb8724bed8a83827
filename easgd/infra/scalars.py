"""The scalars a run logged to TensorBoard, read back: the one reader of the sweeps'
summaries, the studies' tables and the tests.

Every point of every tag is read: TensorBoard's reader keeps by default a sample
of 10,000 points a tag, which a long run's log would lose silently. A resumed
run's history reads as an uninterrupted run's: a file that opens with a
SessionLog START at step s hides the earlier files' points from step s on
(easgd.infra.metrics), so each step appears once.

Light on purpose (no JAX; TensorBoard imported where it reads).
"""

import logging
import os

# The one scalar that measures the wall-clock time of the run that logs it: it
# differs between any two runs, a replay and its run among them.
WALL_CLOCK_TAGS = ("train/images_per_sec",)


def read(workdir: str) -> dict[str, list[tuple[int, float]]]:
  """Every TensorBoard scalar logged in `workdir`, tag -> [(step, value)] as
  TensorBoard shows them; {} for a folder without event files, or no folder."""
  if not os.path.isdir(workdir):
    return {}
  from tensorboard.backend.event_processing import event_accumulator  # noqa: PLC0415

  accumulator = event_accumulator.EventAccumulator(
    str(workdir), size_guidance={event_accumulator.SCALARS: 0}
  )
  # A resumed run's SessionLog START hides what it logs again, as it is meant to; the
  # reader says so in a warning ("Detected out of order event.step"), left out here.
  reader_log = logging.getLogger("tensorboard")
  level = reader_log.level
  reader_log.setLevel(logging.ERROR)
  try:
    accumulator.Reload()
  finally:
    reader_log.setLevel(level)
  return {
    tag: [(event.step, event.value) for event in accumulator.Scalars(tag)]
    for tag in accumulator.Tags()[event_accumulator.SCALARS]
  }


def by_step(workdir: str) -> dict[str, dict[int, float]]:
  """`read(workdir)` as tag -> {step: value}."""
  return {tag: dict(points) for tag, points in read(workdir).items()}


def without_wall_clock(logged: dict[str, list]) -> dict[str, list]:
  """`logged` without the tags that measure wall-clock time: what two runs of the
  same trajectory (a run and its replay, a resumed run and one never stopped)
  log alike."""
  return {tag: points for tag, points in logged.items() if tag not in WALL_CLOCK_TAGS}
