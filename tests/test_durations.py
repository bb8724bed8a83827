"""easgd.durations: a duration as the progress lines say it."""

import pytest

from easgd.durations import duration


@pytest.mark.parametrize(
  "seconds,said",
  [(2.6, "3 s"), (59.4, "59 s"), (245, "4 min 05 s"), (3599, "59 min 59 s"), (7380, "2 h 03 min")],
)
def test_a_duration_is_said_in_seconds_minutes_or_hours(seconds, said):
  assert duration(seconds) == said
