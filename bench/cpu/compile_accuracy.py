"""The default run's accuracy under the changes that move its last bits, over seeds.

    python bench/cpu/compile_accuracy.py [--seeds 0,1,2] [--workdir runs/compile_accuracy]
        [--steps N] [--variants xla_defaults,options,options_shifted_conv1]

Two changes make XLA:CPU add a step's products in another order, so that
the trajectory's last bits move: the compiler options (easgd/infra/compile.py
sends convolutions to other kernels) and LeNet-5's first convolution as
shifted products (models/layers.py). This trains configs/default.py for each
seed three ways, XLA's defaults, the options with XLA's first convolution,
and both (the project as it is), and prints the final center test accuracy
of each, so that the changes can be seen to be rounding and not a change of
what is trained. --variants trains some of the three (named by their run
directories).
"""

import argparse
import os
import statistics

import jax

jax.config.update("jax_num_cpu_devices", 8)

from absl import logging  # noqa: E402
from jax import lax  # noqa: E402

from easgd import arguments  # noqa: E402
from easgd.configs import default  # noqa: E402
from easgd.infra import compile as compile_lib  # noqa: E402
from easgd.models import layers, lenet  # noqa: E402
from easgd.train import trainer  # noqa: E402

# label: (run directory, compiler options, LeNet-5's first convolution)
VARIANTS = {
  "XLA defaults": ("xla_defaults", {}, lax.conv_general_dilated),
  "options, XLA's conv1": ("options", dict(compile_lib.OPTIONS), lax.conv_general_dilated),
  "options, shifted conv1": (
    "options_shifted_conv1",
    dict(compile_lib.OPTIONS),
    layers.conv_general_dilated,
  ),
}


def seeds(text: str) -> list[int]:
  try:
    values = [int(seed) for seed in text.split(",")]
  except ValueError:
    raise argparse.ArgumentTypeError(
      f"{text!r} is not a comma-separated list of integers"
    ) from None
  if len(set(values)) < len(values):
    raise argparse.ArgumentTypeError(f"{text!r} repeats a seed: each is a run of its own")
  return values


def main():
  parser = arguments.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--seeds", default="0,1,2", type=seeds)
  parser.add_argument("--workdir", default="runs/compile_accuracy")
  parser.add_argument(
    "--steps", type=arguments.integer(1), help="run.total_steps (default: the default run's)"
  )
  directories = tuple(directory for directory, _, _ in VARIANTS.values())
  parser.add_argument(
    "--variants", type=arguments.some_of(directories), default=directories, help="the ways"
  )
  args = parser.parse_args()
  chosen = {label: variant for label, variant in VARIANTS.items() if variant[0] in args.variants}
  arguments.check_workdir(args.workdir)
  if os.path.isdir(args.workdir) and os.listdir(args.workdir):
    # An existing run directory would be resumed, with whatever code wrote it.
    arguments.fail(f"--workdir={args.workdir!r} is not empty: give a new directory")
  logging.set_verbosity(logging.WARNING)
  results = {}
  for label, (directory, options, conv) in chosen.items():
    compile_lib.OPTIONS.clear()
    compile_lib.OPTIONS.update(options)
    lenet.conv_general_dilated = conv  # read when LeNet-5 is traced
    for seed in args.seeds:
      config = default.get_config()
      config.seed = seed
      if args.steps:
        config.run.total_steps = args.steps
        config.run.log_every = config.run.eval_every = config.run.checkpoint_every = 0
      workdir = os.path.join(args.workdir, directory, str(seed))
      metrics = trainer.train_and_evaluate(config, workdir).metrics
      results[label, seed] = metrics["eval/center_accuracy"]
  print(f"{'':24}" + "".join(f"{f'seed {s}':>9}" for s in args.seeds) + f"{'mean':>9}")
  for label in chosen:
    values = [results[label, seed] for seed in args.seeds]
    print(f"{label:24}" + "".join(f"{v:9.3f}" for v in values) + f"{statistics.mean(values):9.4f}")


if __name__ == "__main__":
  main()
