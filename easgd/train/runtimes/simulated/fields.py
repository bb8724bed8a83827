"""The field the simulated and threads runtimes read: the trace they replay (a declaration,
importing nothing but the declaring mechanism, so that easgd.config assembles it)."""

from easgd.declare import Field, text

REPLAY = Field(
  "cluster.replay",
  "",
  text("a trace.jsonl path, or '' (off)"),
  "a trace.jsonl of a runtime=threads or ray run, replayed: a parameter-server rule's order "
  "under runtime=simulated, instead of the timing model's; a synchronous rule's rounds under "
  "runtime=threads; '': off",
  earlier="",
)
