"""The cost of config.deterministic_sums: sums over workers in worker order.

    python bench/deterministic_sums.py [--workers 8] [--batch_size 32] [--steps 100] [--rounds 3]
        [--variants "sync_easgd tau=1,sync_easgd tau=4,sync_sgd"]

Times sync_easgd and sync_sgd on LeNet-5 over 8 virtual CPU devices with the
all-reduce (lax.psum, the default) and with the ordered sum (an all-gather,
then x_0 + x_1 + ... + x_{P-1} on every device), at tau = 1 (an exchange
every step) and tau = 4. The variants are timed in the same run, in
interleaved rounds (the machine is shared and noisy); each line gives the
median round's images/s and the ordered sum's ratio to the all-reduce's.
--variants times some of them.
"""

import statistics

import jax

jax.config.update("jax_num_cpu_devices", 8)

from jax.sharding import PartitionSpec as P  # noqa: E402
from throughput import timed  # noqa: E402 (bench/throughput.py, beside this script)

from easgd import assembly, rules, steps  # noqa: E402
from easgd.arguments import ArgumentParser, integer, some_of  # noqa: E402
from easgd.configs import default  # noqa: E402
from easgd.data import batches, datasets  # noqa: E402
from easgd.infra import sharding  # noqa: E402
from easgd.infra.compile import compile_program  # noqa: E402
from easgd.rules import AXIS  # noqa: E402
from easgd.sim import ticks  # noqa: E402

VARIANTS = [("sync_easgd", 1), ("sync_easgd", 4), ("sync_sgd", 0)]


def label(name: str, tau: int) -> str:
  return f"{name} tau={tau}" if tau else name


def main():
  parser = ArgumentParser(prog="bench/deterministic_sums.py", description=__doc__.splitlines()[0])
  parser.add_argument("--workers", type=integer(1), default=8)
  parser.add_argument("--batch_size", type=integer(1), default=32)
  parser.add_argument("--steps", type=integer(1), default=100)
  parser.add_argument("--rounds", type=integer(1), default=3)
  labels = tuple(label(name, tau) for name, tau in VARIANTS)
  parser.add_argument("--variants", type=some_of(labels), default=labels)
  args = parser.parse_args()
  variants = [(name, tau) for name, tau in VARIANTS if label(name, tau) in args.variants]
  if args.workers % 8:  # the 8 virtual devices, each with as many workers
    parser.error(f"--workers={args.workers} is invalid: must be a multiple of 8 (the devices)")

  dataset = datasets.load_dataset("mnist5k")
  # LeNet-5 in float32, as train.py builds it.
  config = default.get_config()
  config.model, config.dtype = "lenet5", "float32"
  built = assembly.for_dataset(config, dataset)
  # One program, as train.py compiles it (and shares through the compilation cache).
  params, loss_fn = jax.jit(built.init_params)(jax.random.PRNGKey(0)), built.loss_fn
  mesh = sharding.make_mesh(8)
  partitions = batches.partition(dataset.train_images, dataset.train_labels, args.workers, 0)
  images, labels = (sharding.place(mesh, array, P(AXIS)) for array in partitions)
  platform = jax.devices()[0].platform
  images_per_step = args.workers * args.batch_size

  programs = {}
  for name, tau in variants:
    for ordered in (False, True):
      hyper = rules.Hyper(
        args.workers,
        0.05,
        comm_period=max(tau, 1),
        moving_rate=0.9 / args.workers,
        deterministic_sums=ordered,
      )
      rule = rules.make_rule(name, hyper)
      state = steps.init_state(rule, params, jax.random.PRNGKey(1), mesh)
      step_fn = steps.build_train_step(rule, loss_fn, mesh, state, args.batch_size)
      empty = rule.tick_inputs(ticks.Tick.empty(args.workers))
      step_fn = compile_program(step_fn.lower(state, images, labels, empty), platform)

      def next_args(empty=empty):
        return (images, labels, empty), images_per_step

      programs[name, tau, ordered] = (step_fn, state, next_args)

  rates = {key: [] for key in programs}
  for _ in range(args.rounds):
    for key, (step_fn, state, next_args) in programs.items():
      seconds, counted, after = timed(step_fn, state, next_args, args.steps)
      programs[key] = (step_fn, after, next_args)
      rates[key].append(counted / seconds)

  print(f"LeNet-5, {args.workers} workers x {args.batch_size} images on 8 CPU devices")
  print(f"(median of {args.rounds} rounds of {args.steps} steps)")
  for name, tau in variants:
    psum = statistics.median(rates[name, tau, False])
    ordered = statistics.median(rates[name, tau, True])
    print(
      f"{label(name, tau):16s} all-reduce {psum:8.0f} img/s   worker order {ordered:8.0f} img/s"
      f"   ratio {ordered / psum:.3f}"
    )


if __name__ == "__main__":
  main()
