"""runtime=threads: the parameter-server rules' workers for real, each in a host
thread of its own (runtime.py), coordinated by `workers.Workers` on a clock of
measured seconds (live_clock.py). runtime=ray runs the same coordination with each
worker in a process of its own (easgd.train.runtimes.ray). The synchronous rules with
local steps run here too, each round closed on the workers' real arrivals (rounds.py)."""
