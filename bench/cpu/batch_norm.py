"""One BatchNorm layer of each ResNet-20 stage, forward and backward, with Flax's
nn.BatchNorm and with models/batch_norm.py: time, and distance from float64.

    python bench/cpu/batch_norm.py [--rounds 5]

Each program is the gradient of sum(tanh(BatchNorm(x)) * t) with respect to x,
the scale and the bias (batch 128, training mode), compiled with the project's
options. The error is the largest difference of the float32 input gradient
from a float64 NumPy computation of the same gradient, over its largest entry.
"""

import time

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from easgd import arguments
from easgd.infra.compile import compile_program
from easgd.models.batch_norm import BatchNorm

EPSILON = 1e-5


def _loss(module):
  def loss(x, scale, bias, target):
    variables = {
      "params": {"scale": scale, "bias": bias},
      "batch_stats": {"mean": jnp.zeros_like(scale), "var": jnp.ones_like(scale)},
    }
    y = module.apply(variables, x, mutable=["batch_stats"])[0]
    return jnp.sum(jnp.tanh(y) * target)

  return loss


def _float64_input_gradient(x, scale, bias, target):
  """d/dx of sum(tanh(BatchNorm(x)) * t), written out in float64 NumPy."""
  shape = x.shape
  x = np.asarray(x, np.float64).reshape(-1, shape[-1])
  mean = x.mean(axis=0)
  std = np.sqrt(x.var(axis=0) + EPSILON)
  x_hat = (x - mean) / std
  y = scale * x_hat + bias
  dy = (1 - np.tanh(y) ** 2) * np.asarray(target, np.float64).reshape(-1, shape[-1])
  dx_hat = dy * scale
  dx = (dx_hat - dx_hat.mean(axis=0) - x_hat * (dx_hat * x_hat).mean(axis=0)) / std
  return dx.reshape(shape)


def _milliseconds(fn, args, rounds):
  jax.block_until_ready(fn(*args))
  best = float("inf")
  for _ in range(rounds):
    start = time.perf_counter()
    for _ in range(10):
      result = fn(*args)
    jax.block_until_ready(result)
    best = min(best, 100 * (time.perf_counter() - start))
  return best


def main():
  parser = arguments.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--rounds", type=arguments.integer(1), default=5)
  args = parser.parse_args()
  platform = jax.devices()[0].platform
  modules = {
    "flax nn.BatchNorm": nn.BatchNorm(use_running_average=False, epsilon=EPSILON),
    "models/batch_norm.py": BatchNorm(use_running_average=False, epsilon=EPSILON),
  }
  print("| layer | module | ms (forward + backward) | input gradient's error |")
  print("| --- | --- | --- | --- |")
  rng = np.random.default_rng(0)
  for channels, side in ((16, 32), (32, 16), (64, 8)):
    shape = (128, side, side, channels)
    x = rng.normal(1.0, 2.0, shape).astype(np.float32)
    target = rng.normal(size=shape).astype(np.float32)
    scale = np.full(channels, 1.3, np.float32)
    bias = np.full(channels, 0.2, np.float32)
    expected = _float64_input_gradient(x, scale, bias, target)
    inputs = [jnp.asarray(a) for a in (x, scale, bias, target)]
    for label, module in modules.items():
      gradient = jax.jit(jax.grad(_loss(module), argnums=(0, 1, 2)))
      compiled = compile_program(gradient.lower(*inputs), platform)
      dx = np.asarray(compiled(*inputs)[0], np.float64)
      error = np.abs(dx - expected).max() / np.abs(expected).max()
      milliseconds = _milliseconds(compiled, inputs, args.rounds)
      print(f"| {channels}@{side}x{side} | {label} | {milliseconds:.2f} | {error:.1e} |")


if __name__ == "__main__":
  main()
