"""Sync SGD, the synchronous baseline: every worker steps every tick at one shared x.

The synchronous rules with a center (Sync EASGD, Sync MEASGD, DiLoCo, Local
SGD, Lookahead) are the center family of easgd.rules.outer.
"""

import jax
import optax
from jax import lax

from easgd.rules import exchange, model_state, quorum
from easgd.rules.base import BASE_READS, Momentum, Rule
from easgd.rules.optimizers import step_metrics
from easgd.rules.spmd import AXIS, exchange_key, local_workers, mean_over_workers
from easgd.rules.state import initial_state, stack_workers
from easgd.sim import rounds


class SyncSGD(Rule):
  """Synchronous data-parallel SGD (the baseline).

  Every worker computes g_i at the shared x on its own batch; one all-reduce
  forms g = (1/P) sum_i Q(g_i) (Q: the exchange dtype's compression, the
  identity for float32), and the inner optimizer updates x; with sgd:
      plain:     x <- x - eta_t*g
      momentum:  m <- mu*m + g;  x <- x - eta_t*m
      Nesterov:  m <- mu*m + g;  x <- x - eta_t*(g + mu*m)
  With P workers of batch b and float32 this equals one worker with batch P*b.
  BatchNorm statistics are all-reduced too: s <- (1/P) sum_i s'_i (the
  workers share one model, so they cannot keep statistics of their own).

  At a quorum (easgd.sim.rounds) a step's round takes its members' gradients
  alone, g = (1/|M|) sum_{i in M} Q(g_i) (statistics alike); a dropped worker's
  gradient is lost, and it computes its next one at the new x.
  """

  name = "sync_sgd"
  momentum = Momentum.OPTIONAL
  nesterov = True
  # Its workers share one model, so they cannot keep statistics of their own.
  batch_stats = (model_state.AVERAGED,)
  missed = ("drop",)
  missed_reason = (
    "its workers share one x, so a gradient taken in by a later step is a stale gradient "
    "(async_sgd's)"
  )
  reads = (*BASE_READS, *rounds.READS)

  def init(self, params, rng):
    center_opt = self.inner.init(model_state.trainable(params))
    return initial_state(rng, params, center_opt, (), (), self.hyper.num_workers)

  def step(self, state, batch, loss_fn, tick):
    # Every local worker differentiates at the shared x on its own batch. x is
    # first marked as varying over devices: the gradient of a replicated value
    # would otherwise come back already summed over devices (the transpose of
    # broadcasting is a psum), and the sum below is to be the one all-reduce.
    center = lax.pcast(state.center, AXIS, to="varying")
    (loss, aux), grads = jax.vmap(jax.value_and_grad(loss_fn, has_aux=True), in_axes=(None, 0))(
      center, batch
    )

    def mean(tree):
      if self.round_policy is None:
        return mean_over_workers(tree, self.hyper.num_workers, self.hyper.deterministic_sums)
      return quorum.mean(tree, tick, self.hyper.num_workers, self.hyper.deterministic_sums)

    params = model_state.trainable(state.center)
    sent = exchange.compress_workers(
      model_state.trainable(grads),
      self.hyper.exchange_dtype,
      exchange_key(state),
      local_workers(state.worker_steps.shape[0]),
    )
    updates, center_opt = self.inner.update(mean(sent), state.center_opt, params)
    center = model_state.with_trainable(state.center, optax.apply_updates(params, updates))
    if model_state.has_stats(center):
      # The statistics ride in the same message, compressed alike.
      stats = exchange.compress_workers(
        aux[model_state.STATS],
        self.hyper.exchange_dtype,
        jax.random.fold_in(exchange_key(state), 1),
        local_workers(state.worker_steps.shape[0]),
      )
      center = dict(center, **{model_state.STATS: mean(stats)})
    new_state = state.replace(
      step=state.step + 1,
      center=center,
      center_opt=center_opt,
      worker_steps=state.worker_steps + 1,
    )
    learning_rate = self.learning_rate(state.worker_steps)
    return new_state, step_metrics(loss, aux, self.hyper, learning_rate)

  def worker_params(self, state):
    # Every worker holds the shared x.
    return stack_workers(state.center, self.hyper.num_workers)

  @property
  def period(self):
    return 1
