"""runtime=ray: the parameter-server rules' workers as Ray actor processes, the center
on server actors (runtime.py: the runtime and its checks; workers.py: the
coordination, runtime=threads' over calls to processes; actors.py: the processes)."""
