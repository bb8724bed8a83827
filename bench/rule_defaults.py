"""Every rule of the registry on the default config, with nothing set but the rule.

    python bench/rule_defaults.py [--rules sync_easgd,async_sgd] [--steps 600]

Runs `python train.py --config configs/default.py --config.algorithm=RULE`
for each rule (each in a process of its own, as a user would) and prints the
rule's own defaults (`Rule.defaults`, the fields where the default config's
value would fail it), its final center test accuracy and the run's wall-clock
seconds. The default run's band is >= 0.95 at the end; every rule should be
in it. tests/train/test_rule_defaults.py runs them on a short schedule.
"""

import re
import subprocess
import sys
import tempfile
import time

from easgd import rules
from easgd.arguments import ArgumentParser, integer

DONE = re.compile(r"eval/center_accuracy ([0-9.]+)")
BAND = 0.95


def run(rule: str, steps: int, workdir: str) -> tuple[float, float]:
  """The final center accuracy and the seconds of one train.py run."""
  command = [
    sys.executable,
    "train.py",
    "--config",
    "configs/default.py",
    f"--config.algorithm={rule}",
    f"--config.run.total_steps={steps}",
    f"--workdir={workdir}",
  ]
  start = time.perf_counter()
  done = subprocess.run(command, capture_output=True, text=True, check=False)
  seconds = time.perf_counter() - start
  found = DONE.findall(done.stderr)
  if done.returncode != 0 or not found:
    last = (done.stderr.strip().splitlines() or ["(no output)"])[-1]
    raise SystemExit(f"{rule}: train.py exited {done.returncode}: {last}")
  return float(found[-1]), seconds


def main() -> None:
  parser = ArgumentParser(prog="bench/rule_defaults.py", description=__doc__.split("\n")[0])
  parser.add_argument("--rules", default=",".join(rules.RULES), help="comma-separated rules")
  parser.add_argument("--steps", type=integer(1), default=600, help="run.total_steps")
  args = parser.parse_args()
  names = args.rules.split(",")
  unknown = [name for name in names if name not in rules.RULES]
  if unknown:
    parser.error(f"--rules={args.rules!r} is invalid: valid: {', '.join(rules.RULES)}")
  print(f"| rule | its own defaults | center accuracy at step {args.steps} | seconds |")
  print("| --- | --- | --- | --- |")
  outside = []
  for name in names:
    with tempfile.TemporaryDirectory() as workdir:
      accuracy, seconds = run(name, args.steps, workdir)
    own = ", ".join(f"{path}={value}" for path, value in rules.RULES[name].defaults.items())
    print(f"| {name} | {own or '-'} | {accuracy:.3f} | {seconds:.0f} |", flush=True)
    if accuracy < BAND:
      outside.append(name)
  print(f"below {BAND}: {', '.join(outside) or 'none'}")


if __name__ == "__main__":
  main()
