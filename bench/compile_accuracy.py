"""The default run's accuracy with and without the compiler options, over seeds.

    python bench/compile_accuracy.py [--seeds 0,1,2] [--workdir runs/compile_accuracy]

The options (easgd/infra/compile.py) send XLA:CPU's convolutions to other
kernels, which add in another order: the trajectory's last bits move. This
trains configs/default.py for each seed both ways and prints the final
center test accuracy of each, so that the change can be seen to be rounding
and not a change of what is trained.
"""

import argparse
import os
import statistics

import jax

jax.config.update("jax_num_cpu_devices", 8)

from absl import logging  # noqa: E402

from easgd import trainer  # noqa: E402
from easgd.configs import default  # noqa: E402
from easgd.infra import compile as compile_lib  # noqa: E402


def main():
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--seeds", default="0,1,2")
  parser.add_argument("--workdir", default="runs/compile_accuracy")
  args = parser.parse_args()
  logging.set_verbosity(logging.WARNING)
  project_options = dict(compile_lib.OPTIONS)
  seeds = [int(seed) for seed in args.seeds.split(",")]
  results = {}
  for label, options in (("XLA defaults", {}), ("project options", project_options)):
    compile_lib.OPTIONS.clear()
    compile_lib.OPTIONS.update(options)
    for seed in seeds:
      config = default.get_config()
      config.seed = seed
      workdir = os.path.join(args.workdir, label.replace(" ", "_"), str(seed))
      metrics = trainer.train_and_evaluate(config, workdir).metrics
      results[label, seed] = metrics["eval/center_accuracy"]
  print(f"{'compiled with':16}" + "".join(f"{f'seed {s}':>9}" for s in seeds) + f"{'mean':>9}")
  for label in ("XLA defaults", "project options"):
    values = [results[label, seed] for seed in seeds]
    print(f"{label:16}" + "".join(f"{v:9.3f}" for v in values) + f"{statistics.mean(values):9.4f}")


if __name__ == "__main__":
  main()
