"""The training state every rule carries: what a checkpoint holds to resume a run."""

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
from flax import struct

Params = Any
Batch = Any
Metrics = dict[str, jax.Array]
# loss_fn(params, batch) -> (mean loss, {"accuracy": mean accuracy}) for one worker;
# a model with BatchNorm also returns its updated statistics as aux["batch_stats"].
LossFn = Callable[[Params, Batch], tuple[jax.Array, dict[str, jax.Array]]]


@struct.dataclass
class TrainState:
  """Everything a run needs to continue: checkpointing this is enough to resume.

  Attributes:
    step: number of steps (ticks) taken, int32 scalar.
    rng: PRNG key of the run. Data order (and any other randomness) is a pure
      function of (rng, worker, worker_steps), so it needs no state of its own.
    center: the center variable x~; for sync_sgd the one shared x.
    center_opt: optimizer state of the center: sync_sgd's inner optimizer's, the
      outer optimizer's (easgd.rules.outer), or the parameter-server master's.
    workers: the workers' parameters x_i, stacked on a leading axis of size P
      (sharded over the mesh); () for sync_sgd, whose workers share x.
    worker_opt: the workers' other state (their inner optimizer's state under
      "inner", accumulated gradients, increments in flight, the centers they
      fetched last), stacked like
      `workers`; () when the rule keeps none.
    worker_steps: local steps each worker has taken, int32 [P]; it picks the
      worker's next batch.
  """

  step: jax.Array
  rng: jax.Array
  center: Params
  center_opt: Any
  workers: Params
  worker_opt: Any
  worker_steps: jax.Array


def stack_workers(tree: Params, count: int) -> Params:
  return jax.tree.map(lambda leaf: jnp.broadcast_to(leaf, (count, *leaf.shape)), tree)


def initial_state(rng, center, center_opt, workers, worker_opt, num_workers) -> TrainState:
  return TrainState(
    step=jnp.zeros((), jnp.int32),
    rng=rng,
    center=center,
    center_opt=center_opt,
    workers=workers,
    worker_opt=worker_opt,
    worker_steps=jnp.zeros((num_workers,), jnp.int32),
  )
