"""runtime=ray on a cluster: two Ray nodes started on this machine
(ray.cluster_utils, as `ray start --head` and `ray start --address=` would on
two hosts), train.py joining them by ray.address, its processes spread over
both nodes, and its trace replayed to the same bits; an empty ray.address
beside a running cluster starts a Ray of its own."""

import re

import pytest

from easgd.train.runtimes import trace
from runs import assert_same_bits, config_with, train

ray = pytest.importorskip("ray")
cluster_utils = pytest.importorskip("ray.cluster_utils")

FLAGS = [
  "--config=configs/default.py",
  "--config.algorithm=async_easgd",
  "--config.model=mlp",
  "--config.workers=2",
  "--config.run.devices=2",
  "--config.outer.moving_rate=0.2",
  "--config.run.total_steps=24",
  "--config.run.log_every=12",
  "--config.run.eval_every=0",
  "--config.run.checkpoint_every=12",
]


@pytest.mark.e2e
def test_train_py_on_a_two_node_cluster_spreads_its_workers_and_replays_to_its_bits(tmp_path):
  cluster = cluster_utils.Cluster(
    initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False}
  )
  try:
    cluster.add_node(num_cpus=1)
    cluster.wait_for_nodes()
    run = train(
      tmp_path / "real",
      *FLAGS,
      "--config.runtime=ray",
      "--config.ray.servers=2",
      f"--config.ray.address={cluster.address}",
    )
    assert run.wait(300) == 0, run.tail()
  finally:
    cluster.shutdown()
  nodes = dict(
    re.findall(r"worker (\d) runs in process \d+ on .* \(Ray node (\w+)\)", run.output())
  )
  assert sorted(nodes) == ["0", "1"] and len(set(nodes.values())) == 2, run.tail()
  replay = train(
    tmp_path / "replay", *FLAGS, f"--config.cluster.replay={tmp_path / 'real' / trace.FILE}"
  )
  assert replay.wait(240) == 0, replay.tail()
  for step in (12, 24):
    assert_same_bits(tmp_path / "real", tmp_path / "replay", step)


@pytest.mark.e2e
def test_an_empty_address_starts_a_ray_of_its_own_beside_a_running_cluster(monkeypatch):
  """ray.address='' (and no RAY_ADDRESS) is an embedded Ray that the run starts and
  ends, not the cluster `ray start` or ray.cluster_utils last started on the
  machine, which Ray's own default (address None) joins."""
  from easgd.train.runtimes import ray_runtime  # noqa: PLC0415 (after the devices are set)

  monkeypatch.delenv("RAY_ADDRESS", raising=False)
  cluster = cluster_utils.Cluster(
    initialize_head=True, head_node_args={"num_cpus": 0, "include_dashboard": False}
  )
  try:
    assert ray_runtime.connect(config_with({"runtime": "ray"}))
    assert ray.get_runtime_context().gcs_address != cluster.address
  finally:
    ray.shutdown()
    cluster.shutdown()
