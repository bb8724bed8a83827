"""Asynchronous Local SGD's master (async_local_sgd), a parameter-server rule
(easgd.rules.parameter_server): with a_j the center worker j last fetched,
    Delta_j = -Q(x_j - a_j);  u, s <- delayed_nesterov.update(Delta_j, s);
    x~ <- x~ + u;  x_j <- x~;  a_j <- x~
Local steps before the request are x_j <- x_j + u_j of its inner optimizer.
"""

import math
import types

import jax
import jax.numpy as jnp
import optax

from easgd.declare import FLAG, Field, Shapes, integer, number
from easgd.rules import exchange, model_state, optimizers, tiers
from easgd.rules.base import BASE_READS, COMM_PERIOD, Momentum
from easgd.rules.outer import OUTER_LEARNING_RATE, OUTER_MOMENTUM
from easgd.rules.parameter_server import ParameterServerRule, row, with_row
from easgd.sim import clocks

# The fields of async_local_sgd alone, each off at the value that leaves it out: what
# an algorithm that does not read it needs.
MOMENTUM_PERIOD = Field(
  "outer.momentum_period",
  1,
  integer(1),
  "N: async_local_sgd's Delayed Nesterov moves the master's momentum every N pushes and "
  "applies each push alone in between (1: Nesterov at every push)",
  Shapes.IF_READ,
  earlier=1,
  setting="momentum_period",
  exclusive="Delayed Nesterov master",
)
MOMENTUM_ACTIVATION = Field(
  "outer.momentum_activation",
  0.0,
  number(0, 1, high_open=False, words="must be in [0, 1/outer.momentum_period]"),
  "c: the share of Delayed Nesterov's momentum applied at each push between its moves "
  "(0: all of it when it moves)",
  Shapes.IF_READ,
  earlier=0.0,
  setting="momentum_activation",
  exclusive="Delayed Nesterov master",
)
DYNAMIC_LOCAL_STEPS = Field(
  "outer.dynamic_local_steps",
  False,
  FLAG,
  "async_local_sgd's DyLU: each worker's local steps between pushes scaled by its speed, "
  "floor(comm_period * its speed / the fastest's)",
  Shapes.IF_READ,
  earlier=False,
  setting="dynamic_local_steps",
  exclusive="dynamic local steps",
)
ASYNC_LOCAL_FIELDS = (MOMENTUM_PERIOD, MOMENTUM_ACTIVATION, DYNAMIC_LOCAL_STEPS)


class AsyncLocalSGD(ParameterServerRule):
  """Asynchronous Local SGD (Liu et al. 2024, "Asynchronous Local-SGD Training for
  Language Modeling", arXiv 2401.09135): each worker takes H = comm_period local
  steps of its inner optimizer, pushes its pseudo-gradient, and fetches the center,
  at its own pace; the master applies each push as it arrives, first come first
  served. With a_j the center worker j fetched last (its anchor):
      Delta_j = -Q(x_j - a_j) = a_j - x_j (float32)
      u, s <- DN.update(Delta_j, s);  x~ <- x~ + u;  x_j <- x~;  a_j <- x~
  DN is Delayed Nesterov (`optimizers.delayed_nesterov`: eta_o, beta = outer.momentum,
  N = outer.momentum_period, c = outer.momentum_activation); N = 1 is the
  asynchronous Nesterov baseline. Dynamic local updates (DyLU,
  outer.dynamic_local_steps) give worker w H_w = max(1, floor(H * v_w / max_k v_k))
  local steps between pushes, v_w = 1/T_w its speed in the timing model, T_w its
  mean step time (`periods`). With one worker and N = 1 the run is diloco's (to float rounding).
  BatchNorm statistics: their change since the anchor is added to the center's as
  it is (averaged), or never sent (local).
  """

  name = "async_local_sgd"
  policy = clocks.Policy.FCFS
  elastic = False
  momentum = Momentum.OPTIONAL
  nesterov = True
  # N = 8, the default config's workers: N pushes then carry about one of each
  # worker, as one synchronous outer step does. At N = 1 the default config's
  # eta_o = 0.7 diverged (center accuracy 0.1 at step 100 of a run of 100); at
  # N = 8 it ended at 0.975 (python bench/rule_defaults.py; bench/README.md).
  defaults = types.MappingProxyType({MOMENTUM_PERIOD.path: 8})
  # A worker restarting from the center (runtime=ray's join) anchors there too.
  center_fields = ("anchor",)
  declares = (OUTER_LEARNING_RATE, OUTER_MOMENTUM, *ASYNC_LOCAL_FIELDS)
  reads = (
    *BASE_READS,
    COMM_PERIOD.path,
    OUTER_LEARNING_RATE.path,
    OUTER_MOMENTUM.path,
    *(field.path for field in ASYNC_LOCAL_FIELDS),
    model_state.BATCH_STATS.path,
    *tiers.READS,
  )

  @property
  def period(self):
    return self.hyper.comm_period

  def periods(self, cluster):
    """H for every worker, or DyLU's H_w = max(1, floor(H * T_min / T_w))."""
    if not self.hyper.dynamic_local_steps:
      return super().periods(cluster)
    times = cluster.mean_step_times(self.hyper.num_workers)
    # The speed ratio up to rounding: a worker exactly k times slower gets H/k.
    return tuple(max(1, math.floor(self.period * times.min() / time + 1e-9)) for time in times)

  def server_optimizer(self):
    hyper = self.hyper
    return optimizers.delayed_nesterov(
      hyper.outer_learning_rate,
      hyper.outer_momentum,
      hyper.momentum_period,
      hyper.momentum_activation,
    )

  def request_fields(self):
    return ("anchor",)

  def init(self, params, rng):
    state = super().init(params, rng)
    # Every worker starts from the center: its first anchor.
    return state.replace(worker_opt=dict(state.worker_opt, anchor=state.workers))

  def serve_read(self, carry, j, key, locked: bool, staleness=0):
    """Worker j's push and fetch (see the class docstring), under the lock."""
    del locked, staleness  # fcfs: always; Delayed Nesterov does not read it
    center, center_opt, shared = carry
    hyper = self.hyper
    x, anchor = row(shared["workers"], j), row(shared["anchor"], j)
    change = model_state.exchanged(jax.tree.map(jnp.subtract, x, anchor), hyper.average_stats)
    sent = exchange.compress(change, hyper.exchange_dtype, key)
    delta = jax.tree.map(jnp.negative, model_state.trainable(sent))
    params = model_state.trainable(center)
    updates, center_opt = self.server_optimizer().update(delta, center_opt, params)
    center = model_state.with_trainable(center, optax.apply_updates(params, updates))
    fetched = center
    if model_state.has_stats(center):
      # Running statistics are added as they changed, not optimized.
      stats = jax.tree.map(jnp.add, center[model_state.STATS], sent[model_state.STATS])
      center = fetched = dict(center, **{model_state.STATS: stats})
      if not hyper.average_stats:
        fetched = dict(fetched, **{model_state.STATS: x[model_state.STATS]})
    shared = dict(
      shared,
      workers=with_row(shared["workers"], j, fetched),
      anchor=with_row(shared["anchor"], j, fetched),
    )
    return center, center_opt, shared
