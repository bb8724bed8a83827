"""Injects the faults of a real cluster into small runs and records what each one cost.

    python studies/faults.py --workdir runs/faults --trials 3

Every trial runs the MLP on mnist5k (4 workers on 4 CPU devices, 60 steps, a
checkpoint every 10) with a fault, then runs the same command again. It
records how the faulted run ended, which checkpoint the rerun resumed from,
and whether the final state equals an uninterrupted run of the same layout
bit for bit (nothing lost beyond the last checkpoint). Kills land at a
random moment (seeded) after the first checkpoint, so some fall during a
save. Writes docs/faults_table.md.
"""

import os
import random
import re
import shutil
import signal
import subprocess
import sys
import time

import numpy as np

from easgd import arguments, rules, schema
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
}
TIMEOUT = 300


# The rules the faults hit: the synchronous elastic rule, and a lock-free parameter-server one.
SYNC = rules.plain(policy=None, elastic=True)
LOCK_FREE = rules.plain(policy=Policy.HOGWILD, elastic=True)


def command(workdir: str, algorithm: str, processes: int) -> list[str]:
  flags = [f"--config.{field}={value}" for field, value in {**RUN, "algorithm": algorithm}.items()]
  script = ["train.py", f"--workdir={workdir}", *flags]
  if processes == 1:
    return [sys.executable, *script]
  return [sys.executable, "-m", "easgd.launch", f"--processes={processes}", "--", *script]


def start(workdir: str, algorithm: str, processes: int, log: str) -> subprocess.Popen:
  with open(log, "w") as out:
    return subprocess.Popen(
      command(workdir, algorithm, processes), cwd=REPO, stdout=out, stderr=subprocess.STDOUT
    )


def finish(workdir: str, algorithm: str, processes: int, log: str) -> int:
  process = start(workdir, algorithm, processes, log)
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


def kill_process(trial_dir, algorithm, processes, index, rng):
  """SIGKILL to process `index` at a random moment after the first checkpoint."""
  log = os.path.join(trial_dir, "faulted.log")
  process = start(os.path.join(trial_dir, "run"), algorithm, processes, log)
  pid = process.pid if processes == 1 else child_pid(log, index)
  wait_for_checkpoint(os.path.join(trial_dir, "run"), RUN["run.checkpoint_every"])
  time.sleep(rng.uniform(0.0, 1.5))
  last = saved(os.path.join(trial_dir, "run"))[-1]
  os.kill(pid, signal.SIGKILL)
  killed = time.monotonic()
  code = process.wait(timeout=TIMEOUT)
  stopped = time.monotonic() - killed
  if processes == 1:
    return f"killed (status {code})", last
  named = grep(log, r"unhealthy \(stopped sending heartbeats\)|leader task was preempted/died")
  with open(log) as f:
    others = re.findall(r"launch: process (\d+) stopped: ([^\n]+)", f.read())
  survivors = ", ".join(f"process {index}: {status}" for index, status in others)
  how = (
    f"the others stopped {stopped:.1f} s after the kill ({survivors}); "
    f"JAX's log named the lost process: {'yes' if named else 'no'}; launcher exit {code}"
  )
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


def flip(trial_dir, algorithm, processes, _rng):
  return corrupt(trial_dir, algorithm, processes, "flip")


FAULTS = [
  # (name, algorithm, processes, inject(trial_dir, algorithm, processes, rng))
  (
    "SIGKILL to process 1 of 2",
    LOCK_FREE,
    2,
    lambda d, a, p, r: kill_process(d, a, p, 1, r),
  ),
  (
    "SIGKILL to process 0 of 2 (the coordinator)",
    SYNC,
    2,
    lambda d, a, p, r: kill_process(d, a, p, 0, r),
  ),
  ("SIGTERM to both processes", SYNC, 2, preempt),
  ("SIGKILL to the only process", SYNC, 1, lambda d, a, p, r: kill_process(d, a, p, 0, r)),
  ("SIGTERM to the only process", schema.PIPELINE, 1, preempt),
  ("newest checkpoint truncated", SYNC, 1, lambda d, a, p, _: corrupt(d, a, p, "truncate")),
  ("newest checkpoint truncated", SYNC, 2, lambda d, a, p, _: corrupt(d, a, p, "truncate")),
  ("a bit flipped in the newest checkpoint", SYNC, 1, flip),
]


# Written into the study's workdir when it makes it: only a directory with it
# is cleared by a later run of the study.
MARKER = ".faults-study"


def fresh_workdir(workdir: str) -> None:
  """Makes `workdir` empty: creates it, or clears one that an earlier run of this
  study made (it holds MARKER). Anything else that is there and not empty is
  refused with one line and exit 2, and nothing is deleted."""
  if os.path.lexists(workdir) and not os.path.isdir(workdir):
    arguments.fail(f"--workdir {workdir!r} is not a directory")
  if os.path.isdir(workdir) and os.listdir(workdir):
    if not os.path.isfile(os.path.join(workdir, MARKER)):
      arguments.fail(
        f"--workdir {workdir!r} is not empty and was not made by this study "
        f"(it has no {MARKER}); give a new or empty directory"
      )
    shutil.rmtree(workdir)
  os.makedirs(workdir, exist_ok=True)
  with open(os.path.join(workdir, MARKER), "w") as marker:
    marker.write("made by studies/faults.py; a rerun of the study clears this directory\n")


def main() -> None:
  parser = arguments.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--workdir", default="runs/faults", type=arguments.directory("--workdir"))
  parser.add_argument("--trials", type=arguments.integer(1), default=3)
  parser.add_argument("--seed", type=arguments.integer(0), default=0)
  parser.add_argument(
    "--out",
    type=arguments.output_file("--out"),
    default=os.path.join(REPO, "docs", "faults_table.md"),
  )
  args = parser.parse_args()
  rng = random.Random(args.seed)
  workdir_arg, args.workdir = args.workdir, os.path.abspath(args.workdir)
  fresh_workdir(args.workdir)
  references = {}
  rows = []
  for name, algorithm, processes, inject in FAULTS:
    key = (algorithm, processes)
    if key not in references:
      workdir = os.path.join(args.workdir, f"reference_{algorithm}_{processes}")
      code = finish(workdir, algorithm, processes, workdir + ".log")
      if code != 0:
        raise RuntimeError(f"the uninterrupted {key} run failed; see {workdir}.log")
      references[key] = final_state(workdir)
    for trial in range(args.trials):
      trial_dir = os.path.join(args.workdir, f"{name.split()[0]}_{algorithm}_{processes}_{trial}")
      trial_dir = trial_dir.replace(" ", "_")
      os.makedirs(trial_dir)
      how, last = inject(trial_dir, algorithm, processes, rng)
      rerun = os.path.join(trial_dir, "rerun.log")
      code = finish(os.path.join(trial_dir, "run"), algorithm, processes, rerun)
      final = final_state(os.path.join(trial_dir, "run")) if code == 0 else None
      equal = final is not None and all(
        np.array_equal(a, b) for a, b in zip(final, references[key], strict=True)
      )
      first = os.path.join(trial_dir, "first_rerun.log")
      set_aside = grep(rerun, r"is corrupt: ") or (
        os.path.exists(first) and grep(first, r"it was moved to")
      )
      rows.append(
        (name, algorithm, processes, trial, how, last, resumed_from(rerun), set_aside, code, equal)
      )
      print(rows[-1], flush=True)
  lines = [
    "| fault | rule | processes | trial | the faulted run | newest checkpoint at the fault "
    "| the rerun resumed from | a corrupt one was set aside | its exit | its final state vs an "
    "uninterrupted run |",
    "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
  ]
  for name, algorithm, processes, trial, how, last, resumed, aside, code, equal in rows:
    lines.append(
      f"| {name} | {algorithm} | {processes} | {trial} | {how} | "
      f"{last if last is not None else '-'} | {resumed} | {'yes' if aside else 'no'} | {code} | "
      f"{'bitwise equal' if equal else 'DIFFERENT'} |"
    )
  header = (
    f"Written by `python studies/faults.py --workdir {workdir_arg} --trials {args.trials}"
    f" --seed {args.seed}`.\n\n"
  )
  with open(args.out, "w") as f:
    f.write(header + "\n".join(lines) + "\n")
  print(f"wrote {args.out}")


if __name__ == "__main__":
  main()
