"""The processes of runtime=ray: a worker's and a server's, and how the center's
parameter blocks are split over the servers.

Each is a plain class that `easgd.train.runtimes.ray.workers` starts as a Ray
actor (one call at a time). Arrays cross between processes as NumPy, through
Ray's object store; each process builds runtime=threads' programs
(easgd.train.runtimes.threads.runtime.programs) from the run's configuration and its
dataset's statistics (`Recipe`: functions are not sent, as the models'
custom gradients do not pickle), places the arrays on its own device and runs
them, so that a replay of the trace reaches the same bits.

Blocks: the center's leaves (its parameter blocks) are dealt to S servers,
the largest first, each to the server holding the fewest bytes so far, as
parameter-server systems split a model. Server s holds its own leaves and,
in place of every other leaf, a placeholder of ones-sized dimensions, so its
master program is the whole model's with the others' blocks shrunk: every
leaf's arithmetic, and the key each leaf's compression draws from, are those
of the unsplit program. A request goes to every server with that server's
blocks of the worker's row; the worker puts the answers' blocks together.

Incarnations: a worker's process makes a token when it starts (Ray starts it
again after a loss under cluster.on_worker_loss=rejoin, from its constructor's
arguments: the row the run started or resumed with). Every answer carries it,
and the servers
refuse a request whose sender is not the incarnation the driver expects, so
that nothing a restarted process computed from its constructor's row is taken
for the row of the process that died (easgd.train.runtimes.ray.workers).

Ray itself is imported where it is used, inside an actor: the module, its
classes plain, imports without it.
"""

import dataclasses
import os
import socket
import threading
import time
import uuid

import jax
import ml_collections
import numpy as np
from jax.sharding import Mesh

from easgd import assembly
from easgd import steps as steps_lib
from easgd.data import augment as augment_lib
from easgd.infra.compile import compile_program
from easgd.rules import AXIS, model_state
from easgd.train.runtimes.threads.rounds import with_rounds
from easgd.train.runtimes.threads.runtime import (
  LOCAL_SPECS,
  MASTER_SPECS,
  SERVER_SPECS,
  on_device,
  programs,
  served_rule,
  server_program,
)


@dataclasses.dataclass(frozen=True)
class Recipe:
  """What a process builds the run's local step and master operation from."""

  config: dict  # the run's configuration, as a dict
  num_classes: int
  image_shape: tuple  # (H, W, C)
  normalization: assembly.Normalization  # the dataset's

  def rule(self):
    """The run's rule; with two-tier servers, as each group server serves its workers:
    as the one master does, on its group's center (runtime=threads' `served`)."""
    return served_rule(assembly.rule(ml_collections.ConfigDict(self.config)))

  def programs(self):
    """(the local step, the master's operation), as runtime=threads' `programs`."""
    config = ml_collections.ConfigDict(self.config)
    built = assembly.network(config, self.num_classes, self.image_shape, self.normalization)
    augment = augment_lib.get(config.data.augment)
    return programs(self.rule(), built.loss_fn, config.data.batch_size, augment)

  def server_program(self):
    """Two-tier servers' own operation (runtime=threads' `server_program`)."""
    return server_program(assembly.rule(ml_collections.ConfigDict(self.config)))


def placeholder(leaf) -> np.ndarray:
  """What a server holds in place of a leaf another server owns: its dimensions
  shrunk to at most 1 (a scalar stays a scalar)."""
  return np.zeros(tuple(min(size, 1) for size in np.shape(leaf)), np.asarray(leaf).dtype)


class Blocks:
  """Which server owns each leaf of the center (module docstring)."""

  def __init__(self, center, servers: int):
    leaves, self.treedef = jax.tree.flatten(center)
    if servers > len(leaves):
      raise ValueError(f"{servers} servers for {len(leaves)} parameter blocks")
    self.servers = servers
    loads = [0] * servers
    owners = [0] * len(leaves)
    by_size = sorted(range(len(leaves)), key=lambda i: (-int(np.size(leaves[i])), i))
    for i in by_size:
      server = min(range(servers), key=lambda s: (loads[s], s))
      owners[i] = server
      loads[server] += int(np.size(leaves[i])) * np.asarray(leaves[i]).dtype.itemsize
    self.owners = jax.tree.unflatten(self.treedef, owners)
    self.loads = loads  # bytes each server holds

  def part(self, tree, server: int):
    """`tree` (the center's structure) as server `server` holds it."""
    if self.servers == 1:
      return tree
    return jax.tree.map(
      lambda leaf, owner: leaf if owner == server else placeholder(leaf), tree, self.owners
    )

  def join(self, parts):
    """The tree put together from the servers' `parts` (as `part` splits it)."""
    if self.servers == 1:
      return parts[0]
    return jax.tree.map(lambda owner, *leaves: leaves[owner], self.owners, *parts)

  def _param_owners(self):
    return model_state.trainable(self.owners)

  def _map_opt(self, function, *states):
    """`function(owners, *subtrees)` on every subtree of the master's optimizer states
    shaped as the parameters; the other leaves (e.g. counts) from `states[0]`."""
    owners = self._param_owners()
    shape = jax.tree.structure(owners)

    def params_shaped(node) -> bool:
      return jax.tree.structure(node) == shape

    first, *others = states
    flat_others = [jax.tree.flatten(s, is_leaf=params_shaped)[0] for s in others]
    nodes, treedef = jax.tree.flatten(first, is_leaf=params_shaped)
    out = []
    for i, node in enumerate(nodes):
      if params_shaped(node) and shape.num_leaves > 1:
        out.append(function(owners, node, *(flat[i] for flat in flat_others)))
      else:
        out.append(node)
    return jax.tree.unflatten(treedef, out)

  def opt_part(self, state, server: int):
    """The master's optimizer state as server `server` holds it."""
    if self.servers == 1:
      return state

    def part(owners, tree):
      return jax.tree.map(
        lambda leaf, owner: leaf if owner == server else placeholder(leaf), tree, owners
      )

    return self._map_opt(part, state)

  def opt_join(self, parts):
    """The master's optimizer state put together from the servers' parts."""
    if self.servers == 1:
      return parts[0]

    def join(owners, *trees):
      return jax.tree.map(lambda owner, *leaves: leaves[owner], owners, *trees)

    return self._map_opt(join, *parts)

  def row_part(self, row: dict, server: int) -> dict:
    """A request's row (workers, its request fields, worker_steps) for server `server`."""
    return {
      key: value if key == "worker_steps" else self.part(value, server)
      for key, value in row.items()
    }

  def row_join(self, parts: list[dict]) -> dict:
    return {
      key: parts[0][key] if key == "worker_steps" else self.join([p[key] for p in parts])
      for key in parts[0]
    }


def _numpy(tree):
  return jax.tree.map(np.asarray, tree)


def where() -> tuple[int, str, str]:
  """This process, its host and its Ray node."""
  import ray  # noqa: PLC0415 (module docstring)

  return os.getpid(), socket.gethostname(), ray.get_runtime_context().get_node_id()


class WorkerProcess:
  """Worker j in a process of its own: its row (x_j and its optimizer state), its
  training partition and its compiled local step, on this process's first device."""

  def __init__(self, j, recipe, row, images, labels, rng, fresh_opt, blocks, fields, platform):
    """recipe: what it builds its local step from (`Recipe`); row: (x_j, worker_opt) as
    NumPy, each leaf [1, ...]; fresh_opt: the optimizer state a joining worker starts
    with; fields: the rule's request fields."""
    self.incarnation = uuid.uuid4().hex  # this process's start (the module's docstring)
    local, _ = recipe.programs()
    self.restart = recipe.rule().restarted_opt
    self.j, self.blocks, self.fields = j, blocks, fields
    self.device = jax.devices()[0]
    put = self._put
    self.workers, self.opt = put(row[0]), put(row[1])
    self.fresh_opt = fresh_opt
    self.images, self.labels, self.rng = put(images), put(labels), put(rng)
    self.worker = put(np.asarray([j], np.int32))
    self.before = None
    args = self._args(self.workers, self.opt, 0, self.workers)
    lowered = on_device(local, LOCAL_SPECS, self.device).lower(*args)
    self.program = compile_program(lowered, platform)

  def _put(self, tree):
    return jax.device_put(tree, self.device)

  def _args(self, at, opt, step: int, base):
    steps = self._put(np.asarray([step], np.int32))
    return (at, opt, steps, self.rng, self.images, self.labels, self.worker, base)

  def where(self) -> tuple[int, str, str, str]:
    """(pid, host, Ray node, incarnation)."""
    return (*where(), self.incarnation)

  def local_step(self, step: int) -> tuple[float, float, str]:
    """Its local step `step` at x_j, kept; (loss, accuracy, incarnation)."""
    args = self._args(self.workers, self.opt, step, self.workers)
    self.workers, self.opt, loss, accuracy = self.program(*args)
    return float(loss[0]), float(accuracy[0]), self.incarnation

  def snapshot(self) -> None:
    """Keeps x_j and its optimizer state from before its exchange step."""
    self.before = (self.workers, self.opt)

  def request(self, steps_done: int):
    """Its incarnation, and what a request carries to each server (one part a
    server). The incarnation is a small value the driver waits on to tell a lost
    worker from a lost server, and the servers check it (`ServerProcess.operate`)."""
    row = {"workers": self.workers, **{f: self.opt[f] for f in self.fields}}
    row["worker_steps"] = np.asarray([steps_done], np.int32)
    row = _numpy(row)
    parts = (self.blocks.row_part(row, s) for s in range(self.blocks.servers))
    return (self.incarnation, *parts)

  def answer(self, *parts) -> None:
    """Takes the servers' answer: the new x_j and request fields."""
    row = self._put(self.blocks.row_join(list(parts)))
    self.workers = row["workers"]
    self.opt = dict(self.opt, **{f: row[f] for f in self.fields})

  def exchange_step(self, step: int) -> tuple[float, float, str]:
    """The local step of an exchange step: at the snapshot, its update added to the
    answer's x_j - e; the answer's request fields kept. (loss, accuracy, incarnation)."""
    before, opt_before = self.before
    args = self._args(before, opt_before, step, self.workers)
    workers, opt, loss, accuracy = self.program(*args)
    self.workers, self.opt = workers, dict(opt, **{f: self.opt[f] for f in self.fields})
    return float(loss[0]), float(accuracy[0]), self.incarnation

  def join(self, *center_parts) -> tuple[str]:
    """Restarts from the center (`easgd.rules.parameter_server`'s RESET): x_j <- x~,
    fresh optimizer state; (its incarnation,)."""
    center = self.blocks.join(list(center_parts))
    row = jax.tree.map(lambda leaf: np.asarray(leaf)[None], center)
    self.workers = self._put(row)
    self.opt = self._put(self.restart(self.fresh_opt, row))
    return (self.incarnation,)

  def row(self):
    """(x_j, its optimizer state) as NumPy, for a checkpoint or an evaluation, and
    its incarnation."""
    return (*_numpy((self.workers, self.opt)), self.incarnation)


class RoundWorkerProcess:
  """Worker j of a synchronous rule in a process of its own (runtime=ray's rounds,
  easgd.train.runtimes.ray.rounds): its training partition and the rule's step at a
  tick without an exchange (runtime=threads' `easgd.steps.build_worker_step`),
  compiled on this process's first device. Its row comes with each call and goes back
  with the answer: the driver keeps the run's rows, so a process Ray restarts has
  nothing of its own to lose. Two calls at once (`stop` beside `steps`)."""

  def __init__(self, j, recipe, row, images, labels, tick, delay_factor, platform):
    """row: the worker's state view as NumPy (easgd.rules.TrainState, its worker fields
    [1, ...]); tick: the rule's inputs of a tick without an exchange; delay_factor:
    a straggler's sleep after each step, in that step's seconds."""
    self.incarnation = uuid.uuid4().hex
    config = ml_collections.ConfigDict(recipe.config)
    built = assembly.network(config, recipe.num_classes, recipe.image_shape, recipe.normalization)
    self.device = jax.devices()[0]
    mesh = Mesh(np.array([self.device]), (AXIS,))
    put = self._put
    self.data = (put(images), put(labels), put(np.asarray([j], np.int32)), put(tick))
    program = steps_lib.build_worker_step(
      with_rounds(assembly.rule(config)),
      built.loss_fn,
      mesh,
      put(row),
      config.data.batch_size,
      augment_lib.get(config.data.augment),
    )
    self.program = compile_program(program.lower(put(row), *self.data), platform)
    self.delay_factor = delay_factor
    self.stopping = threading.Event()
    self.lock = threading.Lock()
    self.segment = None
    self.stopped = -1  # the last call `stop` named (it may come before its `steps`)

  def _put(self, tree):
    return jax.device_put(tree, self.device)

  def where(self) -> tuple[int, str, str, str]:
    """(pid, host, Ray node, incarnation)."""
    return (*where(), self.incarnation)

  def steps(self, row, start: int, end: int, segment: int):
    """Its steps start, ..., end - 1 from `row` (NumPy); (the row after them, each
    step's loss and accuracy). The row is None if `stop` came first: the worker missed
    its round, and what it computed is not wanted."""
    with self.lock:
      self.segment = segment
      if segment > self.stopped:
        self.stopping.clear()
      else:
        self.stopping.set()
    row = self._put(row)
    losses, accuracies = [], []
    for _ in range(start, end):
      if self.stopping.is_set():
        return None, losses, accuracies
      began = time.perf_counter()
      row, values = self.program(row, *self.data)
      loss, accuracy = jax.device_get((values["loss"], values["accuracy"]))
      if self.delay_factor > 0:  # a slower worker, for real; `stop` ends the sleep
        self.stopping.wait(self.delay_factor * (time.perf_counter() - began))
      losses.append(float(loss))
      accuracies.append(float(accuracy))
    return _numpy(row), losses, accuracies

  def stop(self, segment: int) -> None:
    """The round of call `segment` closed without this worker: it stops at its next step."""
    with self.lock:
      self.stopped = max(self.stopped, segment)
      if segment == self.segment:
        self.stopping.set()


class ServerProcess:
  """One server: its blocks of the center and of the master's optimizer state, and
  the master's operation compiled for them on this process's first device."""

  def __init__(self, recipe, center, center_opt, row, rng, platform):
    _, master = recipe.programs()
    self.device = jax.devices()[0]
    self.center = jax.device_put(center, self.device)
    self.center_opt = jax.device_put(center_opt, self.device)
    self.rng = jax.device_put(rng, self.device)
    numbers = [jax.device_put(np.int32(0), self.device)] * 4
    args = (self.center, self.center_opt, jax.device_put(row, self.device), self.rng, *numbers)
    lowered = on_device(master, MASTER_SPECS, self.device).lower(*args)
    self.program = compile_program(lowered, platform)

  def where(self) -> tuple[int, str, str]:
    return where()

  def operate(
    self, row, tick: int, position: int, kind: int, staleness: int, sender: str, expected: str
  ):
    """One master operation on its blocks, at the request's `staleness`; (the answered
    row, seconds it took). A request from another incarnation of the worker than
    `expected` (its process restarted before it sent its row) is refused, changing
    nothing: (None, None)."""
    if sender != expected:
      return None, None
    started = time.perf_counter()
    numbers = (np.int32(tick), np.int32(position), np.int32(kind), np.int32(staleness))
    center, center_opt, row = self.program(
      self.center, self.center_opt, jax.device_put(row, self.device), self.rng, *numbers
    )
    self.center, self.center_opt = jax.block_until_ready((center, center_opt))
    answer = _numpy(row)
    return answer, time.perf_counter() - started

  def state(self):
    """Its blocks of the center and of the master's optimizer state, as NumPy."""
    return _numpy((self.center, self.center_opt))

  def center_part(self):
    """Its blocks of the center, as NumPy (what a joining worker starts from)."""
    return _numpy(self.center)


class GroupServerProcess(ServerProcess):
  """A two-tier group server (easgd.rules.tiers): its group's center and optimizer
  state, served to its workers with the one master's operation, and its last merged
  center, its send in flight and the reply to merge, which the servers' own
  operation (SEND, MERGE) moves, as the tick program does."""

  def __init__(self, recipe, group, like, row, rng, platform):
    """group: its state as NumPy (tiers.init's); like: (x~, the global server's
    optimizer state) of their shapes, for the servers' program."""
    super().__init__(recipe, group["center"], group["opt"], row, rng, platform)
    self.rest = {key: jax.device_put(value, self.device) for key, value in group.items()}
    self.like = jax.device_put(like, self.device)
    kind = jax.device_put(np.int32(0), self.device)
    program = on_device(recipe.server_program(), SERVER_SPECS, self.device)
    self.server = compile_program(program.lower(*self.like, self._group(), kind), platform)

  def _group(self):
    return dict(self.rest, center=self.center, opt=self.center_opt)

  def operation(self, kind: int) -> float:
    """Its own operation `kind` (SEND or MERGE); the seconds it took."""
    started = time.perf_counter()
    _, _, group = self.server(*self.like, self._group(), np.int32(kind))
    group = jax.block_until_ready(group)
    self.center, self.center_opt = group["center"], group["opt"]
    self.rest = group
    return time.perf_counter() - started

  def sent(self):
    """Its change in flight, d_g, as NumPy (what it sends the global server)."""
    return _numpy(self.rest["sent"])

  def take_reply(self, reply) -> None:
    """The global model the global server answered, r_g, to merge."""
    self.rest = dict(self.rest, reply=jax.device_put(reply, self.device))

  def state(self):
    """Its group's state as NumPy (tiers.init's)."""
    return _numpy(self._group())


class GlobalServerProcess:
  """The two-tier global server: x~ and its optimizer state, stepped by the servers'
  own operation (APPLY) on a group's send, as the tick program does."""

  def __init__(self, recipe, center, global_opt, group, platform):
    """group: a group's state as NumPy, whose shapes its program takes."""
    self.device = jax.devices()[0]
    self.center = jax.device_put(center, self.device)
    self.global_opt = jax.device_put(global_opt, self.device)
    self.template = jax.device_put(group, self.device)
    kind = jax.device_put(np.int32(0), self.device)
    program = on_device(recipe.server_program(), SERVER_SPECS, self.device)
    args = (self.center, self.global_opt, self.template, kind)
    self.program = compile_program(program.lower(*args), platform)

  def where(self) -> tuple[int, str, str]:
    return where()

  def apply(self, sent, kind: int):
    """APPLY of a group's send `sent`: (its reply r_g, as NumPy, and the seconds it took)."""
    started = time.perf_counter()
    group = dict(self.template, sent=jax.device_put(sent, self.device))
    center, global_opt, group = self.program(self.center, self.global_opt, group, np.int32(kind))
    self.center, self.global_opt = jax.block_until_ready((center, global_opt))
    return _numpy(group["reply"]), time.perf_counter() - started

  def state(self):
    """(x~, its optimizer state) as NumPy."""
    return _numpy((self.center, self.global_opt))
