"""Injects the faults of a real cluster into small runs and records what each one cost.

    python studies/faults.py --workdir runs/faults --trials 3 [--only PARTS]

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
fault classes in docs/faults.md, between its FAULT CLASSES markers. --only
runs the faults whose names contain one of its ;-separated parts into a table
of its own (--out), and leaves docs/faults.md's table, which lists every
fault, as it is.
"""

import dataclasses
import os
import random
import re
import shutil
from collections.abc import Callable

import numpy as np

from easgd import arguments
from easgd.infra import scalars
from easgd.pipeline.algorithm import PIPELINE
from easgd.studies import fault_injections as inject  # the run and the injections

REPO = inject.REPO


@dataclasses.dataclass(frozen=True)
class Fault:
  """One kind of fault: how it is injected, and how the run goes on after it."""

  name: str
  algorithm: str
  processes: int
  injection: (
    Callable  # (trial_dir, algorithm, processes, rng) -> (what happened, newest checkpoint)
  )
  test: str  # the test of the suite that shows the same
  rerun_processes: int = 0  # 0: as many as the faulted run had
  rerun_flags: tuple[str, ...] = ()
  rerun: str = ""  # what the rerun is, in words ("": the same command)
  history: bool = False  # also compare the TensorBoard history with the reference's


def _kill(index: int) -> Callable:
  return lambda d, a, p, r: inject.kill_process(d, a, p, index, r)


def _corrupt(damage: str) -> Callable:
  return lambda d, a, p, _: inject.corrupt(d, a, p, damage)


DISTRIBUTED = "tests/infra/test_distributed.py::test_"
HISTORY = (
  "tests/infra/test_history.py::"
  "test_history_is_whole_after_a_kill_at_a_checkpoint_then_one_after_a_logged_step"
)
FAULTS = [
  Fault(
    "SIGKILL to process 1 of 2",
    inject.LOCK_FREE,
    2,
    _kill(1),
    DISTRIBUTED + "preempted_then_killed_over_two_processes_each_time_the_same_command_resumes",
  ),
  Fault(
    "SIGKILL to process 0 of 2 (the coordinator)",
    inject.SYNC,
    2,
    _kill(0),
    DISTRIBUTED + "preempted_then_killed_over_two_processes_each_time_the_same_command_resumes",
  ),
  Fault(
    "SIGTERM to both processes",
    inject.SYNC,
    2,
    inject.preempt,
    DISTRIBUTED + "preempted_then_killed_over_two_processes_each_time_the_same_command_resumes",
  ),
  Fault(
    "SIGKILL to the only process",
    inject.SYNC,
    1,
    _kill(0),
    HISTORY,
  ),
  Fault(
    "SIGKILL the instant a checkpoint appears",
    inject.SYNC,
    1,
    inject.kill_at_checkpoint,
    HISTORY,
    history=True,
  ),
  Fault(
    "SIGTERM to the only process",
    PIPELINE.name,
    1,
    inject.preempt,
    "tests/infra/test_preemption.py::test_preempted_run_resumes_bitwise",
  ),
  Fault(
    "newest checkpoint truncated",
    inject.SYNC,
    1,
    _corrupt("truncate"),
    "tests/infra/test_checkpoint.py::test_a_corrupt_checkpoint_is_set_aside_and_the_one_before_resumed",
  ),
  Fault(
    "newest checkpoint truncated",
    inject.SYNC,
    2,
    _corrupt("truncate"),
    DISTRIBUTED + "pipeline_over_two_processes_equals_one_process_and_sets_a_bad_checkpoint_aside",
  ),
  Fault(
    "a bit flipped in the newest checkpoint",
    inject.SYNC,
    1,
    _corrupt("flip"),
    "tests/infra/test_checkpoint.py::test_a_corrupt_checkpoint_is_set_aside_and_the_one_before_resumed",
  ),
  Fault(
    "process 1 of 2 hangs in a checkpoint",
    inject.SYNC,
    2,
    inject.hang,
    "tests/infra/test_watchdog.py::test_a_hung_checkpoint_stops_the_process_and_the_same_command_resumes",
  ),
  Fault(
    "a host lost for good: process 1 of 2 killed, the rerun on the other alone",
    inject.SYNC,
    2,
    inject.lost_host,
    DISTRIBUTED + "preempted_then_killed_over_two_processes_each_time_the_same_command_resumes",
    rerun_processes=1,
    rerun_flags=("--config.run.devices=2",),
    rerun="the same command on 1 process of 2 devices",
  ),
  Fault(
    "the training diverges (learning rate 1e6)",
    inject.SYNC,
    1,
    inject.diverge,
    "tests/train/test_train.py::test_divergence_stops_with_the_step_and_keeps_the_last_good_checkpoint",
    rerun_flags=inject.DIVERGING,
  ),
  Fault(
    "bad input (a learning rate of nan; a workdir under a file)",
    inject.SYNC,
    1,
    inject.bad_input,
    "tests/config/test_bad_input.py",
    rerun="the right command",
  ),
]


# Written into the study's workdir when it makes it: only a directory with it
# is cleared by a later run of the study.
MARKER = ".faults-study"
DEFAULT_OUT = os.path.join(REPO, "docs", "faults_table.md")


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


def logged(workdir: str) -> dict:
  """Every TensorBoard scalar but the wall-clock ones, as (step, value) lists."""
  return scalars.without_wall_clock(scalars.read(workdir))


def run_trial(fault: Fault, number: int, workdir: str, reference: str, rng) -> Trial:
  name = re.sub(r"[^a-z0-9]+", "_", fault.name.lower()).strip("_")[:40]
  trial_dir = os.path.join(workdir, f"{name}_{fault.processes}_{number}")
  os.makedirs(trial_dir)
  how, last = fault.injection(trial_dir, fault.algorithm, fault.processes, rng)
  rerun = os.path.join(trial_dir, "rerun.log")
  run_dir = os.path.join(trial_dir, "run")
  processes = fault.rerun_processes or fault.processes
  code = inject.finish(run_dir, fault.algorithm, processes, rerun, *fault.rerun_flags)
  equal = None
  if code == 0:
    final = inject.final_state(run_dir)
    equal = all(
      np.array_equal(a, b) for a, b in zip(final, inject.final_state(reference), strict=True)
    )
  first = os.path.join(trial_dir, "first_rerun.log")
  set_aside = inject.grep(rerun, r"is corrupt: ") or (
    os.path.exists(first) and inject.grep(first, r"it was moved to")
  )
  history = logged(run_dir) == logged(reference) if fault.history and code == 0 else None
  return Trial(
    fault, number, how, last, inject.resumed_from(rerun), set_aside, code, equal, history
  )


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
  """What a fault's trials kept, in words: the newest checkpoint, the rerun, the final state."""
  fault, n = trials[0].fault, len(trials)
  parts = []
  lasts = sorted({t.last for t in trials if t.last is not None})
  if lasts:
    parts.append(f"the newest checkpoint at the fault ({', '.join(map(str, lasts))})")
  rerun = fault.rerun or "the same command"
  codes = sorted({t.code for t in trials})
  resumed = sorted({t.resumed for t in trials}, key=lambda step: (step == "-", step))
  said = f"{rerun} exits {'/'.join(map(str, codes))}"
  if resumed != ["-"]:
    said += f", resumed from {', '.join(resumed)}"
  parts.append(said)
  if any(t.set_aside for t in trials):
    parts.append(f"a corrupt checkpoint set aside in {sum(t.set_aside for t in trials)} of {n}")
  finished = [t for t in trials if t.equal is not None]
  if finished:
    equal = sum(t.equal for t in finished)
    failed = f" ({n - len(finished)} reruns did not finish)" if len(finished) < n else ""
    parts.append(f"final state bitwise equal to the uninterrupted run in {equal} of {n}{failed}")
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


def check_classes_section(doc: str) -> str:
  """The text of `doc`, which must hold the BEGIN ... END section (else one line, exit 2)."""
  if not os.path.isfile(doc):
    arguments.fail(f"--doc {doc!r} is not a file: give the document with the table's section")
  with open(doc) as f:
    text = f.read()
  if BEGIN not in text or END not in text:
    arguments.fail(f"--doc {doc!r} has no {BEGIN} ... {END} section to write the table into")
  return text


def write_classes(doc: str, lines: list[str], command: str) -> None:
  """Replaces the table between BEGIN and END in `doc`."""
  text = check_classes_section(doc)
  head, rest = text.split(BEGIN, 1)
  _, tail = rest.split(END, 1)
  body = "\n".join([f"Written by `{command}`.", "", *lines])
  with open(doc, "w") as f:
    f.write(f"{head}{BEGIN}\n{body}\n{END}{tail}")


def chosen_faults(only: str) -> list[Fault]:
  """The faults whose names contain one of `only`'s ;-separated parts (all for "");
  a part that names none is refused in one line."""
  if not only:
    return list(FAULTS)
  parts = only.split(";")
  unmatched = [part for part in parts if not part or not any(part in f.name for f in FAULTS)]
  if unmatched:
    arguments.fail(
      f"--only: {'; '.join(unmatched)!r} is in no fault's name; the faults: "
      + "; ".join(fault.name for fault in FAULTS)
    )
  return [fault for fault in FAULTS if any(part in fault.name for part in parts)]


def main() -> None:
  parser = arguments.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--workdir", default="runs/faults", type=arguments.directory("--workdir"))
  parser.add_argument("--trials", type=arguments.integer(1), default=3)
  parser.add_argument("--seed", type=arguments.integer(0), default=0)
  parser.add_argument(
    "--out",
    type=arguments.output_file("--out"),
    default=DEFAULT_OUT,
  )
  parser.add_argument(
    "--doc",
    type=arguments.output_file("--doc"),
    default=os.path.join(REPO, "docs", "faults.md"),
    help="the document whose table of fault classes is rewritten",
  )
  parser.add_argument(
    "--only", default="", help="the faults whose names contain one of these ;-separated parts"
  )
  args = parser.parse_args()
  faults = chosen_faults(args.only)
  if args.only and os.path.abspath(args.out) == os.path.abspath(DEFAULT_OUT):
    arguments.fail(f"--only runs some faults: give --out a table of its own, not {DEFAULT_OUT}")
  if not args.only:  # the doc's table lists every fault: --only leaves it alone
    check_classes_section(args.doc)  # now, not after the hours of trials
  arguments.check_overwritable(args.out, b"Written by `python studies/faults.py")
  rng = random.Random(args.seed)
  workdir_arg, args.workdir = args.workdir, os.path.abspath(args.workdir)
  fresh_workdir(args.workdir)
  references = {}
  trials = []
  for fault in faults:
    key = (fault.algorithm, fault.processes)
    if key not in references:
      reference = os.path.join(args.workdir, f"reference_{fault.algorithm}_{fault.processes}")
      if inject.finish(reference, *key, reference + ".log") != 0:
        raise RuntimeError(f"the uninterrupted {key} run failed; see {reference}.log")
      references[key] = reference
    for number in range(args.trials):
      trials.append(run_trial(fault, number, args.workdir, references[key], rng))
      print(f"{len(trials)}/{len(faults) * args.trials}: {trials[-1]}", flush=True)
  command = (
    f"python studies/faults.py --workdir {workdir_arg} --trials {args.trials} --seed {args.seed}"
    + (f" --only '{args.only}'" if args.only else "")
  )
  os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
  with open(args.out, "w") as f:
    f.write(f"Written by `{command}`.\n\n" + "\n".join(trials_table(trials)) + "\n")
  if args.only:
    print(f"wrote {args.out}; {args.doc}'s table of every fault left as it is (--only)")
    return
  write_classes(args.doc, classes_table(trials), command)
  print(f"wrote {args.out} and the table of {args.doc}")


if __name__ == "__main__":
  main()
