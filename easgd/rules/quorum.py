"""The devices' side of quorum rounds (easgd.sim.rounds): what a round's membership
does to a synchronous exchange.

The clock decides each round's members, late and dropped workers and the late
messages of the round before that it takes (`Round`); `tick_inputs` hands them
to the step as replicated arrays. With C the round's contributions (its members
M, and the messages H held from the round before, each weighted w = 1/sqrt(2)),
the exchange's sum becomes

  S = s * (sum_{i in M} m_i + w * sum_{j in H} h_j),   s = P / (|M| + |H|)

(s = 1 under `outer.world_size=fixed`), so that S / P is the mean over the
contributions and a rule written with sum_i m_i over all P workers needs no
other change. A late worker's message m_j is held in its state
(`worker_opt["held"]`) until the next round; a dropped worker takes the round's
result (`heal`).
"""

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from easgd.rules.spmd import AXIS, local_workers, sum_over_workers
from easgd.sim import rounds

# The [P] arrays of a tick under a round policy (beside the scalars "scale" and "first").
MASKS = ("members", "late", "dropped", "held")


def tick_inputs(this_round: rounds.Round | None, num_workers: int, fixed: bool) -> dict:
  """The round's masks (float32 0/1; `held`: each held message's weight w), the scale s
  of its sum, and its first member (whose inner state the dropped take): zeros on a
  step without a round."""
  if this_round is None:
    zeros = np.zeros(num_workers, np.float32)
    return {
      **dict.fromkeys(MASKS, zeros),
      "scale": np.float32(1.0),
      "first": np.int32(0),
    }
  weight = rounds.late_weight(rounds.LATE_STALENESS)
  contributions = int(this_round.members.sum() + this_round.held.sum())
  return {
    "members": this_round.members.astype(np.float32),
    "late": this_round.late.astype(np.float32),
    "dropped": this_round.dropped.astype(np.float32),
    "held": (this_round.held * weight).astype(np.float32),
    "scale": np.float32(1.0 if fixed else num_workers / contributions),
    "first": np.int32(np.argmax(this_round.members)),
  }


def rows(tick, key: str, count: int) -> jax.Array:
  """This device's `count` workers' entries of the tick's [P] array `key`."""
  return tick[key][local_workers(count)]


def times(tree, weights: jax.Array):
  """Each local worker's rows of `tree` times its weight; a row of weight 0 is 0, even
  where the row is not finite (a dropped worker's message does not reach the sum)."""

  def one(leaf):
    shaped = weights.reshape((-1,) + (1,) * (leaf.ndim - 1)).astype(leaf.dtype)
    return jnp.where(shaped != 0, leaf * shaped, jnp.zeros_like(leaf))

  return jax.tree.map(one, tree)


def select(mask: jax.Array, chosen, other):
  """Each local worker's rows of `chosen` where its `mask` entry is set, else of `other`."""

  def one(a, b):
    return jnp.where(mask.reshape((-1,) + (1,) * (a.ndim - 1)) > 0, a, b)

  return jax.tree.map(one, chosen, other)


def total(sent, held, tick, count: int, in_worker_order: bool):
  """S: the round's scaled sum of its members' messages `sent` and of the `held`
  messages of the round before (None: no late policy)."""
  taken = times(sent, rows(tick, "members", count))
  if held is not None:
    taken = jax.tree.map(jnp.add, taken, times(held, rows(tick, "held", count)))
  summed = sum_over_workers(taken, in_worker_order)
  return jax.tree.map(lambda leaf: leaf * tick["scale"], summed)


def mean(tree, tick, num_workers: int, in_worker_order: bool):
  """S / P: the round's mean over its members' rows of `tree` (dynamic; under a fixed
  world size its sum over P)."""
  count = jax.tree.leaves(tree)[0].shape[0]
  summed = total(tree, None, tick, count, in_worker_order)
  return jax.tree.map(lambda leaf: leaf / num_workers, summed)


def hold(sent, tick, count: int):
  """The messages this round's late workers hold for the next round (0 for the others)."""
  return times(sent, rows(tick, "late", count))


def from_first_member(tree, tick, count: int):
  """The round's first member's rows of the worker-stacked `tree`, on every local row."""
  mine = local_workers(count) == tick["first"]

  def one(leaf):
    picked = jnp.where(mine.reshape((-1,) + (1,) * (leaf.ndim - 1)), leaf, jnp.zeros_like(leaf))
    row = lax.psum(picked.sum(axis=0, dtype=leaf.dtype), AXIS)
    return jnp.broadcast_to(row, leaf.shape)

  return jax.tree.map(one, tree)


def heal(workers, reset, inner_state, tick, count: int):
  """(workers, inner state) after the round: a dropped worker's parameters set to the
  round's result (`reset`, this device's rows of it) and its inner optimizer's state to
  the first member's, as torchft's healing replica downloads them from a peer."""
  dropped = rows(tick, "dropped", count)
  workers = select(dropped, reset, workers)
  inner_state = select(dropped, from_first_member(inner_state, tick, count), inner_state)
  return workers, inner_state


def keep_unsent(left, residual, tick, count: int):
  """Error feedback's residuals after the round: a dropped worker sent nothing, so it
  keeps its residual; None without error feedback."""
  if left is None:
    return None
  return select(rows(tick, "dropped", count), residual, left)
