"""The simulator: a seeded timing model of the cluster and the clocks that replay it.

timing: how long steps, messages, service and all-reduces take (`config.cluster`).
ticks:  the unit of the device program and the master's operation kinds.
events: packing a discrete-event simulation's events into ticks.
clocks: the synchronous and the parameter-server schedules of a run.
sizing: the timing model's steady state in closed form (for the planner).
"""
