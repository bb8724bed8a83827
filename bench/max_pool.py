"""LeNet-5's training step with its 2x2 max-pool as reduce_window and as reshape + max.

    python bench/max_pool.py [--batch_size 128] [--steps 30] [--rounds 3]

Both variants are the same network and SGD step (models/layers.py's
`max_pool_2x2` has the same values and gradient bits as `nn.max_pool`),
compiled with the project's options (easgd/infra/compile.py) and timed in
interleaved rounds in one run; it prints the median images/s of each, the
ratio, and the pooling layers' backward pass alone.
"""

import argparse
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np

from easgd import steps
from easgd.infra.compile import compile_program
from easgd.models.layers import max_pool_2x2, reduce_window_max_pool_2x2
from easgd.models.lenet import LeNet5


def step_program(pool, batch_size):
  """A compiled SGD step of LeNet-5 whose max-pools are `pool`, and its arguments."""
  model = LeNet5(num_classes=10, pool=pool)
  rng = np.random.default_rng(0)
  images = jnp.asarray(rng.integers(0, 256, (batch_size, 28, 28, 1), np.uint8))
  labels = jnp.asarray(rng.integers(0, 10, batch_size, np.int32))
  params = model.init(jax.random.PRNGKey(0), jnp.zeros((1, 28, 28, 1)))["params"]
  loss_fn = steps.make_loss_fn(model, lambda x: x.astype(jnp.float32) / 255.0)

  def step(params, images, labels):
    grads = jax.grad(lambda p: loss_fn(p, {"image": images, "label": labels})[0])(params)
    return jax.tree.map(lambda p, g: p - 0.1 * g, params, grads)

  lowered = jax.jit(step, donate_argnums=0).lower(params, images, labels)
  return compile_program(lowered, "cpu"), params, images, labels


def pool_backward(pool, shape):
  """The compiled backward pass of one pooling layer on `shape` inputs."""
  x = jnp.asarray(np.random.default_rng(1).normal(size=shape), jnp.float32)
  grad = jax.jit(jax.grad(lambda x: (pool(x) ** 2).sum()))
  return compile_program(grad.lower(x), "cpu"), x


def main():
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--batch_size", type=int, default=128)
  parser.add_argument("--steps", type=int, default=30)
  parser.add_argument("--rounds", type=int, default=3)
  args = parser.parse_args()
  variants = {"reduce_window": reduce_window_max_pool_2x2, "reshape + max": max_pool_2x2}
  programs = {name: step_program(pool, args.batch_size) for name, pool in variants.items()}
  backward = {
    name: pool_backward(pool, (args.batch_size, 28, 28, 6)) for name, pool in variants.items()
  }
  rates = {name: [] for name in variants}
  layer_ms = {name: [] for name in variants}
  for _ in range(args.rounds):
    for name, (compiled, state, images, labels) in programs.items():
      trained = compiled(state, images, labels)  # warm-up
      start = time.perf_counter()
      for _ in range(args.steps):
        trained = compiled(trained, images, labels)
      jax.block_until_ready(trained)
      rates[name].append(args.steps * args.batch_size / (time.perf_counter() - start))
      programs[name] = (compiled, trained, images, labels)
      grad, x = backward[name]
      grad(x).block_until_ready()
      start = time.perf_counter()
      for _ in range(args.steps):
        out = grad(x)
      out.block_until_ready()
      layer_ms[name].append(1e3 * (time.perf_counter() - start) / args.steps)
  print(f"LeNet-5, batch {args.batch_size}, medians of {args.rounds} rounds of {args.steps} steps")
  print(f"{'max-pool':16} {'images/s':>9} {'pool backward ms':>17}")
  for name in variants:
    print(
      f"{name:16} {statistics.median(rates[name]):9.0f} {statistics.median(layer_ms[name]):17.3f}"
    )
  ratio = statistics.median(rates["reshape + max"]) / statistics.median(rates["reduce_window"])
  print(f"reshape + max / reduce_window: {ratio:.2f}x")


if __name__ == "__main__":
  main()
