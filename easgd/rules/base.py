"""Update rules: pure functions over one sharded training state.

Every rule maps `(state, batch) -> (state, metrics)` for one training step.
`Rule.step` is written in SPMD form: it runs on every device inside
`jax.shard_map` over the 1-D mesh axis `workers`, and sees only that
device's slice of the worker-indexed leaves (`workers`, `worker_opt` and the
batch, each with a leading axis of P/D local workers). Quantities over all P
workers are formed as a local sum followed by one all-reduce (`lax.psum`),
which replaces the master of the original algorithms by a tree reduction.

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
import dataclasses
import enum
import functools
import types
from collections.abc import Callable, Mapping
from typing import Any, ClassVar

import jax
import jax.numpy as jnp
import optax
from flax import struct
from jax import lax
from jax.sharding import PartitionSpec

from easgd.rules import exchange, model_state, optimizers
from easgd.sim import clocks, ticks, timing

AXIS = "workers"

Params = Any
Batch = Any
Metrics = dict[str, jax.Array]
# loss_fn(params, batch) -> (mean loss, {"accuracy": mean accuracy}) for one worker;
# a model with BatchNorm also returns its updated statistics as aux["batch_stats"].
LossFn = Callable[[Params, Batch], tuple[jax.Array, dict[str, jax.Array]]]
# easgd.sim.ticks.Tick.device_inputs(), or {} for the synchronous rules.
TickInputs = dict[str, jax.Array]


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


def _config(path: str, convert: Callable[[Any], Any] | None = None, **default) -> Any:
  """A Hyper field read from the config field `path` (dotted), through `convert`."""
  return dataclasses.field(metadata={"config": path, "convert": convert}, **default)


@dataclasses.dataclass(frozen=True)
class Hyper:
  """Hyper-parameters shared by the rules (static: baked into the program).

  Each field names the config field it comes from (`Hyper.from_config`).
  """

  num_workers: int = _config("workers")
  learning_rate: float = _config("optimizer.learning_rate")  # eta (peak, under a schedule)
  momentum: float = _config("optimizer.momentum", default=0.0)  # mu (sgd)
  nesterov: bool = _config("optimizer.nesterov", default=False)
  comm_period: int = _config("outer.comm_period", default=1)  # tau
  moving_rate: float = _config("outer.moving_rate", default=0.0)  # alpha; 0: DEFAULT_BETA / P
  n_sync: int = _config("downpour.n_sync", default=1)
  server_optimizer: str = _config("downpour.server_optimizer", default="sgd")
  # lambda: L2 (g + lambda*x) for sgd, decoupled for adamw
  weight_decay: float = _config("optimizer.weight_decay", default=0.0)
  # BatchNorm statistics: averaged into the center, or local to each worker.
  average_stats: bool = _config(
    "outer.batch_stats", lambda mode: mode == model_state.AVERAGED, default=True
  )
  # The inner optimizer and its schedule (easgd.rules.optimizers).
  optimizer: str = _config("optimizer.name", default="sgd")
  schedule: str = _config("optimizer.schedule", default="constant")
  warmup_steps: int = _config("optimizer.warmup_steps", default=0)
  boundaries: tuple[float, ...] = _config("optimizer.boundaries", tuple, default=(0.5, 0.75))
  decay_factor: float = _config("optimizer.decay_factor", default=0.1)
  b1: float = _config("optimizer.b1", default=0.9)
  b2: float = _config("optimizer.b2", default=0.999)
  eps: float = _config("optimizer.eps", default=1e-8)
  # The schedule's horizon T, in local steps.
  total_steps: int = _config("run.total_steps", default=0)
  # The center family's outer optimizer and pull (easgd.rules.outer).
  outer_optimizer: str = _config("outer.optimizer", default="sgd")
  outer_learning_rate: float = _config("outer.learning_rate", default=1.0)  # eta_o
  outer_momentum: float = _config("outer.momentum", default=0.0)
  outer_nesterov: bool = _config("outer.nesterov", default=False)
  pull: str = _config("outer.pull", default="")  # "": the rule's own
  # What a worker's exchange message is sent as (easgd.rules.exchange).
  exchange_dtype: str = _config("outer.exchange_dtype", default="float32")
  # The streaming rules' fragments, overlap and merge (easgd.rules.streaming).
  fragments: int = _config("outer.fragments", default=1)
  sync_delay: int = _config("outer.sync_delay", default=0)
  merge: float = _config("outer.merge", default=1.0)
  # async_local_sgd's master and workers (easgd.rules.parameter_server).
  momentum_period: int = _config("outer.momentum_period", default=1)  # N of Delayed Nesterov
  momentum_activation: float = _config("outer.momentum_activation", default=0.0)  # its c
  dynamic_local_steps: bool = _config("outer.dynamic_local_steps", default=False)  # DyLU
  # Sums over workers added in worker order: no layout reassociates them.
  deterministic_sums: bool = _config("deterministic_sums", default=False)

  @classmethod
  def from_config(cls, config) -> "Hyper":
    """The rule's hyper-parameters from a (grouped) config."""
    values = {}
    for field in dataclasses.fields(cls):
      value = functools.reduce(
        lambda group, key: group[key], field.metadata["config"].split("."), config
      )
      convert = field.metadata["convert"]
      values[field.name] = convert(value) if convert else value
    hyper = cls(**values)
    if not hyper.moving_rate and hyper.num_workers > 0:
      # 0 asks for the EASGD authors' beta = P*alpha = 0.9.
      hyper = dataclasses.replace(hyper, moving_rate=DEFAULT_BETA / hyper.num_workers)
    return hyper


# beta = P*alpha of the elastic pull when outer.moving_rate is 0 (Zhang et al. 2015).
DEFAULT_BETA = 0.9


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


def sum_over_workers(tree: Params, in_worker_order: bool = False) -> Params:
  """sum_i tree_i over all P workers (each leaf has a leading axis of local workers).

  By default a local sum, then one all-reduce (`lax.psum`). The order of its
  additions follows the layout (XLA's within a process, the collective
  library's across processes), so the last bits of a sum may differ between
  layouts of the same P. `in_worker_order` (config.deterministic_sums) adds
  ((x_0 + x_1) + x_2) + ... + x_{P-1} on every device after an all-gather:
  the same bits on every layout, for the bytes of an all-gather (each device
  receives all P terms) and P-1 sequential additions.
  """
  if not in_worker_order:
    return jax.tree.map(lambda leaf: lax.psum(leaf.sum(axis=0), AXIS), tree)

  def ordered(leaf):
    every = lax.all_gather(leaf, AXIS, tiled=True, to="invarying")  # [P, ...], worker order
    return lax.fori_loop(1, every.shape[0], lambda i, total: total + every[i], every[0])

  return jax.tree.map(ordered, tree)


def local_workers(count: int) -> jax.Array:
  """The global indices of this device's `count` workers."""
  return lax.axis_index(AXIS) * count + jnp.arange(count)


def exchange_key(state: "TrainState") -> jax.Array:
  """The key of this step's compressed exchanges (easgd.rules.exchange)."""
  return jax.random.fold_in(jax.random.fold_in(state.rng, EXCHANGE_STREAM), state.step)


# Keys of the exchanges are drawn apart from the data's (which fold in epochs).
EXCHANGE_STREAM = 2**31 - 1


def step_metrics(
  loss: jax.Array,
  aux: dict[str, jax.Array],
  hyper: "Hyper",
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


def map_workers(function: Callable, *args):
  """`function` of each worker's slice of `args` (pytrees with a leading axis of local
  workers), stacked on that axis again.

  jax.vmap on CPUs and TPUs. On GPUs one call per worker, one after another
  (`map_unrolled`): vmapped over the workers' own weights, a convolution
  becomes one grouped convolution (feature_group_count = workers), which cuDNN
  runs far slower than the workers' convolutions one by one (bench/gpu.py,
  bench/README.md). The CPU keeps vmap, whose programs (and bits) the replays
  and NumPy references were measured with.
  """
  unrolled = functools.partial(map_unrolled, function)
  return lax.platform_dependent(*args, cuda=unrolled, rocm=unrolled, default=jax.vmap(function))


@jax.named_scope("map_unrolled")  # tests/test_lowering.py finds the GPUs' path by it
def map_unrolled(function: Callable, *args):
  """`map_workers` on GPUs: `function` called once per worker, the results stacked.

  A scan unrolled in full: XLA sees the workers' calls one after another, as a
  Python loop would write them, and `function` is traced once, not once a
  worker (lax.platform_dependent traces every platform's branch, so the CPU's
  programs pay for this one's tracing too).
  """
  count = jax.tree.leaves(args)[0].shape[0]
  _, results = lax.scan(lambda carry, row: (carry, function(*row)), None, args, unroll=count)
  return results


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


class Pull(enum.StrEnum):
  """How an exchange brings the workers back to the center (easgd.rules.outer)."""

  ELASTIC = "elastic"  # x_i <- x_i - alpha*(x_i - x~)
  RESET = "reset"  # x_i <- x~


class Momentum(enum.StrEnum):
  """Whether a rule's optimizer takes momentum (optimizer.momentum)."""

  NONE = "none"  # momentum must be 0
  OPTIONAL = "optional"  # 0 (plain SGD) or in (0, 1)
  REQUIRED = "required"  # in (0, 1)


# Config fields every rule reads: its inner optimizer and schedule (with the
# schedule's horizon), and what its exchange messages are sent as.
BASE_READS = ("optimizer", "outer.exchange_dtype")
# And those of an elastic exchange.
ELASTIC_READS = ("outer.comm_period", "outer.moving_rate", "outer.batch_stats")


# The checkpoint revision (easgd.infra.checkpoint.REVISION) from which the
# look-ahead rules take EAMSGD's form; their checkpoints before it hold optax's trace.
LOOK_AHEAD_REVISION = 2


# A momentum SGD rule's own defaults: mu = 0.9, and eta = 0.01 so that its
# effective step eta/(1 - mu) is the default config's plain SGD step, 0.1 (at
# eta = 0.1 Async MEASGD's center swung between 0.23 and 0.96 accuracy from run
# to run; python bench/rule_defaults.py gives every rule's figure).
MOMENTUM_DEFAULTS = types.MappingProxyType(
  {"optimizer.momentum": 0.9, "optimizer.learning_rate": 0.01}
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
    defaults:    its own values of config fields (dotted path -> value) where
                 the default config's would fail it: they apply where neither
                 the config file nor the command line changes the field
                 (easgd.config.schema.with_rule_defaults).
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
  defaults: ClassVar[Mapping[str, Any]] = types.MappingProxyType({})

  @classmethod
  def parameter_server(cls) -> bool:
    """Whether a master serves the workers' requests (asynchronous rules)."""
    return cls.policy is not None

  def __init__(self, hyper: Hyper):
    self.hyper = hyper
    # The workers' local optimizer (for sync_sgd, the shared model's).
    if self.takes_look_ahead(hyper.optimizer, hyper.nesterov):
      self.inner = optimizers.look_ahead_sgd(hyper)
    else:
      self.inner = optimizers.inner(hyper)

  @classmethod
  def check_model(cls, hyper: Hyper, shapes: Callable[[], Params]) -> None:
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

  def make_clock(
    self, cluster: timing.Cluster, model_bytes: float, seed: int, sent_bytes: float | None = None
  ) -> clocks.Clock:
    """The schedule of this rule on `cluster`: all workers in lockstep."""
    # An all-reduce's bytes are all its own (easgd.rules.exchange.sizes): sent_bytes unused.
    del sent_bytes
    return clocks.SyncClock(cluster, self.hyper.num_workers, model_bytes, seed, self.period)

  def tick_inputs(self, tick: ticks.Tick) -> TickInputs:
    """What the device program needs of a tick: nothing, for lockstep rules."""
    del tick
    return {}
