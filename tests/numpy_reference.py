"""The rules' equations in plain NumPy, written from ALGORITHMS.md, not from easgd/.

Models are parameter dicts of NumPy arrays; `grad(params, batch)` returns the
gradient dict of one worker's loss on its batch.
"""

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
