"""runtime=ray for the synchronous rules with local steps: runtime=threads' rounds
(easgd.train.runtimes.threads.rounds), each worker's steps in a process of its own.

This process keeps the run's rows, the rounds and the trace, as runtime=threads does;
a worker's thread here hands its worker's process (actors.RoundWorkerProcess) its row
and the steps to take, and the worker arrives when the answer does. A round that
closes without a worker tells its process to stop at its next step (under
outer.missed=drop; a late one finishes them). The round's last
tick, the exchange, runs here, on this process's devices.

A worker process that dies is absent from the round it was in, under
cluster.on_worker_loss:
  rejoin:   Ray restarts the process, and the worker is back in the next round from
            the row the round gave it (a dropped worker's: the round's result); a
            loss in the steps before a log, an evaluation or a checkpoint (a cut)
            takes the steps again on the restarted process, which the row they
            start from makes the same;
  continue: the run goes on without it: absent from every later round, it takes no
            step from the tick its lost steps began at (a "gone" line of the trace);
  stop:     the run stops, naming the worker.
The trace replays under runtime=threads: each round waits for its members, its
dropped workers and those gone for good take no step, whatever the worker processes
did.
"""

import contextlib
import threading
import time

import jax
import numpy as np
import ray
from absl import logging

from easgd import assembly, ray_connection
from easgd.errors import WorkerFailed
from easgd.sim import ticks
from easgd.train.runtimes.ray import actors as ray_actors
from easgd.train.runtimes.ray.workers import RESTART_POLL, RESTART_TIMEOUT, WORKER_GONE
from easgd.train.runtimes.threads.rounds import Gate, RoundsTrainee, Work

# The most times a worker's process may die in one call's steps before the run stops:
# a process that dies every time it takes them (a crash, not a loss) would else be
# restarted for ever.
MAX_LOSSES = 3


class RayRoundsTrainee(RoundsTrainee):
  """runtime=threads' rounds, each worker's steps in a Ray actor process."""

  def __init__(self, *args, started_ray: bool, actor_options: dict, **kwargs):
    self.started_ray = started_ray
    self.actor_options = actor_options
    self.actors: list = []
    self.restarting: set[int] = set()  # workers whose process Ray is restarting
    self.lock = threading.Lock()  # the clock's and the trace's, from the workers' threads
    # A lost worker process is said in the run's own line: Ray's page about it is left out.
    self._quiet = contextlib.ExitStack()
    self._quiet.enter_context(ray_connection.lost_processes_in_our_words())
    try:
      super().__init__(*args, **kwargs)
    except BaseException:
      self._end_ray()
      raise

  def _start_workers(self, setup, augment) -> None:
    """A process each worker (none for a worker gone for good), its step compiled there."""
    del augment  # each process builds its own
    config, dataset = setup.config, setup.dataset
    recipe = ray_actors.Recipe(
      config.to_dict(),
      dataset.num_classes,
      tuple(dataset.train_images.shape[1:]),
      assembly.Normalization.of(dataset),
    )
    restarts = -1 if config.cluster.on_worker_loss == "rejoin" else 0
    worker_class = ray.remote(ray_actors.RoundWorkerProcess).options(
      max_restarts=restarts, max_task_retries=0, max_concurrency=2, **self.actor_options
    )
    tick = jax.tree.map(np.asarray, self.rule.tick_inputs(ticks.Tick.empty(self.num_workers)))
    # A restarted process is built again from its constructor's arguments: they are put
    # in the object store here and held until the run ends.
    self.held = [
      None
      if j in self.clock.gone
      else [
        ray.put(argument)
        for argument in (
          j,
          recipe,
          jax.device_get(self.rows[j]),
          np.asarray(self.images[j]),
          np.asarray(self.labels[j]),
          tick,
          float(self.delay_factor[j]),
          "gpu" if config.ray.worker_gpus else "cpu",
        )
      ]
      for j in range(self.num_workers)
    ]
    self.actors = [None if held is None else worker_class.remote(*held) for held in self.held]
    live = [j for j, actor in enumerate(self.actors) if actor is not None]
    try:
      places = ray.get([self.actors[j].where.remote() for j in live])
    except ray.exceptions.RayError as error:
      first = str(error).strip().splitlines()[-1] if str(error).strip() else ""
      raise RuntimeError(f"the worker processes did not start: {first}") from None
    for j, (pid, host, node, _) in zip(live, places, strict=True):
      self.trace.process(j, pid, host)
      self.clock.events += 1
      logging.info("worker %d runs in process %d on %s (Ray node %s)", j, pid, host, node)

  def _work(self, j: int, start: int, end: int, gate: Gate) -> Work:
    try:
      return self._steps(j, start, end, gate)
    except BaseException as error:  # noqa: BLE001 (any failure stops the run, named)
      if isinstance(error, WorkerFailed):
        failure = error
      else:
        message = str(error).strip().splitlines()[-1] if str(error).strip() else ""
        name = type(error).__name__
        where = f"worker {j} failed in its steps from tick {start}"
        failure = WorkerFailed(f"{where}: {name}: {message}")
      gate.fail(failure)
      return Work(None, [], [], failure)

  def _steps(self, j: int, start: int, end: int, gate: Gate) -> Work:
    """Worker j's steps in its process (`_work`, which names any failure)."""
    row, segment = jax.device_get(self.rows[j]), self.segments
    deaths = 0
    while True:
      if j in self.restarting and not self._restarted(j, gate):
        return Work(None, [], [])  # its round closed first: it is still coming back
      if gate.out(j):
        return Work(None, [], [])
      try:
        answer = ray.get(self.actors[j].steps.remote(row, start, end, segment))
        break
      except WORKER_GONE:
        deaths += 1
        if deaths > MAX_LOSSES:
          raise WorkerFailed(
            f"worker {j}'s process died {deaths} times in its steps from tick {start}"
          ) from None
        lost = self._lost(j, start, gate)
        if lost is not None:
          return lost
    row, losses, accuracies = answer
    # Each step's values are means over the run's P workers, of which it is one.
    losses = [loss * self.num_workers for loss in losses]
    accuracies = [accuracy * self.num_workers for accuracy in accuracies]
    if row is None:  # stopped: its round closed without it
      return Work(None, losses, accuracies)
    gate.arrive(j)
    return Work(jax.device_put(row, self.layout.device_of(j)), losses, accuracies)

  def _lost(self, j: int, start: int, gate: Gate) -> Work | None:
    """Worker j's process died in its steps from tick `start`: what becomes of it
    (module docstring); None to take the steps again on its restarted process."""
    policy = self.setup.config.cluster.on_worker_loss
    if policy == "stop":
      failure = WorkerFailed(
        f"worker {j}'s process died in its steps from tick {start} "
        "(cluster.on_worker_loss=stop); the same command resumes from the last checkpoint"
      )
      gate.fail(failure)
      return Work(None, [], [], failure)
    if policy == "continue":
      with self.lock:
        self.clock.gone.append(j)
        self.trace.gone(j, start)
        self.clock.events += 1
      logging.warning("worker %d's process died: the run goes on without it", j)
      gate.leave(j)
      return Work(None, [], [])
    with self.lock:
      self.restarting.add(j)
    if not gate.closes:
      logging.warning("worker %d's process died: Ray restarts it, and it takes its steps again", j)
      return None  # a cut's steps: taken again
    logging.warning("worker %d's process died: Ray restarts it for the next round", j)
    gate.leave(j)
    return Work(None, [], [])

  def _restarted(self, j: int, gate: Gate) -> bool:
    """Waits for Ray to restart worker j's process, and traces where it runs; False if
    its round closed first (its steps there are not wanted), WorkerFailed if it does not
    come back."""
    deadline = time.monotonic() + RESTART_TIMEOUT
    while True:
      if gate.out(j):
        return False
      try:
        pid, host, node, _ = ray.get(self.actors[j].where.remote(), timeout=RESTART_POLL * 10)
        break
      except ray.exceptions.ActorDiedError:
        raise WorkerFailed(f"worker {j}'s process died and Ray could not restart it") from None
      except (ray.exceptions.RayError, TimeoutError):
        if time.monotonic() > deadline:
          raise WorkerFailed(
            f"worker {j}'s process did not restart within {RESTART_TIMEOUT:.0f} s"
          ) from None
        time.sleep(RESTART_POLL)
    with self.lock:
      self.restarting.discard(j)
      self.trace.process(j, pid, host)
      self.clock.events += 1
    logging.info("worker %d runs in process %d on %s (Ray node %s, restarted)", j, pid, host, node)
    return True

  def _closed(self, gate: Gate, members: np.ndarray | None) -> None:
    if members is not None and gate.keeps_late:
      return  # a late worker finishes its steps
    for j in range(self.num_workers) if members is None else np.flatnonzero(~members):
      if self.actors[j] is not None and j not in gate.gone:
        self.actors[j].stop.remote(self.segments)

  def _end_ray(self) -> None:
    for actor in self.actors:
      if actor is not None:
        ray.kill(actor, no_restart=True)
    self._quiet.close()
    if self.started_ray:
      ray_connection.shutdown()

  def close(self):
    try:
      super().close()
    finally:
      self._end_ray()
