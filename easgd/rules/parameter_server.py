"""The parameter-server family, as pure functions over the same sharded state.

In the original algorithms a master process holds x~ and serves worker
requests as they arrive. Here the arrival order comes from a seeded timing
model (`easgd.sim.clocks.AsyncClock`), which hands every step a *tick*: the
workers that take a local step (`local`, [P]) and the master's operations in
the order it performs them (`op_kind`, `op_worker`, `num_ops`). One step then
  1. takes a local step for the workers in `local` (the others keep their
     state: slow workers really take fewer steps);
  2. replays the master: the workers' parameters (and whatever a request
     carries) are all-gathered, every device runs the same ordered loop over
     the operations on its replica of x~, and keeps its own workers' rows.
The master's sequential semantics are therefore exact, whatever the order.

Master operations on request of worker j (alpha: moving rate, eta: learning
rate, G_j: gradients accumulated since worker j's last request):
  EASGD family (original, async, async_measgd, hogwild):
      e = alpha*(x_j - x~);  x_j <- x_j - e;  x~ <- x~ + e
    The request is sent at the start of the worker's exchange step and the
    step's local update u_j is computed at the x_j it sent, so the step is
    x_j <- x_j + u_j - alpha*(x_j - x~) (Zhang et al. 2015, Algorithm 1).
  SGD family (async_sgd, async_msgd, hogwild_sgd, downpour):
      u, s <- server_optimizer.update(G_j, s);  x~ <- x~ + u;  x_j <- x~;  G_j <- 0
    Local steps before the request are x_j <- x_j - eta*g_j(x_j),
    G_j <- G_j + g_j (Dean et al. 2012's Downpour client; with one local step
    per request the local update is overwritten by the fetch: Async SGD).
  Asynchronous Local SGD (async_local_sgd): its master in easgd.rules.async_local.
BatchNorm statistics (easgd.rules.model_state) are part of x_j and x~: the EASGD
family's e moves them like the parameters, and the SGD family accumulates
their local changes in G_j and adds them to x~ as they are (the server
optimizer sees the parameters only). With config.outer.batch_stats='local' they
stay out of every request: e and the added change are zero there, and a
fetch keeps the worker's own statistics.
Without a lock (Hogwild) a request is split in two operations: READ at
arrival computes the increment (e, or u) from the x~ it sees then and
updates the worker (x_j <- x_j - e, or x_j <- snapshot + u), and WRITE adds
the increment to x~ one service time later. Requests whose READ and WRITE
interleave read the same snapshot and all their increments are added.
"""

import dataclasses
import types
from typing import ClassVar

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax import lax
from jax.sharding import PartitionSpec

from easgd.declare import Field, Shapes, integer, one_of
from easgd.errors import require
from easgd.rules import exchange, model_state, optimizers, tiers
from easgd.rules.base import BASE_READS, ELASTIC_READS, MOMENTUM_DEFAULTS, Momentum, Pull, Rule
from easgd.rules.optimizers import decayed, local_update, shifted
from easgd.rules.spmd import AXIS, exchange_key
from easgd.rules.state import TrainState, initial_state, stack_workers
from easgd.sim import clocks, ticks, timing


def row(tree, j):
  """Worker j's row of a [workers]-stacked tree."""
  return jax.tree.map(lambda leaf: leaf[j], tree)


def _where_rows(rows, new, old):
  """`new`'s rows where `rows` (a [workers] mask) holds, `old`'s elsewhere."""
  return jax.tree.map(
    lambda n, o: jnp.where(rows.reshape((-1,) + (1,) * (n.ndim - 1)), n, o), new, old
  )


def with_row(tree, j, value):
  """The stacked tree with worker j's row replaced by `value`."""
  return jax.tree.map(lambda leaf, v: leaf.at[j].set(v), tree, value)


class ParameterServerRule(Rule):
  """A master and P workers; see the module docstring for the operations. Every one
  runs on two-tier servers too (`outer.two_tier`, easgd.rules.tiers)."""

  policy: ClassVar[clocks.Policy]
  declares = (*tiers.FIELDS, timing.GROUPS)
  # Whether a worker can rejoin: restart from the center with zeroed request fields
  # (`serve_reset`). A runtime whose worker processes can be lost and restarted
  # (runtime=ray) runs the rules that can.
  rejoins: ClassVar[bool] = True
  # Request fields a worker restarting from the center takes from it too, not zero
  # (`serve_reset`, runtime=ray's join): async_local_sgd's anchor, the center last fetched.
  center_fields: ClassVar[tuple[str, ...]] = ()
  # Whether the tick program serves RESETs: a replay of a runtime=ray trace in which
  # worker processes joined or left (easgd.train.runtimes.simulated.runtime sets it).
  resets = False
  # elastic: EASGD exchange (True) or push/pull of gradients (False)

  @property
  def period(self):
    return self.hyper.comm_period if self.elastic else 1

  def server_optimizer(self) -> optax.GradientTransformation:
    """The master's optimizer at learning rate 1: `_read` scales its update by
    eta_t of the pushing worker's schedule."""
    return optax.sgd(1.0)

  @classmethod
  def check_config(cls, config):
    """The two tiers' settings are read with outer.two_tier only."""
    if not tiers.TWO_TIER.of(config):
      for field in tiers.FIELDS[1:]:
        require(
          field.of(config) == field.off,
          field,
          field.of(config),
          f"is read with outer.two_tier=True (HALoS's two tiers); leave it {field.off!r}",
        )

  @property
  def num_groups(self) -> int:
    """The two tiers' group servers (one a group of cluster.groups; 1 without groups)."""
    return len(self.hyper.groups) or 1

  def periods(self, cluster: timing.Cluster) -> tuple[int, ...]:
    """Each worker's local steps between two of its requests on `cluster`."""
    del cluster
    return (self.period,) * self.hyper.num_workers

  def make_clock(self, cluster, model_bytes, seed, sent_bytes=None):
    settings = dict(
      period=self.periods(cluster),
      policy=self.policy,
      exchange_first=self.elastic,
      sent_bytes=sent_bytes,
    )
    if self.hyper.two_tier:
      return clocks.TwoTierClock(
        cluster,
        self.hyper.num_workers,
        model_bytes,
        seed,
        global_every=self.hyper.global_every,
        **settings,
      )
    return clocks.AsyncClock(cluster, self.hyper.num_workers, model_bytes, seed, **settings)

  def levels(self):
    """The workers' requests, and with two tiers the group servers' sends (level 1)."""
    if self.hyper.two_tier:
      return (timing.Exchange(), timing.Exchange())
    return super().levels()

  def tick_inputs(self, tick):
    if not self.hyper.two_tier:
      return tick.device_inputs()
    inputs = tick.device_inputs(servers=True)
    # Each operation's group server: its worker's, or the group a server operation names.
    of_worker = timing.group_of(self.hyper.groups, self.hyper.num_workers)
    served = np.array([kind < ticks.OpKind.SEND for kind, _ in tick.ops], bool)
    index = inputs["op_worker"][: len(tick.ops)]
    groups = np.zeros_like(inputs["op_worker"])
    own = of_worker[np.minimum(index, len(of_worker) - 1)]
    groups[: len(tick.ops)] = np.where(served, own, index)
    inputs["op_group"] = groups
    return inputs

  # Which worker_opt fields a request reads or writes (all-gathered for the master).
  def request_fields(self) -> tuple[str, ...]:
    fields = () if self.elastic else ("accum",)
    return fields + (("pending",) if self.policy == clocks.Policy.HOGWILD else ())

  def init(self, params, rng):
    num_workers = self.hyper.num_workers
    workers = stack_workers(params, num_workers)
    worker_opt = self.fresh_worker_opt(workers)
    center_opt = () if self.elastic else self.server_optimizer().init(model_state.trainable(params))
    if self.hyper.two_tier:
      center_opt = tiers.init(params, center_opt, self.hyper, self.num_groups)
    return initial_state(rng, params, center_opt, workers, worker_opt, num_workers)

  def fresh_worker_opt(self, workers):
    """The optimizer state of workers `workers` (stacked) that start afresh: at step 0,
    or joining (`serve_reset`)."""
    worker_opt = {field: jax.tree.map(jnp.zeros_like, workers) for field in self.request_fields()}
    worker_opt["inner"] = optimizers.init_workers(self.inner, workers)
    return worker_opt

  def restarted_opt(self, fresh_opt, center_row):
    """A worker's optimizer state as it restarts from the center (runtime=ray's join or
    leave, as `serve_reset` restarts it): fresh, its `center_fields` the center's row."""
    return dict(fresh_opt, **{field: center_row for field in self.center_fields})

  def worker_params(self, state):
    return state.workers

  def metrics_spec(self) -> PartitionSpec:
    """Each worker's values, split over the devices as the workers are."""
    return PartitionSpec(AXIS)

  # The step.

  def local_step(self, state: TrainState, batch, loss_fn, stepping: jax.Array):
    """Local step of this device's workers that are in the tick.

    Returns (workers, worker_opt, deferred, loss, accuracy); the elastic rules
    apply their step after the master's operations (`apply_deferred`), the
    others defer none (None). The threads runtime
    (easgd.train.runtimes.threads.runtime) calls it for one worker at a time.
    """
    hyper = self.hyper

    def where(new, old):
      return jax.tree.map(
        lambda n, o: jnp.where(stepping.reshape((-1,) + (1,) * (n.ndim - 1)), n, o), new, old
      )

    def stepping_only(tree):
      """`tree` for the workers in the tick, zeros for the others."""
      return None if tree is None else where(tree, jax.tree.map(jnp.zeros_like, tree))

    # Every worker computes; the mask keeps the result of those in the tick.
    # (Skipping idle workers with lax.cond made the step about 3x slower on CPU.)
    worker_opt = dict(state.worker_opt)
    # Where each local step starts: x_i, or EAMSGD's look-ahead point x_i + mu*v_i.
    shift = self.look_ahead_shift(worker_opt["inner"])
    updates, inner_state, grads, loss, aux = local_update(
      self.inner,
      state.workers,
      worker_opt["inner"],
      batch,
      loss_fn,
      at=shifted(state.workers, shift),
    )
    worker_opt["inner"] = where(inner_state, worker_opt["inner"])
    if self.elastic:
      # Applied after the master's operations, which read x_i from before the step.
      deferred = (stepping_only(shift), stepping_only(updates))
      return state.workers, worker_opt, deferred, loss, aux["accuracy"]
    workers = where(jax.tree.map(jnp.add, state.workers, updates), state.workers)
    if "accum" in self.request_fields():
      accum = worker_opt["accum"]
      # G_j gathers the (L2-decayed) gradients, and the statistics' local changes.
      pushed = model_state.stats_step(decayed(hyper, grads, state.workers), state.workers, aux)
      worker_opt["accum"] = where(jax.tree.map(jnp.add, accum, pushed), accum)
    return workers, worker_opt, None, loss, aux["accuracy"]

  def apply_deferred(self, base, deferred):
    """`base` (x_j, or x_j - e after its exchange) moved by the local step that
    `local_step` deferred: base + u_j, or EAMSGD's (base + mu*v_j) + u_j."""
    shift, updates = deferred
    return jax.tree.map(jnp.add, shifted(base, shift), updates)

  def serve_read(self, carry, j, key, locked: bool, staleness=0):
    """Request of worker j; locked: READ and WRITE at once. `key` draws the
    compression of what the request sends (easgd.rules.exchange); `staleness`: the
    master updates by other workers since worker j last read (Tick.staleness, an
    int32 the clock or the runtime measured), for a rule whose operation depends
    on it (none of these does).

    carry = (center, center_opt, shared): `shared` holds rows of the workers'
    fields ("workers", "worker_steps" after this tick's steps, and the request
    fields); the tick program passes all P rows, the threads runtime the one
    row of the requesting worker (j = 0)."""
    del staleness
    center, center_opt, shared = carry
    dtype = self.hyper.exchange_dtype
    if self.elastic:
      x = row(shared["workers"], j)
      increment = model_state.exchanged(
        jax.tree.map(lambda xj, c: self.hyper.moving_rate * (xj - c), x, center),
        self.hyper.average_stats,
      )
      shared = dict(
        shared, workers=with_row(shared["workers"], j, jax.tree.map(jnp.subtract, x, increment))
      )
      # The worker moves by its exact e; the master receives Q(e).
      increment = exchange.compress(increment, dtype, key)
    else:
      accum = exchange.compress(row(shared["accum"], j), dtype, key)
      params, center_opt = self.server_optimizer().update(
        model_state.trainable(accum), center_opt, model_state.trainable(center)
      )
      # eta_t of the pusher's schedule, at its last local step.
      rate = self.learning_rate(jnp.maximum(shared["worker_steps"][j] - 1, 0))
      params = jax.tree.map(lambda u: rate * u, params)
      increment = model_state.exchanged(
        model_state.with_trainable(accum, params), self.hyper.average_stats
      )
      fetched = optax.apply_updates(center, increment)
      if model_state.has_stats(fetched) and not self.hyper.average_stats:
        fetched = dict(fetched, **{model_state.STATS: row(shared["workers"], j)[model_state.STATS]})
      shared = dict(
        shared,
        workers=with_row(shared["workers"], j, fetched),
        accum=with_row(shared["accum"], j, jax.tree.map(jnp.zeros_like, increment)),
      )
    if locked:
      center = optax.apply_updates(center, increment)
    else:
      shared = dict(shared, pending=with_row(shared["pending"], j, increment))
    return center, center_opt, shared

  def serve_write(self, carry, j):
    """Hogwild's WRITE of worker j: x~ <- x~ + its pending increment."""
    center, center_opt, shared = carry
    return optax.apply_updates(center, row(shared["pending"], j)), center_opt, shared

  def serve_reset(self, carry, j):
    """Worker j's process joins or leaves (runtime=ray): its row restarts from the
    center, x_j <- x~, its request fields zero, or the center for `center_fields`
    (its optimizer state: `step`)."""
    center, center_opt, shared = carry
    shared = dict(shared, workers=with_row(shared["workers"], j, center))
    for field in self.request_fields():
      zeros = jax.tree.map(jnp.zeros_like, row(shared[field], j))
      restart = center if field in self.center_fields else zeros
      shared[field] = with_row(shared[field], j, restart)
    return center, center_opt, shared

  def serve(self, tick, key, start, carry):
    """The master's operations start, ..., num_ops - 1 of `tick`, in order, on
    carry = (center, center_opt, shared) (see `serve_read`). The tick program
    serves them all; the threads runtime one at a time, as it happens. With
    two-tier servers (`outer.two_tier`) each worker's request is served by its
    group's server, and the servers' own operations come between (easgd.rules.tiers)."""

    def operation(carry, n):
      j = tick["op_worker"][n]
      op_key = jax.random.fold_in(key, n)
      staleness = tick["op_staleness"][n]

      def request(carry):
        if self.policy != clocks.Policy.HOGWILD:
          return self.serve_read(carry, j, op_key, locked=True, staleness=staleness)
        return lax.cond(
          tick["op_kind"][n] == ticks.OpKind.READ,
          lambda: self.serve_read(carry, j, op_key, locked=False, staleness=staleness),
          lambda: self.serve_write(carry, j),
        )

      if not self.resets:
        return request(carry)
      return lax.cond(
        tick["op_kind"][n] == ticks.OpKind.RESET,
        lambda carry: self.serve_reset(carry, j),
        request,
        carry,
      )

    if self.hyper.two_tier:
      return tiers.serve(self, tick, key, start, carry, operation)
    return lax.fori_loop(start, tick["num_ops"], lambda n, carry: operation(carry, n), carry)

  def _restarted(self, tick, first, count) -> jax.Array:
    """Whether each of this device's workers is restarted by a RESET of `tick`."""
    is_reset = (tick["op_kind"] == ticks.OpKind.RESET) & (
      jnp.arange(tick["op_kind"].shape[0]) < tick["num_ops"]
    )
    restarted = (
      jnp.zeros(self.hyper.num_workers, jnp.int32)
      .at[tick["op_worker"]]
      .max(is_reset.astype(jnp.int32))
    )
    return lax.dynamic_slice_in_dim(restarted, first, count) > 0

  def _reset_inner(self, restarted, workers, inner):
    """Fresh optimizer state for the `restarted` workers."""
    fresh = self.fresh_worker_opt(workers)["inner"]
    return _where_rows(restarted, fresh, inner)

  def _master(self, tick, key, first, count, steps_done, center, center_opt, workers, worker_opt):
    shared = {"workers": workers, **{f: worker_opt[f] for f in self.request_fields()}}
    shared["worker_steps"] = steps_done
    # Every device gets all rows, as values equal on every device.
    shared = lax.all_gather(shared, AXIS, tiled=True, to="invarying")
    center, center_opt, shared = self.serve(tick, key, 0, (center, center_opt, shared))
    own = jax.tree.map(lambda leaf: lax.dynamic_slice_in_dim(leaf, first, count), shared)
    worker_opt = dict(worker_opt, **{f: own[f] for f in self.request_fields()})
    return center, center_opt, own["workers"], worker_opt

  def step(self, state, batch, loss_fn, tick):
    count = state.worker_steps.shape[0]
    first = lax.axis_index(AXIS) * count
    stepping = lax.dynamic_slice_in_dim(tick["local"], first, count)
    workers, worker_opt, deferred, loss, accuracy = self.local_step(state, batch, loss_fn, stepping)
    steps_done = state.worker_steps + stepping.astype(jnp.int32)
    key = exchange_key(state)
    center, center_opt, workers, worker_opt = lax.cond(
      tick["num_ops"] > 0,
      lambda *args: self._master(tick, key, first, count, steps_done, *args),
      lambda *args: args,
      state.center,
      state.center_opt,
      workers,
      worker_opt,
    )
    if deferred is not None:
      if self.resets:
        # A worker restarted in the tick keeps the center the RESET gave it, as the
        # run's process holds it (runtime=ray's reset at a cut shares the tick of the
        # worker's last step, whose process held it; easgd.sim.events): its step's
        # deferred update is zeroed. Zeroed, not selected past: the addition stays
        # the one the workers' own programs make, which a select beside it compiled
        # to other roundings.
        restarted = self._restarted(tick, first, count)
        deferred = jax.tree.map(
          lambda leaf: _where_rows(restarted, jnp.zeros_like(leaf), leaf), deferred
        )
      workers = self.apply_deferred(workers, deferred)
    if self.resets:
      inner = self._reset_inner(self._restarted(tick, first, count), workers, worker_opt["inner"])
      worker_opt = dict(worker_opt, inner=inner)
    # Each worker's loss and accuracy, and whether it stepped, where the worker is
    # (`metrics_spec`): the reports average them over the local steps taken
    # (easgd.train.runtimes.rule_runtime).
    # The mask as int32: fetched from several processes it is all-gathered
    # (easgd.infra.sharding.fetch), and an all-gather of booleans crashed XLA's CPU
    # runtime.
    metrics = {"loss": loss, "accuracy": accuracy, "stepping": stepping.astype(jnp.int32)}
    new_state = state.replace(
      step=state.step + 1,
      center=center,
      center_opt=center_opt,
      workers=workers,
      worker_opt=worker_opt,
      worker_steps=steps_done,
    )
    return new_state, metrics


class ElasticMaster(ParameterServerRule):
  """The EASGD family at a master: elastic exchanges, any inner optimizer.
  Subclasses set `name` and `policy`."""

  elastic = True
  pulls = (Pull.ELASTIC,)
  momentum = Momentum.OPTIONAL
  nesterov = True
  reads = (*BASE_READS, *ELASTIC_READS, *tiers.READS)


class OriginalEASGD(ElasticMaster):
  """EASGD with a round-robin master (SC17's baseline): worker i's k-th exchange is
  served after worker i-1's k-th, so later workers see the center as moved by earlier ones."""

  name = "original_easgd"
  policy = clocks.Policy.ROUND_ROBIN


class AsyncEASGD(ElasticMaster):
  """Asynchronous EASGD: exchanges served first come, first served under a lock."""

  name = "async_easgd"
  policy = clocks.Policy.FCFS


class AsyncMEASGD(AsyncEASGD):
  """Async EASGD whose inner SGD must have momentum, as sync_measgd's: classic
  (SC17's Async MEASGD) m_i <- mu*m_i + g_i(x_i), u_i = -eta_t*m_i, or Nesterov
  (EAMSGD, Zhang et al. 2015, Algorithm 2) v_i <- mu*v_i - eta_t*g_i(x_i + mu*v_i),
  u_i = v_i; then x_i <- x_i + u_i [- alpha*(x_i - x~) on exchange steps]."""

  name = "async_measgd"
  momentum = Momentum.REQUIRED
  look_ahead = True
  defaults = MOMENTUM_DEFAULTS
  inner_optimizers = ("sgd",)
  inner_reason = "it is defined by its momentum SGD"


class HogwildEASGD(ElasticMaster):
  """EASGD without a lock at the master: overlapping exchanges read the same x~."""

  name = "hogwild_easgd"
  policy = clocks.Policy.HOGWILD


class AsyncSGD(ParameterServerRule):
  """Asynchronous SGD: pull x, compute g at it, push g; the master applies
  x <- x - eta*g per arrival, first come first served."""

  name = "async_sgd"
  policy = clocks.Policy.FCFS
  elastic = False
  # The master takes a step for every worker's push, so P workers take P steps
  # of eta in the time one worker takes one, each from a stale gradient: on the
  # default config eta = 0.1 ended at 0.941 and 0.2 diverged; 0.03 trains
  # (python bench/rule_defaults.py). Hogwild SGD inherits it.
  defaults = types.MappingProxyType({optimizers.LEARNING_RATE.path: 0.03})
  # The workers push gradients that the master's own optimizer applies: an
  # adaptive inner optimizer would shape only the local steps the fetch overwrites.
  inner_optimizers = ("sgd",)
  inner_reason = "its workers push gradients that the master's optimizer applies"
  # The batch statistics' local changes ride with the pushed gradients.
  reads = (*BASE_READS, model_state.BATCH_STATS.path, *tiers.READS)


class AsyncMSGD(AsyncSGD):
  """Async SGD with momentum at the master: m <- mu*m + g;  x <- x - eta*m."""

  name = "async_msgd"
  momentum = Momentum.REQUIRED  # at the master
  # The master applies each worker's stale gradient, and staleness already acts
  # as momentum (Mitliagkas et al. 2016): with 8 workers mu = 0.9 diverged at
  # eta = 0.01 and trained at eta = 0.002 (python bench/rule_defaults.py).
  defaults = types.MappingProxyType(
    {optimizers.MOMENTUM.path: 0.9, optimizers.LEARNING_RATE.path: 0.002}
  )

  def __init__(self, hyper):
    super().__init__(hyper)
    # optimizer.momentum is the master's: the workers' own steps take none.
    self.inner = optimizers.inner(dataclasses.replace(hyper, momentum=0.0, nesterov=False))

  def server_optimizer(self):
    return optax.sgd(1.0, momentum=self.hyper.momentum)


class HogwildSGD(AsyncSGD):
  """Async SGD without a lock: overlapping pushes apply to the same snapshot."""

  name = "hogwild_sgd"
  policy = clocks.Policy.HOGWILD


class Downpour(AsyncSGD):
  """Downpour SGD / GPU A-SGD (Dean et al. 2012; Paine et al. 2013): n_sync local
  steps (n_fetch = n_push = n_sync), then push the accumulated gradient, which the
  master applies with SGD or AdaGrad, and fetch x~."""

  name = "downpour"
  # Each push is n_sync local steps' accumulated gradient: with the master's
  # sgd, eta = 0.1 diverged and 0.02 ended at 0.94 on the default config; 0.01
  # trains (python bench/rule_defaults.py).
  defaults = types.MappingProxyType({optimizers.LEARNING_RATE.path: 0.01})
  declares = (
    Field(
      "downpour.n_sync",
      4,
      integer(1, note="downpour's local steps between push and fetch"),
      "local steps between push and fetch",
      Shapes.IF_READ,
      formerly=("n_sync",),
      setting="n_sync",
      off=1,
    ),
    Field(
      "downpour.server_optimizer",
      "sgd",
      one_of(("sgd", "adagrad")),
      "the master's optimizer: sgd or adagrad",
      Shapes.IF_READ,
      formerly=("server_optimizer",),
      setting="server_optimizer",
    ),
  )
  reads = (*AsyncSGD.reads, *(field.path for field in declares))

  @property
  def period(self):
    return self.hyper.n_sync

  def server_optimizer(self):
    if self.hyper.server_optimizer == "adagrad":
      return optax.adagrad(1.0)
    return optax.sgd(1.0)
