"""Images/s of the sync rules on 8 virtual devices beside a plain single-device baseline.

    python bench/throughput.py [--workers 8] [--batch_size 32] [--steps 100] [--rounds 3]

The baseline is a minimal jit-compiled LeNet-5 SGD step on one device with
the same images per step (workers * batch_size) already on the device. All
variants are timed in the same run, in interleaved rounds (the machine is
shared and noisy); the median round is reported with its ratio to the
baseline's median.
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import argparse  # noqa: E402
import statistics  # noqa: E402
import time  # noqa: E402

import jax  # noqa: E402

jax.config.update("jax_num_cpu_devices", 8)

import jax.numpy as jnp  # noqa: E402
import optax  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

import models  # noqa: E402
from easgd import algorithms, data, rules, sharding, steps, trainer  # noqa: E402
from easgd.rules import AXIS  # noqa: E402


def timed(step_fn, state, args, num_steps):
  """Seconds for `num_steps` steps, blocking every 8 to bound queued programs."""
  state, out = step_fn(state, *args)  # warm-up (compiled already)
  jax.block_until_ready(out)
  start = time.perf_counter()
  for i in range(num_steps):
    state, out = step_fn(state, *args)
    if i % trainer.MAX_IN_FLIGHT == 0:
      jax.block_until_ready(out)
  jax.block_until_ready(out)
  return time.perf_counter() - start, state


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--workers", type=int, default=8)
  parser.add_argument("--batch_size", type=int, default=32)
  parser.add_argument("--steps", type=int, default=100)
  parser.add_argument("--rounds", type=int, default=3)
  args = parser.parse_args()

  dataset = data.load_dataset("mnist5k")
  model = models.get_model("lenet5", dataset.num_classes)
  params = model.init(jax.random.PRNGKey(0), jnp.zeros((1, 28, 28, 1)))["params"]
  loss_fn = steps.make_loss_fn(model, steps.make_normalize(dataset))
  images_per_step = args.workers * args.batch_size

  # Baseline: one device, one plain SGD step per dispatch on a resident batch.
  optimizer = optax.sgd(0.05)

  @jax.jit
  def baseline_step(state, images, labels):
    params, opt_state = state
    (loss, _), grads = jax.value_and_grad(loss_fn, has_aux=True)(
      params, {"image": images, "label": labels}
    )
    updates, opt_state = optimizer.update(grads, opt_state, params)
    return (optax.apply_updates(params, updates), opt_state), loss

  baseline_images = jnp.asarray(dataset.train_images[:images_per_step])
  baseline_labels = jnp.asarray(dataset.train_labels[:images_per_step])
  variants = {
    "baseline (1 device, plain jit)": (
      baseline_step,
      (jax.tree.map(jnp.copy, params), optimizer.init(params)),
      (baseline_images, baseline_labels),
    )
  }

  mesh = sharding.make_mesh(8)
  partitions = data.partition(dataset.train_images, dataset.train_labels, args.workers, 0)
  train_data = tuple(sharding.place(mesh, array, P(AXIS)) for array in partitions)
  for name, tau in (("sync_sgd", 1), ("sync_easgd", 1), ("sync_easgd", 4)):
    hyper = rules.Hyper(args.workers, 0.05, comm_period=tau, moving_rate=0.9 / args.workers)
    rule = algorithms.make_rule(name, hyper)
    state = steps.init_state(rule, params, jax.random.PRNGKey(1), mesh)
    step_fn = steps.build_train_step(rule, loss_fn, mesh, state, args.batch_size)
    label = f"{name} tau={tau}" if name != "sync_sgd" else name
    variants[label] = (step_fn, state, train_data)

  seconds = {label: [] for label in variants}
  for _ in range(args.rounds):
    for label, (step_fn, state, step_args) in variants.items():
      elapsed, new_state = timed(step_fn, state, step_args, args.steps)
      variants[label] = (step_fn, new_state, step_args)
      seconds[label].append(elapsed)

  rates = {
    label: args.steps * images_per_step / statistics.median(s) for label, s in seconds.items()
  }
  baseline = next(iter(rates.values()))
  print(
    f"LeNet-5, mnist5k, {args.workers} workers x batch {args.batch_size} "
    f"({images_per_step} images a step), 8 {jax.devices()[0].platform} devices, "
    f"{args.steps} steps x {args.rounds} rounds (median)"
  )
  print(f"{'variant':<32} {'images/s':>10} {'vs baseline':>12}")
  for label, rate in rates.items():
    print(f"{label:<32} {rate:>10.0f} {rate / baseline:>11.2f}x")


if __name__ == "__main__":
  main()
