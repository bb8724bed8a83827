"""The one reader of logged scalars reads every point a run wrote."""

import numpy as np

from easgd.infra import metrics, scalars


def test_every_point_is_read_back_past_tensorboards_sample_of_ten_thousand(tmp_path):
  writer = metrics.MetricWriter(str(tmp_path))
  steps = range(1, 10_051)
  for step in steps:
    writer.scalars(step, {"train/loss": 1.0 / step, "train/images_per_sec": 100.0})
  writer.close()
  logged = scalars.read(str(tmp_path))
  assert logged["train/loss"] == [(step, float(np.float32(1.0 / step))) for step in steps]
  # What a run and its replay log alike: all but the wall-clock time.
  assert set(scalars.without_wall_clock(logged)) == {"train/loss"}


def test_a_folder_without_events_reads_as_nothing(tmp_path):
  assert scalars.read(str(tmp_path / "none")) == {}
  assert scalars.read(str(tmp_path)) == {}
