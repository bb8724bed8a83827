"""The synchronous rules: every worker steps every tick; exchanges are all-reduces.

Sync SGD is the baseline; Sync EASGD and Sync MEASGD keep a center x~ and
pull the workers towards it every tau steps (docs/algorithms.md).
"""

from typing import Any

import jax
import jax.numpy as jnp
import optax
from jax import lax

from easgd.rules import model_state
from easgd.rules.base import (
  AXIS,
  BASE_READS,
  ELASTIC_READS,
  Batch,
  Hyper,
  LossFn,
  Momentum,
  Params,
  Rule,
  TrainState,
  decayed,
  initial_state,
  momentum_update,
  sgd_update,
  stack_workers,
  step_metrics,
  sum_over_workers,
)


class SyncSGD(Rule):
  """Synchronous data-parallel SGD (the baseline).

  Every worker computes g_i at the shared x on its own batch; one all-reduce
  forms g = (1/P) sum_i g_i, and the optimizer (optax.sgd) updates x:
      plain:     x <- x - eta*g
      momentum:  m <- mu*m + g;  x <- x - eta*m
      Nesterov:  m <- mu*m + g;  x <- x - eta*(g + mu*m)
  With P workers of batch b this equals one worker with batch P*b.
  BatchNorm statistics are all-reduced too: s <- (1/P) sum_i s'_i (the
  workers share one model, so they cannot keep statistics of their own).
  """

  name = "sync_sgd"
  momentum = Momentum.OPTIONAL
  nesterov = True
  # Its workers share one model, so they cannot keep statistics of their own.
  batch_stats = (model_state.AVERAGED,)
  reads = (*BASE_READS, "optimizer.momentum", "optimizer.nesterov")

  def __init__(self, hyper: Hyper):
    super().__init__(hyper)
    self.optimizer = optax.sgd(
      hyper.learning_rate, momentum=hyper.momentum or None, nesterov=hyper.nesterov
    )

  def init(self, params, rng):
    center_opt = self.optimizer.init(model_state.trainable(params))
    return initial_state(rng, params, center_opt, (), (), self.hyper.num_workers)

  def step(self, state, batch, loss_fn, tick):
    del tick
    # Every local worker differentiates at the shared x on its own batch. x is
    # first marked as varying over devices: the gradient of a replicated value
    # would otherwise come back already summed over devices (the transpose of
    # broadcasting is a psum), and the sum below is to be the one all-reduce.
    center = lax.pcast(state.center, AXIS, to="varying")
    (loss, aux), grads = jax.vmap(jax.value_and_grad(loss_fn, has_aux=True), in_axes=(None, 0))(
      center, batch
    )

    def mean(tree):
      return jax.tree.map(lambda leaf: leaf / self.hyper.num_workers, sum_over_workers(tree))

    params = model_state.trainable(state.center)
    mean_grad = decayed(self.hyper, mean(model_state.trainable(grads)), params)
    updates, center_opt = self.optimizer.update(mean_grad, state.center_opt, params)
    center = model_state.with_trainable(state.center, optax.apply_updates(params, updates))
    if model_state.has_stats(center):
      center = dict(center, **{model_state.STATS: mean(aux[model_state.STATS])})
    new_state = state.replace(
      step=state.step + 1,
      center=center,
      center_opt=center_opt,
      worker_steps=state.worker_steps + 1,
    )
    return new_state, step_metrics(loss, aux, self.hyper.num_workers)

  def worker_params(self, state):
    # Every worker holds the shared x.
    return stack_workers(state.center, self.hyper.num_workers)

  @property
  def period(self):
    return 1


class SyncEASGD(Rule):
  """Synchronous elastic averaging SGD (Zhang, Choromanska, LeCun, NIPS 2015;
  You, Buluc, Demmel, SC17).

  Every step t each worker takes a local step u_i = -eta*g_i(x_i). On every
  tau-th step ((t+1) mod tau == 0) the elastic exchange is applied too, with
  the values from before it (d_i = x_i - x~ at step t):
      x_i <- x_i + u_i - alpha*d_i
      x~  <- x~ + alpha * sum_i d_i        (= (1-beta)*x~ + beta*mean_i x_i)
  and otherwise x_i <- x_i + u_i. With tau = 1 this is the paper's
  synchronous EASGD (its equations 5-6). The sum is one all-reduce, so an
  exchange costs one model-sized all-reduce every tau steps.
  """

  name = "sync_easgd"
  elastic = True
  reads = (*BASE_READS, *ELASTIC_READS)

  def init(self, params, rng):
    workers = stack_workers(params, self.hyper.num_workers)
    return initial_state(
      rng, params, (), workers, self._init_worker_opt(workers), self.hyper.num_workers
    )

  def _init_worker_opt(self, workers: Params) -> Any:
    del workers
    return ()

  def _local_update(self, state: TrainState, batch: Batch, loss_fn: LossFn):
    """Returns (u_i, new worker_opt, loss_i, aux_i) for the local workers."""
    updates, _, loss, aux = sgd_update(self.hyper, state.workers, batch, loss_fn)
    return updates, state.worker_opt, loss, aux

  def step(self, state, batch, loss_fn, tick):
    del tick
    updates, worker_opt, loss, aux = self._local_update(state, batch, loss_fn)
    alpha = self.hyper.moving_rate

    def local_only():
      return jax.tree.map(jnp.add, state.workers, updates), state.center

    def with_exchange():
      distance = model_state.exchanged(
        jax.tree.map(lambda x, c: x - c, state.workers, state.center), self.hyper.average_stats
      )
      workers = jax.tree.map(lambda x, u, d: x + u - alpha * d, state.workers, updates, distance)
      center = jax.tree.map(lambda c, s: c + alpha * s, state.center, sum_over_workers(distance))
      return workers, center

    is_exchange = (state.step + 1) % self.hyper.comm_period == 0
    workers, center = lax.cond(is_exchange, with_exchange, local_only)
    new_state = state.replace(
      step=state.step + 1,
      workers=workers,
      center=center,
      worker_opt=worker_opt,
      worker_steps=state.worker_steps + 1,
    )
    return new_state, step_metrics(loss, aux, self.hyper.num_workers)

  def worker_params(self, state):
    return state.workers

  @property
  def period(self):
    return self.hyper.comm_period


class SyncMEASGD(SyncEASGD):
  """Synchronous momentum EASGD: Sync EASGD with a momentum local step.

  The exchange is that of SyncEASGD; the local step keeps a velocity v_i:
      classic (mu):            v_i <- mu*v_i - eta*g_i(x_i)
      Nesterov, EAMSGD (delta): v_i <- delta*v_i - eta*g_i(x_i + delta*v_i)
  and u_i = v_i (the new velocity), so x_i <- x_i + v_i [- alpha*(x_i - x~)].
  EAMSGD is from Zhang, Choromanska, LeCun (NIPS 2015), MEASGD from You,
  Buluc, Demmel (SC17).
  """

  name = "sync_measgd"
  momentum = Momentum.REQUIRED
  nesterov = True
  reads = (*SyncEASGD.reads, "optimizer.momentum", "optimizer.nesterov")

  def _init_worker_opt(self, workers):
    return jax.tree.map(jnp.zeros_like, workers)

  def _local_update(self, state, batch, loss_fn):
    velocity, updates, loss, aux = momentum_update(
      self.hyper, state.workers, state.worker_opt, batch, loss_fn
    )
    return updates, velocity, loss, aux
