"""runtime=simulated: every rule's workers stepping in the ticks of a schedule, one
program for all of them; the schedule comes from the timing model (easgd.sim) or,
with cluster.replay, from a recorded trace (replay_clock.py)."""
