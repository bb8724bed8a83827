"""Whether two runs of one config end with the same bits, with and without XLA:GPU's
deterministic ops.

    python bench/gpu_determinism.py [--steps 40] [--workers 4] [--model lenet5]
        [--deterministic both]

Runs `python train.py` with the default config (LeNet-5 on mnist5k, sync_easgd;
--model mlp, a smaller one) twice with the deterministic ops train.py sets on a
GPU (easgd/infra/platform.py), and twice with them turned off
(XLA_FLAGS=--xla_gpu_deterministic_ops=false, which train.py keeps), then
compares the final checkpoints leaf by leaf (--deterministic true or false: that
pair alone). On a CPU both pairs are equal (XLA:CPU is deterministic; the flag
is XLA:GPU's). On a GPU, the pair without the flag shows what a user would
lose: bench/README.md, "On one GPU".
"""

import os
import subprocess
import sys
import tempfile

import numpy as np

from easgd.arguments import ArgumentParser, integer
from easgd.infra import checkpoint

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def train(workdir: str, steps: int, workers: int, model: str, deterministic: bool) -> None:
  env = dict(os.environ)
  if not deterministic:
    env["XLA_FLAGS"] = f"{env.get('XLA_FLAGS', '')} --xla_gpu_deterministic_ops=false".strip()
  flags = [
    f"--config.run.total_steps={steps}",
    f"--config.run.checkpoint_every={steps}",
    f"--config.run.eval_every={steps}",
    f"--config.run.log_every={steps}",
    f"--config.workers={workers}",
    f"--config.model={model}",
  ]
  command = [sys.executable, "train.py", "--config", "configs/default.py", f"--workdir={workdir}"]
  subprocess.run([*command, *flags], cwd=REPO, env=env, check=True, capture_output=True)


def main():
  parser = ArgumentParser(prog="bench/gpu_determinism.py", description=__doc__.splitlines()[0])
  parser.add_argument("--steps", type=integer(1), default=40)
  parser.add_argument("--workers", type=integer(1), default=4)
  parser.add_argument("--model", choices=("lenet5", "mlp"), default="lenet5")
  parser.add_argument(
    "--deterministic", choices=("both", "true", "false"), default="both", help="the pairs run"
  )
  args = parser.parse_args()
  pairs = {"both": (True, False), "true": (True,), "false": (False,)}[args.deterministic]
  print(f"{'deterministic ops':<18} {'leaves differing':>17} {'largest difference':>19}")
  with tempfile.TemporaryDirectory() as root:
    for deterministic in pairs:
      runs = [os.path.join(root, f"{deterministic}_{n}") for n in range(2)]
      for workdir in runs:
        train(workdir, args.steps, args.workers, args.model, deterministic)
      a, b = (checkpoint.saved_leaves(workdir, args.steps) for workdir in runs)
      differing = sum(x.tobytes() != y.tobytes() for x, y in zip(a, b, strict=True))
      largest = max(
        float(np.max(np.abs(x.astype(np.float64) - y))) for x, y in zip(a, b, strict=True)
      )
      print(f"{str(deterministic):<18} {f'{differing} of {len(a)}':>17} {largest:>19.3g}")


if __name__ == "__main__":
  main()
