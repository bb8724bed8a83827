"""The workers of runtime=ray: a process each (a Ray actor), and the servers they share.

The coordination is runtime=threads' (easgd.train.runtimes.threads.workers.Workers):
this process keeps a thread per worker, which drives its worker's process
and waits for nobody, the master's disciplines (first come first served,
round robin, Hogwild's READ and WRITE), the packing of events into ticks,
the limit the workers park at, and the trace. What changes is where the
arrays are: each worker's row lives in its own process
(easgd.train.runtimes.ray.actors.WorkerProcess), on its own device, and the
center in S server processes (ServerProcess), split by parameter blocks. A
request's row goes from the worker's process to every server through Ray's
object store, and the answers straight back: only small numbers (and, for a
join, the center it starts from) pass through this process, as in Ray's own
asynchronous parameter-server example. An operation is applied by every
server before the next one starts (the master lock), so the trace is the
order each server applied them in.

At a cut (every worker parked) the rows and the center are fetched here, for
a log, an evaluation or a checkpoint.

A worker process that dies (killed, its node lost) is handled by
cluster.on_worker_loss:
  rejoin:   Ray restarts the process; the worker joins again from the current
            center (x_j <- x~, fresh optimizer state), as an elastic-averaging
            worker naturally joins: a "join" event;
  continue: the run goes on without it: a "leave" event, its row set to the
            center as it left (so the state stays a function of the trace);
  stop:     the run stops, naming the worker.
The loss is seen wherever it is first seen, every call to a worker's process
going through one door (`_get`): a local step, a request, a join, or the
fetch of a cut. A loss seen at a cut (or a worker whose reset waits past it)
leaves the cut without that worker's row: its join or leave is then the last
operation of the cut's own tick ("cut" in easgd.train.runtimes.trace), and the
cut's state has it restarted from the cut's center, as the replay has.

Every answer of a worker's process carries the incarnation it comes from
(easgd.train.runtimes.ray.actors): an answer of a process Ray restarted since
the run last knew it is a loss, like a call that fails, and the servers refuse
its requests, so the run uses nothing a process computed from its
constructor's row. A server process that dies stops the run in one line,
wherever it is seen: the same command resumes from the last checkpoint.
"""

import time

import jax
import numpy as np
import ray
from absl import logging

from easgd import arguments
from easgd.sim.ticks import OpKind
from easgd.train.runtimes import trace as trace_lib
from easgd.train.runtimes.threads import live_clock
from easgd.train.runtimes.threads.workers import Workers, _Stop

# Seconds between checks that a worker's restarted process is up.
RESTART_POLL = 0.2
# The most seconds a restarted worker process may take to come up.
RESTART_TIMEOUT = 300.0

LOSS_POLICIES = ("rejoin", "continue", "stop")


# What a call to a worker's process raises when the process, or the node that held
# its answer, is gone.
WORKER_GONE = (ray.exceptions.RayActorError, ray.exceptions.ObjectLostError)


class WorkerLost(Exception):
  """Worker j's process died, or answered from an incarnation the run does not know."""

  def __init__(self, j: int):
    super().__init__(f"worker {j}'s process died")
    self.j = j


class _ResetAtCut(Exception):
  """Unwinds worker j's thread from where it parked: a cut restarted it meanwhile."""


class RayWorkers(Workers):
  """runtime=threads' coordination, its workers and master in other processes."""

  def __init__(
    self, actors, servers, blocks, fresh_opt, on_loss: str, *args, global_server=None, **kwargs
  ):
    """actors: each worker's WorkerProcess handle (None for a worker gone for good);
    servers: the ServerProcess handles (two tiers: each group's GroupServerProcess);
    blocks: their split of the center (actors.Blocks); fresh_opt: a joining worker's
    optimizer state, as NumPy; global_server: two tiers' GlobalServerProcess; the
    rest: Workers'."""
    super().__init__(*args, **kwargs)
    self.actors, self.servers, self.blocks = actors, servers, blocks
    self.global_server = global_server
    self.fresh_opt, self.on_loss = fresh_opt, on_loss
    self.held: list = []  # what the worker processes are built from, while they may restart
    self.unvalued: dict[int, int] = {}  # worker -> its traced step lost before its values
    # Each worker's process as the run knows it (actors.WorkerProcess.where);
    # None from its loss until its restarted process answers.
    self.incarnations: list[str | None] = [None] * self.num_workers
    self.rowless: set[int] = set()  # workers lost whose join or leave is still to come
    # Workers a cut restarted (a join at the cut): the cut's center, by server,
    # that their process is still to start from.
    self.joins_at_cut: dict[int, list] = {}

  # Where the arrays are: in the worker's and the servers' processes. Every call
  # to a worker's process is answered through `_get`, to a server's through
  # `_from_servers`.

  def _get(self, j: int, ref) -> list:
    """The answer of worker j's call `ref` less the incarnation that ends it;
    WorkerLost if the process died, or is not the incarnation the run knows."""
    try:
      *values, incarnation = ray.get(ref)
    except WORKER_GONE as error:
      raise WorkerLost(j) from error
    if incarnation != self.incarnations[j]:
      raise WorkerLost(j)  # Ray restarted it since: its row is its constructor's
    return values

  def _from_servers(self, refs) -> list:
    """The servers' answers; a lost server stops the run in one line."""
    try:
      return ray.get(refs)
    except ray.exceptions.RayError as error:
      self._server_lost(error)

  def _local_step(self, j: int, step: int) -> tuple[float, float]:
    loss, accuracy = self._get(j, self.actors[j].local_step.remote(step))
    return loss, accuracy

  def _snapshot(self, j: int) -> None:
    self.actors[j].snapshot.remote()  # runs before the worker's next call

  def _exchange_local_step(self, j: int, step: int) -> tuple[float, float]:
    # Called once the step's request is served and traced: a process lost now
    # takes the step's values with it (an "unvalued" step, traced at the loss).
    try:
      loss, accuracy = self._get(j, self.actors[j].exchange_step.remote(step))
    except WorkerLost:
      self.unvalued[j] = step
      raise
    return loss, accuracy

  def _servers_of(self, j: int) -> list:
    """The servers that serve worker j: every block server, or its group's server."""
    return self.servers if self.tiers is None else [self.servers[self.group_of[j]]]

  def _master_operation(self, j, op, tick, position, steps_done, staleness):
    servers = self._servers_of(j)
    sent, *parts = self.actors[j].request.options(num_returns=len(servers) + 1).remote(steps_done)
    numbers = (tick, position, int(trace_lib.OPS[op]), staleness)
    # Each server checks that the row comes from the incarnation the run knows.
    expected = self.incarnations[j]
    calls = [
      server.operate.options(num_returns=2).remote(part, *numbers, sent, expected)
      for server, part in zip(servers, parts, strict=True)
    ]
    answers = [answer for answer, _ in calls]
    try:
      seconds = ray.get([seconds for _, seconds in calls])
    except ray.exceptions.RayError as error:
      failed = error
      try:
        ray.get(sent)
      except WORKER_GONE as error:
        raise WorkerLost(j) from error  # it died before it sent its row
      if isinstance(failed, ray.exceptions.ObjectLostError):
        raise WorkerLost(j) from failed  # its row's parts were lost with its node
      self._server_lost(failed)
    if any(second is None for second in seconds):
      raise WorkerLost(j)  # refused by every server: a restarted process sent it
    return None if op == "write" else answers

  def _answer(self, j: int, answers) -> None:
    self.actors[j].answer.remote(*answers)  # runs before the worker's next call

  def _run_server_op(self, g: int, op: str, tick: int) -> None:
    """A two-tier server's own operation in the servers' processes: the send and the
    reply go from the group server's process to the global server's and back."""
    del tick
    kind = int(trace_lib.OPS[op])
    group = self.servers[g]
    if op == "apply":
      reply, seconds = self.global_server.apply.options(num_returns=2).remote(
        group.sent.remote(), kind
      )
      self._from_servers([seconds, group.take_reply.remote(reply)])
    else:
      self._from_servers([group.operation.remote(kind)])

  def _server_lost(self, error: Exception) -> None:
    """A call to the servers failed with `error`: the run stops in one line naming the
    server whose process died (_Stop)."""
    named = [(f"server {s}", "the center's blocks it held") for s in range(len(self.servers))]
    handles = list(self.servers)
    if self.tiers is not None:
      named = [(f"group {g}'s server", "its group's center") for g in range(len(self.servers))]
      named.append(("the global server", "the global center"))
      handles.append(self.global_server)
    for (name, held), server in zip(named, handles, strict=True):
      try:
        ray.get(server.where.remote(), timeout=30)
      except (ray.exceptions.RayError, TimeoutError):
        self._fail(
          f"{name}'s process died: {held} is lost; the same command resumes from the "
          "last checkpoint"
        )
        raise _Stop from None
    raise RuntimeError(
      f"a call to the servers failed, with every server alive: {arguments.first_line(error)}"
    )

  def fetch_cut(self) -> None:
    """Brings the rows of the live workers and the center here (every worker parked,
    self.cond held). A worker whose row is lost is restarted at the cut
    (`_reset_at_cut`), or stops the run under cluster.on_worker_loss=stop."""
    live = [j for j, actor in enumerate(self.actors) if actor is not None and j not in self.rowless]
    rows = {j: self.actors[j].row.remote() for j in live}
    if self.tiers is not None:
      servers = [self.global_server, *self.servers]
    else:
      servers = self.servers
    try:
      states = self._from_servers([server.state.remote() for server in servers])
    except _Stop:
      raise self.failure from None
    lost = set(self.rowless)
    for j, ref in rows.items():
      try:
        self.workers[j], self.worker_opt[j] = self._get(j, ref)
      except WorkerLost:
        lost.add(j)
        self.incarnations[j] = None
    if self.tiers is not None:
      (self.center, self.global_opt), *groups = states
      self.group_states = list(groups)
    else:
      self.center = self.blocks.join([center for center, _ in states])
      self.center_opt = self.blocks.opt_join([opt for _, opt in states])
    for j in sorted(lost):
      if self.tiers is not None:
        self._reset_at_cut(j, [self._center_of(j)])
      else:
        self._reset_at_cut(j, [center for center, _ in states])
    for j in range(self.num_workers):  # on its device, as the loop's state takes them
      device = self._device_of(j)
      self.workers[j] = jax.device_put(self.workers[j], device)
      self.worker_opt[j] = jax.device_put(self.worker_opt[j], device)

  def _reset_at_cut(self, j: int, center_parts: list) -> None:
    """Worker j, its row lost with the run at the cut, joins or leaves there: the last
    operation of the cut's tick (self.cond held)."""
    cut = self.limit + 1
    if self.on_loss == "stop":
      self._fail(
        f"worker {j}'s process died at the cut of step {cut} "
        "(cluster.on_worker_loss=stop; rejoin or continue go on without it stopping)"
      )
      raise self.failure
    op = "join" if self.on_loss == "rejoin" else "leave"
    tick = self.clock.packer.emit(self._now(), j, False, OpKind.RESET, at_cut=self.limit)
    self.clock.missed[j] = 0
    self._record(j, op, False, tick, read=self.clock.version, cut=True)
    self.workers[j] = jax.tree.map(lambda leaf: np.asarray(leaf)[None], self._center_of(j))
    self.worker_opt[j] = self.rule.restarted_opt(self.fresh_opt, self.workers[j])
    self.rowless.discard(j)
    if op == "leave":
      self._leave(j)
      logging.warning("worker %d's process died at the cut of step %d; it leaves", j, cut)
    else:
      self.joins_at_cut[j] = center_parts
      logging.warning("worker %d's process died at the cut of step %d; it rejoins", j, cut)
    self.cond.notify_all()

  def _leave(self, j: int) -> None:
    """Worker j is gone for good (self.cond held)."""
    self.clock.gone.append(j)
    self.actors[j] = None
    if self.clock.turn == j:
      self.clock.turn = self._next_turn(j)

  def _park_until(self, j: int, fits) -> None:
    super()._park_until(j, fits)
    if j in self.joins_at_cut or j in self.clock.gone:
      raise _ResetAtCut  # a cut restarted it while it waited: its step is not taken

  def wait_for_cut(self) -> None:
    super().wait_for_cut()
    self.fetch_cut()

  def parked(self) -> bool:
    gone = set(self.clock.gone)
    workers = self.parked_at[: self.num_workers]
    return all(at == self.limit or j in gone for j, at in enumerate(workers)) and all(
      at == self.limit or self.clock.phase[g] == live_clock.IDLE
      for g, at in enumerate(self.parked_at[self.num_workers :])
    )

  def _next_turn(self, j: int) -> int:
    gone = set(self.clock.gone)
    for offset in range(1, self.num_workers + 1):
      following = (j + offset) % self.num_workers
      if following not in gone:
        return following
    return j

  # A worker process lost.

  def _steps(self, j: int) -> None:
    while True:
      try:
        if j in self.clock.gone:
          return
        if j in self.joins_at_cut or j in self.rowless:
          if self.on_loss == "continue":
            self._reset(j, "leave")
            return
          if self.incarnations[j] is None:
            self._restarted(j)
          if j in self.joins_at_cut:
            self._join_at_cut(j)
          else:
            self._reset(j, "join")
        super()._steps(j)
      except WorkerLost:
        self._lost(j)
      except _ResetAtCut:
        pass

  def _lost(self, j: int) -> None:
    """Worker j's process is lost: traced, then its policy (its thread goes on to
    rejoin or leave, or the run stops)."""
    if self.stopping:
      raise _Stop from None
    with self.cond:
      if j in self.unvalued:  # traced when the loss is seen, before its join or leave
        self.trace.unvalued(j, self.unvalued.pop(j))
        self.clock.events += 1
      self.rowless.add(j)
      self.incarnations[j] = None
    step = self.steps[j]
    if self.on_loss == "stop":
      self._fail(
        f"worker {j}'s process died at its local step {step} "
        "(cluster.on_worker_loss=stop; rejoin or continue go on without it stopping)"
      )
      raise _Stop from None
    how = "leaves" if self.on_loss == "continue" else "rejoins"
    logging.warning("worker %d's process died at its local step %d; it %s", j, step, how)

  def _join_at_cut(self, j: int) -> None:
    """Worker j's process starts from the center of the cut that restarted it."""
    self._get(j, self.actors[j].join.remote(*self.joins_at_cut[j]))
    with self.cond:
      del self.joins_at_cut[j]
      self.rowless.discard(j)

  def _restarted(self, j: int) -> None:
    """Waits for Ray to restart worker j's process, and traces where it runs."""
    deadline = time.monotonic() + RESTART_TIMEOUT
    while True:
      self._check_stop()
      try:
        place = ray.get(self.actors[j].where.remote(), timeout=RESTART_POLL * 10)
        pid, host, node, incarnation = place
        break
      except ray.exceptions.ActorDiedError:
        self._fail(f"worker {j}'s process died and Ray could not restart it")
        raise _Stop from None
      except (ray.exceptions.RayError, TimeoutError):
        if time.monotonic() > deadline:
          self._fail(f"worker {j}'s process did not restart within {RESTART_TIMEOUT:.0f} s")
          raise _Stop from None
        time.sleep(RESTART_POLL)
    with self.cond:
      self.trace.process(j, pid, host)
      self.clock.events += 1
      self.incarnations[j] = incarnation
    logging.info("worker %d runs in process %d on %s (Ray node %s, restarted)", j, pid, host, node)

  def _reset(self, j: int, op: str) -> None:
    """Worker j joins ("join") or leaves ("leave"): its row restarts from the center,
    an operation of the master (easgd.rules.parameter_server.serve_reset)."""
    packer = self.clock.packer
    while True:
      with self.master:
        with self.cond:
          self._check_stop()
          tick = packer.index_of(j, False, True, reset=True)
          fits = tick <= self.limit
        if fits:
          parts = self._from_servers(
            [server.center_part.remote() for server in self._servers_of(j)]
          )
          if op == "join":
            self._get(j, self.actors[j].join.remote(*parts))
          else:
            center = self.blocks.join(parts)
            self.workers[j] = jax.tree.map(lambda leaf: np.asarray(leaf)[None], center)
            self.worker_opt[j] = self.rule.restarted_opt(self.fresh_opt, self.workers[j])
          with self.cond:
            if op == "leave":
              self._leave(j)
            self.rowless.discard(j)
            self.clock.missed[j] = 0
            self._emit(j, False, op, tick)
            self._record(j, op, False, tick, read=self.clock.version)
          return
      with self.cond:
        self._park_until(j, lambda: packer.index_of(j, False, True, reset=True) <= self.limit)

  def start(self) -> None:
    """Starts the threads of the workers that have not left."""
    self._started = time.perf_counter()
    for j, thread in enumerate(self.threads):  # the workers', then two tiers' servers'
      if j >= self.num_workers or self.actors[j] is not None:
        thread.start()

  def stop(self) -> None:
    super().stop()
    for handle in [*self.actors, *self.servers, self.global_server]:
      if handle is not None:
        ray.kill(handle, no_restart=True)
