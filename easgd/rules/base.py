"""The rule interface: pure functions over one sharded training state
(easgd.rules.state), built from its hyper-parameters (easgd.rules.hyper).

Every rule maps `(state, batch) -> (state, metrics)` for one training step.
`Rule.step` is written in SPMD form: it runs on every device inside
`jax.shard_map` over the 1-D mesh axis `workers`, and sees only that
device's slice of the worker-indexed leaves (`workers`, `worker_opt` and the
batch, each with a leading axis of P/D local workers). Quantities over all P
workers are formed as a local sum followed by one all-reduce (`lax.psum`),
which replaces the master of the original algorithms by a tree reduction
(easgd.rules.spmd).

Notation (as in the papers): P workers with parameters x_i, center x~,
learning rate eta (eta_k under a schedule), moving rate alpha, communication
period tau, g_i the stochastic gradient of worker i on its own mini-batch,
u_i the update of its inner optimizer (easgd.rules.optimizers). `state.step`
counts the steps taken so far (t).

A model with BatchNorm is the tree {"params", "batch_stats"}; a local step
moves its statistics to the forward pass's s' and the exchanges move them
with the parameters or not, as `Hyper.average_stats` says
(`easgd.rules.model_state` has the equations).

Each step also receives a `tick`: the replicated arrays of `easgd.sim.ticks.Tick`
that say which workers step and which requests the master serves. The
synchronous rules (`easgd.rules.sync`, `easgd.rules.outer`) get an empty tick; the
parameter-server rules (`easgd.rules.parameter_server`) are driven by it.

Every rule class declares what it is and what it accepts (`Rule.momentum`,
`nesterov`, `elastic`, `policy`, `batch_stats`, `reads`); validation, the
planner, the studies and the benchmarks ask the registry
(`easgd.rules.registry`), never a list of names. docs/algorithms.md has
every rule's equations.
"""

import abc
import enum
import types
from collections.abc import Callable, Mapping
from typing import Any, ClassVar

import jax
from jax.sharding import PartitionSpec

from easgd.declare import REQUIRED, Field, Shapes, integer, number, unique
from easgd.rules import exchange, model_state, optimizers, quorum, spmd
from easgd.rules.state import Batch, LossFn, Metrics, Params, TrainState
from easgd.sim import clocks, rounds, ticks, timing

# easgd.sim.ticks.Tick.device_inputs(), or {} for the synchronous rules.
TickInputs = dict[str, jax.Array]


class Pull(enum.StrEnum):
  """How an exchange brings the workers back to the center (easgd.rules.outer)."""

  ELASTIC = "elastic"  # x_i <- x_i - alpha*(x_i - x~)
  RESET = "reset"  # x_i <- x~


class Momentum(enum.StrEnum):
  """Whether a rule's optimizer takes momentum (optimizer.momentum)."""

  NONE = "none"  # momentum must be 0
  OPTIONAL = "optional"  # 0 (plain SGD) or in (0, 1)
  REQUIRED = "required"  # in (0, 1)


# beta = P*alpha of the elastic pull when outer.moving_rate is 0 (Zhang et al. 2015).
DEFAULT_BETA = 0.9

WORKERS = Field(
  "workers",
  8,
  integer(1),
  "P: an array axis sharded over the devices",
  setting="num_workers",
  off=REQUIRED,
)
COMM_PERIOD = Field(
  "outer.comm_period",
  4,
  integer(1),
  "tau: local steps between exchanges with the center (async_local_sgd's H)",
  Shapes.IF_READ,
  formerly=("comm_period",),
  setting="comm_period",
  off=1,
  mid_run=True,
)
MOVING_RATE = Field(
  "outer.moving_rate",
  0.0,
  number(0, 1, words="must be in (0, 1), or 0 for beta = workers*moving_rate = 0.9"),
  "alpha of the elastic pull, beta = workers*alpha < 1; 0: beta = 0.9 (the EASGD "
  "authors'); a reset pull has none: 0",
  Shapes.IF_READ,
  formerly=("moving_rate",),
  setting="moving_rate",
  mid_run=True,
)

# Config fields every rule reads: its inner optimizer and schedule (with the
# schedule's horizon), and what its exchange messages are sent as.
BASE_READS = ("optimizer", exchange.EXCHANGE_DTYPE.path)
# And those of an elastic exchange.
ELASTIC_READS = (COMM_PERIOD.path, MOVING_RATE.path, model_state.BATCH_STATS.path)


# The checkpoint revision (easgd.infra.checkpoint.REVISION) from which the
# look-ahead rules take EAMSGD's form; their checkpoints before it hold optax's trace.
LOOK_AHEAD_REVISION = 2


# A momentum SGD rule's own defaults: mu = 0.9, and eta = 0.01 so that its
# effective step eta/(1 - mu) is the default config's plain SGD step, 0.1 (at
# eta = 0.1 Async MEASGD's center swung between 0.23 and 0.96 accuracy from run
# to run; python bench/rule_defaults.py gives every rule's figure).
MOMENTUM_DEFAULTS = types.MappingProxyType(
  {optimizers.MOMENTUM.path: 0.9, optimizers.LEARNING_RATE.path: 0.01}
)


class Rule(abc.ABC):
  """The one interface the training loop knows.

  A rule class declares what it is and accepts; validation, the planner,
  the studies and the benchmarks read these, never a list of names:
    name:        the registry name (`config.algorithm`).
    momentum:    whether its optimizer takes momentum (`Momentum`).
    nesterov:    whether that momentum may be Nesterov's.
    look_ahead:  whether its Nesterov momentum is EAMSGD's, the gradient taken at
                 the look-ahead point x_i + mu*v_i (`optimizers.look_ahead_sgd`),
                 rather than optax's form.
    elastic:     whether it has an elastic exchange (moving rate, period).
    policy:      None for a synchronous rule; for a parameter-server rule the
                 master's discipline (`easgd.sim.clocks.Policy`).
    batch_stats: the `outer.batch_stats` modes it supports for BatchNorm models.
    reads:       the config fields of the algorithm groups (optimizer, outer,
                 downpour) that its trajectory depends on; the others may
                 differ when a checkpoint is resumed and are left out of
                 its HParams.
    inner_optimizers: the inner optimizers (`optimizer.name`) its workers may step with.
    exchange_dtypes: what its exchange messages may be sent as (`outer.exchange_dtype`).
    pulls:       the pulls it may take (`Pull`, `outer.pull`), its own first;
                 () for a rule without a center to pull to (the SGD rules).
    missed:      the kinds of `outer.missed` its synchronous rounds honour under a
                 quorum (easgd.sim.rounds: drop, late); () for a rule whose
                 exchanges cannot close at a quorum, `missed_reason` says why.
    defaults:    its own values of config fields (dotted path -> value) where
                 the default config's would fail it: they apply where neither
                 the config file nor the command line changes the field
                 (easgd.config.hyperparameters.with_rule_defaults).
    declares:    the config fields this class introduces (easgd.declare.Field),
                 each with the `Hyper` attribute it is read into; a rule has
                 those of its class and of every class above it (`declared`).
  """

  name: ClassVar[str]
  momentum: ClassVar[Momentum] = Momentum.NONE
  nesterov: ClassVar[bool] = False
  look_ahead: ClassVar[bool] = False
  elastic: ClassVar[bool] = False
  policy: ClassVar[clocks.Policy | None] = None
  batch_stats: ClassVar[tuple[str, ...]] = model_state.BATCH_STATS_CHOICES
  reads: ClassVar[tuple[str, ...]] = BASE_READS
  pulls: ClassVar[tuple[str, ...]] = ()
  inner_optimizers: ClassVar[tuple[str, ...]] = optimizers.INNER
  inner_reason: ClassVar[str] = ""  # why, when it is not every one
  exchange_dtypes: ClassVar[tuple[str, ...]] = exchange.COMMON_DTYPES
  missed: ClassVar[tuple[str, ...]] = ()
  missed_reason: ClassVar[str] = ""
  defaults: ClassVar[Mapping[str, Any]] = types.MappingProxyType({})
  declares: ClassVar[tuple[Field, ...]] = (
    WORKERS,
    *optimizers.FIELDS,
    optimizers.TOTAL_STEPS,
    COMM_PERIOD,
    MOVING_RATE,
    exchange.EXCHANGE_DTYPE,
    model_state.BATCH_STATS,
    spmd.DETERMINISTIC_SUMS,
    *rounds.FIELDS,
  )

  @classmethod
  def declared(cls) -> tuple[Field, ...]:
    """The config fields this rule's classes declare, the most general first."""
    return unique(
      field for klass in reversed(cls.__mro__) for field in vars(klass).get("declares", ())
    )

  @classmethod
  def parameter_server(cls) -> bool:
    """Whether a master serves the workers' requests (asynchronous rules)."""
    return cls.policy is not None

  def __init__(self, hyper):
    self.hyper = hyper
    # Its rounds' quorum policy; None where every exchange waits for every worker.
    self.round_policy = rounds.Policy.of(hyper) if self.missed else None
    # The workers' local optimizer (for sync_sgd, the shared model's).
    if self.takes_look_ahead(hyper.optimizer, hyper.nesterov):
      self.inner = optimizers.look_ahead_sgd(hyper)
    else:
      self.inner = optimizers.inner(hyper)

  @classmethod
  def check_config(cls, config) -> None:
    """Checks what only it asks of the config across fields (its own fields against
    the others), after the family's checks (easgd.rules.checks). Raises ConfigError."""
    del config

  @classmethod
  def pull_members(cls, config) -> int:
    """How many workers pull one center elastically: every worker by default; a
    hierarchical rule's group. Its moving rate's beta is this many times alpha (< 1),
    and 0 asks for alpha = 0.9 / this (easgd.rules.hyper, easgd.rules.checks)."""
    return config.workers

  @classmethod
  def check_model(cls, hyper, shapes: Callable[[], Params]) -> None:
    """Checks what it needs of the model; `shapes()` traces its tree's shapes, for a
    rule that asks. Raises ConfigError."""
    del hyper, shapes

  @classmethod
  def takes_look_ahead(cls, optimizer: str, nesterov: bool) -> bool:
    """Whether its workers step with EAMSGD's look-ahead Nesterov momentum."""
    return cls.look_ahead and optimizer == "sgd" and nesterov

  @classmethod
  def changed_since(cls, revision: int, optimizer) -> str:
    """What this version trains differently from a checkpoint written at checkpoint
    `revision` (easgd.infra.checkpoint.REVISION) under the `optimizer` group;
    "" when it trains the same trajectory."""
    if revision < LOOK_AHEAD_REVISION and cls.takes_look_ahead(optimizer.name, optimizer.nesterov):
      return (
        "its Nesterov step took the gradient at x_i (optax's form), and this version "
        "takes it at the look-ahead point x_i + mu*v_i, as EAMSGD does"
      )
    return ""

  def look_ahead_shift(self, inner_state) -> Params | None:
    """mu*v_i, by which EAMSGD's look-ahead point x_i + mu*v_i (where its gradient
    is taken, and whence its update steps) is ahead of x_i; None for a rule
    whose local step starts at x_i."""
    if not self.takes_look_ahead(self.hyper.optimizer, self.hyper.nesterov):
      return None
    return optimizers.look_ahead_shift(self.hyper, inner_state)

  def learning_rate(self, worker_steps: jax.Array) -> jax.Array:
    """The inner learning rate in force for workers with these local step counts."""
    return optimizers.learning_rate_at(self.hyper, worker_steps)

  def metrics_spec(self) -> PartitionSpec:
    """How the step's metrics lie over the devices: means equal on every device."""
    return PartitionSpec()

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

  def exchanges_after(self, step):
    """Whether the step that starts with `step` steps taken (`state.step`: a traced
    integer inside the step, an int in the clock) ends with an exchange: every
    period-th by default. A rule that decides otherwise when it exchanges says so
    here, and its step and its clock follow."""
    return (step + 1) % self.period == 0

  def levels(self) -> tuple[timing.Exchange, ...]:
    """Its levels of exchange, as the network carries them (`timing.Exchange`): which
    blocks of workers all-reduce together, and whether workers or their blocks'
    centers take part. One level of every worker by default; a hierarchical rule has
    one a level (its groups' averages, then the whole's), which the timing model
    charges on the links each crosses (`Cluster.exchange`)."""
    return (timing.Exchange(),)

  def level_exchanges(self, step) -> tuple:
    """For each of `levels`, whether the step that starts with `step` steps taken ends
    with its exchange (traced or int, as `exchanges_after`): the levels' in order,
    one after another. By default the one level's `exchanges_after`."""
    return (self.exchanges_after(step),)

  def level_rates(self) -> tuple[float, ...]:
    """For each of `levels`, the share of the run's steps that end with its exchange
    (the planner's r_k, easgd.sim.sizing), counted over the run's first 2**17 steps."""
    steps = range(min(self.hyper.total_steps, 2**17))
    fired = [self.level_exchanges(step) for step in steps]
    counts = [sum(bool(fires[k]) for fires in fired) for k in range(len(self.levels()))]
    return tuple(count / len(steps) for count in counts)

  def make_clock(
    self, cluster: timing.Cluster, model_bytes: float, seed: int, sent_bytes: float | None = None
  ) -> clocks.Clock:
    """The schedule of this rule on `cluster`: all workers in lockstep, each level's
    exchange on its links."""
    # An all-reduce's bytes are all its own (easgd.rules.exchange.sizes): sent_bytes unused.
    del sent_bytes
    return clocks.SyncClock(
      cluster,
      self.hyper.num_workers,
      model_bytes,
      seed,
      self.period,
      exchanges_after=self.exchanges_after,
      levels=self.levels(),
      level_exchanges=self.level_exchanges,
      policy=self.round_policy,
    )

  def tick_inputs(self, tick: ticks.Tick) -> TickInputs:
    """What the device program needs of a tick: nothing, for lockstep rules; under a
    round policy the round's membership (easgd.rules.quorum)."""
    if self.round_policy is None:
      return {}
    fixed = self.hyper.world_size == "fixed"
    return quorum.tick_inputs(tick.round, self.hyper.num_workers, fixed)
