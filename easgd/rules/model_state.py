"""What a worker holds of its model: parameters, and BatchNorm statistics if any.

The rules work on one tree per model. For a network without BatchNorm that
tree is its parameters, as before. For one with BatchNorm it is Flax's
variables `{"params": p, "batch_stats": s}`: the running statistics s travel
with the parameters through every copy, exchange, checkpoint and move, and
the rules tell the two apart with the functions here.

The statistics are not trained by gradients: the loss, computed with batch
statistics, does not depend on s, so its gradient there is zero. Each
forward pass returns s' = m*s + (1 - m)*(moments of the batch) instead, and
a local step moves the statistics by u_s = s' - s. Whether the elastic
exchange then also averages them into the center is `config.outer.batch_stats`:
  averaged: d_i = x_i - x~ over the whole tree, so with tau-step exchanges
            s_i <- s'_i - alpha*(s_i - s~),  s~ <- s~ + alpha*sum_i (s_i - s~)
            exactly as the parameters; the center is one usable model.
  local:    the statistics are left out of every exchange (d_i is zero
            there): s_i <- s'_i; the center is evaluated with each worker's
            statistics in turn.
"""

from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp

from easgd.declare import Field, Shapes, one_of

STATS = "batch_stats"
AVERAGED, LOCAL = "averaged", "local"
BATCH_STATS_CHOICES = (AVERAGED, LOCAL)

# Read as a flag: whether the exchanges move the statistics with the parameters.
BATCH_STATS = Field(
  "outer.batch_stats",
  AVERAGED,
  one_of(
    BATCH_STATS_CHOICES,
    "BatchNorm statistics: averaged into the center like parameters, or kept by each worker",
  ),
  "BatchNorm statistics averaged into the center like the parameters, or local to each "
  "worker (docs/cifar.md)",
  Shapes.IF_READ,
  formerly=("batch_stats",),
  setting="average_stats",
  convert=lambda mode: mode == AVERAGED,
  off=True,
)

Tree = Any


def has_stats(tree: Tree) -> bool:
  """Whether `tree` is a model with BatchNorm statistics."""
  return isinstance(tree, Mapping) and STATS in tree


def model_tree(variables: Mapping) -> Tree:
  """The tree the rules train, from Flax's variables of a freshly built model."""
  if STATS in variables:
    return {"params": variables["params"], STATS: variables[STATS]}
  return variables["params"]


def variables(tree: Tree) -> dict:
  """Flax's variables for `model.apply`, from a model tree."""
  return dict(tree) if has_stats(tree) else {"params": tree}


def trainable(tree: Tree) -> Tree:
  """The parameters of a model tree (the part that gradients move)."""
  return tree["params"] if has_stats(tree) else tree


def with_trainable(tree: Tree, params: Tree) -> Tree:
  """`tree` with its parameters replaced by `params`."""
  return dict(tree, params=params) if has_stats(tree) else params


def stats_step(updates: Tree, tree: Tree, aux: Mapping) -> Tree:
  """`updates` of a local step with the statistics' part set to u_s = s' - s.

  `aux[STATS]` holds s' from the forward pass; a tree without statistics is
  returned as it is.
  """
  if not has_stats(tree):
    return updates
  return dict(updates, **{STATS: jax.tree.map(jnp.subtract, aux[STATS], tree[STATS])})


def exchanged(distance: Tree, average_stats: bool) -> Tree:
  """The part of d_i = x_i - x~ that an exchange moves: all of it, or the
  parameters only when the statistics stay local (zero elsewhere)."""
  if average_stats or not has_stats(distance):
    return distance
  return dict(distance, **{STATS: jax.tree.map(jnp.zeros_like, distance[STATS])})
