"""runtime=ray on a cluster: two Ray nodes started on this machine
(ray.cluster_utils, as `ray start --head` and `ray start --address=` would on
two hosts), train.py joining them by ray.address, its processes spread over
both nodes, a worker's process killed by the pid the run printed rejoining,
and its trace replayed to the same bits; an empty ray.address beside a
running cluster starts a Ray of its own. (A driver stopped by SIGTERM or
kill -9 and resumed: test_threads.py, whose coordination runtime=ray shares.)"""

import os
import re
import signal

import pytest

from easgd.train.runtimes import trace
from runs import assert_same_bits, assert_same_scalars, config_with, steps_saved, train

ray = pytest.importorskip("ray")
cluster_utils = pytest.importorskip("ray.cluster_utils")

FLAGS = [
  "--config=configs/default.py",
  "--config.algorithm=async_measgd",
  "--config.optimizer.momentum=0.9",
  "--config.model=mlp",
  "--config.workers=2",
  "--config.run.devices=2",
  "--config.outer.moving_rate=0.2",
  "--config.run.total_steps=200",
  "--config.run.log_every=10",
  "--config.run.eval_every=0",
  "--config.run.checkpoint_every=50",
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
    pid = int(run.wait_for(r"worker 1 runs in process (\d+) on ", 180).group(1))
    run.wait_for(r"step 10/", 120)
    os.kill(pid, signal.SIGKILL)
    run.wait_for(r"worker 1 runs in process \d+ on .*, restarted\)", 120)
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
  kept = steps_saved(tmp_path / "real")
  assert kept[-1] == 200
  for step in kept:
    assert_same_bits(tmp_path / "real", tmp_path / "replay", step)
  assert_same_scalars(tmp_path / "real", tmp_path / "replay")
  recorded = trace.read(str(tmp_path / "real" / trace.FILE))
  worker_1 = [e.op for e in recorded.events if e.worker == 1]
  assert "join" in worker_1 and worker_1.index("join") < len(worker_1) - 1  # it stepped again
  restarted = [p["pid"] for p in recorded.processes if p["worker"] == 1]
  assert len(restarted) == 2 and restarted[0] == pid != restarted[1]


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
