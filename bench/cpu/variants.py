"""LeNet-5's and ResNet-20's training steps with each of their CPU speed changes off and on.

    python bench/cpu/variants.py [--models lenet5,resnet20] [--rounds 5] [--batch_size 128]

The changes (models/layers.py), each leaving the network's parameters alone:
  LeNet-5   the 2x2 max-pool as reshape + max with reduce_window's gradient
            bits (`pool`), the one-channel first convolution as shifted
            products (`conv1`), its output materialized (`materialize`);
  ResNet-20 every convolution's input materialized (`materialize`),
            BatchNorm with its statistics and gradient written out
            (models/batch_norm.py, `batch_norm`; off: Flax's nn.BatchNorm).
Every variant is a plain SGD step compiled with the project's options, timed
in interleaved rounds in one process; it prints the median images/s of each
and the ratio to the first (every change off). The variants are made by
swapping the layer functions the model modules read when they are traced.
"""

import statistics
import time

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from peer_steps import SHAPES  # bench/cpu/peer_steps.py, beside this file
from peers import model_names

from easgd import arguments, steps
from easgd.infra.compile import compile_program
from easgd.models import batch_norm, layers, lenet, resnet
from easgd.rules import model_state

STEPS = {"lenet5": 30, "resnet20": 3}


def _identity(x):
  return x


# label: {module attribute: layer}, applied to the model's module while it is traced.
VARIANTS = {
  "lenet5": {
    "none (reduce_window pool, XLA's conv1)": {
      "pool": layers.reduce_window_max_pool_2x2,
      "conv1": lax.conv_general_dilated,
      "materialize": _identity,
    },
    "pool": {
      "pool": layers.max_pool_2x2,
      "conv1": lax.conv_general_dilated,
      "materialize": _identity,
    },
    "pool, materialize": {
      "pool": layers.max_pool_2x2,
      "conv1": lax.conv_general_dilated,
      "materialize": layers.materialize,
    },
    "pool, conv1, materialize (the default)": {
      "pool": layers.max_pool_2x2,
      "conv1": layers.conv_general_dilated,
      "materialize": layers.materialize,
    },
  },
  "resnet20": {
    "none": {"materialize": _identity, "BatchNorm": nn.BatchNorm},
    "materialize": {"materialize": layers.materialize, "BatchNorm": nn.BatchNorm},
    "materialize, batch_norm (the default)": {
      "materialize": layers.materialize,
      "BatchNorm": batch_norm.BatchNorm,
    },
  },
}


def plain_sgd_step(model, name: str, batch_size: int):
  """The compiled plain SGD step (learning rate 0.1) of `model` on random batches of
  network `name`'s shape, and its arguments: (compiled, tree, images, labels)."""
  shape = SHAPES[name]
  rng = np.random.default_rng(0)
  images = jnp.asarray(rng.integers(0, 256, (batch_size, *shape), np.uint8))
  labels = jnp.asarray(rng.integers(0, 10, batch_size, np.int32))
  tree = model_state.model_tree(jax.jit(model.init)(jax.random.PRNGKey(0), jnp.zeros((1, *shape))))
  loss_fn = steps.make_loss_fn(model, lambda x: x.astype(jnp.float32) / 255.0)

  def step(tree, images, labels):
    (_, aux), grads = jax.value_and_grad(loss_fn, has_aux=True)(
      tree, {"image": images, "label": labels}
    )
    updates = jax.tree.map(lambda g: -0.1 * g, grads)
    return jax.tree.map(jnp.add, tree, model_state.stats_step(updates, tree, aux))

  lowered = jax.jit(step, donate_argnums=0).lower(tree, images, labels)
  return compile_program(lowered, jax.devices()[0].platform), tree, images, labels


def compiled_step(name: str, swaps: dict, batch_size: int):
  """The compiled plain SGD step of network `name` with `swaps`, and its arguments."""
  module = lenet if name == "lenet5" else resnet
  saved = {attribute: getattr(module, attribute) for attribute in ("materialize",)}
  pool = swaps.get("pool", layers.max_pool_2x2)
  if name == "lenet5":
    saved["conv_general_dilated"] = module.conv_general_dilated
    module.conv_general_dilated = swaps["conv1"]
    model = lenet.LeNet5(num_classes=10, pool=pool)
  else:
    saved["BatchNorm"] = module.BatchNorm
    module.BatchNorm = swaps["BatchNorm"]
    model = resnet.ResNet(num_classes=10)
  module.materialize = swaps["materialize"]
  try:
    return plain_sgd_step(model, name, batch_size)  # traced here, with the swaps in place
  finally:
    for attribute, value in saved.items():
      setattr(module, attribute, value)


def main():
  parser = arguments.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--models", default="lenet5,resnet20", type=model_names)
  parser.add_argument("--rounds", type=arguments.integer(1), default=5)
  parser.add_argument("--batch_size", type=arguments.integer(1), default=128)
  args = parser.parse_args()
  for name in args.models:
    programs = {
      label: compiled_step(name, swaps, args.batch_size) for label, swaps in VARIANTS[name].items()
    }
    rates = time_interleaved(programs, STEPS[name], args.batch_size, args.rounds)
    print(
      f"\n{name}, batch {args.batch_size}: medians of {args.rounds} rounds of {STEPS[name]} steps"
    )
    print_rates("changes on", rates, "none")


def time_interleaved(programs: dict, count: int, batch_size: int, rounds: int) -> dict:
  """{label: images/s of each round} of compiled steps (label: (compiled, state, images,
  labels)) timed `count` steps a round, the labels interleaved in every round."""
  programs = {label: list(program) for label, program in programs.items()}
  rates = {label: [] for label in programs}
  for _ in range(rounds):
    for label, program in programs.items():
      compiled, state, images, labels = program
      state = compiled(state, images, labels)  # warm-up
      jax.block_until_ready(state)
      start = time.perf_counter()
      for _ in range(count):
        state = compiled(state, images, labels)
      jax.block_until_ready(state)
      rates[label].append(count * batch_size / (time.perf_counter() - start))
      program[1] = state
  return rates


def print_rates(column: str, rates: dict, base_name: str) -> None:
  """A table of the medians of `rates`, each as a ratio to the first row's."""
  print(f"| {column} | images/s | vs {base_name} |\n| --- | --- | --- |")
  base = statistics.median(next(iter(rates.values())))
  for label, values in rates.items():
    rate = statistics.median(values)
    print(f"| {label} | {rate:.0f} | {rate / base:.2f}x |")


if __name__ == "__main__":
  main()
