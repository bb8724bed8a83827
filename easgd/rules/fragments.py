"""A model split into F fragments of whole layers, for the streaming rules
(easgd.rules.streaming).

A *block* is one top-level layer of the model's parameters (a Flax module:
`Conv_0`, `Dense_1`, a BatchNorm's scale and shift); a BatchNorm layer's
running statistics belong to its block too. The blocks, in the order of the
tree's leaves (the layers sorted by name, which is not always their depth:
`bn1` sorts before `conv1`), are cut into F contiguous fragments of about
equal size: fragment k ends at the first block where the
running count of parameters reaches k/F of the total, and every fragment
keeps at least one block. A model of fewer than F blocks cannot be split so.
"""

import dataclasses
import itertools
import math

import jax
import numpy as np

from easgd.rules import model_state


@dataclasses.dataclass(frozen=True)
class Fragments:
  """The F fragments of one model: the names of the blocks of each, and their sizes.

  blocks: for each fragment, the names of its top-level layers.
  sizes:  for each fragment, its number of parameters (statistics not counted).
  """

  blocks: tuple[tuple[str, ...], ...]
  sizes: tuple[int, ...]

  @property
  def count(self) -> int:
    return len(self.blocks)

  def take(self, tree, fragment: int):
    """The part of a model tree (or a stacked one, or one shaped like it) in `fragment`."""
    names = self.blocks[fragment]

    def part(layers):
      return {name: layers[name] for name in names if name in layers}

    if model_state.has_stats(tree):
      return {"params": part(tree["params"]), model_state.STATS: part(tree[model_state.STATS])}
    return part(tree)

  def put(self, tree, fragment: int, part):
    """`tree` with its part in `fragment` replaced by `part` (a `take` of the same shape)."""
    if model_state.has_stats(tree):
      return {
        "params": {**tree["params"], **part["params"]},
        model_state.STATS: {**tree[model_state.STATS], **part[model_state.STATS]},
      }
    return {**tree, **part}


def blocks(tree) -> dict[str, int]:
  """The model's blocks (top-level layers, in leaf order) and their parameter counts
  (0 for a layer of statistics alone, a BatchNorm without scale or shift)."""
  params = model_state.trainable(tree)
  names = set(params) | (set(tree[model_state.STATS]) if model_state.has_stats(tree) else set())
  return {
    name: sum(int(np.prod(np.shape(leaf))) for leaf in jax.tree.leaves(params.get(name, {})))
    for name in sorted(names)
  }


def split(tree, count: int) -> Fragments:
  """`tree`'s blocks cut into `count` contiguous fragments of about equal size.

  Raises ValueError if the model has fewer blocks than `count`.
  """
  sizes = blocks(tree)
  names = list(sizes)
  if not 1 <= count <= len(names):
    raise ValueError(
      f"a model of {len(names)} parameter blocks (layers) splits into 1 to {len(names)} "
      f"fragments, not {count}"
    )
  total = sum(sizes.values())
  running = np.cumsum([sizes[name] for name in names])
  ends = []
  for k in range(1, count):
    # The first block at which k/F of the parameters are reached, leaving at
    # least one block for each fragment before and after.
    end = int(np.searchsorted(running, math.ceil(k * total / count))) + 1
    low = ends[-1] + 1 if ends else 1
    ends.append(min(max(end, low), len(names) - (count - k)))
  cuts = [0, *ends, len(names)]
  parts = tuple(tuple(names[a:b]) for a, b in itertools.pairwise(cuts))
  return Fragments(parts, tuple(sum(sizes[name] for name in part) for part in parts))
