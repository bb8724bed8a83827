"""XLA:CPU flags against the default, on the forward and backward passes.

    python bench/cpu/xla_flags.py [--models resnet20,lenet5] [--steps 3] [--only FLAGS]

Each setting of XLA_FLAGS runs in a process of its own (the flags are read
when JAX starts its backend) and times bench/cpu/peer_steps.py's plain jit step's
forward pass and forward + backward pass, batch 128, in ms a step. --only times
the default and the settings that contain one of its ;-separated parts.
"""

import argparse
import os
import subprocess
import sys

import peers  # bench/cpu/peers.py, beside this file (imports no JAX)

from easgd import arguments

SETTINGS = (
  "",
  "--xla_cpu_use_onednn=true",
  "--xla_cpu_use_xnnpack=true",
  "--xla_cpu_use_thunk_runtime=false",
)


def child(model_names, steps):
  import peer_steps  # noqa: PLC0415 (after XLA_FLAGS is set)

  cells = []
  for name in model_names:
    plain = peer_steps.jax_variant({"kind": "plain", "devices": 1, "options": True}, name, 128)
    seconds = plain["split"](steps)
    parts = [1e3 * seconds[part] / steps for part in ("forward", "forward+backward")]
    cells.append(f"{parts[0]:8.1f} / {parts[1]:7.1f}")
  print(" | ".join(cells), flush=True)


def settings(only: str) -> list[str]:
  """The default and the settings that contain one of `only`'s ;-separated parts (all for
  ""); a part that none contains is refused in one line."""
  if not only:
    return list(SETTINGS)
  parts = only.split(";")
  unmatched = [part for part in parts if not part or not any(part in s for s in SETTINGS[1:])]
  if unmatched:
    arguments.fail(
      f"--only: {'; '.join(unmatched)!r} is in no setting; they are: " + " ".join(SETTINGS[1:])
    )
  return [SETTINGS[0]] + [s for s in SETTINGS[1:] if any(part in s for part in parts)]


def main():
  parser = arguments.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--models", default="resnet20,lenet5", type=peers.model_names)
  parser.add_argument("--steps", type=arguments.integer(1), default=3)
  parser.add_argument(
    "--only", default="", help="the settings that contain one of these ;-separated parts"
  )
  parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
  args = parser.parse_args()
  names = args.models
  if args.child:
    child(names, args.steps)
    return
  chosen = settings(args.only)
  print(f"{'XLA_FLAGS':36} " + " | ".join(f"{n + ' fwd / fwd+bwd ms':>20}" for n in names))
  for flags in chosen:
    result = subprocess.run(
      [sys.executable, __file__, "--child", f"--models={','.join(names)}", f"--steps={args.steps}"],
      env=dict(os.environ, XLA_FLAGS=flags),
      capture_output=True,
      text=True,
      check=True,
    )
    print(f"{flags or '(default)':36} {result.stdout.strip()}")


if __name__ == "__main__":
  main()
