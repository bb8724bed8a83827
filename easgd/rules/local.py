"""The workers' local step with their inner optimizer, and its metrics: the steps the
rules share."""

import jax
import jax.numpy as jnp
import optax

from easgd.rules import model_state
from easgd.rules.hyper import Hyper
from easgd.rules.spmd import map_workers, sum_over_workers
from easgd.rules.state import Batch, LossFn, Metrics, Params


def step_metrics(
  loss: jax.Array,
  aux: dict[str, jax.Array],
  hyper: Hyper,
  learning_rate: jax.Array,
) -> Metrics:
  """Mean over all workers of each worker's loss, accuracy and learning rate in force."""
  values = {"loss": loss, "accuracy": aux["accuracy"], "learning_rate": learning_rate}
  totals = sum_over_workers(values, hyper.deterministic_sums)
  return {tag: total / hyper.num_workers for tag, total in totals.items()}


def decayed(hyper: Hyper, grads: Params, at: Params) -> Params:
  """g + lambda*x on the parameters (L2 weight decay); BatchNorm statistics untouched."""
  if not hyper.weight_decay:
    return grads
  params = jax.tree.map(
    lambda g, x: g + hyper.weight_decay * x, model_state.trainable(grads), model_state.trainable(at)
  )
  return model_state.with_trainable(grads, params)


def shifted(tree: Params, shift: Params | None) -> Params:
  """`tree` with `shift` added to its parameters (`Rule.look_ahead_shift`; None: `tree`)."""
  if shift is None:
    return tree
  params = jax.tree.map(jnp.add, model_state.trainable(tree), shift)
  return model_state.with_trainable(tree, params)


def local_update(
  inner: optax.GradientTransformation,
  workers: Params,
  inner_state,
  batch: Batch,
  loss_fn: LossFn,
  at: Params | None = None,
):
  """The local step of the local workers with the inner optimizer.

  `at`: where the gradients are taken and whence the step goes, the workers
  themselves if None (EAMSGD's look-ahead point otherwise: `shifted`). The
  optimizer sees it as the parameters, so an L2 term is taken there too, and
  the loss and accuracy are those of its forward pass.

  Returns (u_i, new inner state, g_i, loss_i, aux_i): u_i is the optimizer's
  update of the parameters, to be added to `at`, with the BatchNorm
  statistics' part set to s'_i - s_i; g_i the raw gradient.
  """
  at = workers if at is None else at
  (loss, aux), grads = map_workers(jax.value_and_grad(loss_fn, has_aux=True), at, batch)
  updates, inner_state = jax.vmap(inner.update)(
    model_state.trainable(grads), inner_state, model_state.trainable(at)
  )
  updates = model_state.stats_step(model_state.with_trainable(grads, updates), workers, aux)
  return updates, inner_state, grads, loss, aux
