"""Update rules: pure functions over one sharded training state.

Every rule maps `(state, batch) -> (state, metrics)` for one training step.
`Rule.step` is written in SPMD form: it runs on every device inside
`jax.shard_map` over the 1-D mesh axis `workers`, and sees only that
device's slice of the worker-indexed leaves (`workers`, `worker_opt` and the
batch, each with a leading axis of P/D local workers). Quantities over all P
workers are formed as a local sum followed by one all-reduce (`lax.psum`),
which replaces the master of the original algorithms by a tree reduction.

Notation (as in the papers): P workers with parameters x_i, center x~,
learning rate eta, moving rate alpha, communication period tau, momentum mu
(classic) or delta (Nesterov), g_i the stochastic gradient of worker i on its
own mini-batch (plus lambda*x_i with weight decay lambda). `state.step`
counts the steps taken so far (t).

A model with BatchNorm is the tree {"params", "batch_stats"}; a local step
moves its statistics to the forward pass's s' and the exchanges move them
with the parameters or not, as `Hyper.average_stats` says
(`easgd.model_state` has the equations).

Each step also receives a `tick`: the replicated arrays of `cluster.Tick`
that say which workers step and which requests the master serves. The
synchronous rules get an empty tick; the parameter-server rules
(`easgd.parameter_server`) are driven by it.
"""

import abc
import dataclasses
from collections.abc import Callable
from typing import Any, ClassVar

import jax
import jax.numpy as jnp
import optax
from flax import struct
from jax import lax

from easgd import cluster as cluster_lib
from easgd import model_state

AXIS = "workers"

Params = Any
Batch = Any
Metrics = dict[str, jax.Array]
# loss_fn(params, batch) -> (mean loss, {"accuracy": mean accuracy}) for one worker;
# a model with BatchNorm also returns its updated statistics as aux["batch_stats"].
LossFn = Callable[[Params, Batch], tuple[jax.Array, dict[str, jax.Array]]]
# cluster.Tick.device_inputs(), or {} for the synchronous rules.
TickInputs = dict[str, jax.Array]


@struct.dataclass
class TrainState:
  """Everything a run needs to continue: checkpointing this is enough to resume.

  Attributes:
    step: number of steps (ticks) taken, int32 scalar.
    rng: PRNG key of the run. Data order (and any other randomness) is a pure
      function of (rng, worker, worker_steps), so it needs no state of its own.
    center: the center variable x~; for sync_sgd the one shared x.
    center_opt: optimizer state of the center (sync_sgd), else ().
    workers: the workers' parameters x_i, stacked on a leading axis of size P
      (sharded over the mesh); () for sync_sgd, whose workers share x.
    worker_opt: the workers' other state (velocities v_i, accumulated
      gradients, increments in flight), stacked like `workers`; () when the
      rule keeps none.
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


@dataclasses.dataclass(frozen=True)
class Hyper:
  """Hyper-parameters shared by the rules (static: baked into the program)."""

  num_workers: int
  learning_rate: float
  momentum: float = 0.0
  nesterov: bool = False
  comm_period: int = 1
  moving_rate: float = 0.0
  n_sync: int = 1
  server_optimizer: str = "sgd"
  weight_decay: float = 0.0  # lambda: g_i is the gradient of loss + (lambda/2)*|x|^2
  average_stats: bool = True  # BatchNorm statistics: averaged into the center, or local


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


def _sum_over_workers(tree: Params) -> Params:
  """sum_i tree_i over all P workers: a local sum, then one all-reduce."""
  return jax.tree.map(lambda leaf: lax.psum(leaf.sum(axis=0), AXIS), tree)


def _step_metrics(loss: jax.Array, aux: dict[str, jax.Array], num_workers: int) -> Metrics:
  """Mean over all workers of each worker's loss and accuracy."""
  return {
    "loss": lax.psum(loss.sum(), AXIS) / num_workers,
    "accuracy": lax.psum(aux["accuracy"].sum(), AXIS) / num_workers,
  }


def decayed(hyper: Hyper, grads: Params, at: Params) -> Params:
  """g + lambda*x on the parameters (weight decay); BatchNorm statistics untouched."""
  if not hyper.weight_decay:
    return grads
  params = jax.tree.map(
    lambda g, x: g + hyper.weight_decay * x, model_state.trainable(grads), model_state.trainable(at)
  )
  return model_state.with_trainable(grads, params)


def sgd_update(hyper: Hyper, workers: Params, batch: Batch, loss_fn: LossFn):
  """Local SGD step of the local workers: returns (u_i = -eta*g_i(x_i), g_i, loss_i, aux_i);
  u_i moves BatchNorm statistics to s'_i."""
  (loss, aux), grads = jax.vmap(jax.value_and_grad(loss_fn, has_aux=True))(workers, batch)
  grads = decayed(hyper, grads, workers)
  updates = jax.tree.map(lambda g: -hyper.learning_rate * g, grads)
  return model_state.stats_step(updates, workers, aux), grads, loss, aux


def momentum_update(hyper: Hyper, workers: Params, velocity: Params, batch: Batch, loss_fn):
  """Local momentum step: returns (new v_i, u_i, loss_i, aux_i), where
  classic (mu):             v_i <- mu*v_i - eta*g_i(x_i)
  Nesterov, EAMSGD (delta): v_i <- delta*v_i - eta*g_i(x_i + delta*v_i)
  and the step u_i = v_i, with BatchNorm statistics moved to s'_i (their
  velocity stays zero: their gradient is).
  """
  mu, eta = hyper.momentum, hyper.learning_rate
  if hyper.nesterov:
    at = jax.tree.map(lambda x, v: x + mu * v, workers, velocity)
  else:
    at = workers
  (loss, aux), grads = jax.vmap(jax.value_and_grad(loss_fn, has_aux=True))(at, batch)
  grads = decayed(hyper, grads, at)
  velocity = jax.tree.map(lambda v, g: mu * v - eta * g, velocity, grads)
  return velocity, model_state.stats_step(velocity, workers, aux), loss, aux


class Rule(abc.ABC):
  """The one interface the training loop knows."""

  name: ClassVar[str]

  def __init__(self, hyper: Hyper):
    self.hyper = hyper

  @abc.abstractmethod
  def init(self, params: Params, rng: jax.Array) -> TrainState:
    """Builds the state at step 0 from one set of initial parameters."""

  @abc.abstractmethod
  def step(
    self, state: TrainState, batch: Batch, loss_fn: LossFn, tick: TickInputs
  ) -> tuple[TrainState, Metrics]:
    """One training step (tick), per device inside shard_map over `AXIS`."""

  @abc.abstractmethod
  def worker_params(self, state: TrainState) -> Params:
    """The parameters each worker evaluates with, stacked on a leading axis."""

  @property
  @abc.abstractmethod
  def period(self) -> int:
    """Local steps of a worker between two of its exchanges."""

  def make_clock(
    self, cluster: cluster_lib.Cluster, model_bytes: int, seed: int
  ) -> cluster_lib.Clock:
    """The schedule of this rule on `cluster`: all workers in lockstep."""
    return cluster_lib.SyncClock(cluster, self.hyper.num_workers, model_bytes, seed, self.period)

  def tick_inputs(self, tick: cluster_lib.Tick) -> TickInputs:
    """What the device program needs of a tick: nothing, for lockstep rules."""
    del tick
    return {}


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
      return jax.tree.map(lambda leaf: leaf / self.hyper.num_workers, _sum_over_workers(tree))

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
    return new_state, _step_metrics(loss, aux, self.hyper.num_workers)

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
      center = jax.tree.map(lambda c, s: c + alpha * s, state.center, _sum_over_workers(distance))
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
    return new_state, _step_metrics(loss, aux, self.hyper.num_workers)

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

  def _init_worker_opt(self, workers):
    return jax.tree.map(jnp.zeros_like, workers)

  def _local_update(self, state, batch, loss_fn):
    velocity, updates, loss, aux = momentum_update(
      self.hyper, state.workers, state.worker_opt, batch, loss_fn
    )
    return updates, velocity, loss, aux
