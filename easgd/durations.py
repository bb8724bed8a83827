"""A duration as the progress lines say it: 3 s, 4 min 05 s, 2 h 03 min."""


def duration(seconds: float) -> str:
  """3 s, 4 min 05 s, 2 h 03 min."""
  seconds = round(seconds)
  if seconds < 60:
    return f"{seconds} s"
  minutes, seconds = divmod(seconds, 60)
  if minutes < 60:
    return f"{minutes} min {seconds:02d} s"
  hours, minutes = divmod(minutes, 60)
  return f"{hours} h {minutes:02d} min"
