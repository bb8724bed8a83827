"""The grouped config: moved names, derived roles of fields, and rules' declarations that hold."""

import dataclasses
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import tiers

from easgd import rules, steps
from easgd.config import fields, hyperparameters
from easgd.configs import default
from easgd.infra import sharding
from easgd.sim import timing
from least_squares import DIM, OUT, loss_fn
from runs import config_with

FIELDS = hyperparameters.flatten(default.get_config().to_dict())
# A valid other value for every field of the algorithm groups (4 workers).
OTHER_VALUES = {
  "optimizer.learning_rate": 0.03,
  "optimizer.momentum": 0.5,
  "optimizer.nesterov": True,
  "optimizer.weight_decay": 0.01,
  "outer.comm_period": 2,
  "outer.moving_rate": 0.2,
  "outer.batch_stats": "local",
  "outer.pull": "elastic",
  "outer.optimizer": "adam",
  "outer.learning_rate": 0.3,
  "outer.momentum": 0.5,
  "outer.nesterov": False,
  "downpour.n_sync": 2,
  "downpour.server_optimizer": "adagrad",
}


def test_every_moved_name_points_at_a_field_and_none_is_left_flat():
  for old, new in hyperparameters.MOVED.items():
    assert old not in FIELDS
    assert new in FIELDS or any(field.startswith(new + ".") for field in FIELDS), new
  assert hyperparameters.moved("per_model.seed") == "pipeline.per_model.seed"
  assert hyperparameters.moved("cluster.device_flops") == "device.flops"
  assert hyperparameters.moved("cluster.latency") is None


def test_every_declared_read_and_hyper_field_exists():
  for rule in rules.RULES.values():
    for field in rule.reads:  # a field, or a whole group
      assert field in FIELDS or any(f.startswith(field + ".") for f in FIELDS), (rule.name, field)
  for field in dataclasses.fields(rules.Hyper):
    declared = field.metadata["config"]
    assert fields.FIELDS[declared.path] is declared and declared.setting == field.name


def test_hyper_comes_from_the_grouped_fields():
  config = config_with({"optimizer.learning_rate": 0.3, "outer.batch_stats": "local"})
  hyper = rules.Hyper.from_config(config)
  assert hyper.learning_rate == 0.3 and hyper.num_workers == config.workers
  assert hyper.comm_period == config.outer.comm_period and not hyper.average_stats


def test_what_shapes_a_trajectory_follows_the_groups_and_the_rule():
  assert not hyperparameters.shapes_trajectory("run.total_steps", "sync_easgd")
  # A schedule spans the run: its length then shapes the trajectory.
  cosine = {"name": "sgd", "schedule": "warmup_cosine"}
  assert hyperparameters.shapes_trajectory("run.total_steps", "sync_easgd", cosine)
  # What the optimizer and schedule in use do not read does not shape the run.
  assert not hyperparameters.shapes_trajectory("optimizer.b1", "sync_easgd", cosine)
  assert not hyperparameters.shapes_trajectory("optimizer.boundaries", "sync_easgd", cosine)
  assert hyperparameters.shapes_trajectory("optimizer.warmup_steps", "sync_easgd", cosine)
  adamw = {"name": "adamw", "schedule": "constant"}
  assert hyperparameters.shapes_trajectory("optimizer.b1", "diloco", adamw)
  assert not hyperparameters.shapes_trajectory("optimizer.momentum", "diloco", adamw)
  assert hyperparameters.shapes_trajectory("optimizer.schedule", "async_sgd")
  assert not hyperparameters.shapes_trajectory("outer.learning_rate", "sync_easgd")
  assert hyperparameters.shapes_trajectory("outer.learning_rate", "diloco")
  assert not hyperparameters.shapes_trajectory("device.memory", "sync_easgd")
  assert hyperparameters.shapes_trajectory("cluster.latency", "sync_sgd")
  assert hyperparameters.shapes_trajectory("data.batch_size", "pipeline")
  assert hyperparameters.shapes_trajectory("outer.moving_rate", "sync_easgd")
  assert not hyperparameters.shapes_trajectory("outer.moving_rate", "sync_sgd")
  assert not hyperparameters.shapes_trajectory("downpour.n_sync", "async_easgd")
  assert hyperparameters.shapes_trajectory("downpour.n_sync", "downpour")
  assert hyperparameters.shapes_trajectory("pipeline.per_model.seed", "pipeline")
  assert not hyperparameters.shapes_trajectory("pipeline.stage_steps", "sync_easgd")
  # The pipeline: one partition a device, no workers, no simulated cluster.
  assert hyperparameters.shapes_trajectory("run.devices", "pipeline")
  assert not hyperparameters.shapes_trajectory("run.devices", "sync_easgd")
  assert not hyperparameters.shapes_trajectory("workers", "pipeline")
  assert not hyperparameters.shapes_trajectory("cluster.latency", "pipeline")
  assert hyperparameters.shapes_trajectory("seed", "pipeline")
  hparams = hyperparameters.hparams_of(config_with(algorithm="sync_sgd"))
  assert "optimizer.momentum" in hparams and "outer.comm_period" not in hparams
  assert not any(field.startswith(("run.", "device.")) for field in hparams)
  assert hparams["cluster.server_bandwidth"] == "inf"


def test_devices_default_to_the_largest_divisor_up_to_8():
  assert hyperparameters.resolve_devices(config_with(workers=12)) == 6
  assert hyperparameters.resolve_devices(config_with(workers=12), available=4) == 4
  assert hyperparameters.resolve_devices(config_with({"run.devices": 3}, workers=12)) == 3
  pipeline = config_with({"pipeline.models": 10}, algorithm="pipeline", workers=3)
  assert hyperparameters.resolve_devices(pipeline) == 5


def _final_state(name: str, config, num_ticks: int = 6):
  """A rule's state after `num_ticks` ticks on least squares, 4 workers on 2 devices."""
  mesh = sharding.make_mesh(2)
  rule = rules.make_rule(name, rules.Hyper.from_config(config))
  rng = np.random.default_rng(0)
  x0 = {"w": jnp.asarray(rng.normal(size=(DIM, OUT)), jnp.float32), "b": jnp.zeros(OUT)}
  state = steps.init_state(rule, x0, jax.random.PRNGKey(0), mesh)
  step = steps.build_rule_step(rule, loss_fn, mesh, state)
  cluster = timing.Cluster(compute_time=1.0, speed_spread=1.0, jitter=0.3, master_time=0.4)
  clock = rule.make_clock(cluster, model_bytes=4 * (DIM * OUT + OUT), seed=0)
  for _ in range(num_ticks):
    batch = {
      "x": rng.normal(size=(4, 4, DIM)).astype(np.float32),
      "y": rng.normal(size=(4, 4, OUT)).astype(np.float32),
    }
    state, _ = step(state, batch, rule.tick_inputs(clock.next_tick()))
  return jax.device_get(state)


@pytest.mark.parametrize("name", tiers.cases(rules.RULES))
def test_fields_a_rule_does_not_read_leave_its_trajectory_alone(name):
  rule = rules.RULES[name]
  base = {"optimizer.momentum": 0.9} if rule.momentum == rules.Momentum.REQUIRED else {}
  config = config_with({**base, "outer.moving_rate": 0.1}, workers=4)
  unread = {
    field: value
    for field, value in OTHER_VALUES.items()
    if not hyperparameters.shapes_trajectory(field, name)
  }
  assert unread, name  # every rule leaves some algorithm field unread
  other = config_with({**base, "outer.moving_rate": 0.1, **unread}, workers=4)
  a, b = _final_state(name, config), _final_state(name, other)
  for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
    assert np.array_equal(x, y), name
  # And the learning rate, which every rule reads, does move it.
  faster = config_with(
    {**base, "outer.moving_rate": 0.1, "optimizer.learning_rate": 0.3}, workers=4
  )
  moved = _final_state(name, faster)
  # (The state: hierarchical_easgd's global center first moves at step 16.)
  assert not all(
    np.array_equal(x, y) for x, y in zip(jax.tree.leaves(moved), jax.tree.leaves(a), strict=True)
  )
  assert math.isfinite(float(np.abs(a.center["w"]).sum()))
