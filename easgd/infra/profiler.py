"""A profile window: a jax.profiler trace of a few training steps (config.run.profile).

"START:STEPS" traces steps START+1 .. START+STEPS. The trace starts once
step START's results are ready, so none of its execution is in it, and stops
once step START+STEPS's are, so all of the window's is: the loop waits for
the state at both ends. Outside the window nothing is traced and nothing
waits; inside it the steps pay the profiler's overhead, which the throughput
logged over them includes.

Where it goes: WORKDIR/profile, in the layout TensorBoard's profile plugin
reads (plugins/profile/<time>/<host>.xplane.pb). jax.profiler names the file
after the host, so in a run of several processes each writes under a folder
of its own, WORKDIR/profile/process_<i>. View it with `xprof --logdir WORKDIR`
or TensorBoard with tensorboard-plugin-profile (docs/running.md, "Profiling a
window of steps").

A run resumed past the window traces nothing; one resumed inside it traces
from the step it resumed at to the window's end. A run that stops inside the
window (the end of training, a preemption, an error) stops the trace with
what ran so far, so no trace is left open.
"""

import os

import jax
from absl import logging

from easgd.declare import Field, Shapes, text

PROFILE = Field(
  "run.profile",
  "",
  text("must be '' (off) or 'START:STEPS'"),
  "'START:STEPS': a jax.profiler trace of steps START+1 .. START+STEPS into WORKDIR/profile "
  "(docs/running.md); '': off",
  Shapes.NEVER,
  formerly=("profile",),
)


def refusal(value, total_steps: int) -> str | None:
  """Why `value` is no window of a run of `total_steps` steps, and what is; None if it is one."""
  if value == "":
    return None
  allowed = (
    "must be '' (off) or 'START:STEPS', integers START >= 0 and STEPS >= 1 with START + STEPS "
    f"<= run.total_steps={total_steps} (traces steps START+1 .. START+STEPS)"
  )
  if not isinstance(value, str):
    return allowed
  start, colon, steps = value.partition(":")
  if not (colon and _digits(start) and _digits(steps)):
    return allowed
  if int(steps) < 1 or int(start) + int(steps) > total_steps:
    return f"a profile window outside the run: {allowed}"
  return None


def parse(value, total_steps: int) -> tuple[int, int] | None:
  """(START, STEPS) of a window "START:STEPS" within `total_steps` steps, or None for "".

  Raises ValueError for anything else (easgd.config.validation refuses it first).
  """
  why = refusal(value, total_steps)
  if why is not None:
    raise ValueError(f"config.run.profile={value!r} is invalid: {why}")
  if value == "":
    return None
  start, _, steps = value.partition(":")
  return int(start), int(steps)


def _digits(text: str) -> bool:
  # Not int() alone: it takes signs, spaces and underscores ("-1", " 2", "1_0").
  return text.isascii() and text.isdigit()


def log_dir(workdir: str) -> str:
  """Where this process writes its trace under `workdir`."""
  path = os.path.join(workdir, "profile")
  if jax.process_count() > 1:
    # jax.profiler names the file after the host: processes on one host would overwrite it.
    path = os.path.join(path, f"process_{jax.process_index()}")
  return path


class Window:
  """The window of config.run.profile (validated) in a run resumed after step `resumed`.

  The loop asks `opens(step)` before it dispatches step `step`+1 and
  `closes(step)` after it dispatched step `step`; `close(step)` in its
  clean-up stops a trace still open.
  """

  def __init__(self, profile: str, total_steps: int, resumed: int):
    span = parse(profile, total_steps)
    # The steps traced: first .. last; none for "".
    self.first, self.last = (span[0] + 1, span[0] + span[1]) if span else (1, 0)
    if span and resumed >= self.last:
      logging.info("resumed after the profile window %s: nothing is traced", profile)
    elif span and resumed >= self.first:
      logging.info(
        "resumed inside the profile window %s: tracing steps %d .. %d",
        profile,
        resumed + 1,
        self.last,
      )
    self._traced_from: int | None = None  # the first step of the open trace
    self._dir = ""

  def opens(self, step: int) -> bool:
    """Whether the trace starts before step `step`+1 (a run resumed inside the window: at once)."""
    return self._traced_from is None and self.first - 1 <= step < self.last

  def closes(self, step: int) -> bool:
    """Whether step `step` was the window's last, its trace open."""
    return self._traced_from is not None and step == self.last

  def start(self, state, workdir: str, step: int) -> None:
    """Waits for `state` after step `step`, leaving its execution out, then starts the trace."""
    jax.block_until_ready(state)
    self._dir = log_dir(workdir)
    jax.profiler.start_trace(self._dir)
    self._traced_from = step + 1

  def stop(self, state, step: int) -> None:
    """Waits for `state` after step `step`, so that the window's execution is in the trace,
    then writes it."""
    jax.block_until_ready(state)
    self._stop(step)

  def close(self, step: int) -> None:
    """Stops a trace left open by a run that ended inside the window, with what has run."""
    if self._traced_from is None:
      return
    try:
      self._stop(step)
    except Exception:  # noqa: BLE001 (in a run's clean-up: the run's own error goes on)
      logging.exception("the profile trace could not be written")

  def _stop(self, step: int) -> None:
    first, self._traced_from = self._traced_from, None
    jax.profiler.stop_trace()
    logging.info("profile of steps %d .. %d written to %s", first, step, self._dir)
