"""The rules' equations in plain NumPy, written from docs/algorithms.md, not from easgd/.

The tests run every rule and compare it, step by step, with these functions.
Nothing here imports JAX or easgd: models are parameter dicts of NumPy arrays,
and whatever the equations need from a model (its gradient, its forward pass)
or from the code under test (the sampler's batch indices) is passed in as a
function.
"""

import copy
import heapq

import numpy as np

# Parameter dicts: the arithmetic every section uses, key by key.


def _add(a, b, scale=1.0):
  """a + scale * b."""
  return {k: a[k] + scale * b[k] for k in a}


def _sub(a, b):
  """a - b."""
  return {k: a[k] - b[k] for k in a}


def _scale(a, s):
  """s * a."""
  return {k: s * a[k] for k in a}


def _zeros(a):
  """0 shaped like a."""
  return {k: np.zeros_like(v) for k, v in a.items()}


def _mean(dicts):
  """(1/P) sum_i dicts[i]."""
  return {k: np.mean([d[k] for d in dicts], axis=0) for k in dicts[0]}


# Synchronous rules (docs/algorithms.md, "Synchronous rules"): `grad(params, batch)`
# is the gradient of one worker's mean loss on its batch.


def sync_sgd(x0, batches, grad, eta, mu=0.0, nesterov=False):
  """g = mean_i g_i(x); m <- mu*m + g; x <- x - eta*m (or - eta*(g + mu*m))."""
  x, m = dict(x0), _zeros(x0)
  history = []
  for step_batches in batches:
    g = _mean([grad(x, b) for b in step_batches])
    m = _add(_scale(m, mu), g)
    direction = _add(g, m, mu) if nesterov else m
    x = _add(x, direction, -eta)
    history.append(dict(x))
  return history


def warm_up_then_local(x0, batches, grad, inner, switch, average):
  """PyTorch's post-local schedule with an averaging of one's own; [(workers, center)]
  after each step t (from 0). `inner` is an optimizer of numpy_optim.

  t < switch: g = mean_i g_i(x); every worker steps x <- x + inner(g) with one
  optimizer state, and the center is x. t >= switch: x_i <- x_i + inner_i(g_i(x_i)),
  each with its own state (a copy of the shared one at the switch), then
  `average(t - switch, workers)` -> (workers, the new center or None to keep it)."""
  num_workers = len(batches[0])
  model, shared = dict(x0), inner.init(x0)
  workers, states, center = None, None, dict(x0)
  history = []
  for t, step_batches in enumerate(batches):
    if t < switch:
      update, shared = inner.update(_mean([grad(model, b) for b in step_batches]), shared, model)
      model = _add(model, update)
      center = dict(model)
      history.append(([dict(model) for _ in range(num_workers)], dict(center)))
      continue
    if workers is None:
      workers = [dict(model) for _ in range(num_workers)]
      states = [copy.deepcopy(shared) for _ in range(num_workers)]
    for i, b in enumerate(step_batches):
      update, states[i] = inner.update(grad(workers[i], b), states[i], workers[i])
      workers[i] = _add(workers[i], update)
    workers, averaged = average(t - switch, workers)
    center = center if averaged is None else averaged
    history.append(([dict(w) for w in workers], dict(center)))
  return history


def sync_easgd(x0, batches, grad, eta, alpha, tau, mu=None, nesterov=False):
  """EASGD (mu None) or MEASGD/EAMSGD; returns [(workers, center)] after each step.

  Step t: u_i = -eta*g_i(x_i); or MEASGD's m_i <- mu*m_i + g_i(x_i), u_i = -eta*m_i;
  or EAMSGD's (nesterov) v_i <- mu*v_i - eta*g_i(x_i + mu*v_i), u_i = v_i.
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
      elif nesterov:
        g = grad(_add(workers[i], velocity[i], mu), step_batches[i])
        velocity[i] = _add(_scale(velocity[i], mu), g, -eta)
        updates.append(dict(velocity[i]))
      else:
        g = grad(workers[i], step_batches[i])
        velocity[i] = _add(_scale(velocity[i], mu), g)
        updates.append(_scale(velocity[i], -eta))
    if (t + 1) % tau == 0:
      distances = [_sub(w, center) for w in workers]
      pairs = zip(workers, updates, distances, strict=True)
      workers = [_add(_add(w, u), d, -alpha) for w, u, d in pairs]
      total = {k: np.sum([d[k] for d in distances], axis=0) for k in center}
      center = _add(center, total, alpha)
    else:
      workers = [_add(w, u) for w, u in zip(workers, updates, strict=True)]
    history.append(([dict(w) for w in workers], dict(center)))
  return history


# Parameter-server rules (docs/algorithms.md, "Parameter-server rules" and "The
# timing model"), as a literal event loop rather than the code's ticks.


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
  inner=None,
  server="sgd",
  outer=None,
  until,
):
  """A literal parameter server: P worker loops and one master, event by event.

  Written from docs/algorithms.md and the timing model in the docstring of
  easgd/sim/timing.py, without ticks: every update is applied at its moment in
  simulated time, in time order (at equal times: master writes, then
  arrivals, then other worker events; then by worker).

  family: "elastic" (EASGD: on steps with (k+1) % period == 0 the worker sends
    x_i at the step's start; after the reply, x_i <- x_i - e + u(x_i) with
    e = alpha*(x_i - center) and u the local update at the x_i it sent), or
    "push" (SGD/Downpour: x_i <- x_i + u, G_i += g at the end of each
    step; every period-th step ends by pushing G_i and fetching the center), or
    "local" (Asynchronous Local SGD: x_i <- x_i + u at the end of each step;
    every period-th step ends by pushing Delta_i = a_i - x_i, which the master
    applies with `outer` (numpy_optim.DelayedNesterov), and fetching the
    center, which becomes x_i and the anchor a_i).
  period: local steps between a worker's requests, one for all or a list, each worker's.
  inner: the workers' optimizer (numpy_optim.Optimizer or LookAheadSGD, whose gradient is
    taken at inner.point(x)) or None (u = -eta*g); mu: the master's.
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
  periods = [period] * num_workers if isinstance(period, int) else list(period)
  workers = [dict(x0) for _ in range(num_workers)]
  anchors = [dict(x0) for _ in range(num_workers)]
  outer_state = outer.init(x0) if outer else None
  states = [inner.init(x0) if inner else None for _ in range(num_workers)]
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
    """(u, g): worker i's step from x and the gradient it took, at inner.point(x)."""
    if inner is None:
      g = grad(x, batch)
      return _scale(g, -eta), g
    y = inner.point(x, states[i])
    g = grad(y, batch)
    u, states[i] = inner.update(g, states[i], y)
    return u, g

  def begin(i, time):
    k = steps[i]
    if family == "elastic" and (k + 1) % periods[i] == 0:
      sent[i] = dict(workers[i])
      at(time + message, 1, i, "arrive")
    else:
      at(time + durations(i, k), 2, i, "step")

  def server_update(g, i):  # at the learning rate of worker i's last step
    rate = inner.rate(steps[i] - 1) if inner else eta
    if server == "momentum":
      momentum.update(_add(_scale(momentum, mu), g))
      return _scale(momentum, -rate)
    if server == "adagrad":
      adagrad.update({k: adagrad[k] + g[k] ** 2 for k in g})
      return {k: -rate * g[k] / np.sqrt(adagrad[k] + 1e-7) for k in g}
    return _scale(g, -rate)

  def read(i):
    """The master's answer to worker i, computed from the center as it is now."""
    staleness.append(writes - writes_seen[i])
    if family == "elastic":
      increment = _scale(_sub(sent[i], center), alpha)
      reply[i] = increment
    elif family == "local":
      nonlocal outer_state
      increment, outer_state = outer.update(_sub(anchors[i], workers[i]), outer_state, center)
      reply[i] = _add(center, increment)
    else:
      increment = server_update(accumulated[i], i)
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
      workers[i] = anchors[i] = reply[i]
      accumulated[i] = _zeros(x0)
      worker_histories[i].append(dict(workers[i]))
      begin(i, time)
    else:  # "step": the end of a local step
      k = steps[i]
      batch = batches[i][k]
      steps[i] += 1
      exchanged = family == "elastic" and (k + 1) % periods[i] == 0
      if family == "elastic":
        x = sent[i] if exchanged else workers[i]
        update, _ = local_update(i, x, batch)
        workers[i] = _add(_sub(x, reply[i]) if exchanged else x, update)
        worker_histories[i].append(dict(workers[i]))
        begin(i, time)
      else:
        update, g = local_update(i, workers[i], batch)
        workers[i] = _add(workers[i], update)
        accumulated[i] = _add(accumulated[i], g)
        worker_histories[i].append(dict(workers[i]))
        if steps[i] % periods[i] == 0:
          at(time + message, 1, i, "arrive")
        else:
          begin(i, time)
  return center_history, worker_histories, staleness


def two_tier_parameter_server(
  x0,
  batches,
  grad,
  *,
  family,
  groups,
  period,
  durations,
  message,
  uplink,
  master_time,
  eta,
  every,
  weight,
  global_outer,
  alpha=0.0,
  outer=None,
  until,
):
  """HALoS's two tiers (docs/algorithms.md, "Two-tier parameter servers") as a literal
  event loop: a first-come-first-served server per group of workers (`groups`, sizes
  of contiguous blocks), a global server, every update at its moment in simulated
  time, in time order.

  A worker's life is `parameter_server`'s, with its group's server in place of the
  master (messages `message` either way). A group server serves its queue in
  order: a worker's request takes `master_time`; its K-th request since the last
  merge (K = `every`), when no send is in flight, ends by sending d_g = c_g - m_g
  (reaching the global server `uplink[g]` later). The global server serves sends
  in order, `master_time` each: x~ <- x~ + global_outer.update(-d_g); its reply
  x~ reaches the group server `uplink[g]` later and joins its queue, where it
  takes no time: c_g <- (1 - w) c_g + w x~, m_g <- c_g, the count starts again.
  family: "elastic" (EASGD: e = alpha (x_i - c_g) at the request) or "local"
  (Asynchronous Local SGD: the group server's `outer` on a_i - x_i, the reply
  c_g becoming x_i and a_i); plain SGD steps (-eta g) inside.

  Returns (center_history, group_histories, worker_histories, staleness): x~
  after each APPLY, each group's c_g after each of its changes, each worker's
  parameters after each of its updates, and each request's (group, staleness) in
  the order its group served them (its group server's changes by others, merges
  included, since the requester's last read).
  """
  num_workers = len(batches)
  group_of = [g for g, size in enumerate(groups) for _ in range(size)]
  members = [[i for i in range(num_workers) if group_of[i] == g] for g in range(len(groups))]
  workers = [dict(x0) for _ in range(num_workers)]
  anchors = [dict(x0) for _ in range(num_workers)]
  centers = [dict(x0) for _ in groups]
  merged = [dict(x0) for _ in groups]
  changes = [None] * len(groups)
  replies = [None] * len(groups)
  server_states = [outer.init(x0) if outer else None for _ in groups]
  center, global_state = dict(x0), global_outer.init(x0)
  since, in_flight = [0] * len(groups), [False] * len(groups)
  queues, busy = [[] for _ in groups], [False] * len(groups)
  global_queue, global_busy = [], [False]
  center_history, group_histories = [dict(center)], [[dict(c)] for c in centers]
  worker_histories = [[dict(w)] for w in workers]
  staleness, missed = [], [0] * num_workers
  steps, sent, reply = [0] * num_workers, [None] * num_workers, [None] * num_workers
  events = []

  def at(time, priority, index, name):
    heapq.heappush(events, (time, priority, index, name))

  def begin(i, time):
    k = steps[i]
    if family == "elastic" and (k + 1) % period == 0:
      sent[i] = dict(workers[i])
      at(time + message, 1, i, "arrive")
    else:
      at(time + durations(i, k), 2, i, "step")

  def changed(g, by=None):
    group_histories[g].append(dict(centers[g]))
    for j in members[g]:
      if j != by:
        missed[j] += 1

  def serve_next(g, time):
    while queues[g] and not busy[g]:
      item = queues[g].pop(0)
      if item == "merge":
        centers[g] = {k: (1 - weight) * centers[g][k] + weight * replies[g][k] for k in x0}
        merged[g] = dict(centers[g])
        since[g], in_flight[g] = 0, False
        changed(g)
        continue
      i = item
      staleness.append((g, missed[i]))
      missed[i] = 0
      if family == "elastic":
        increment = _scale(_sub(sent[i], centers[g]), alpha)
        reply[i] = increment
        centers[g] = _add(centers[g], increment)
      else:
        update, server_states[g] = outer.update(
          _sub(anchors[i], workers[i]), server_states[g], centers[g]
        )
        centers[g] = _add(centers[g], update)
        reply[i] = dict(centers[g])
      changed(g, by=i)
      since[g] += 1
      busy[g] = True
      at(time + master_time, 0, i, "served")

  def global_next(time):
    if global_busy[0] or not global_queue:
      return
    nonlocal center, global_state
    g = global_queue.pop(0)
    update, global_state = global_outer.update(_scale(changes[g], -1.0), global_state, center)
    center = _add(center, update)
    center_history.append(dict(center))
    replies[g] = dict(center)
    global_busy[0] = True
    at(time + master_time, 0, g, "global served")

  for i in range(num_workers):
    begin(i, 0.0)
  while events and events[0][0] <= until:
    time, _, i, name = heapq.heappop(events)
    if name == "arrive":
      queues[group_of[i]].append(i)
      serve_next(group_of[i], time)
    elif name == "served":
      g = group_of[i]
      busy[g] = False
      if since[g] >= every and not in_flight[g]:
        in_flight[g] = True
        changes[g] = _sub(centers[g], merged[g])
        at(time + uplink[g], 1, g, "at global")
      at(time + message, 2, i, "reply")
      serve_next(g, time)
    elif name == "at global":
      global_queue.append(i)
      global_next(time)
    elif name == "global served":
      global_busy[0] = False
      at(time + uplink[i], 0, i, "merge")
      global_next(time)
    elif name == "merge":
      queues[i].append("merge")
      serve_next(i, time)
    elif name == "reply" and family == "elastic":
      at(time + durations(i, steps[i]), 2, i, "step")
    elif name == "reply":
      workers[i] = anchors[i] = reply[i]
      worker_histories[i].append(dict(workers[i]))
      begin(i, time)
    else:  # "step": the end of a local step
      k = steps[i]
      steps[i] += 1
      exchanged = family == "elastic" and (k + 1) % period == 0
      x = sent[i] if exchanged else workers[i]
      update = _scale(grad(x, batches[i][k]), -eta)
      if family == "elastic":
        workers[i] = _add(_sub(x, reply[i]) if exchanged else x, update)
        worker_histories[i].append(dict(workers[i]))
        begin(i, time)
      else:
        workers[i] = _add(workers[i], update)
        worker_histories[i].append(dict(workers[i]))
        if steps[i] % period == 0:
          at(time + message, 1, i, "arrive")
        else:
          begin(i, time)
  return center_history, group_histories, worker_histories, staleness


# BatchNorm statistics under exchanges (docs/algorithms.md, "BatchNorm statistics
# under exchanges"). The model is BatchNorm on the input features, then one dense
# layer: parameters {"scale", "shift", "kernel", "bias"}, statistics {"mean", "var"}.
# `forward(params, stats, batch)` returns (gradient, new statistics), as
# batch_norm_dense_forward does.


def batch_norm_dense_forward(params, stats, batch, *, momentum, epsilon):
  """The gradient of the mean cross-entropy in training mode, and the new statistics.

  With the batch's mean_B and biased variance var_B of the features x:
    z = (x - mean_B) / sqrt(var_B + epsilon),  h = scale * z + shift,  logits = h W + b;
    s' = momentum * s + (1 - momentum) * (mean_B, var_B).
  The loss does not depend on s, and mean_B, var_B depend on x alone, not on the
  parameters: dlogits = (softmax(logits) - onehot(label)) / N, dW = h^T dlogits,
  db = sum_n dlogits, dh = dlogits W^T, dscale = sum_n dh * z, dshift = sum_n dh.
  """
  x, labels = batch["image"], batch["label"]
  mean, var = x.mean(axis=0), x.var(axis=0)
  z = (x - mean) / np.sqrt(var + epsilon)
  h = params["scale"] * z + params["shift"]
  logits = h @ params["kernel"] + params["bias"]
  prob = np.exp(logits - logits.max(axis=1, keepdims=True))
  prob /= prob.sum(axis=1, keepdims=True)
  d_logits = (prob - np.eye(params["kernel"].shape[1])[labels]) / len(x)
  d_h = d_logits @ params["kernel"].T
  grads = {
    "kernel": h.T @ d_logits,
    "bias": d_logits.sum(axis=0),
    "scale": (d_h * z).sum(axis=0),
    "shift": d_h.sum(axis=0),
  }
  new_stats = {
    "mean": momentum * stats["mean"] + (1 - momentum) * mean,
    "var": momentum * stats["var"] + (1 - momentum) * var,
  }
  return grads, new_stats


def batch_norm_sync_easgd(x0, s0, batches, forward, eta, alpha, tau, average_stats):
  """sync_easgd with statistics; returns [(workers, center)] after each step,
  a worker and the center each a pair (parameters, statistics).

  Step t: x'_i = x_i - eta*g_i(x_i) and s'_i from forward. If (t+1) % tau == 0,
  with d_i = x_i - x~ and ds_i = s_i - s~ (averaged) or 0 (local), before the exchange:
  x_i <- x'_i - alpha*d_i, s_i <- s'_i - alpha*ds_i,
  x~ <- x~ + alpha*sum_i d_i, s~ <- s~ + alpha*sum_i ds_i; else x_i <- x'_i, s_i <- s'_i.
  """
  num_workers = len(batches[0])
  workers = [(dict(x0), dict(s0)) for _ in range(num_workers)]
  center = (dict(x0), dict(s0))
  history = []
  for t, step_batches in enumerate(batches):
    stepped = []
    for (x, s), batch in zip(workers, step_batches, strict=True):
      g, s_new = forward(x, s, batch)
      stepped.append((_add(x, g, -eta), s_new))
    if (t + 1) % tau == 0:
      distances = [_sub(x, center[0]) for x, _ in workers]
      stat_distances = [_sub(s, center[1]) if average_stats else _zeros(s) for _, s in workers]
      workers = [
        (_add(x, d, -alpha), _add(s, ds, -alpha))
        for (x, s), d, ds in zip(stepped, distances, stat_distances, strict=True)
      ]
      center = (
        _add(center[0], {k: sum(d[k] for d in distances) for k in x0}, alpha),
        _add(center[1], {k: sum(ds[k] for ds in stat_distances) for k in s0}, alpha),
      )
    else:
      workers = stepped
    history.append((list(workers), center))
  return history


def batch_norm_sync_sgd(x0, s0, batches, forward, eta):
  """sync_sgd with averaged statistics; returns [(x, s)] after each step:
  x <- x - eta*(1/P) sum_i g_i(x);  s <- (1/P) sum_i s'_i."""
  params, stats = x0, s0
  history = []
  for step_batches in batches:
    results = [forward(params, stats, batch) for batch in step_batches]
    params = _add(params, _mean([g for g, _ in results]), -eta)
    stats = _mean([s for _, s in results])
    history.append((params, stats))
  return history


# The pipeline (docs/algorithms.md, "`pipeline`: pipelined multi-model training"),
# run model after model instead of in parallel.


def pipeline_sgd(
  models,
  partitions,
  grad,
  batch_indices,
  *,
  learning_rate,
  momentum,
  weight_decay,
  num_stages,
  stage_steps,
  nesterov=False,
):
  """Each model m on its own: in stage s it trains on partition d(m, s) = (m // k + s) mod D,
  k = M/D, for stage_steps steps of SGD with its own eta_m, mu_m, lambda_m:
    g' = grad(x_m, batch) + lambda_m * x_m;  v <- mu_m * v + g' (v = 0 at the start);
    x_m <- x_m - eta_m * v,  Nesterov: x_m <- x_m - eta_m * (g' + mu_m * v).

  models: the M models' initial parameter dicts. partitions: the D partitions,
  each a batch dict of arrays indexed along their first axis.
  batch_indices(m, s, j, d): the indices of the batch model m draws from
  partition d at step j of stage s. learning_rate, momentum, weight_decay: M
  values each. Returns the M models' final parameters (float64).
  """
  num_models, num_devices = len(models), len(partitions)
  per_device = num_models // num_devices
  final = []
  for m, initial in enumerate(models):
    params = {name: np.array(leaf, np.float64) for name, leaf in initial.items()}
    velocity = {name: np.zeros_like(leaf) for name, leaf in params.items()}
    for s in range(num_stages):
      partition = (m // per_device + s) % num_devices
      for j in range(stage_steps):
        indices = batch_indices(m, s, j, partition)
        batch = {k: v[indices] for k, v in partitions[partition].items()}
        g_batch = grad(params, batch)
        for name, value in params.items():
          g = g_batch[name] + weight_decay[m] * value
          velocity[name] = momentum[m] * velocity[name] + g
          step = g + momentum[m] * velocity[name] if nesterov else velocity[name]
          params[name] = value - learning_rate[m] * step
    final.append(params)
  return final


def post_local_in_rounds(x0, batches, grad, inner, switch, period, memberships):
  """Post-local SGD whose rounds close at a quorum; [(workers, center)] after each step.
  memberships[r]: the members of the r-th round (every step before the switch, then
  steps switch, switch + period, ...); the others are dropped.

  t < switch: g = mean_{i in M} g_i(x), one shared step. t >= switch: each worker steps
  with its own state; at a round the center is mean_{i in M} x_i, every worker takes
  it, and a dropped worker also the optimizer state of the lowest-numbered member."""
  num_workers = len(batches[0])
  model, shared = dict(x0), inner.init(x0)
  workers, states = None, None
  rounds = iter(memberships)
  history = []
  for t, step_batches in enumerate(batches):
    if t < switch:
      members = sorted(next(rounds))
      g = _mean([grad(model, step_batches[i]) for i in members])
      update, shared = inner.update(g, shared, model)
      model = _add(model, update)
      history.append(([dict(model) for _ in range(num_workers)], dict(model)))
      continue
    if workers is None:
      workers = [dict(model) for _ in range(num_workers)]
      states = [copy.deepcopy(shared) for _ in range(num_workers)]
      center = dict(model)
    for i, b in enumerate(step_batches):
      update, states[i] = inner.update(grad(workers[i], b), states[i], workers[i])
      workers[i] = _add(workers[i], update)
    if (t - switch) % period == 0:
      members = sorted(next(rounds))
      center = _mean([workers[i] for i in members])
      workers = [dict(center) for _ in range(num_workers)]
      states = [
        s if i in members else copy.deepcopy(states[members[0]]) for i, s in enumerate(states)
      ]
    history.append(([dict(w) for w in workers], dict(center)))
  return history
