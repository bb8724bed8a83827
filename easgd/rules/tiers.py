"""Two-tier parameter servers (HALoS's design: Kim et al., "HALoS: Hierarchical
Asynchronous Local SGD over Slow Networks for Geo-Distributed Large Language
Model Training", ICML 2025; reference code utnslab/halos): a server in each
group of the cluster (easgd.sim.timing's `cluster.groups`) serves that group's
workers, and a global server serves the group servers.

Every parameter-server rule (easgd.rules.parameter_server) runs on them with
`outer.two_tier`: its master's operation, unchanged, is served by worker j's
group server on that group's center c_g and optimizer state s_g, in place of
the one center. Each group server also keeps the center it last merged, m_g.
Once K = `outer.global_every` of its workers' requests have been served since
its last merge, and no send of its is in flight, it sends its accumulated
change; the global server applies it with its own optimizer, and the group
server merges the global model back when it arrives:

  SEND   (group g)    d_g <- c_g - m_g
  APPLY  (global)     u, s <- GO.update(-d_g, s);  x~ <- x~ + u;  r_g <- x~
  MERGE  (group g)    c_g <- (1 - w) c_g + w r_g;  m_g <- c_g

GO is Delayed Nesterov (easgd.rules.optimizers.delayed_nesterov) at
eta_G = `outer.global_learning_rate`, beta_G = `outer.global_momentum`, N_G =
`outer.global_momentum_period` (HALoS's global server; the defaults, 1, 0 and 1,
add the change as it is) and w = `outer.merge_weight`. HALoS's code merges
`(1 - w) * local + w * global` (src/halos/ps.py, merge_model), where its help
text says the reverse: this follows the code. Requests served between a SEND
and its MERGE move c_g and are kept in part, (1 - w) of them (w = 1, HALoS's
default, drops them, as its code does); they count toward the next K from
the merge on. x~ is the center the evaluation scores. BatchNorm statistics are
part of c_g and x~: the global optimizer steps the parameters and adds the
statistics' change as it is (as async_local_sgd's master does).

The timing of the three (easgd.sim.clocks.TwoTierClock): a worker reaches its
group's server over the link inside its group; a group server reaches the
global server, in `cluster.server_group`, over the link between groups (its
own group's, inside); the global server serves one send at a time.
"""

import jax
import jax.numpy as jnp
import optax
from jax import lax

from easgd.declare import FLAG, Field, Shapes, integer, number
from easgd.rules import model_state, optimizers
from easgd.sim import ticks

TWO_TIER = Field(
  "outer.two_tier",
  False,
  FLAG,
  "a parameter-server rule's master as HALoS's two tiers: a server in each of "
  "cluster.groups serves its workers, a global server the group servers "
  "(easgd/rules/tiers.py)",
  Shapes.IF_READ,
  earlier=False,
  setting="two_tier",
  exclusive="two-tier servers",
)
GLOBAL_EVERY = Field(
  "outer.global_every",
  8,
  integer(1),
  "K: a group server sends its accumulated change to the global server after every K "
  "requests of its workers since its last merge, one send in flight at most",
  Shapes.IF_READ,
  earlier=8,
  setting="global_every",
  exclusive="two-tier servers",
)
MERGE_WEIGHT = Field(
  "outer.merge_weight",
  1.0,
  number(0, 1, low_open=True, high_open=False, words="must be in (0, 1]"),
  "w: a group server merges the global model back as (1 - w) * its own + w * global",
  Shapes.IF_READ,
  earlier=1.0,
  setting="merge_weight",
  exclusive="two-tier servers",
)
GLOBAL_LEARNING_RATE = Field(
  "outer.global_learning_rate",
  1.0,
  number(0, low_open=True),
  "eta_G: the global server's Delayed Nesterov rate on the group servers' changes",
  Shapes.IF_READ,
  earlier=1.0,
  setting="global_learning_rate",
  exclusive="two-tier servers",
)
GLOBAL_MOMENTUM = Field(
  "outer.global_momentum",
  0.0,
  number(0, 1),
  "beta_G: the global server's Delayed Nesterov momentum (0: none)",
  Shapes.IF_READ,
  earlier=0.0,
  setting="global_momentum",
  exclusive="two-tier servers",
)
GLOBAL_MOMENTUM_PERIOD = Field(
  "outer.global_momentum_period",
  1,
  integer(1),
  "N_G: the global server moves its momentum every N_G sends",
  Shapes.IF_READ,
  earlier=1,
  setting="global_momentum_period",
  exclusive="two-tier servers",
)
FIELDS = (
  TWO_TIER,
  GLOBAL_EVERY,
  MERGE_WEIGHT,
  GLOBAL_LEARNING_RATE,
  GLOBAL_MOMENTUM,
  GLOBAL_MOMENTUM_PERIOD,
)
READS = tuple(field.path for field in FIELDS)


def global_optimizer(hyper) -> optax.GradientTransformation:
  """GO: the global server's Delayed Nesterov."""
  return optimizers.delayed_nesterov(
    hyper.global_learning_rate, hyper.global_momentum, hyper.global_momentum_period, 0.0
  )


def init(params, server_opt, hyper, num_groups: int):
  """The two tiers' state (the rule's `center_opt`): the global optimizer's, and each
  group server's center, optimizer state, last merged center, change in flight and
  the global model it is to merge."""
  group = {
    "center": params,
    "opt": server_opt,
    "merged": params,
    "sent": jax.tree.map(jnp.zeros_like, params),
    "reply": params,
  }
  trainable = model_state.trainable(params)
  return {"global": global_optimizer(hyper).init(trainable), "groups": (group,) * num_groups}


def send(group):
  """SEND: d_g <- c_g - m_g."""
  return dict(group, sent=jax.tree.map(jnp.subtract, group["center"], group["merged"]))


def apply(center, global_opt, group, hyper):
  """APPLY: the global server steps x~ with -d_g; the reply r_g is the new x~."""
  sent = group["sent"]
  delta = jax.tree.map(jnp.negative, model_state.trainable(sent))
  params = model_state.trainable(center)
  updates, global_opt = global_optimizer(hyper).update(delta, global_opt, params)
  center = model_state.with_trainable(center, optax.apply_updates(params, updates))
  if model_state.has_stats(center):
    stats = jax.tree.map(jnp.add, center[model_state.STATS], sent[model_state.STATS])
    center = dict(center, **{model_state.STATS: stats})
  return center, global_opt, dict(group, reply=center)


def merge(group, weight: float):
  """MERGE: c_g <- (1 - w) c_g + w r_g;  m_g <- c_g."""
  merged = jax.tree.map(lambda c, r: (1 - weight) * c + weight * r, group["center"], group["reply"])
  return dict(group, center=merged, merged=merged)


def serve(rule, tick, key, start, carry, request):
  """The tick's operations start, ..., num_ops - 1 on the two tiers, in order.

  carry = (x~, {"global": s, "groups": (group, ...)}, shared); `request(carry_g, n)`
  serves the n-th operation, a worker's, on carry_g = (c_g, s_g, shared) of its
  group `tick["op_group"][n]`, as the one master serves it.
  """
  hyper = rule.hyper

  def operation(n, carry):
    center, tiers, shared = carry
    groups = tiers["groups"]
    kind, g = tick["op_kind"][n], tick["op_group"][n]

    def worker_request(b):
      def run(carry):
        center, tiers, shared = carry
        group = tiers["groups"][b]
        served, opt, shared = request((group["center"], group["opt"], shared), n)
        moved = dict(group, center=served, opt=opt)
        return center, {**tiers, "groups": _with(tiers["groups"], b, moved)}, shared

      return run

    def tier(b):
      def run(carry):
        center, tiers, shared = carry
        moved = server_operation(center, tiers["global"], tiers["groups"][b], kind, hyper)
        new_center, global_opt, group = moved
        tiers = {"global": global_opt, "groups": _with(tiers["groups"], b, group)}
        return new_center, tiers, shared

      return run

    is_tier = kind >= ticks.OpKind.SEND
    return lax.cond(
      is_tier,
      lambda carry: lax.switch(g, [tier(b) for b in range(len(groups))], carry),
      lambda carry: lax.switch(g, [worker_request(b) for b in range(len(groups))], carry),
      carry,
    )

  del key
  return lax.fori_loop(start, tick["num_ops"], operation, carry)


def server_operation(center, global_opt, group, kind, hyper):
  """A server's own operation `kind` (SEND, APPLY or MERGE) for one group:
  (x~, s, the group's state) after it. The tick program runs it for the tick's
  group; runtime=threads and ray as the operation happens."""

  def sent():
    return center, global_opt, send(group)

  def applied():
    return apply(center, global_opt, group, hyper)

  def merged():
    return center, global_opt, merge(group, hyper.merge_weight)

  branch = jnp.clip(kind - ticks.OpKind.SEND, 0, 2)
  return lax.switch(branch, [sent, applied, merged])


def _with(groups: tuple, index: int, group) -> tuple:
  return tuple(group if b == index else other for b, other in enumerate(groups))
