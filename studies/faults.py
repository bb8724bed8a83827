"""Injects the faults of a real cluster into small runs and records what each one cost.

    python studies/faults.py --workdir runs/faults --trials 3

Every trial runs the MLP on mnist5k (4 workers on 4 CPU devices, 60 steps, a
checkpoint every 10, sums over workers in worker order) with a fault, then
runs the same command again (after a lost host: on the one process left).
It records how the faulted run ended, which checkpoint the rerun resumed
from, and whether the final state equals an uninterrupted run bit for bit
(nothing lost beyond the last checkpoint). Kills land at a random moment
(seeded) after the first checkpoint, so some fall during a save; one kind
lands the instant a checkpoint appears, and compares the TensorBoard
history too. A hang is injected by a wrapper script the study writes into
its workdir. Writes docs/faults_table.md (every trial) and the table of
fault classes in docs/faults.md, between its FAULT CLASSES markers.
"""

import dataclasses
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable

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
  # The same bits on every layout: a run resumed on fewer processes is comparable.
  "deterministic_sums": True,
}
TIMEOUT = 300
# The watchdog's limit in the hang trials (--step_timeout).
HANG_TIMEOUT = 5
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
  how, last = kill_process(trial_dir, algorithm, processes, 1, rng)
  return how.split("; JAX's log")[0], last


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
  said = re.search(r"\[process 1\] error: (no progress in [^;]+);", text)
  statuses = re.findall(r"launch: process (\d+) (?:\(pid \d+\) was lost|stopped): ([^\n]+)", text)
  stopped = ", ".join(f"process {index}: {status}" for index, status in statuses)
  what = said.group(1) if said else "(nothing)"
  how = f"process 1 said '{what}'; {stopped}; launcher exit {code}"
  return how, saved(workdir)[-1] if saved(workdir) else None


# The flags that make a run diverge.
DIVERGING = ("--config.optimizer.learning_rate=1e6",)


def diverge(trial_dir, algorithm, processes, _rng):
  """A learning rate of 1e6 (FAULTS reruns the same command)."""
  workdir = os.path.join(trial_dir, "run")
  log = os.path.join(trial_dir, "faulted.log")
  code = finish(workdir, algorithm, processes, log, *DIVERGING)
  with open(log) as f:
    said = re.search(r"error: ([^\n]+)", f.read())
  return f"exit {code}: '{said.group(1) if said else '(nothing)'}'", saved(workdir)[-1]


def bad_input(trial_dir, algorithm, processes, _rng):
  """A non-finite learning rate and a workdir under a file; the rerun is the right command."""
  workdir = os.path.join(trial_dir, "run")
  with open(os.path.join(trial_dir, "a_file"), "w") as f:
    f.write("not a directory\n")
  said = []
  for extra, where in (
    (["--config.optimizer.learning_rate=nan"], workdir),
    ([], os.path.join(trial_dir, "a_file", "run")),
  ):
    log = os.path.join(trial_dir, f"bad_{len(said)}.log")
    code = finish(where, algorithm, processes, log, *extra)
    with open(log) as f:
      lines = f.read().strip().splitlines()
    said.append(f"exit {code} and {len(lines)} line: '{lines[-1] if lines else ''}'")
  left = "nothing written" if not os.path.exists(workdir) else "a workdir was written"
  return "; ".join(said) + f"; {left}", None


@dataclasses.dataclass(frozen=True)
class Fault:
  """One kind of fault: how it is injected, and how the run goes on after it."""

  name: str
  algorithm: str
  processes: int
  inject: Callable  # (trial_dir, algorithm, processes, rng) -> (what happened, newest checkpoint)
  test: str  # the test of the suite that shows the same
  rerun_processes: int = 0  # 0: as many as the faulted run had
  rerun_flags: tuple[str, ...] = ()
  history: bool = False  # also compare the TensorBoard history with the reference's


def _kill(index: int) -> Callable:
  return lambda d, a, p, r: kill_process(d, a, p, index, r)


def _corrupt(damage: str) -> Callable:
  return lambda d, a, p, _: corrupt(d, a, p, damage)


DISTRIBUTED = "tests/test_distributed.py::test_"
FAULTS = [
  Fault(
    "SIGKILL to process 1 of 2",
    LOCK_FREE,
    2,
    _kill(1),
    DISTRIBUTED + "a_killed_process_stops_the_others_and_a_restart_resumes",
  ),
  Fault(
    "SIGKILL to process 0 of 2 (the coordinator)",
    SYNC,
    2,
    _kill(0),
    DISTRIBUTED + "a_killed_process_stops_the_others_and_a_restart_resumes",
  ),
  Fault(
    "SIGTERM to both processes",
    SYNC,
    2,
    preempt,
    DISTRIBUTED + "sync_easgd_preempted_over_two_processes_resumes_to_one_process_result",
  ),
  Fault(
    "SIGKILL to the only process",
    SYNC,
    1,
    _kill(0),
    "tests/test_train.py::test_kill_and_resume_ends_bitwise_equal_to_an_uninterrupted_run",
  ),
  Fault(
    "SIGKILL the instant a checkpoint appears",
    SYNC,
    1,
    kill_at_checkpoint,
    "tests/test_history.py::test_history_is_whole_after_a_kill",
    history=True,
  ),
  Fault(
    "SIGTERM to the only process",
    schema.PIPELINE,
    1,
    preempt,
    "tests/test_preemption.py::test_preempted_run_resumes_bitwise",
  ),
  Fault(
    "newest checkpoint truncated",
    SYNC,
    1,
    _corrupt("truncate"),
    "tests/test_checkpoint.py::test_a_corrupt_checkpoint_is_set_aside_and_the_one_before_resumed",
  ),
  Fault(
    "newest checkpoint truncated",
    SYNC,
    2,
    _corrupt("truncate"),
    DISTRIBUTED + "pipeline_over_two_processes_equals_one_process_and_outlives_a_bad_checkpoint",
  ),
  Fault(
    "a bit flipped in the newest checkpoint",
    SYNC,
    1,
    _corrupt("flip"),
    "tests/test_checkpoint.py::test_a_corrupt_checkpoint_is_set_aside_and_the_one_before_resumed",
  ),
  Fault(
    "process 1 of 2 hangs in a checkpoint",
    SYNC,
    2,
    hang,
    "tests/test_watchdog.py::test_a_hung_checkpoint_stops_the_process_and_the_same_command_resumes",
  ),
  Fault(
    "a host lost for good: process 1 of 2 killed, the rerun on the other alone",
    SYNC,
    2,
    lost_host,
    DISTRIBUTED + "a_run_resumes_on_another_layout_bit_for_bit",
    rerun_processes=1,
    rerun_flags=("--config.run.devices=2",),
  ),
  Fault(
    "the training diverges (learning rate 1e6)",
    SYNC,
    1,
    diverge,
    "tests/test_train.py::test_divergence_stops_with_the_step_and_keeps_the_last_good_checkpoint",
    rerun_flags=DIVERGING,
  ),
  Fault(
    "bad input (a learning rate of nan; a workdir under a file)",
    SYNC,
    1,
    bad_input,
    "tests/test_bad_input.py",
  ),
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


@dataclasses.dataclass
class Trial:
  fault: Fault
  number: int
  how: str  # what the faulted run did, as the user saw it
  last: int | None  # the newest checkpoint at the fault
  resumed: str  # the checkpoint the rerun resumed from ("-": none)
  set_aside: bool  # a corrupt checkpoint was moved aside
  code: int  # the rerun's exit status
  equal: bool | None  # its final state equals the uninterrupted run's (None: it has none)
  history: bool | None  # its TensorBoard history equals it too (None: not compared)


def scalars(workdir: str) -> dict:
  """Every TensorBoard scalar but the wall-clock ones, as (step, value) lists."""
  from tensorboard.backend.event_processing import event_accumulator  # noqa: PLC0415

  accumulator = event_accumulator.EventAccumulator(workdir, size_guidance={"scalars": 0})
  accumulator.Reload()
  return {
    tag: [(event.step, event.value) for event in accumulator.Scalars(tag)]
    for tag in accumulator.Tags()["scalars"]
    if tag != "train/images_per_sec"
  }


def run_trial(fault: Fault, number: int, workdir: str, reference: str, rng) -> Trial:
  name = re.sub(r"[^a-z0-9]+", "_", fault.name.lower()).strip("_")[:40]
  trial_dir = os.path.join(workdir, f"{name}_{fault.processes}_{number}")
  os.makedirs(trial_dir)
  how, last = fault.inject(trial_dir, fault.algorithm, fault.processes, rng)
  rerun = os.path.join(trial_dir, "rerun.log")
  run_dir = os.path.join(trial_dir, "run")
  processes = fault.rerun_processes or fault.processes
  code = finish(run_dir, fault.algorithm, processes, rerun, *fault.rerun_flags)
  equal = None
  if code == 0:
    final = final_state(run_dir)
    equal = all(np.array_equal(a, b) for a, b in zip(final, final_state(reference), strict=True))
  first = os.path.join(trial_dir, "first_rerun.log")
  set_aside = grep(rerun, r"is corrupt: ") or (
    os.path.exists(first) and grep(first, r"it was moved to")
  )
  history = scalars(run_dir) == scalars(reference) if fault.history and code == 0 else None
  return Trial(fault, number, how, last, resumed_from(rerun), set_aside, code, equal, history)


def _cell(value) -> str:
  return "-" if value is None else str(value)


def trials_table(trials: list[Trial]) -> list[str]:
  lines = [
    "| fault | rule | processes | trial | the faulted run | newest checkpoint at the fault "
    "| the rerun resumed from | a corrupt one was set aside | its exit | its final state vs an "
    "uninterrupted run |",
    "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
  ]
  for t in trials:
    final = {None: "-", True: "bitwise equal", False: "DIFFERENT"}[t.equal]
    if t.history is not None:
      final += "; TensorBoard history " + ("equal" if t.history else "DIFFERENT")
    lines.append(
      f"| {t.fault.name} | {t.fault.algorithm} | {t.fault.processes} | {t.number} | {t.how} | "
      f"{_cell(t.last)} | {t.resumed} | {'yes' if t.set_aside else 'no'} | {t.code} | {final} |"
    )
  return lines


def kept(trials: list[Trial]) -> str:
  """What a fault's trials kept, in words: checkpoints, the rerun, the final state."""
  fault, n = trials[0].fault, len(trials)
  parts = []
  lasts = sorted({t.last for t in trials if t.last is not None})
  if lasts:
    parts.append(f"every checkpoint up to the newest at the fault ({', '.join(map(str, lasts))})")
  where = f" on {fault.rerun_processes} process" if fault.rerun_processes else ""
  codes = sorted({t.code for t in trials})
  resumed = sorted({t.resumed for t in trials})
  rerun = f"the same command{where} exits {'/'.join(map(str, codes))}"
  if resumed != ["-"]:
    rerun += f", resumed from {', '.join(resumed)}"
  parts.append(rerun)
  if any(t.set_aside for t in trials):
    parts.append(f"a corrupt checkpoint set aside in {sum(t.set_aside for t in trials)} of {n}")
  if all(t.equal is not None for t in trials):
    parts.append(
      f"final state bitwise equal to the uninterrupted run in {sum(t.equal for t in trials)} of {n}"
    )
  if any(t.history is not None for t in trials):
    parts.append(f"TensorBoard history equal in {sum(bool(t.history) for t in trials)} of {n}")
  return "; ".join(parts)


def classes_table(trials: list[Trial]) -> list[str]:
  """One row a fault: what the user sees (the first trial), what is kept, the test."""
  lines = [
    "| fault | processes | what the user sees (trial 0) | what is kept (all trials) | the test |",
    "| --- | --- | --- | --- | --- |",
  ]
  by_fault: dict = {}
  for t in trials:
    by_fault.setdefault((t.fault.name, t.fault.processes), []).append(t)
  for (name, processes), group in by_fault.items():
    lines.append(
      f"| {name} | {processes} | {group[0].how} | {kept(group)} | `{group[0].fault.test}` |"
    )
  return lines


BEGIN, END = "<!-- FAULT CLASSES: written by studies/faults.py -->", "<!-- END FAULT CLASSES -->"


def write_classes(doc: str, lines: list[str], command: str) -> None:
  """Replaces the table between BEGIN and END in `doc`."""
  with open(doc) as f:
    text = f.read()
  if BEGIN not in text or END not in text:
    arguments.fail(f"--doc {doc!r} has no {BEGIN} ... {END} section to write the table into")
  head, rest = text.split(BEGIN, 1)
  _, tail = rest.split(END, 1)
  body = "\n".join([f"Written by `{command}`.", "", *lines])
  with open(doc, "w") as f:
    f.write(f"{head}{BEGIN}\n{body}\n{END}{tail}")


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
  parser.add_argument(
    "--doc",
    type=arguments.output_file("--doc"),
    default=os.path.join(REPO, "docs", "faults.md"),
    help="the document whose table of fault classes is rewritten",
  )
  args = parser.parse_args()
  rng = random.Random(args.seed)
  workdir_arg, args.workdir = args.workdir, os.path.abspath(args.workdir)
  fresh_workdir(args.workdir)
  references = {}
  trials = []
  for fault in FAULTS:
    key = (fault.algorithm, fault.processes)
    if key not in references:
      reference = os.path.join(args.workdir, f"reference_{fault.algorithm}_{fault.processes}")
      if finish(reference, *key, reference + ".log") != 0:
        raise RuntimeError(f"the uninterrupted {key} run failed; see {reference}.log")
      references[key] = reference
    for number in range(args.trials):
      trials.append(run_trial(fault, number, args.workdir, references[key], rng))
      print(trials[-1], flush=True)
  command = (
    f"python studies/faults.py --workdir {workdir_arg} --trials {args.trials} --seed {args.seed}"
  )
  with open(args.out, "w") as f:
    f.write(f"Written by `{command}`.\n\n" + "\n".join(trials_table(trials)) + "\n")
  write_classes(args.doc, classes_table(trials), command)
  print(f"wrote {args.out} and the table of {args.doc}")


if __name__ == "__main__":
  main()
