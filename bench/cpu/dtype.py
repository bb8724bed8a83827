"""LeNet-5's and ResNet-20's training steps computing in float32 and in bfloat16 (config.dtype).

    python bench/cpu/dtype.py [--models lenet5,resnet20] [--rounds 5] [--batch_size 128]

Each is a plain SGD step (float32 parameters, the model computing in the
dtype, the loss in float32), compiled with the project's options and timed
in interleaved rounds in one process; it prints the median images/s of each
and bfloat16's ratio to float32. bfloat16 is meant for accelerators, whose
matrix units take it at several times the float32 rate; a CPU without such
units converts it around every operation, so expect a ratio below 1 here.
"""

import jax
from peers import model_names
from variants import plain_sgd_step, print_rates, time_interleaved  # bench/cpu/variants.py

from easgd import arguments, models

STEPS = {"lenet5": 30, "resnet20": 3}
DTYPES = ("float32", "bfloat16")


def compiled_step(name: str, dtype: str, batch_size: int):
  """The compiled plain SGD step of network `name` computing in `dtype`, and its arguments."""
  return plain_sgd_step(models.get_model(name, 10, dtype), name, batch_size)


def main():
  parser = arguments.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--models", default="lenet5,resnet20", type=model_names)
  parser.add_argument("--rounds", type=arguments.integer(1), default=5)
  parser.add_argument("--batch_size", type=arguments.integer(1), default=128)
  args = parser.parse_args()
  print(f"device: {jax.devices()[0].device_kind}")
  for name in args.models:
    programs = {dtype: compiled_step(name, dtype, args.batch_size) for dtype in DTYPES}
    rates = time_interleaved(programs, STEPS[name], args.batch_size, args.rounds)
    print(
      f"\n{name}, batch {args.batch_size}: medians of {args.rounds} rounds of {STEPS[name]} steps"
    )
    print_rates("dtype", rates, "float32")


if __name__ == "__main__":
  main()
