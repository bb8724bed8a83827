"""The inner and outer optimizers, schedules and the center family in plain NumPy,
written from docs/algorithms.md ("The inner optimizer and its schedule", "The center
family"), not from easgd/.

Models are parameter dicts of NumPy arrays, as in numpy_reference.
"""

import copy
import math

import numpy as np

# Learning-rate schedules: t -> eta_t, t the worker's count of local steps taken.


def constant(eta):
  return lambda t: eta


def warmup_cosine(eta, warmup, total):
  """Linear from 0 over `warmup` steps, then a half cosine from eta to 0 at `total`."""

  def rate(t):
    if t < warmup:
      return eta * t / warmup
    return eta * 0.5 * (1 + math.cos(math.pi * min(t - warmup, total - warmup) / (total - warmup)))

  return rate


def warmup_step(eta, warmup, total, boundaries, factor):
  """Linear warm-up, then eta times `factor` for each boundary b with t >= floor(b*total)."""

  def rate(t):
    if t < warmup:
      return eta * t / warmup
    return eta * factor ** sum(t >= math.floor(b * total) for b in boundaries)

  return rate


class Optimizer:
  """One model's optimizer: sgd (L2 weight decay, momentum mu, Nesterov) or
  adamw (Adam's bias-corrected moments, decoupled weight decay); eta_t = rate(t)."""

  def __init__(self, name, rate, mu=0.0, nesterov=False, wd=0.0, b1=0.9, b2=0.999, eps=1e-8):
    self.name, self.rate, self.mu, self.nesterov, self.wd = name, rate, mu, nesterov, wd
    self.b1, self.b2, self.eps = b1, b2, eps

  def init(self, x):
    zeros = {k: np.zeros_like(v, dtype=np.float64) for k, v in x.items()}
    return {"t": 0, "m": dict(zeros), "v": dict(zeros)}

  def point(self, x, state):
    """Where the gradient of the next step is taken: at x."""
    del state
    return x

  def update(self, g, state, x):
    """Returns (u, new state): the step to add to x."""
    t, eta = state["t"], self.rate(state["t"])
    if self.name == "sgd":
      g = {k: g[k] + self.wd * x[k] for k in g}
      m = {k: self.mu * state["m"][k] + g[k] for k in g}
      direction = {k: g[k] + self.mu * m[k] for k in g} if self.nesterov else m
      if not self.mu:
        direction = g
      return {k: -eta * direction[k] for k in g}, {"t": t + 1, "m": m, "v": state["v"]}
    b1, b2 = self.b1, self.b2
    m = {k: b1 * state["m"][k] + (1 - b1) * g[k] for k in g}
    v = {k: b2 * state["v"][k] + (1 - b2) * g[k] ** 2 for k in g}
    u = {}
    for k in g:
      m_hat, v_hat = m[k] / (1 - b1 ** (t + 1)), v[k] / (1 - b2 ** (t + 1))
      u[k] = -eta * (m_hat / (np.sqrt(v_hat) + self.eps) + self.wd * x[k])
    return u, {"t": t + 1, "m": m, "v": v}


class LookAheadSGD:
  """EAMSGD's momentum (Zhang, Choromanska, LeCun 2015, Algorithm 2), velocity v in
  parameter units: the gradient is taken at the look-ahead point y = x + mu*v, then
  g' = g(y) + wd*y,  v <- mu*v - eta_t*g',  and the step is u = v."""

  def __init__(self, rate, mu, wd=0.0):
    self.rate, self.mu, self.wd = rate, mu, wd

  def init(self, x):
    return {"t": 0, "v": {k: np.zeros_like(v, dtype=np.float64) for k, v in x.items()}}

  def point(self, x, state):
    return {k: x[k] + self.mu * state["v"][k] for k in x}

  def update(self, g, state, y):
    """g: the gradient at y = point(x, state). Returns (u, new state)."""
    eta = self.rate(state["t"])
    v = {k: self.mu * state["v"][k] - eta * (g[k] + self.wd * y[k]) for k in g}
    return dict(v), {"t": state["t"] + 1, "v": v}


class DelayedNesterov:
  """Delayed Nesterov (Liu et al. 2024, "Asynchronous Local-SGD Training for Language
  Modeling", Algorithm 3), a master's outer optimizer: learning rate eta, momentum
  decay beta, buffer size N, momentum activation c. At the t-th pseudo-gradient g:
  if t is a multiple of N, m <- beta*m + (D + g)/N, D <- 0, and the center moves by
  -eta*((1 - c*N + c)*beta*m + g/N); otherwise D <- D + g and it moves by
  -eta*(c*beta*m + g/N)."""

  def __init__(self, eta, beta, n, c=0.0):
    self.eta, self.beta, self.n, self.c = eta, beta, n, c

  def init(self, x):
    zeros = {k: np.zeros_like(v, dtype=np.float64) for k, v in x.items()}
    return {"t": 0, "m": dict(zeros), "d": dict(zeros)}

  def update(self, g, state, x):
    """Returns (the center's step, the new state)."""
    del x
    t, m, d = state["t"] + 1, state["m"], state["d"]
    if t % self.n == 0:
      m = {k: self.beta * m[k] + (d[k] + g[k]) / self.n for k in g}
      d = {k: np.zeros_like(v) for k, v in d.items()}
      share = 1 - self.c * self.n + self.c
    else:
      d = {k: d[k] + g[k] for k in g}
      share = self.c
    step = {k: -self.eta * (share * self.beta * m[k] + g[k] / self.n) for k in g}
    return step, {"t": t, "m": m, "d": d}


def sgd(eta, mu=0.0, nesterov=False):
  return Optimizer("sgd", constant(eta), mu=mu, nesterov=nesterov)


def feedback(sent, count):
  """`sent` (Q of a message: (v, t, i) -> Q(v)) under error feedback, for `count`
  workers: worker i sends Q(v + e_i) and keeps e_i <- (v + e_i) - Q(v + e_i), e_i = 0 at
  the start (Seide et al. 2014; Karimireddy et al. 2019). Its residuals are those of the
  names it is given, each kept apart."""
  residuals = [{} for _ in range(count)]

  def with_feedback(v, t, i):
    e = residuals[i]
    total = {k: v[k] + e.get(k, 0.0) for k in v}
    q = sent(total, t, i)
    e.update({k: total[k] - q[k] for k in v})
    return q

  return with_feedback


def _local_steps(workers, states, step_batches, grad, inner):
  """x_i + u_i for every worker, u_i its inner update with the gradient at
  inner.point(x_i); each worker's state in `states` is replaced by the one after it."""
  stepped = []
  for i, (x, batch) in enumerate(zip(workers, step_batches, strict=True)):
    y = inner.point(x, states[i])
    u, states[i] = inner.update(grad(y, batch), states[i], y)
    stepped.append({k: x[k] + u[k] for k in x})
  return stepped


def center_family(x0, batches, grad, inner, tau, pull, outer, alpha=0.0, sent=lambda d, t, i: d):
  """The center family; returns [(workers, center)] after each step.

  Step t: u_i = inner update with the gradient at inner.point(x_i) (x_i but for
  EAMSGD's look-ahead). If (t+1) % tau == 0: with r_i = x_i (elastic)
  or x_i + u_i (reset), each worker sends s_i = Q(r_i - center) (`sent`; `feedback`
  of it for error feedback), Delta = -mean_i s_i, center' = center + outer update of
  Delta; then x_i <- x_i + u_i - alpha*(x_i - center) (elastic) or x_i <- center'
  (reset). Else x_i <- x_i + u_i.
  """
  num_workers = len(batches[0])
  workers = [dict(x0) for _ in range(num_workers)]
  states = [inner.init(x0) for _ in range(num_workers)]
  center, outer_state = dict(x0), outer.init(x0)
  history = []
  for t, step_batches in enumerate(batches):
    stepped = _local_steps(workers, states, step_batches, grad, inner)
    if (t + 1) % tau == 0:
      read = workers if pull == "elastic" else stepped
      messages = [sent({k: r[k] - center[k] for k in r}, t, i) for i, r in enumerate(read)]
      delta = {k: -np.mean([s[k] for s in messages], axis=0) for k in center}
      step, outer_state = outer.update(delta, outer_state, center)
      new_center = {k: center[k] + step[k] for k in center}
      if pull == "elastic":
        workers = [
          {k: s[k] - alpha * (w[k] - center[k]) for k in w}
          for w, s in zip(workers, stepped, strict=True)
        ]
      else:
        workers = [dict(new_center) for _ in range(num_workers)]
      center = new_center
    else:
      workers = stepped
    history.append(([dict(w) for w in workers], dict(center)))
  return history


def pipeline(models, partitions, grad, batch_indices, optimizers, *, num_stages, stage_steps):
  """numpy_reference.pipeline_sgd with model m trained by optimizers[m] (an Optimizer)."""
  num_models, num_devices = len(models), len(partitions)
  per_device = num_models // num_devices
  final = []
  for m, initial in enumerate(models):
    params = {name: np.array(leaf, np.float64) for name, leaf in initial.items()}
    state = optimizers[m].init(params)
    for s in range(num_stages):
      partition = (m // per_device + s) % num_devices
      for j in range(stage_steps):
        indices = batch_indices(m, s, j, partition)
        batch = {k: v[indices] for k, v in partitions[partition].items()}
        u, state = optimizers[m].update(grad(params, batch), state, params)
        params = {k: params[k] + u[k] for k in params}
    final.append(params)
  return final


def streaming(
  x0,
  batches,
  grad,
  inner,
  tau,
  fragments,
  delay,
  pull,
  outer=None,
  alpha=0.0,
  merge=1.0,
  sent=lambda d, t, i: d,
):
  """The streaming rules (Streaming DiLoCo and its elastic sibling); returns
  [(workers, center)] after each step.

  `fragments`: lists of parameter names. With t = steps taken after step t-1, every
  worker steps x_i <- x_i + u_i; fragment f is sent when (t - f*tau/F) % tau == 0,
  as d_i = r_i - center on its names (r_i the stepped worker for the reset pull,
  the worker from before the step for the elastic pull), and its result arrives
  `delay` steps later: reset: center_f <- center_f + outer step of -mean_i Q(d_i) (its
  own optimizer state), x_i,f <- merge*center_f + (1-merge)*x_i,f; elastic:
  center_f <- center_f + alpha*sum_i Q(d_i), x_i,f <- x_i,f - alpha*d_i,f. Q is
  `sent(d, t - 1, i)` (the steps taken before the sending step), or `feedback` of it.
  """
  num_workers, count = len(batches[0]), len(fragments)
  spacing = tau // count
  workers = [dict(x0) for _ in range(num_workers)]
  states = [inner.init(x0) for _ in range(num_workers)]
  center = dict(x0)
  outer_states = [outer.init({k: x0[k] for k in names}) for names in fragments] if outer else None
  arriving = {}  # t -> (fragment, the workers' differences, what they sent)
  history = []
  for t, step_batches in enumerate(batches, start=1):
    before = [dict(w) for w in workers]
    for i in range(num_workers):
      y = inner.point(workers[i], states[i])
      u, states[i] = inner.update(grad(y, step_batches[i]), states[i], y)
      workers[i] = {k: y[k] + u[k] for k in y}
    for f, names in enumerate(fragments):
      if (t - f * spacing) % tau == 0 and t >= f * spacing:
        read = workers if pull == "reset" else before
        differences = [{k: r[k] - center[k] for k in names} for r in read]
        messages = [sent(d, t - 1, i) for i, d in enumerate(differences)]
        arriving[t + delay] = (f, differences, messages)
    if t in arriving:
      f, differences, messages = arriving.pop(t)
      names = fragments[f]
      if pull == "reset":
        delta = {k: -np.mean([m[k] for m in messages], axis=0) for k in names}
        step, outer_states[f] = outer.update(delta, outer_states[f], center)
        center.update({k: center[k] + step[k] for k in names})
        for w in workers:
          w.update({k: merge * center[k] + (1 - merge) * w[k] for k in names})
      else:
        totals = {k: np.sum([m[k] for m in messages], axis=0) for k in names}
        center.update({k: center[k] + alpha * totals[k] for k in names})
        for w, d in zip(workers, differences, strict=True):
          w.update({k: w[k] - alpha * d[k] for k in names})
    history.append(([dict(w) for w in workers], dict(center)))
  return history


def center_family_in_rounds(
  x0, batches, grad, inner, tau, pull, outer, memberships, alpha=0.0, fixed=False
):
  """The center family whose rounds close at a quorum; returns [(workers, center)]
  after each step, as `center_family`.

  memberships[r] = (members, late, dropped), sets of workers, for the r-th round
  (the step t with (t+1) % tau == 0). With H the late workers of round r-1 and
  h_j what each sent then, round r takes its members' messages s_i and the held
  h_j at weight w = 1/sqrt(1 + 1):
    Delta = -(sum_{i in M} s_i + w sum_{j in H} h_j) / (|M| + |H|)   (fixed: / P)
  then the center moves by the outer update of Delta; members and late workers
  are pulled (or reset) as in `center_family`, a late worker's s_j held for round
  r+1; a dropped worker takes the new center and the inner state of the round's
  lowest-numbered member.
  """
  num_workers = len(batches[0])
  weight = 1 / math.sqrt(2)
  workers = [dict(x0) for _ in range(num_workers)]
  states = [inner.init(x0) for _ in range(num_workers)]
  center, outer_state = dict(x0), outer.init(x0)
  held = {}
  history = []
  rounds = iter(memberships)
  for t, step_batches in enumerate(batches):
    stepped = _local_steps(workers, states, step_batches, grad, inner)
    if (t + 1) % tau != 0:
      workers = stepped
      history.append(([dict(w) for w in workers], dict(center)))
      continue
    members, late, dropped = next(rounds)
    read = workers if pull == "elastic" else stepped
    messages = [{k: r[k] - center[k] for k in r} for r in read]
    count = num_workers if fixed else len(members) + len(held)
    delta = {
      k: -(sum(messages[i][k] for i in members) + weight * sum(h[k] for h in held.values())) / count
      for k in center
    }
    step, outer_state = outer.update(delta, outer_state, center)
    new_center = {k: center[k] + step[k] for k in center}
    first = min(members)
    new_workers = []
    for i in range(num_workers):
      if i in dropped or pull == "reset":
        new_workers.append(dict(new_center))
      else:
        new_workers.append({k: stepped[i][k] - alpha * messages[i][k] for k in center})
    states = [
      copy.deepcopy(states[first]) if i in dropped else states[i] for i in range(num_workers)
    ]
    held = {j: messages[j] for j in late}
    workers, center = new_workers, new_center
    history.append(([dict(w) for w in workers], dict(center)))
  return history


def streaming_in_rounds(
  x0,
  batches,
  grad,
  inner,
  tau,
  fragments,
  delay,
  pull,
  memberships,
  outer=None,
  alpha=0.0,
  merge=1.0,
):
  """The streaming rules whose fragments' rounds close at a quorum; returns
  [(workers, center)] after each step, as `streaming`.

  memberships[r] = (members, late, dropped), sets of workers, for the r-th send (of
  whichever fragment it is). Each step: every worker steps; a result due at t (sent
  d steps before) is applied; fragment f is sent if due. A send of f takes its
  members' d_i,f and the messages H_f its late workers sent at f's send before, at
  w = 1/sqrt(2): S_f = sum_{i in M} d_i,f + w sum_{j in H_f} h_j, C = |M| + |H_f|; the
  late workers' d_j,f are held for f's next send. A dropped worker becomes a copy of
  the lowest-numbered member: its parameters, inner state and the differences it has
  in flight. d steps later (d = 0: the same step) the result is applied as the
  round's mean S_f / C: reset: x~_f <- x~_f + outer step of -S_f/C, x_i,f <- merge*x~_f
  + (1 - merge)*x_i,f; elastic: x~_f <- x~_f + P*alpha*S_f/C, x_i,f <- x_i,f - alpha*d_i,f;
  a worker dropped from that send takes x~_f as it is.
  """
  num_workers, count = len(batches[0]), len(fragments)
  spacing, weight = tau // count, 1 / math.sqrt(2)
  workers = [dict(x0) for _ in range(num_workers)]
  states = [inner.init(x0) for _ in range(num_workers)]
  center = dict(x0)
  outer_states = [outer.init({k: x0[k] for k in names}) for names in fragments] if outer else None
  held = [{} for _ in fragments]  # fragment -> {late worker: its message}
  arriving = {}  # t -> (fragment, each worker's difference, the round's S_f/C, the dropped)
  rounds = iter(memberships)
  history = []

  def apply_due(t):
    if t not in arriving:
      return
    f, differences, mean, dropped = arriving.pop(t)
    names = fragments[f]
    if pull == "reset":
      step, outer_states[f] = outer.update(
        {k: -mean[k] for k in names}, outer_states[f], {k: center[k] for k in names}
      )
      center.update({k: center[k] + step[k] for k in names})
    else:
      center.update({k: center[k] + num_workers * alpha * mean[k] for k in names})
    for i, w in enumerate(workers):
      if i in dropped:
        w.update({k: center[k] for k in names})
      elif pull == "reset":
        w.update({k: merge * center[k] + (1 - merge) * w[k] for k in names})
      else:
        w.update({k: w[k] - alpha * differences[i][k] for k in names})

  for t, step_batches in enumerate(batches, start=1):
    before = [dict(w) for w in workers]
    workers[:] = _local_steps(workers, states, step_batches, grad, inner)
    apply_due(t)
    for f, names in enumerate(fragments):
      if not ((t - f * spacing) % tau == 0 and t >= f * spacing):
        continue
      members, late, dropped = next(rounds)
      read = workers if pull == "reset" else before
      differences = [{k: r[k] - center[k] for k in names} for r in read]
      contributions = len(members) + len(held[f])
      mean = {
        k: (sum(differences[i][k] for i in members) + weight * sum(h[k] for h in held[f].values()))
        / contributions
        for k in names
      }
      held[f] = {j: differences[j] for j in late}
      first = min(members)
      for j in dropped:
        workers[j] = dict(workers[first])
        states[j] = copy.deepcopy(states[first])
        for _, in_flight, _, _ in arriving.values():
          in_flight[j] = in_flight[first]
      arriving[t + delay] = (f, differences, mean, set(dropped))
    apply_due(t)
    history.append(([dict(w) for w in workers], dict(center)))
  return history
