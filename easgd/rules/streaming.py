"""The streaming rules: the center family's exchange cut into fragments that are
synced on a staggered schedule, each overlapped with the next inner steps.

Streaming DiLoCo (Douillard et al. 2025, "Streaming DiLoCo with overlapping
communication", arXiv 2501.18512) splits the model into F fragments of whole
layers (easgd.rules.fragments) and syncs one fragment every H/F steps
instead of the whole model every H, which divides the peak bandwidth by about
F. With H = `outer.comm_period`, F = `outer.fragments`, d = `outer.sync_delay`
and t the steps taken, this one included (state.step + 1):

  every step:    u_i = inner update;  x_i <- x_i + u_i
  send, at every t with (t - f*H/F) mod H == 0, for fragment f:
                 each worker sends Q(r_i,f - x~_f) (r_i = x_i after the step's update
                 for the reset pull, from before it for the elastic pull);
                 total_f = sum_i Q(r_i,f - x~_f)          (one all-reduce of fragment f)
  apply, d steps later (the workers trained on meanwhile):
    streaming_diloco  x~_f <- x~_f + outer_f(Delta_f),  Delta_f = -total_f / P
                      x_i,f <- merge * x~_f + (1 - merge) * x_i,f     (merge = 1: x_i,f <- x~_f)
    streaming_easgd   x~_f <- x~_f + alpha * total_f
                      x_i,f <- x_i,f - alpha * (r_i,f - x~_f)   (its own exact difference, as sent)

outer_f is the outer optimizer on fragment f alone (its own state); d < H,
so a fragment's result is applied before it is sent again. With F = 1, d = 0
and merge = 1, streaming_diloco is diloco, and streaming_easgd with F = 1 and
d = 0 is sync_easgd, bit for bit. BatchNorm statistics go with their layer's
fragment, as the center family moves them (averaged; or never sent when local).

At a quorum (easgd.sim.rounds, easgd.rules.quorum) each send of a fragment is a
round of its own: total_f is the round's sum over its members' messages and the
late messages of that fragment's round before (at 1/sqrt(2)), scaled to P
contributions; a late worker's message waits for its fragment's next send. A
dropped worker heals at the send as torchft's replica behind a quorum does, from
a peer's whole state (the round's first member's parameters, inner state and
in-flight differences; its local statistics and residual its own), since its
steps moved every fragment; d steps later it takes fragment f's result as it is.
With F = 1 and d = 0 that is the center family's heal, bit for bit.
"""

import types

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from easgd.declare import Field, Shapes, integer, number
from easgd.errors import ConfigError
from easgd.rules import exchange, fragments, model_state, quorum
from easgd.rules.base import BASE_READS, ELASTIC_READS, Pull
from easgd.rules.optimizers import local_update, step_metrics
from easgd.rules.outer import OUTER_READS, CenterRule
from easgd.rules.spmd import exchange_key, sum_over_workers
from easgd.rules.state import initial_state, stack_workers
from easgd.sim import clocks, rounds

# The streaming fields, each off at the value that leaves streaming out (one fragment,
# no delay, the reset itself): what an algorithm that does not read it needs.
FRAGMENTS = Field(
  "outer.fragments",
  1,
  integer(1, note="at most the model's layers (parameter blocks)"),
  "F: the streaming rules' fragments of whole layers, one synced every comm_period/F "
  "steps (easgd/rules/streaming.py)",
  Shapes.IF_READ,
  earlier=1,
  setting="fragments",
  exclusive="fragments: it does not stream its exchanges",
)
SYNC_DELAY = Field(
  "outer.sync_delay",
  0,
  integer(0, note="below outer.comm_period"),
  "d: the streaming rules' inner steps between sending a fragment and applying its result",
  Shapes.IF_READ,
  earlier=0,
  setting="sync_delay",
  exclusive="sync delay: it does not stream its exchanges",
)
MERGE = Field(
  "outer.merge",
  1.0,
  number(0, 1, low_open=True, high_open=False),
  "streaming_diloco's merge on arrival: x_i <- merge*x~ + (1 - merge)*x_i (1: the reset)",
  Shapes.IF_READ,
  earlier=1.0,
  setting="merge",
  exclusive="merge",
)
STREAMING_READS = (FRAGMENTS.path, SYNC_DELAY.path)


class StreamingRule(CenterRule):
  """The streaming family: see the module docstring. Subclasses set the pull."""

  declares = (FRAGMENTS, SYNC_DELAY, MERGE)
  missed = rounds.MISSED

  @classmethod
  def check_model(cls, hyper, shapes):
    cls.split(hyper, shapes())

  @staticmethod
  def split(hyper, tree) -> fragments.Fragments:
    """The fragments of a model shaped like `tree`; ConfigError if it has too few blocks."""
    try:
      return fragments.split(tree, hyper.fragments)
    except ValueError as error:
      raise ConfigError(f"config.outer.fragments={hyper.fragments} is invalid: {error}") from None

  def fragments_of(self, tree) -> fragments.Fragments:
    """The fragments of a model shaped like `tree`."""
    return self.split(self.hyper, tree)

  def init(self, params, rng):
    self.fragments = self.fragments_of(params)
    # Each fragment's message size, as exchange.sizes sizes the whole model's.
    hyper = self.hyper
    self.fragment_bytes = [
      exchange.sizes(self.fragments.take(params, f), hyper.exchange_dtype, hyper.average_stats)[0]
      for f in range(self.fragments.count)
    ]
    self.heal_bytes = self._heal_bytes(params)
    count = self.hyper.num_workers
    workers = stack_workers(params, count)
    outer = self.outer()
    trainable = model_state.trainable(params)
    outer_states = (
      ()
      if outer is None
      else tuple(outer.init(self.fragments.take(trainable, f)) for f in range(self.fragments.count))
    )
    # What is in flight: each fragment's total since its send (and, for the
    # elastic pull, each worker's own difference, which it pulls itself by).
    center_opt = {"outer": outer_states, "in_flight": jax.tree.map(jnp.zeros_like, params)}
    worker_opt = self.worker_opt(workers)
    if self.pull == Pull.ELASTIC:
      worker_opt["in_flight"] = jax.tree.map(jnp.zeros_like, workers)
    if self.heals():
      # Each worker's drop from each fragment's last round: applied with its result.
      worker_opt["dropped"] = jnp.zeros((count, self.fragments.count), jnp.float32)
    return initial_state(rng, params, center_opt, workers, worker_opt, count)

  def make_clock(self, cluster, model_bytes, seed, sent_bytes=None):
    """The staggered schedule of the fragments `init` found, each of its own size."""
    del sent_bytes  # an all-reduce's bytes are all its own, as the family's
    if not hasattr(self, "fragment_bytes"):
      raise RuntimeError(f"{self.name}'s clock needs the model's fragments: call init first")
    return clocks.StreamingClock(
      cluster,
      self.hyper.num_workers,
      model_bytes,
      seed,
      self.period,
      fragment_bytes=self.fragment_bytes,
      delay=self.hyper.sync_delay,
      policy=self.round_policy,
      heal_bytes=self.heal_bytes,
    )

  def _heal_bytes(self, params) -> float:
    """What `_heal` copies of a member to a dropped worker, in bytes: its parameters
    (its statistics too, unless they stay local) and its inner optimizer's state."""
    sent = params
    if model_state.has_stats(params) and not self.hyper.average_stats:
      sent = model_state.trainable(params)
    inner = jax.eval_shape(self.inner.init, model_state.trainable(params))
    leaves = jax.tree.leaves((sent, inner))
    return float(sum(np.prod(leaf.shape) * np.dtype(leaf.dtype).itemsize for leaf in leaves))

  def heals(self) -> bool:
    """Whether its rounds drop (and heal) the workers that miss them."""
    return self.round_policy is not None and self.round_policy.missed == "drop"

  def fragment_at(self, steps_taken: jax.Array, count: int) -> jax.Array:
    """The fragment sent when `steps_taken` steps are done (-1: none): the f with
    (t - f*H/F) mod H == 0 for t >= 1."""
    period = self.hyper.comm_period
    spacing = period // count
    phase = steps_taken % period
    return jnp.where((steps_taken >= 1) & (phase % spacing == 0), phase // spacing, -1)

  def step(self, state, batch, loss_fn, tick):
    parts = self.fragments_of(state.center)
    updates, inner_state, _, loss, aux = local_update(
      self.inner, state.workers, state.worker_opt["inner"], batch, loss_fn
    )
    taken = state.step + 1
    delay = self.hyper.sync_delay
    # The inner state rides in the carry: a round's drop heals it.
    carry = (
      state.workers,
      state.center,
      state.center_opt,
      {**state.worker_opt, "inner": inner_state},
    )

    # x_i + u_i is formed inside each branch, as the center family forms it, so
    # that XLA compiles the same arithmetic (and diloco's and sync_easgd's bits).
    def local_only(carry):
      workers, center, center_opt, worker_opt = carry
      return jax.tree.map(jnp.add, workers, updates), center, center_opt, worker_opt

    def exchange_of(f):
      """Fragment f sent, and applied in the same step (d = 0)."""

      def exchanged(carry):
        workers, center, center_opt, worker_opt = carry
        stepped = jax.tree.map(jnp.add, workers, updates)
        sent = self._send(state, parts, f, stepped, center_opt, worker_opt, tick)
        stepped, center_opt, worker_opt = sent
        return self._apply(parts, f, workers, stepped, center, center_opt, worker_opt)

      return exchanged

    def apply_of(f):
      """Fragment f's result applied, d steps after it was sent."""

      def apply(carry):
        workers = carry[0]
        stepped = jax.tree.map(jnp.add, workers, updates)
        return self._apply(parts, f, workers, stepped, *carry[1:])

      return apply

    def send_of(f):
      """Fragment f sent from the stepped workers; its result comes d steps later."""

      def send(carry):
        stepped, center, center_opt, worker_opt = carry
        stepped, center_opt, worker_opt = self._send(
          state, parts, f, stepped, center_opt, worker_opt, tick
        )
        return stepped, center, center_opt, worker_opt

      return send

    fragment_ids = range(parts.count)
    sent = self.fragment_at(taken, parts.count)
    if delay == 0:
      carry = lax.switch(sent + 1, [local_only, *map(exchange_of, fragment_ids)], carry)
    else:
      arrived = jnp.where(taken > delay, self.fragment_at(taken - delay, parts.count), -1)
      carry = lax.switch(arrived + 1, [local_only, *map(apply_of, fragment_ids)], carry)
      carry = lax.switch(sent + 1, [lambda carry: carry, *map(send_of, fragment_ids)], carry)
    workers, center, center_opt, worker_opt = carry
    new_state = state.replace(
      step=taken,
      workers=workers,
      center=center,
      center_opt=center_opt,
      worker_opt=worker_opt,
      worker_steps=state.worker_steps + 1,
    )
    learning_rate = self.learning_rate(state.worker_steps)
    return new_state, step_metrics(loss, aux, self.hyper, learning_rate)

  def _send(self, state, parts, f, stepped, center_opt, worker_opt, tick):
    """Fragment f's messages, summed into the in-flight total: Q(r_i - x~) with r_i the
    stepped worker (reset pull) or the worker from before the step (elastic). Under a
    round policy the round's sum (easgd.rules.quorum), a late worker's message held
    for its fragment's next round, and a dropped worker healed from the round's
    first member. Returns (the stepped workers, center_opt, worker_opt)."""
    read = stepped if self.pull == Pull.RESET else state.workers
    distance = model_state.exchanged(
      jax.tree.map(lambda x, c: x - c, parts.take(read, f), parts.take(state.center, f)),
      self.hyper.average_stats,
    )
    count = state.worker_steps.shape[0]
    residual = worker_opt.get("residual")
    if residual is not None:
      residual = parts.take(residual, f)
    messages, left = self.compress(distance, residual, exchange_key(state), count)
    if self.round_policy is None:
      total = sum_over_workers(messages, self.hyper.deterministic_sums)
    else:
      held = worker_opt.get("held")
      taken = None if held is None else parts.take(held, f)
      total = quorum.total(messages, taken, tick, count, self.hyper.deterministic_sums)
      left = quorum.keep_unsent(left, residual, tick, count)
      if held is not None:
        worker_opt = dict(worker_opt, held=parts.put(held, f, quorum.hold(messages, tick, count)))
    if left is not None:
      worker_opt = dict(worker_opt, residual=parts.put(worker_opt["residual"], f, left))
    center_opt = dict(center_opt, in_flight=parts.put(center_opt["in_flight"], f, total))
    if self.pull == Pull.ELASTIC:
      worker_opt = dict(worker_opt, in_flight=parts.put(worker_opt["in_flight"], f, distance))
    if self.heals():
      stepped, worker_opt = self._heal(f, stepped, worker_opt, tick, count)
    return stepped, center_opt, worker_opt

  def _heal(self, f, stepped, worker_opt, tick, count):
    """A dropped worker abandons its steps and takes the state of the round's first
    member, as torchft's replica behind the quorum downloads a peer's: its parameters
    (its own statistics kept when they are local), inner optimizer state and
    in-flight differences; its residual is its own (it sent nothing). Its drop is
    kept for fragment f's result, which it takes as it is."""
    dropped = quorum.rows(tick, "dropped", count)
    copied = quorum.from_first_member(stepped, tick, count)
    if model_state.has_stats(stepped) and not self.hyper.average_stats:
      copied = dict(copied, **{model_state.STATS: stepped[model_state.STATS]})
    stepped = quorum.select(dropped, copied, stepped)
    worker_opt = dict(worker_opt)
    for key in ("inner", "in_flight"):
      if key in worker_opt:
        first = quorum.from_first_member(worker_opt[key], tick, count)
        worker_opt[key] = quorum.select(dropped, first, worker_opt[key])
    worker_opt["dropped"] = worker_opt["dropped"].at[:, f].set(dropped)
    return stepped, worker_opt

  def _apply(self, parts, f, workers, stepped, center, center_opt, worker_opt):
    """The stepped workers (x_i + u_i, healed where a round dropped them) with fragment
    f's in-flight result applied to the center and pulled into the workers. Returns
    the carry."""
    total = parts.take(center_opt["in_flight"], f)
    outer = self.outer()
    if outer is None:
      moved, _ = self._apply_total(parts.take(center, f), (), total, None)
      outer_states = center_opt["outer"]
    else:
      moved, state_f = self._apply_total(
        parts.take(center, f), center_opt["outer"][f], total, outer
      )
      outer_states = tuple(state_f if g == f else s for g, s in enumerate(center_opt["outer"]))
    center = parts.put(center, f, moved)
    center_opt = dict(center_opt, outer=outer_states)
    count = jax.tree.leaves(workers)[0].shape[0]
    local = parts.take(stepped, f)
    reset = self._reset(moved, local, count)
    if self.pull == Pull.ELASTIC:
      # Each worker pulls itself by its own exact difference, as sent: x_i + u_i - alpha*d_i
      # (x_i + u_i is the stepped worker, a healed one's as its peer's).
      alpha = self.hyper.moving_rate
      pulled = jax.tree.map(
        lambda x, d: x - alpha * d, local, parts.take(worker_opt["in_flight"], f)
      )
    else:
      pulled = reset
      merge = self.hyper.merge
      if merge != 1.0:
        # merge = 1 is the reset itself; statistics kept local stay the worker's.
        merged = jax.tree.map(lambda g, x: merge * g + (1.0 - merge) * x, reset, local)
        if model_state.has_stats(local) and not self.hyper.average_stats:
          merged = dict(merged, **{model_state.STATS: local[model_state.STATS]})
        pulled = merged
    if self.heals():
      # A worker dropped from the round takes its result as it is, as the family's
      # dropped worker does: its own message is not in it, and its steps on the
      # fragment since the heal (d of them) are discarded, not merged or pulled.
      pulled = quorum.select(worker_opt["dropped"][:, f], reset, pulled)
    return parts.put(stepped, f, pulled), center, center_opt, worker_opt


# The streaming rules' own defaults: without them a rule would be its family's
# member (F = 1, d = 0); two fragments, each overlapped with one inner step.
STREAMING_DEFAULTS = types.MappingProxyType({FRAGMENTS.path: 2, SYNC_DELAY.path: 1})


class StreamingDiLoCo(StreamingRule):
  """Streaming DiLoCo (Douillard et al. 2025): diloco's reset pull and outer optimizer,
  fragment by fragment, overlapped and merged (the module docstring's equations)."""

  name = "streaming_diloco"
  defaults = STREAMING_DEFAULTS
  pulls = (Pull.RESET,)
  reads = (
    *BASE_READS,
    *ELASTIC_READS,
    *OUTER_READS,
    *STREAMING_READS,
    MERGE.path,
    exchange.ERROR_FEEDBACK.path,
    *rounds.READS,
  )


class StreamingEASGD(StreamingRule):
  """Streaming EASGD: sync_easgd's elastic pull (alpha per fragment, outer SGD at
  P*alpha), fragment by fragment and overlapped (the module docstring's equations)."""

  name = "streaming_easgd"
  defaults = STREAMING_DEFAULTS
  elastic = True
  pulls = (Pull.ELASTIC,)
  reads = (
    *BASE_READS,
    *ELASTIC_READS,
    *STREAMING_READS,
    exchange.ERROR_FEEDBACK.path,
    *rounds.READS,
  )

  def outer_settings(self):
    return None
