"""The rules' equations in plain NumPy, written from ALGORITHMS.md, not from easgd/.

Models are parameter dicts of NumPy arrays; `grad(params, batch)` returns the
gradient dict of one worker's loss on its batch.
"""

import heapq

import numpy as np


def _add(a, b, scale=1.0):
  return {k: a[k] + scale * b[k] for k in a}


def _sub(a, b):
  return {k: a[k] - b[k] for k in a}


def _scale(a, s):
  return {k: s * a[k] for k in a}


def _zeros(a):
  return {k: np.zeros_like(v) for k, v in a.items()}


def sync_sgd(x0, batches, grad, eta, mu=0.0, nesterov=False):
  """g = mean_i g_i(x); m <- mu*m + g; x <- x - eta*m (or - eta*(g + mu*m))."""
  x, m = dict(x0), _zeros(x0)
  history = []
  for step_batches in batches:
    grads = [grad(x, b) for b in step_batches]
    g = {k: np.mean([gi[k] for gi in grads], axis=0) for k in x}
    m = _add(_scale(m, mu), g)
    direction = _add(g, m, mu) if nesterov else m
    x = _add(x, direction, -eta)
    history.append(dict(x))
  return history


def sync_easgd(x0, batches, grad, eta, alpha, tau, mu=None, nesterov=False):
  """EASGD (mu None) or MEASGD/EAMSGD; returns [(workers, center)] after each step.

  Step t: u_i = -eta*g_i(x_i), or v_i <- mu*v_i - eta*g_i(x_i [+ mu*v_i]), u_i = v_i.
  If (t+1) % tau == 0, with d_i = x_i - center before the exchange:
  x_i <- x_i + u_i - alpha*d_i, center <- center + alpha*sum_i d_i; else x_i <- x_i + u_i.
  """
  num_workers = len(batches[0])
  workers = [dict(x0) for _ in range(num_workers)]
  velocity = [_zeros(x0) for _ in range(num_workers)]
  center = dict(x0)
  history = []
  for t, step_batches in enumerate(batches):
    updates = []
    for i in range(num_workers):
      if mu is None:
        updates.append(_scale(grad(workers[i], step_batches[i]), -eta))
      else:
        at = _add(workers[i], velocity[i], mu) if nesterov else workers[i]
        velocity[i] = _add(_scale(velocity[i], mu), grad(at, step_batches[i]), -eta)
        updates.append(velocity[i])
    if (t + 1) % tau == 0:
      distances = [_sub(w, center) for w in workers]
      workers = [
        _add(_add(w, u), d, -alpha) for w, u, d in zip(workers, updates, distances, strict=True)
      ]
      total = {k: np.sum([d[k] for d in distances], axis=0) for k in center}
      center = _add(center, total, alpha)
    else:
      workers = [_add(w, u) for w, u in zip(workers, updates, strict=True)]
    history.append(([dict(w) for w in workers], dict(center)))
  return history


def parameter_server(
  x0,
  batches,
  grad,
  *,
  family,
  lock,
  period,
  durations,
  message,
  master_time,
  eta,
  alpha=0.0,
  mu=None,
  nesterov=False,
  server="sgd",
  until,
):
  """A literal parameter server: P worker loops and one master, event by event.

  Written from ALGORITHMS.md and the timing model of easgd/cluster.py's
  docstring, without ticks: every update is applied at its moment in
  simulated time, in time order (at equal times: master writes, then
  arrivals, then other worker events; then by worker).

  family: "elastic" (EASGD: on steps with (k+1) % period == 0 the worker sends
    x_i at the step's start; after the reply, x_i <- x_i - e + u(x_i) with
    e = alpha*(x_i - center) and u the local update at the x_i it sent), or
    "push" (SGD/Downpour: x_i <- x_i - eta*g, G_i += g at the end of each
    step; every period-th step ends by pushing G_i and fetching the center).
  lock: "fcfs" (a FIFO queue at a locked master), "round_robin", or None (Hogwild:
    read on arrival, write master_time later).
  durations(i, k): compute time of worker i's step k.
  until: simulated time at which to stop (events at later times are not run).

  Returns (center_history, worker_histories, staleness): the center after each
  master write, each worker's parameters after each of its updates, and for each
  request in service order the writes by other workers since the requester's
  previous read.
  """
  num_workers = len(batches)
  workers = [dict(x0) for _ in range(num_workers)]
  velocity = [_zeros(x0) for _ in range(num_workers)]
  accumulated = [_zeros(x0) for _ in range(num_workers)]
  center = dict(x0)
  momentum, adagrad = _zeros(x0), {k: np.full_like(v, 0.1) for k, v in x0.items()}
  center_history = [dict(center)]
  worker_histories = [[dict(w)] for w in workers]
  staleness, writes_seen = [], [0] * num_workers
  writes = 0
  steps = [0] * num_workers
  sent = [None] * num_workers  # what a worker sent with its request
  reply = [None] * num_workers  # what the master answered
  events = []  # (time, priority, worker, name)
  queue = []  # requests waiting at a locked master, in arrival order
  busy = [False]
  turn = [0]

  def at(time, priority, worker, name):
    heapq.heappush(events, (time, priority, worker, name))

  def local_update(i, x, batch):
    if mu is None:
      return _scale(grad(x, batch), -eta)
    point = _add(x, velocity[i], mu) if nesterov else x
    velocity[i] = _add(_scale(velocity[i], mu), grad(point, batch), -eta)
    return velocity[i]

  def begin(i, time):
    k = steps[i]
    if family == "elastic" and (k + 1) % period == 0:
      sent[i] = dict(workers[i])
      at(time + message, 1, i, "arrive")
    else:
      at(time + durations(i, k), 2, i, "step")

  def server_update(g):
    if server == "momentum":
      momentum.update(_add(_scale(momentum, mu), g))
      return _scale(momentum, -eta)
    if server == "adagrad":
      adagrad.update({k: adagrad[k] + g[k] ** 2 for k in g})
      return {k: -eta * g[k] / np.sqrt(adagrad[k] + 1e-7) for k in g}
    return _scale(g, -eta)

  def read(i):
    """The master's answer to worker i, computed from the center as it is now."""
    staleness.append(writes - writes_seen[i])
    if family == "elastic":
      increment = _scale(_sub(sent[i], center), alpha)
      reply[i] = increment
    else:
      increment = server_update(accumulated[i])
      reply[i] = _add(center, increment)
    return increment

  def write(i, increment):
    nonlocal center, writes
    center = _add(center, increment)
    writes += 1
    writes_seen[i] += 1  # a worker's own write is not news to it
    center_history.append(dict(center))

  def serve_next(time):
    """A locked master takes the next request it may serve."""
    if busy[0] or not queue:
      return
    if lock == "round_robin":
      mine = [r for r in queue if r == turn[0]]
      if not mine:
        return
      i = mine[0]
      turn[0] = (turn[0] + 1) % num_workers
    else:
      i = queue[0]
    queue.remove(i)
    busy[0] = True
    write(i, read(i))
    writes_seen[i] = writes
    at(time + master_time, 0, i, "served")

  for i in range(num_workers):
    begin(i, 0.0)
  while events and events[0][0] <= until:
    time, _, i, name = heapq.heappop(events)
    if name == "arrive":
      if lock is None:
        increment = read(i)
        writes_seen[i] = writes
        at(time + master_time, 0, i, ("write", increment))
      else:
        queue.append(i)
        serve_next(time)
    elif name == "served":
      busy[0] = False
      at(time + message, 2, i, "reply")
      serve_next(time)
    elif isinstance(name, tuple):  # Hogwild write
      write(i, name[1])
      at(time + message, 2, i, "reply")
    elif name == "reply" and family == "elastic":
      at(time + durations(i, steps[i]), 2, i, "step")
    elif name == "reply":
      workers[i] = reply[i]
      accumulated[i] = _zeros(x0)
      worker_histories[i].append(dict(workers[i]))
      begin(i, time)
    else:  # "step": the end of a local step
      k = steps[i]
      batch = batches[i][k]
      steps[i] += 1
      exchanged = family == "elastic" and (k + 1) % period == 0
      if family == "elastic":
        x = sent[i] if exchanged else workers[i]
        update = local_update(i, x, batch)
        workers[i] = _add(_sub(x, reply[i]) if exchanged else x, update)
        worker_histories[i].append(dict(workers[i]))
        begin(i, time)
      else:
        g = grad(workers[i], batch)
        workers[i] = _add(workers[i], g, -eta)
        accumulated[i] = _add(accumulated[i], g)
        worker_histories[i].append(dict(workers[i]))
        if steps[i] % period == 0:
          at(time + message, 1, i, "arrive")
        else:
          begin(i, time)
  return center_history, worker_histories, staleness
