"""The runtimes, by name: how a configuration runs (easgd.train.runtimes.base.Runtime).

simulated: every rule, its workers stepping in the ticks of a schedule, one
  program for all of them; the schedule comes from the timing model or, with
  cluster.replay, from a recorded trace.
threads: the parameter-server rules, each worker in its own host thread, for
  real, recording the trace that replays it; and the synchronous rules with
  local steps, each round closed on the workers' real arrivals (threads/rounds.py),
  whose trace it replays itself.
ray: the parameter-server rules, each worker a process (a Ray actor) on one
  machine or a cluster, the center on server actors; the same trace.
pipeline: config.algorithm=pipeline's models on a ring of devices.

A runtime is chosen by config.runtime, except one that is its algorithms'
only runtime (`Runtime.chosen_by_algorithm`), which their algorithm chooses
(registry.py holds them by name). The fields only one runtime reads are
declared beside it (ray/fields.py, simulated/fields.py; cluster.replay is the
simulated and threads runtimes').
"""
