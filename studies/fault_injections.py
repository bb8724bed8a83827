"""The faults of studies/faults.py: the small run they hit, and how each is injected.

Each injection `inject(trial_dir, algorithm, processes, rng)` starts the run
in <trial_dir>/run, does its harm, and returns what the user saw and the
newest checkpoint at the fault (None where there is none to speak of).
"""

import os
import re
import signal
import subprocess
import sys
import time

import numpy as np

from easgd import rules
from easgd.sim.clocks import Policy

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# The config of every run, by grouped field name (train.py's --config.GROUP.FIELD flags).
RUN = {
  "model": "mlp",
  "workers": 4,
  "pipeline.models": 4,
  "run.devices": 4,
  "outer.moving_rate": 0.2,
  "run.total_steps": 60,
  "run.checkpoint_every": 10,
  "run.log_every": 5,
  "run.eval_every": 0,
  "pipeline.stage_steps": 10,
  # The same bits on every layout: a run resumed on fewer processes is comparable.
  "deterministic_sums": True,
}
TIMEOUT = 300
# The watchdog's limit in the hang trials (--step_timeout).
HANG_TIMEOUT = 10
# The wrapper that hangs a process's checkpoint of step 20, written into the workdir.
HANG_SCRIPT = """
import runpy, sys, threading
import jax
from easgd.infra import checkpoint
original = checkpoint.Checkpointer.save
def save(self, state, *args, **kwargs):
  if int(jax.device_get(state.step)) == 20 and "--process_id=1" in sys.argv:
    threading.Event().wait()  # a write that never returns
  return original(self, state, *args, **kwargs)
checkpoint.Checkpointer.save = save
sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")
"""


# The rules the faults hit: the synchronous elastic rule, and a lock-free parameter-server one.
SYNC = rules.plain(policy=None, elastic=True)
LOCK_FREE = rules.plain(policy=Policy.HOGWILD, elastic=True)


def command(workdir: str, algorithm: str, processes: int, *extra: str, wrapper=None) -> list:
  flags = [f"--config.{field}={value}" for field, value in {**RUN, "algorithm": algorithm}.items()]
  script = [*([wrapper] if wrapper else []), "train.py", f"--workdir={workdir}", *flags, *extra]
  if processes == 1:
    return [sys.executable, *script]
  return [sys.executable, "-m", "easgd.launch", f"--processes={processes}", "--", *script]


def start(workdir, algorithm, processes, log, *extra, wrapper=None) -> subprocess.Popen:
  with open(log, "w") as out:
    return subprocess.Popen(
      command(workdir, algorithm, processes, *extra, wrapper=wrapper),
      cwd=REPO,
      stdout=out,
      stderr=subprocess.STDOUT,
    )


def finish(workdir: str, algorithm: str, processes: int, log: str, *extra: str) -> int:
  process = start(workdir, algorithm, processes, log, *extra)
  return process.wait(timeout=TIMEOUT)


def saved(workdir: str) -> list[int]:
  path = os.path.join(workdir, "checkpoints")
  if not os.path.isdir(path):
    return []
  return sorted(int(name) for name in os.listdir(path) if name.isdigit())


def wait_for_checkpoint(workdir: str, step: int) -> None:
  deadline = time.monotonic() + TIMEOUT
  while step not in saved(workdir):
    if time.monotonic() > deadline:
      raise RuntimeError(f"no checkpoint {step} in {workdir}")
    time.sleep(0.01)


def child_pid(log: str, index: int) -> int:
  deadline = time.monotonic() + 60
  while time.monotonic() < deadline:
    with open(log) as f:
      match = re.search(rf"process {index} \(pid (\d+)\) started", f.read())
    if match:
      return int(match.group(1))
    time.sleep(0.05)
  raise RuntimeError(f"no pid of process {index} in {log}")


def final_state(workdir: str) -> list[np.ndarray]:
  import jax  # noqa: PLC0415 (only the parent reads checkpoints)
  import orbax.checkpoint as ocp  # noqa: PLC0415

  path = os.path.join(workdir, "checkpoints", str(RUN["run.total_steps"]), "state")
  checkpointer = ocp.PyTreeCheckpointer()
  tree = checkpointer.metadata(path).item_metadata.tree
  args = jax.tree.map(lambda _: ocp.RestoreArgs(restore_type=np.ndarray), tree)
  restored = checkpointer.restore(path, args=ocp.args.PyTreeRestore(restore_args=args))
  return [np.asarray(leaf) for leaf in jax.tree.leaves(restored)]


def resumed_from(log: str) -> str:
  with open(log) as f:
    match = re.search(r"resumed from the checkpoint of step (\d+)", f.read())
  return match.group(1) if match else "-"


def grep(log: str, pattern: str) -> bool:
  with open(log) as f:
    return re.search(pattern, f.read()) is not None


def kill_process(trial_dir, algorithm, processes, index, rng, name_the_lost=True):
  """SIGKILL to process `index` at a random moment after the first checkpoint."""
  log = os.path.join(trial_dir, "faulted.log")
  process = start(os.path.join(trial_dir, "run"), algorithm, processes, log)
  pid = process.pid if processes == 1 else child_pid(log, index)
  wait_for_checkpoint(os.path.join(trial_dir, "run"), RUN["run.checkpoint_every"])
  time.sleep(rng.uniform(0.0, 1.5))
  os.kill(pid, signal.SIGKILL)
  killed = time.monotonic()
  code = process.wait(timeout=TIMEOUT)
  # Read once the process is gone: a checkpoint finished as it was killed counts.
  last = saved(os.path.join(trial_dir, "run"))[-1]
  stopped = time.monotonic() - killed
  if processes == 1:
    return f"killed (status {code})", last
  named = grep(log, r"unhealthy \(stopped sending heartbeats\)|leader task was preempted/died")
  with open(log) as f:
    others = re.findall(r"launch: process (\d+) stopped: ([^\n]+)", f.read())
  survivors = ", ".join(f"process {index}: {status}" for index, status in others)
  how = f"the others stopped {stopped:.1f} s after the kill ({survivors})"
  if name_the_lost:
    how += f"; JAX's log named the lost process: {'yes' if named else 'no'}; launcher exit {code}"
  return how, last


def preempt(trial_dir, algorithm, processes, rng):
  """SIGTERM (to the launcher, which passes it on) at a random step after the first checkpoint."""
  log = os.path.join(trial_dir, "faulted.log")
  process = start(os.path.join(trial_dir, "run"), algorithm, processes, log)
  wait_for_checkpoint(os.path.join(trial_dir, "run"), RUN["run.checkpoint_every"])
  time.sleep(rng.uniform(0.0, 0.5 if processes == 1 else 1.5))
  process.send_signal(signal.SIGTERM)
  signalled = time.monotonic()
  code = process.wait(timeout=TIMEOUT)
  with open(log) as f:
    stops = sorted(set(re.findall(r"stopping after step (\d+)", f.read())))
  last = saved(os.path.join(trial_dir, "run"))[-1]
  seconds = time.monotonic() - signalled
  if not stops:
    return f"had finished before the signal (exit {code})", last
  how = f"exit {code} {seconds:.1f} s after the signal; stopped after step {', '.join(stops)}"
  return how, last


def corrupt(trial_dir, algorithm, processes, damage):
  """A finished run whose newest checkpoint is then damaged on disk."""
  workdir = os.path.join(trial_dir, "run")
  code = finish(workdir, algorithm, processes, os.path.join(trial_dir, "faulted.log"))
  newest = os.path.join(workdir, "checkpoints", str(RUN["run.total_steps"]), "state")
  files = [os.path.join(root, name) for root, _, names in os.walk(newest) for name in names]
  largest = max(files, key=os.path.getsize)
  with open(largest, "r+b") as f:
    if damage == "truncate":
      f.truncate(os.path.getsize(largest) // 2)
    else:
      f.seek(os.path.getsize(largest) // 2)
      byte = f.read(1)
      f.seek(-1, os.SEEK_CUR)
      f.write(bytes([byte[0] ^ 0x01]))
  damaged = "cut to half its size" if damage == "truncate" else "one bit flipped"
  how = f"finished (exit {code}); the newest checkpoint's largest file: {damaged}"
  if processes > 1:
    # The processes that cannot read their part set the checkpoint aside and
    # stop the run (exit 1); the next rerun resumes from the one before.
    first = os.path.join(trial_dir, "first_rerun.log")
    how += f"; a first rerun exited {finish(workdir, algorithm, processes, first)}"
    how += " after setting it aside" if grep(first, r"it was moved to") else " (nothing set aside)"
  return how, None


def kill_at_checkpoint(trial_dir, algorithm, processes, rng):
  """SIGKILL the instant a checkpoint (10 to 40, seeded) becomes visible, polled every 0.5 ms."""
  workdir = os.path.join(trial_dir, "run")
  step = RUN["run.checkpoint_every"] * rng.randint(1, 4)
  process = start(workdir, algorithm, processes, os.path.join(trial_dir, "faulted.log"))
  target = os.path.join(workdir, "checkpoints", str(step))
  deadline = time.monotonic() + TIMEOUT
  while not os.path.isdir(target) and time.monotonic() < deadline:
    time.sleep(0.0005)
  process.kill()
  code = process.wait(timeout=TIMEOUT)
  return f"killed (status {code}) the instant checkpoint {step} appeared", saved(workdir)[-1]


def lost_host(trial_dir, algorithm, processes, rng):
  """SIGKILL to process 1 of 2; the rerun goes on with process 0's host alone (FAULTS)."""
  return kill_process(trial_dir, algorithm, processes, 1, rng, name_the_lost=False)


def hang(trial_dir, algorithm, processes, _rng):
  """Process 1's checkpoint of step 20 never returns; the watchdog's limit is HANG_TIMEOUT."""
  wrapper = os.path.join(trial_dir, "hang.py")
  with open(wrapper, "w") as script:
    script.write(HANG_SCRIPT)
  log = os.path.join(trial_dir, "faulted.log")
  workdir = os.path.join(trial_dir, "run")
  process = start(
    workdir, algorithm, processes, log, f"--step_timeout={HANG_TIMEOUT}", wrapper=wrapper
  )
  code = process.wait(timeout=TIMEOUT)
  with open(log) as f:
    text = f.read()
  # Each process that stopped itself says so; the one a watchdog did not stop first
  # is aborted when the other's heartbeats stop.
  said = re.findall(r"\[process (\d)\] error: (no progress in [^;]+);", text)
  statuses = re.findall(r"launch: process (\d+) (?:\(pid \d+\) was lost|stopped): ([^\n]+)", text)
  stopped = ", ".join(f"process {index}: {status}" for index, status in statuses)
  words = "; ".join(f"process {index} said '{line}'" for index, line in said) or "nothing said"
  how = f"{words}; {stopped}; launcher exit {code}"
  return how, saved(workdir)[-1] if saved(workdir) else None


# The flags that make a run diverge within its first steps, each step checkpointed.
DIVERGING = ("--config.optimizer.learning_rate=1e6", "--config.run.checkpoint_every=1")


def diverge(trial_dir, algorithm, processes, _rng):
  """A learning rate of 1e6 (FAULTS reruns the same command)."""
  workdir = os.path.join(trial_dir, "run")
  log = os.path.join(trial_dir, "faulted.log")
  code = finish(workdir, algorithm, processes, log, *DIVERGING)
  with open(log) as f:
    said = re.search(r"error: ([^\n]+)", f.read())
  what = said.group(1) if said else "(nothing)"
  return f"exit {code}: '{what}'", saved(workdir)[-1] if saved(workdir) else None


def bad_input(trial_dir, algorithm, processes, _rng):
  """A non-finite learning rate and a workdir under a file; the rerun is the right command."""
  workdir = os.path.join(trial_dir, "run")
  with open(os.path.join(trial_dir, "a_file"), "w") as f:
    f.write("not a directory\n")
  said = []
  for extra, where in (
    (["--config.optimizer.learning_rate=nan"], workdir),
    ([], os.path.relpath(os.path.join(trial_dir, "a_file", "run"), REPO)),
  ):
    log = os.path.join(trial_dir, f"bad_{len(said)}.log")
    code = finish(where, algorithm, processes, log, *extra)
    with open(log) as f:
      lines = f.read().strip().splitlines()
    said.append(f"exit {code} and {len(lines)} line: '{lines[-1] if lines else ''}'")
  left = "nothing written" if not os.path.exists(workdir) else "a workdir was written"
  return "; ".join(said) + f"; {left}", None
