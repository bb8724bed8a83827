"""Where a ResNet-20 step's time goes on CPU: one 3x3 convolution of each stage,
forward, input gradient (dx) and filter gradient (dw), batch 128.

    python bench/conv_grad.py

Each layer is the same 0.6 GFLOP in all three directions; XLA:CPU's times
for them show which direction is slow.
"""

import time

import jax
from jax import lax


def _milliseconds(fn, *args, repeats=5):
  jax.block_until_ready(fn(*args))
  start = time.perf_counter()
  for _ in range(repeats):
    result = fn(*args)
  jax.block_until_ready(result)
  return 1e3 * (time.perf_counter() - start) / repeats


def conv(x, w):
  return lax.conv_general_dilated(x, w, (1, 1), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC"))


def main():
  print(f"{'layer':>22} {'GFLOP':>6} {'forward':>9} {'dx':>9} {'dw':>9}")
  for channels, side in ((16, 32), (32, 16), (64, 8)):
    x = jax.random.normal(jax.random.PRNGKey(0), (128, side, side, channels))
    w = jax.random.normal(jax.random.PRNGKey(1), (3, 3, channels, channels))
    forward = jax.jit(conv)
    dx = jax.jit(jax.grad(lambda x, w: conv(x, w).sum(), 0))
    dw = jax.jit(jax.grad(lambda x, w: conv(x, w).sum(), 1))
    gflop = 2 * 128 * side * side * 9 * channels * channels / 1e9
    times = [_milliseconds(fn, x, w) for fn in (forward, dx, dw)]
    cells = " ".join(f"{t:7.1f}ms" for t in times)
    print(f"{f'{channels}@{side}x{side}, 3x3':>22} {gflop:6.2f} {cells}")


if __name__ == "__main__":
  main()
