"""Images/s of streamed input against data placed on the devices, and of the input alone.

    python bench/stream.py [--models lenet5,resnet20] [--workers 2] [--batch_size 128]
                           [--rounds 5]

For each network a records folder of generated images of its dataset's
shape (MNIST's 28x28x1 for LeNet-5, CIFAR's 32x32x3 for ResNet-20) is written
to a temporary folder; the same sync_easgd run (tau 4, `--workers` workers on
as many devices, `--batch_size` a worker) is then set up twice through the
training loop's own setup, with data.source=device and data.source=stream,
and both are stepped as train.py steps them, in interleaved rounds. The
third row reads and places the streamed batches alone (no training step).
It prints the medians and the ratio to the placed run.
"""

import argparse
import os
import statistics
import tempfile
import time

import jax

from easgd import arguments

ROWS = ("device", "stream", "input alone")
SHAPES = {"lenet5": (28, 28, 1), "resnet20": (32, 32, 3)}
# Steps a round: a few seconds of each.
STEPS = {"lenet5": 40, "resnet20": 4}


def _model_names(text: str) -> list[str]:
  """--models: networks of SHAPES, comma-separated."""
  names = text.split(",") if text else []
  unknown = [name for name in names if name not in SHAPES]
  if not names or unknown:
    given = ",".join(unknown) + " is not a network here" if unknown else "is empty"
    raise argparse.ArgumentTypeError(f"{given}; choose from {','.join(SHAPES)}")
  return names


def _records(folder: str, shape, count: int) -> None:
  import numpy as np  # noqa: PLC0415

  from easgd.data import convert  # noqa: PLC0415

  rng = np.random.default_rng(0)
  splits = {
    split: (rng.integers(0, 256, (n, *shape), np.uint8), rng.integers(0, 10, n, np.int32))
    for split, n in (("train", count), ("test", 100))
  }
  convert.write(folder, splits, 10, 255.0)


def _trainee(name, folder, source, args, workdir):
  from easgd.configs import default  # noqa: PLC0415
  from easgd.train import setup as setup_lib  # noqa: PLC0415
  from easgd.train import trainer  # noqa: PLC0415

  config = default.get_config()
  config.update_from_flattened_dict(
    {
      "model": name,
      "workers": args.workers,
      "run.devices": args.workers,
      "data.dataset": "records",
      "run.data_dir": folder,
      "data.source": source,
      "data.batch_size": args.batch_size,
      "run.total_steps": 10**6,
    }
  )
  runtime_class = trainer.check(config)
  runtime = runtime_class(setup_lib.setup(config, workdir, runtime_class))
  return runtime.trainee(runtime.init_state(), None, None)


def _time_steps(trainee, count: int) -> float:
  start = time.perf_counter()
  for done in range(1, count + 1):
    trainee.step()
    if done % 8 == 0:  # a bounded queue of programs with collectives (easgd.train.loop)
      jax.block_until_ready(trainee.state)
  jax.block_until_ready(trainee.state)
  return time.perf_counter() - start


def _time_input(trainee, count: int) -> float:
  # Moves the trainee's host steps ahead of its state's: its later timed steps
  # read other batches than a run would, which changes no timing.
  streamer = trainee.streamer
  start = time.perf_counter()
  for _ in range(count):
    batches = streamer.batches(trainee.host_steps)
    trainee.host_steps = trainee.host_steps + 1
  jax.block_until_ready(batches)
  return time.perf_counter() - start


def main():
  parser = arguments.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--models", default="lenet5,resnet20", type=_model_names)
  parser.add_argument("--workers", type=arguments.integer(1), default=2)
  parser.add_argument("--batch_size", type=arguments.integer(1), default=128)
  parser.add_argument("--rounds", type=arguments.integer(1), default=5)
  args = parser.parse_args()
  jax.config.update("jax_num_cpu_devices", args.workers)
  from absl import logging  # noqa: PLC0415

  logging.set_verbosity(logging.WARNING)
  print(time.strftime("%Y-%m-%d %H:%M"), f"load average {os.getloadavg()[0]:.2f}")
  with tempfile.TemporaryDirectory() as temp:
    for name in args.models:
      folder = os.path.join(temp, f"{name}_records")
      count = args.workers * args.batch_size * 50
      _records(folder, SHAPES[name], count)
      placed = _trainee(name, folder, "device", args, os.path.join(temp, f"{name}_d"))
      streamed = _trainee(name, folder, "stream", args, os.path.join(temp, f"{name}_s"))
      steps = STEPS[name]
      for trainee in (placed, streamed):
        _time_steps(trainee, 2)  # warm-up
      rates = {row: [] for row in ROWS}
      images = steps * args.workers * args.batch_size
      for _ in range(args.rounds):
        rates["device"].append(images / _time_steps(placed, steps))
        rates["stream"].append(images / _time_steps(streamed, steps))
        rates["input alone"].append(images / _time_input(streamed, steps))
      for trainee in (placed, streamed):
        trainee.close()
      print(
        f"\n{name}, sync_easgd, {args.workers} workers on {args.workers} devices, batch "
        f"{args.batch_size} a worker, {count} records; medians of {args.rounds} rounds of "
        f"{steps} steps"
      )
      print("| source | images/s | vs device |\n| --- | --- | --- |")
      base = statistics.median(rates["device"])
      for row, values in rates.items():
        rate = statistics.median(values)
        print(f"| {row} | {rate:.0f} | {rate / base:.2f}x |")


if __name__ == "__main__":
  main()
