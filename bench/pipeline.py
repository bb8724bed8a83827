"""The pipeline beside two ways of training the same M models, from one run.

    python bench/pipeline.py [--models 8] [--devices 8] [--batch_size 32] [--stage_steps 25]
        [--model lenet5]

M LeNet-5 models (--model mlp: the MLP) on mnist5k (4,000 training images), D
virtual CPU devices, each model trained with SGD at batch b:

  pipeline        each device trains its M/D models on its own partition
                  (N/D examples) for stage_steps steps, then the models move
                  one device along the ring (easgd/pipeline/programs.py);
  (a) one by one  the models one after another, each with sync_sgd on all D
                  devices (D workers of b/D examples: the same batch b), its
                  gradients all-reduced every step;
  (b) replicated  each device trains its M/D models on the whole training
                  set, replicated on every device; nothing moves.

For each: model-images/s (images trained on, summed over models, per second;
medians of interleaved rounds), bytes sent between devices per epoch (every
model sees N examples), read from the compiled program's collectives, and
bytes held per device: training data, and model state plus the step
program's temporaries (XLA's memory analysis). Bytes sent: a collective-permute sends its
buffer once from every device; a ring all-reduce of B bytes sends
2(D-1)/D * B from every device.
"""

import statistics
import sys
import time

import jax

jax.config.update("jax_num_cpu_devices", 8)

import numpy as np  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

from easgd import assembly, rules, steps  # noqa: E402
from easgd.arguments import ArgumentParser, integer  # noqa: E402
from easgd.configs import default  # noqa: E402
from easgd.data import batches, datasets  # noqa: E402
from easgd.infra import hlo, sharding  # noqa: E402
from easgd.infra.compile import compile_program  # noqa: E402
from easgd.pipeline import programs  # noqa: E402
from easgd.rules import AXIS  # noqa: E402
from easgd.rules.sync import SyncSGD  # noqa: E402

NAMES = {"lenet5": "LeNet-5", "mlp": "MLP"}


def sent_bytes(compiled, num_devices: int) -> int:
  """Bytes one run of `compiled` sends between devices, all devices together."""
  total = 0
  for kind, size in hlo.collectives(compiled.as_text()):
    if kind == "all-reduce":
      total += 2 * (num_devices - 1) * size  # D devices x 2(D-1)/D x B
    else:
      total += num_devices * size
  return total


def on_device(*trees) -> int:
  """Bytes of device 0's shards of `trees`."""
  return sum(
    leaf.addressable_shards[0].data.nbytes for tree in trees for leaf in jax.tree.leaves(tree)
  )


def held_bytes(compiled, images, labels, state) -> tuple[int, int]:
  """(training data, model state + the program's temporaries) on device 0."""
  return on_device(images, labels), on_device(state) + compiled.memory_analysis().temp_size_in_bytes


def rate(run, rounds: int) -> float:
  """Median over rounds of images/s; run() -> images of one timed call (blocking)."""
  run()  # warm-up
  rates = []
  for _ in range(rounds):
    start = time.perf_counter()
    images = run()
    rates.append(images / (time.perf_counter() - start))
  return statistics.median(rates)


def main():
  parser = ArgumentParser(prog="bench/pipeline.py", description=__doc__.splitlines()[0])
  parser.add_argument("--models", type=integer(1), default=8)
  parser.add_argument("--devices", type=integer(1), default=8)
  parser.add_argument("--batch_size", type=integer(1), default=32)
  parser.add_argument("--stage_steps", type=integer(1), default=25)
  parser.add_argument("--rounds", type=integer(1), default=3)
  parser.add_argument("--model", choices=tuple(NAMES), default="lenet5")
  args = parser.parse_args()
  num_models, num_devices, batch = args.models, args.devices, args.batch_size
  if num_models % num_devices or batch % num_devices:
    sys.exit("error: --models and --batch_size must be multiples of --devices")

  dataset = datasets.load_dataset("mnist5k")
  # The network in float32, as train.py builds it.
  config = default.get_config()
  config.model, config.dtype = args.model, "float32"
  built = assembly.for_dataset(config, dataset)
  loss_fn, init_params = built.loss_fn, built.init_params

  mesh = sharding.make_mesh(num_devices)
  examples = len(dataset.train_labels)
  steps_per_epoch = examples // batch  # of one model
  hypers = (
    np.arange(num_models, dtype=np.int32),
    np.full(num_models, 0.05, np.float32),
    np.zeros(num_models, np.float32),
    np.zeros(num_models, np.float32),
    np.full(num_models, 0.9, np.float32),
    np.full(num_models, 0.999, np.float32),
  )
  results = {}

  # The pipeline, and (b): its local steps on the replicated training set, no moves.
  partitions = batches.partition(dataset.train_images, dataset.train_labels, num_devices, 0)
  replicated = tuple(
    np.broadcast_to(array[None], (num_devices, *array.shape))
    for array in (dataset.train_images, dataset.train_labels)
  )
  stages_per_epoch = steps_per_epoch / args.stage_steps
  for label, arrays, moves in (
    ("pipeline", partitions, True),
    ("(b) replicated", replicated, False),
  ):
    runner = programs.Pipeline(num_models, num_devices, args.stage_steps)
    state = programs.init_state(runner, init_params, hypers, mesh)
    images, labels = (sharding.place(mesh, array, P(AXIS)) for array in arrays)
    step = programs.build_step(runner, loss_fn, mesh, state, batch)
    step = compile_program(step.lower(state, images, labels), "cpu")
    move = compile_program(programs.build_move(runner, mesh, state).lower(state), "cpu")
    holder = {"state": state}

    def run(holder=holder, step=step, move=move, images=images, labels=labels, moves=moves):
      # One stage: stage_steps steps of every model, then (pipeline) the move.
      for _ in range(args.stage_steps):
        holder["state"], out = step(holder["state"], images, labels)
      if moves:
        holder["state"] = move(holder["state"])
      jax.block_until_ready(holder["state"])
      return num_models * args.stage_steps * batch

    sent = (sent_bytes(move, num_devices) if moves else 0) + sent_bytes(step, num_devices)
    results[label] = (
      run,
      sent * stages_per_epoch,
      held_bytes(step, images, labels, state),
    )

  # (a): one model at a time, sync_sgd over all devices with the same batch.
  rule = SyncSGD(rules.Hyper(num_devices, 0.05))
  params = jax.jit(init_params)(jax.random.PRNGKey(0))  # one program, as train.py's
  state = steps.init_state(rule, params, jax.random.PRNGKey(1), mesh)
  images, labels = (sharding.place(mesh, array, P(AXIS)) for array in partitions)
  step = steps.build_train_step(rule, loss_fn, mesh, state, batch // num_devices)
  compiled = compile_program(step.lower(state, images, labels, {}), "cpu")
  holder = {"state": state}

  def run_one_by_one(holder=holder):
    # Every model in turn for the steps the pipeline gives each model in a stage
    # (one model's state stands in for all: their cost is the same).
    for _ in range(num_models):
      for n in range(args.stage_steps):
        holder["state"], out = compiled(holder["state"], images, labels, {})
        if n % 8 == 7:
          jax.block_until_ready(out)  # bounds the programs in flight
      jax.block_until_ready(out)
    return num_models * args.stage_steps * batch

  results["(a) one by one, sync_sgd"] = (
    run_one_by_one,
    sent_bytes(compiled, num_devices) * steps_per_epoch * num_models,
    held_bytes(compiled, images, labels, state),
  )

  rates = {label: [] for label in results}
  run_one = {label: run for label, (run, _, _) in results.items()}
  for _ in range(args.rounds):
    for label, run in run_one.items():
      rates[label].append(rate(run, 1))
  baseline = statistics.median(rates["(a) one by one, sync_sgd"])
  print(
    f"{num_models} {NAMES[args.model]} models, mnist5k ({examples} images), "
    f"{num_devices} cpu devices, batch {batch} a model, {args.stage_steps} steps a stage, "
    f"medians of {args.rounds} rounds"
  )
  print(
    f"{'variant':26s} {'model-images/s':>14s} {'vs (a)':>7s} {'MB sent/epoch':>14s} "
    f"{'data MB/device':>15s} {'state+temp MB/device':>21s}"
  )
  for label, (_, sent, (data_bytes, other_bytes)) in results.items():
    median = statistics.median(rates[label])
    print(
      f"{label:26s} {median:14.0f} {median / baseline:6.2f}x {sent / 1e6:14.2f} "
      f"{data_bytes / 1e6:15.2f} {other_bytes / 1e6:21.2f}"
    )


if __name__ == "__main__":
  main()
