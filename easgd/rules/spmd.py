"""The SPMD helpers of the rules' steps: each runs on every device inside
`jax.shard_map` over the 1-D mesh axis `workers` (AXIS), on that device's slice of
the worker-indexed leaves (a leading axis of P/D local workers)."""

import functools
from collections.abc import Callable

import jax
import jax.numpy as jnp
from jax import lax

from easgd.declare import FLAG, Field
from easgd.rules.state import Params, TrainState

AXIS = "workers"

DETERMINISTIC_SUMS = Field(
  "deterministic_sums",
  False,
  FLAG,
  "sums over workers added in worker order after an all-gather: the same bits on every "
  "process layout with the same workers a device (docs/distributed.md)",
  earlier=False,
  setting="deterministic_sums",
)


def sum_over_workers(tree: Params, in_worker_order: bool = False) -> Params:
  """sum_i tree_i over all P workers (each leaf has a leading axis of local workers).

  By default a local sum, then one all-reduce (`lax.psum`). The order of its
  additions follows the layout (XLA's within a process, the collective
  library's across processes), so the last bits of a sum may differ between
  layouts of the same P. `in_worker_order` (config.deterministic_sums) adds
  ((x_0 + x_1) + x_2) + ... + x_{P-1} on every device after an all-gather:
  the same bits on every layout, for the bytes of an all-gather (each device
  receives all P terms) and P-1 sequential additions.
  """
  if not in_worker_order:
    return jax.tree.map(lambda leaf: lax.psum(leaf.sum(axis=0), AXIS), tree)

  def ordered(leaf):
    every = lax.all_gather(leaf, AXIS, tiled=True, to="invarying")  # [P, ...], worker order
    return lax.fori_loop(1, every.shape[0], lambda i, total: total + every[i], every[0])

  return jax.tree.map(ordered, tree)


def sum_over_blocks(
  tree: Params, block: int, num_workers: int, in_worker_order: bool = False
) -> Params:
  """sum_{i in b} tree_i for every contiguous block b of `block` workers (workers
  b*block, ..., (b+1)*block - 1): [P/block, ...] on every device, block b in row b.

  By default each device adds its workers into their blocks' rows (a segment sum)
  and one all-reduce adds the devices' rows; `in_worker_order` adds each block's
  terms in worker order after an all-gather, as `sum_over_workers` does.
  """
  blocks = num_workers // block

  def one(leaf):
    if in_worker_order:
      every = lax.all_gather(leaf, AXIS, tiled=True, to="invarying")
      grouped = every.reshape(blocks, block, *leaf.shape[1:])
      return lax.fori_loop(1, block, lambda i, total: total + grouped[:, i], grouped[:, 0])
    count = leaf.shape[0]
    ids = (lax.axis_index(AXIS) * count + jnp.arange(count)) // block
    return lax.psum(jax.ops.segment_sum(leaf, ids, num_segments=blocks), AXIS)

  return jax.tree.map(one, tree)


def rows_of_blocks(tree: Params, block: int, count: int) -> Params:
  """This device's `count` workers' rows of a [P/block, ...] tree (`sum_over_blocks`'s):
  each worker its block's row."""
  ids = local_workers(count) // block
  return jax.tree.map(lambda leaf: leaf[ids], tree)


def mean_over_workers(tree: Params, num_workers: int, in_worker_order: bool = False) -> Params:
  """(1/P) sum_i tree_i: `sum_over_workers`, then divided by P; the same on every device."""
  total = sum_over_workers(tree, in_worker_order)
  return jax.tree.map(lambda leaf: leaf / num_workers, total)


def local_workers(count: int) -> jax.Array:
  """The global indices of this device's `count` workers."""
  return lax.axis_index(AXIS) * count + jnp.arange(count)


def exchange_key(state: "TrainState") -> jax.Array:
  """The key of this step's compressed exchanges (easgd.rules.exchange)."""
  return jax.random.fold_in(jax.random.fold_in(state.rng, EXCHANGE_STREAM), state.step)


# Keys of the exchanges are drawn apart from the data's (which fold in epochs).
EXCHANGE_STREAM = 2**31 - 1


def map_workers(function: Callable, *args):
  """`function` of each worker's slice of `args` (pytrees with a leading axis of local
  workers), stacked on that axis again.

  jax.vmap on CPUs and TPUs. On GPUs one call per worker, one after another
  (`map_unrolled`): vmapped over the workers' own weights, a convolution
  becomes one grouped convolution (feature_group_count = workers), which cuDNN
  runs far slower than the workers' convolutions one by one (bench/gpu.py,
  bench/README.md). The CPU keeps vmap, whose programs (and bits) the replays
  and NumPy references were measured with.
  """
  unrolled = functools.partial(map_unrolled, function)
  return lax.platform_dependent(*args, cuda=unrolled, rocm=unrolled, default=jax.vmap(function))


@jax.named_scope("map_unrolled")  # tests/test_lowering.py finds the GPUs' path by it
def map_unrolled(function: Callable, *args):
  """`map_workers` on GPUs: `function` called once per worker, the results stacked.

  A scan unrolled in full: XLA sees the workers' calls one after another, as a
  Python loop would write them, and `function` is traced once, not once a
  worker (lax.platform_dependent traces every platform's branch, so the CPU's
  programs pay for this one's tracing too).
  """
  count = jax.tree.leaves(args)[0].shape[0]
  _, results = lax.scan(lambda carry, row: (carry, function(*row)), None, args, unroll=count)
  return results
