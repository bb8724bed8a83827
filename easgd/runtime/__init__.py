"""How the parameter-server rules' workers run (`config.runtime`).

simulated: every worker steps in the ticks of a schedule, one program for
  all of them (easgd.trainer); the schedule comes from the timing model
  (easgd.sim.clocks) or, with cluster.replay, from a recorded trace
  (easgd.runtime.trace).
threads: each worker in its own host thread, for real (easgd.runtime.threads),
  recording the trace that replays it.
"""

SIMULATED = "simulated"
THREADS = "threads"
RUNTIMES = (SIMULATED, THREADS)
