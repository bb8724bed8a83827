"""NoLoCo, run sharded over the mesh, against its equations in plain NumPy; its groups,
its identity with DiLoCo, its clock and its resume."""

import jax
import numpy as np
import pytest
import tiers
from test_rules import ETA, make_problem, per_worker, run_rule

import numpy_optim
from easgd import rules
from easgd.config import validation
from easgd.configs import default
from easgd.errors import ConfigError
from easgd.rules import noloco
from easgd.sim import clocks, timing
from least_squares import numpy_grad
from runs import assert_stopped_and_resumed_ends_as_never_stopped

WORKERS, TAU, OUTER_ETA, OUTER_MU = 4, 3, 0.7, 0.5


def groups_of(step, workers, size):
  """The groups of the outer step after step `step`: a permutation of the workers drawn
  from the run's key (jax.random.PRNGKey(0) in run_rule), the step and noloco's stream,
  cut into consecutive groups of `size`."""
  key = jax.random.fold_in(jax.random.fold_in(jax.random.PRNGKey(0), noloco.GROUP_STREAM), step)
  order = [int(w) for w in jax.random.permutation(key, workers)]
  return [order[g : g + size] for g in range(0, workers, size)]


def reference(x0, batches, inner, tau, size, eta_o, mu_o, gamma):
  """NoLoCo as the reference code writes its outer step (src/noloco/sparse_optimizer_c.py,
  lines 57-66), with the momentum M_i in parameter units; [(workers, center)] after each
  step t (from 0).

  Every step x_i <- x_i + u_i. After a step t with (t+1) % tau == 0, for each worker i
  of group G:  M_i <- mu_o*M_i + eta_o*mean_G(x - phi) + gamma*(mean_G phi - phi_i);
  phi_i <- phi_i + M_i;  x_i <- phi_i. The center is mean_i phi_i (evaluation only)."""
  workers = [dict(x0) for _ in batches[0]]
  phi = [dict(x0) for _ in batches[0]]
  momentum = [{k: np.zeros_like(v) for k, v in x0.items()} for _ in batches[0]]
  states = [inner.init(x0) for _ in batches[0]]
  history = []
  for t, step_batches in enumerate(batches):
    for i, batch in enumerate(step_batches):
      u, states[i] = inner.update(numpy_grad(workers[i], batch), states[i], workers[i])
      workers[i] = {k: workers[i][k] + u[k] for k in x0}
    if (t + 1) % tau == 0:
      moved = list(phi)
      for group in groups_of(t, len(workers), size):
        for i in group:
          for k in x0:
            drift = np.mean([workers[j][k] - phi[j][k] for j in group], axis=0)
            spread = np.mean([phi[j][k] for j in group], axis=0)
            momentum[i][k] = mu_o * momentum[i][k] + eta_o * drift + gamma * (spread - phi[i][k])
          moved[i] = {k: phi[i][k] + momentum[i][k] for k in x0}
      phi = moved
      workers = [dict(p) for p in phi]
    center = {k: np.mean([p[k] for p in phi], axis=0) for k in x0}
    history.append(([dict(w) for w in workers], center))
  return history


def assert_within(actual, expected, rtol=1e-5, atol=1e-6):
  """Every worker and the center after each step, within 1e-5 relative."""
  for state, (workers, center) in zip(actual, expected, strict=True):
    for key in center:
      np.testing.assert_allclose(np.asarray(state.center[key]), center[key], rtol, atol)
    for i, values in enumerate(workers):
      for key in values:
        np.testing.assert_allclose(np.asarray(state.workers[key][i]), values[key], rtol, atol)


def assert_follows(consensus, optimizer, num_devices):
  """4 workers in pairs, tau = 3, 7 steps (two outer steps, each with its own pairs)."""
  x0, batches = make_problem(num_workers=WORKERS)
  if optimizer == "sgd":
    settings, inner = {"learning_rate": ETA}, numpy_optim.sgd(ETA)
  else:
    settings = dict(optimizer="adamw", learning_rate=0.01, weight_decay=0.1)
    inner = numpy_optim.Optimizer("adamw", numpy_optim.constant(0.01), wd=0.1)
  hyper = rules.Hyper(
    **{"num_workers": WORKERS, **settings},
    comm_period=TAU,
    outer_learning_rate=OUTER_ETA,
    outer_momentum=OUTER_MU,
    outer_nesterov=False,
    group_size=2,
    consensus=consensus,
  )
  actual = run_rule("noloco", hyper, x0, batches, num_devices)
  gamma = consensus * OUTER_ETA
  expected = reference(
    x0, [per_worker(b) for b in batches], inner, TAU, 2, OUTER_ETA, OUTER_MU, gamma
  )
  assert_within(actual, expected)
  # The pairs differ between the two outer steps (the test means something).
  assert groups_of(2, WORKERS, 2) != groups_of(5, WORKERS, 2)


@pytest.mark.parametrize(
  "consensus,optimizer,num_devices",
  tiers.first_quick([(1.0, "sgd", 4), (1.0, "sgd", 2), (0.5, "adamw", 2)]),
)
def test_noloco_follows_its_equations(consensus, optimizer, num_devices):
  """The reference code's gamma = eta_o (consensus 1) with SGD inside; and a gamma of its
  own (0.5 * eta_o) under AdamW, with the worker's moments never averaged."""
  assert_follows(consensus, optimizer, num_devices)


def test_the_groups_partition_the_workers_anew_at_each_outer_step_from_the_seed():
  rule = rules.make_rule("noloco", rules.Hyper(8, ETA, group_size=2))
  key = jax.random.PRNGKey(3)
  drawn = [np.asarray(rule.groups(key, step)) for step in range(3, 200, 4)]
  for groups in drawn:
    assert groups.shape == (4, 2) and sorted(groups.reshape(-1)) == list(range(8))
  assert len({groups.tobytes() for groups in drawn}) > 40  # fresh pairs, most steps
  # A pure function of the key and the step: the same run, the same groups.
  np.testing.assert_array_equal(np.asarray(rule.groups(key, 7)), drawn[1])
  assert not np.array_equal(rule.groups(jax.random.PRNGKey(4), 7), drawn[1])


@pytest.mark.parametrize("num_devices", tiers.devices(4, 1))
def test_one_group_of_every_worker_without_the_pull_is_diloco(num_devices):
  """n = P and kappa = 0: g_i = -mean_i (x_i - phi_i), the same for every worker, so every
  phi_i is DiLoCo's center under the same outer optimizer (Nesterov 0.7, 0.9), to float
  rounding (the group's mean is summed in another order than DiLoCo's all-reduce)."""
  x0, batches = make_problem(num_workers=WORKERS)
  outer = dict(outer_learning_rate=0.7, outer_momentum=0.9, outer_nesterov=True)
  base = dict(num_workers=WORKERS, learning_rate=ETA, comm_period=TAU, **outer)
  gossip = rules.Hyper(**base, group_size=WORKERS, consensus=0.0)
  ours = run_rule("noloco", gossip, x0, batches, num_devices)
  diloco = run_rule("diloco", rules.Hyper(**base), x0, batches, num_devices)
  for a, b in zip(ours, diloco, strict=True):
    for x, y in zip(jax.tree.leaves(a.center), jax.tree.leaves(b.center), strict=True):
      np.testing.assert_allclose(x, y, rtol=1e-6, atol=1e-7)
    for x, y in zip(jax.tree.leaves(a.workers), jax.tree.leaves(b.workers), strict=True):
      np.testing.assert_allclose(x, y, rtol=1e-6, atol=1e-7)


def test_its_clock_all_reduces_among_a_group_every_period():
  """Pairs of 8 workers: an all-reduce of 2 every tau-th step; two messages when gamma is
  neither 0 nor eta_o."""
  cluster = timing.Cluster(compute_time=1.0, latency=0.5, bandwidth=1e3)
  for consensus, messages in ((1.0, 1), (0.0, 1), (0.5, 2)):
    hyper = rules.Hyper(8, ETA, comm_period=3, group_size=2, consensus=consensus)
    clock = rules.make_rule("noloco", hyper).make_clock(cluster, model_bytes=100.0, seed=0)
    assert isinstance(clock, clocks.SyncClock) and clock.levels == (timing.Exchange(block=2),)
    sent = [clock.next_tick().bytes_sent[0] for _ in range(6)]
    assert sent == [0, 0, timing.allreduce_bytes(messages * 100.0, 2)] * 2


def test_a_cluster_of_groups_is_refused_in_one_line():
  """Its random groups would cross the network's groups where the timing model, pricing
  contiguous blocks, says they do not."""
  config = default.get_config()
  config.update_from_flattened_dict({"algorithm": "noloco", "cluster.groups": (4, 4)})
  with pytest.raises(
    ConfigError, match=r"^config\.cluster\.groups=\(4, 4\) is invalid: must be \(\) with noloco"
  ):
    validation.validate(config)


@pytest.mark.e2e
def test_a_noloco_run_resumes_bit_for_bit(tmp_path):
  """Stopped after step 22, between outer steps: its groups come from the key and the
  step, and each worker's outer weights and momentum are in the checkpoint."""
  overrides = {"outer.moving_rate": 0.0, "run.checkpoint_every": 22}
  assert_stopped_and_resumed_ends_as_never_stopped(tmp_path, "noloco", overrides, stop=22)


# The GPU tier's checks of this rule (tests/test_gpu.py), on its one device.
GPU_CHECKS = {
  "noloco": [
    lambda: assert_follows(1.0, "sgd", 1),
    lambda: assert_follows(0.5, "adamw", 1),
  ]
}
