"""The field only the simulated runtime reads: the trace it replays (a declaration,
importing nothing but the declaring mechanism, so that easgd.config assembles it)."""

from easgd.declare import Field, text

REPLAY = Field(
  "cluster.replay",
  "",
  text("a trace.jsonl path, or '' (off)"),
  "a trace.jsonl of a runtime=threads or ray run, replayed instead of the timing model's "
  "order; '': off",
  earlier="",
)
