"""Where a ResNet-20 step's time goes on CPU: one 3x3 convolution of each stage,
forward, input gradient (dx) and filter gradient (dw), batch 128 (--batch_size).

    python bench/cpu/conv_grad.py [--xla_defaults] [--batch_size 128]

Each program is compiled with the project's compiler options
(easgd/infra/compile.py), or as jax.jit compiles it with --xla_defaults. The
last lines time ResNet-20's other three convolutions (its first, on 3
channels, which needs no input gradient, and the two of stride 2 that halve
the side) and add up all 19 (6, 5 and 5 of the table's, a stage): the time
its convolutions take on their own, which no change around them can remove.

Each layer is the same 0.6 GFLOP in all three directions; XLA:CPU's times
for them show which direction is slow. The last two columns compute the
filter gradient as matrix products instead, to see whether that is faster:
  slices  dw[a, b] = sum over n, i, j of x_pad[n, i + a, j + b]^T dy[n, i, j],
          nine (C x NHW) @ (NHW x C) products, one per kernel offset;
  im2col  the nine shifted copies concatenated into patches [NHW, 9C], then
          one patches^T @ dy.
"""

import time

import jax
import jax.numpy as jnp
from jax import lax

from easgd import arguments
from easgd.infra.compile import compile_program, options_for


def _milliseconds(fn, *args, repeats=5, rounds=3):
  """The best of `rounds` means over `repeats` calls (this machine's noise only adds)."""
  jax.block_until_ready(fn(*args))
  best = float("inf")
  for _ in range(rounds):
    start = time.perf_counter()
    for _ in range(repeats):
      result = fn(*args)
    jax.block_until_ready(result)
    best = min(best, 1e3 * (time.perf_counter() - start) / repeats)
  return best


def conv(x, w, stride=1):
  """A 3x3 convolution padded by 1 on each side (SAME at stride 1), NHWC."""
  pads, numbers = ((1, 1), (1, 1)), ("NHWC", "HWIO", "NHWC")
  return lax.conv_general_dilated(x, w, (stride, stride), pads, dimension_numbers=numbers)


def _shifted(x, size):
  """The 9 copies of x (zero-padded by 1) shifted by each 3x3 kernel offset, as [N, H, W, C]."""
  padded = jnp.pad(x, ((0, 0), (1, 1), (1, 1), (0, 0)))
  return [padded[:, a : a + size, b : b + size, :] for a in range(3) for b in range(3)]


def dw_slices(x, dy):
  size = x.shape[1]
  products = [jnp.einsum("nijc,nijd->cd", s, dy) for s in _shifted(x, size)]
  return jnp.stack(products).reshape(3, 3, x.shape[3], dy.shape[3])


def dw_im2col(x, dy):
  size = x.shape[1]
  patches = jnp.concatenate(_shifted(x, size), axis=3).reshape(-1, 9 * x.shape[3])
  return (patches.T @ dy.reshape(-1, dy.shape[3])).reshape(3, 3, x.shape[3], dy.shape[3])


def main():
  parser = arguments.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--xla_defaults", action="store_true", help="compile as jax.jit does")
  parser.add_argument(
    "--batch_size", type=arguments.integer(1), default=128, help="images a convolution"
  )
  args = parser.parse_args()
  batch = args.batch_size
  platform = jax.devices()[0].platform
  options = {} if args.xla_defaults else options_for(platform)

  def _compiled(fn, *operands):
    return compile_program(jax.jit(fn).lower(*operands), platform, options)

  columns = ("forward", "dx", "dw", "slices", "im2col")
  print(f"{'layer':>22} {'GFLOP':>6} " + " ".join(f"{c:>9}" for c in columns))
  total = 0.0
  for channels, side, count in ((16, 32, 6), (32, 16, 5), (64, 8, 5)):
    x = jax.random.normal(jax.random.PRNGKey(0), (batch, side, side, channels))
    w = jax.random.normal(jax.random.PRNGKey(1), (3, 3, channels, channels))
    forward = _compiled(conv, x, w)
    dx = _compiled(jax.grad(lambda x, w: conv(x, w).sum(), 0), x, w)
    dw = _compiled(jax.grad(lambda x, w: conv(x, w).sum(), 1), x, w)
    gflop = 2 * batch * side * side * 9 * channels * channels / 1e9
    times = [_milliseconds(fn, x, w) for fn in (forward, dx, dw)]
    dy = jax.random.normal(jax.random.PRNGKey(2), x.shape)
    expected = jax.vjp(lambda w, x=x: conv(x, w), w)[1](dy)[0]
    for variant in (dw_slices, dw_im2col):
      compiled = _compiled(variant, x, dy)
      # The rewrite must compute the same gradient before its time means anything.
      error = float(jnp.abs(compiled(x, dy) - expected).max() / jnp.abs(expected).max())
      assert error < 1e-4, (variant.__name__, error)
      times.append(_milliseconds(compiled, x, dy))
    cells = " ".join(f"{t:7.1f}ms" for t in times)
    print(f"{f'{channels}@{side}x{side}, 3x3':>22} {gflop:6.2f} {cells}")
    total += count * sum(times[:3])
  for inputs, outputs, side, stride in ((3, 16, 32, 1), (16, 32, 32, 2), (32, 64, 16, 2)):
    x = jax.random.normal(jax.random.PRNGKey(0), (batch, side, side, inputs))
    w = jax.random.normal(jax.random.PRNGKey(1), (3, 3, inputs, outputs))

    def strided(x, w, stride=stride):
      return conv(x, w, stride)

    directions = {"forward": strided, "dw": jax.grad(lambda x, w: strided(x, w).sum(), 1)}
    if inputs > 3:  # the first convolution's input is the images: no gradient
      directions["dx"] = jax.grad(lambda x, w: strided(x, w).sum(), 0)
    times = {name: _milliseconds(_compiled(fn, x, w), x, w) for name, fn in directions.items()}
    total += sum(times.values())
    cells = ", ".join(f"{name} {t:.1f}ms" for name, t in times.items())
    print(f"{inputs}->{outputs} @{side}x{side}, stride {stride}: {cells}")
  print(f"ResNet-20's 19 convolutions, forward + dx + dw: {total:.0f} ms")


if __name__ == "__main__":
  main()
