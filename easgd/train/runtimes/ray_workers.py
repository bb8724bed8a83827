"""The workers of runtime=ray: a process each (a Ray actor), and the servers they share.

The coordination is runtime=threads' (easgd.train.runtimes.workers.Workers):
this process keeps a thread per worker, which drives its worker's process
and waits for nobody, the master's disciplines (first come first served,
round robin, Hogwild's READ and WRITE), the packing of events into ticks,
the limit the workers park at, and the trace. What changes is where the
arrays are: each worker's row lives in its own process
(easgd.train.runtimes.ray_actors.WorkerProcess), on its own device, and the
center in S server processes (ServerProcess), split by parameter blocks. A
request's row goes from the worker's process to every server through Ray's
object store, and the answers straight back: only small numbers pass
through this process, as in Ray's own asynchronous parameter-server
example. An operation is applied by every server before the next one starts
(the master lock), so the trace is the order each server applied them in.

At a cut (every worker parked) the rows and the center are fetched here, for
an evaluation or a checkpoint.

A worker process that dies (killed, its node lost) is handled by
cluster.on_worker_loss:
  rejoin:   Ray restarts the process; the worker joins again from the current
            center (x_j <- x~, fresh optimizer state), as an elastic-averaging
            worker naturally joins: a "join" event;
  continue: the run goes on without it: a "leave" event, its row set to the
            center as it left (so the state stays a function of the trace);
  stop:     the run stops, naming the worker.
A server process that dies stops the run: the same command resumes from the
last checkpoint.
"""

import time

import jax
import numpy as np
import ray
from absl import logging

from easgd.train.runtimes import trace as trace_lib
from easgd.train.runtimes.workers import Workers, _Stop

# Seconds between checks that a worker's restarted process is up.
RESTART_POLL = 0.2
# The most seconds a restarted worker process may take to come up.
RESTART_TIMEOUT = 300.0

LOSS_POLICIES = ("rejoin", "continue", "stop")


class WorkerLost(Exception):
  """Worker j's process died."""

  def __init__(self, j: int):
    super().__init__(f"worker {j}'s process died")
    self.j = j


class RayWorkers(Workers):
  """runtime=threads' coordination, its workers and master in other processes."""

  def __init__(self, actors, servers, blocks, fresh_opt, on_loss: str, *args, **kwargs):
    """actors: each worker's WorkerProcess handle (None for a worker gone for good);
    servers: the ServerProcess handles; blocks: their split of the center
    (ray_actors.Blocks); fresh_opt: a joining worker's optimizer state, as NumPy;
    the rest: Workers'."""
    super().__init__(*args, **kwargs)
    self.actors, self.servers, self.blocks = actors, servers, blocks
    self.fresh_opt, self.on_loss = fresh_opt, on_loss
    self.held: list = []  # what the worker processes are built from, while they may restart
    self.unvalued: dict[int, int] = {}  # worker -> its traced step lost before its values

  # Where the arrays are: in the worker's and the servers' processes.

  def _get(self, j: int, ref):
    try:
      return ray.get(ref)
    except ray.exceptions.RayActorError as error:
      raise WorkerLost(j) from error

  def _local_step(self, j: int, step: int) -> tuple[float, float]:
    return self._get(j, self.actors[j].local_step.remote(step))

  def _snapshot(self, j: int) -> None:
    self.actors[j].snapshot.remote()  # runs before the worker's next call

  def _exchange_local_step(self, j: int, step: int) -> tuple[float, float]:
    # Called once the step's request is served and traced: a process lost now
    # takes the step's values with it (an "unvalued" step, traced at the loss).
    try:
      return self._get(j, self.actors[j].exchange_step.remote(step))
    except WorkerLost:
      self.unvalued[j] = step
      raise

  def _master_operation(self, j, op, tick, position, steps_done):
    count = len(self.servers)
    sent, *parts = self.actors[j].request.options(num_returns=count + 1).remote(steps_done)
    kind = int(trace_lib.OPS[op])
    calls = [
      server.operate.options(num_returns=2).remote(part, tick, position, kind)
      for server, part in zip(self.servers, parts, strict=True)
    ]
    answers = [answer for answer, _ in calls]
    try:
      ray.get([seconds for _, seconds in calls])
    except ray.exceptions.RayError:
      self._get(j, sent)  # the worker's process died before it sent its row
      self._server_lost()
    return None if op == "write" else answers

  def _answer(self, j: int, answers) -> None:
    self.actors[j].answer.remote(*answers)  # runs before the worker's next call

  def _server_lost(self) -> None:
    for s, server in enumerate(self.servers):
      try:
        ray.get(server.where.remote(), timeout=30)
      except (ray.exceptions.RayError, TimeoutError):
        self._fail(
          f"server {s}'s process died: the center's blocks it held are lost; the same "
          "command resumes from the last checkpoint"
        )
        raise _Stop from None
    raise RuntimeError("a master operation failed, with every server alive")

  def fetch_cut(self) -> None:
    """Brings the rows of the live workers and the center here (every worker parked)."""
    live = [j for j, actor in enumerate(self.actors) if actor is not None]
    rows = ray.get([self.actors[j].row.remote() for j in live])
    for j, (workers, opt) in zip(live, rows, strict=True):
      self.workers[j], self.worker_opt[j] = workers, opt
    for j in range(self.num_workers):  # on its device, as the loop's state takes them
      device = self._device_of(j)
      self.workers[j] = jax.device_put(self.workers[j], device)
      self.worker_opt[j] = jax.device_put(self.worker_opt[j], device)
    states = ray.get([server.state.remote() for server in self.servers])
    self.center = self.blocks.join([center for center, _ in states])
    self.center_opt = self.blocks.opt_join([opt for _, opt in states])

  def wait_for_cut(self) -> None:
    super().wait_for_cut()
    self.fetch_cut()

  def parked(self) -> bool:
    gone = set(self.clock.gone)
    return all(at == self.limit or j in gone for j, at in enumerate(self.parked_at))

  def _next_turn(self, j: int) -> int:
    gone = set(self.clock.gone)
    for offset in range(1, self.num_workers + 1):
      following = (j + offset) % self.num_workers
      if following not in gone:
        return following
    return j

  # A worker process lost.

  def _steps(self, j: int) -> None:
    lost = False
    while True:
      try:
        if lost:
          self._restarted(j)
          self._reset(j, "join")
          lost = False
        super()._steps(j)
      except WorkerLost:
        if self.stopping:
          raise _Stop from None
        if j in self.unvalued:  # traced when the loss is seen, before its join or leave
          with self.cond:
            self.trace.unvalued(j, self.unvalued.pop(j))
            self.clock.events += 1
        step = self.steps[j]
        if self.on_loss == "stop":
          self._fail(
            f"worker {j}'s process died at its local step {step} "
            "(cluster.on_worker_loss=stop; rejoin or continue go on without it stopping)"
          )
          raise _Stop from None
        if self.on_loss == "continue":
          logging.warning("worker %d's process died at its local step %d; it leaves", j, step)
          self._reset(j, "leave")
          return
        logging.warning("worker %d's process died at its local step %d; it rejoins", j, step)
        lost = True

  def _restarted(self, j: int) -> None:
    """Waits for Ray to restart worker j's process, and traces where it runs."""
    deadline = time.monotonic() + RESTART_TIMEOUT
    while True:
      self._check_stop()
      try:
        pid, host, node = ray.get(self.actors[j].where.remote(), timeout=RESTART_POLL * 10)
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
          parts = [server.center_part.remote() for server in self.servers]
          if op == "join":
            self._get(j, self.actors[j].join.remote(*parts))
          else:
            center = self.blocks.join(ray.get(parts))
            self.workers[j] = jax.tree.map(lambda leaf: np.asarray(leaf)[None], center)
            self.worker_opt[j] = self.fresh_opt
          with self.cond:
            if op == "leave":
              self.clock.gone.append(j)
              self.actors[j] = None
              if self.clock.turn == j:
                self.clock.turn = self._next_turn(j)
            self.clock.missed[j] = 0
            self._emit(j, False, op, tick)
            self._record(j, op, False, tick, read=self.clock.version)
          return
      with self.cond:
        self._park_until(j, lambda: packer.index_of(j, False, True, reset=True) <= self.limit)

  def start(self) -> None:
    """Starts the threads of the workers that have not left."""
    self._started = time.perf_counter()
    for j, thread in enumerate(self.threads):
      if self.actors[j] is not None:
        thread.start()

  def stop(self) -> None:
    super().stop()
    for handle in [*self.actors, *self.servers]:
      if handle is not None:
        ray.kill(handle, no_restart=True)
