"""runtime=ray on a cluster: two Ray nodes started on this machine
(ray.cluster_utils, as `ray start --head` and `ray start --address=` would on
two hosts), train.py joining them by ray.address, its processes spread over
both nodes, a worker's process killed by the pid the run printed rejoining,
train.py itself stopped by SIGTERM and by kill -9 and resumed, and its trace
replayed to the same bits; beside that running cluster, an empty ray.address
starts a Ray of its own."""

import json
import os
import re
import signal

import pytest

from easgd import ray_connection
from easgd.train.runtimes import trace
from runs import config_with, stop_resume_and_replay, train

ray = pytest.importorskip("ray")
cluster_utils = pytest.importorskip("ray.cluster_utils")

FLAGS = [
  "--config=configs/default.py",
  "--config.algorithm=async_measgd",
  "--config.optimizer.momentum=0.9",
  "--config.optimizer.nesterov=True",  # EAMSGD's form, as test_ray.py's rejoining workers
  "--config.model=mlp",
  "--config.workers=2",
  "--config.run.devices=2",
  "--config.outer.moving_rate=0.2",
  "--config.run.total_steps=60",
  "--config.run.log_every=10",
  "--config.run.eval_every=0",
  "--config.run.checkpoint_every=20",
]


@pytest.mark.e2e
def test_train_py_on_a_two_node_cluster_survives_kills_and_replays_to_its_bits(
  tmp_path, monkeypatch
):
  """train.py on two Ray nodes, as a user runs it: its workers spread over both;
  kill -9 of the worker pid it logged (the worker rejoins), SIGTERM of train.py (a
  cut saved, exit 0), a resume, kill -9 of train.py after a checkpoint, a resume to
  the end; the trace of the whole run, cut back at each resume, replays to the
  final bits and logs what the run logged. Then, beside the cluster, an empty
  ray.address starts a Ray of its own (`_an_empty_address_starts_a_ray_of_its_own`)."""
  monkeypatch.delenv("RAY_ADDRESS", raising=False)
  cluster = cluster_utils.Cluster(
    initialize_head=True,
    head_node_args={
      "num_cpus": 1,
      "include_dashboard": False,
      "_system_config": ray_connection.system_config(),  # as docs/runtimes.md starts one
    },
  )
  try:
    cluster.add_node(num_cpus=1)
    cluster.wait_for_nodes()
    flags = [*FLAGS, "--config.runtime=ray", "--config.ray.servers=2"]
    flags.append(f"--config.ray.address={cluster.address}")
    workdir = tmp_path / "real"
    run = train(workdir, *flags)
    pid = int(run.wait_for(r"worker 1 runs in process (\d+) on ", 180).group(1))
    run.wait_for(r"step 10/", 120)
    os.kill(pid, signal.SIGKILL)
    run.wait_for(r"worker 1 runs in process \d+ on .*, restarted\)", 120)
    nodes = dict(
      re.findall(r"worker (\d) runs in process \d+ on .* \(Ray node (\w+)\)", run.output())
    )
    assert sorted(nodes) == ["0", "1"] and len(set(nodes.values())) == 2, run.tail()
    stop_resume_and_replay(
      tmp_path, workdir, flags, run, sigterm_at=30, kill_at=50, total=60, timeout=180
    )
    _an_empty_address_starts_a_ray_of_its_own(cluster)
  finally:
    cluster.shutdown()
  recorded = trace.read(str(workdir / trace.FILE))  # its checksums chain across both resumes
  worker_1 = [e.op for e in recorded.events if e.worker == 1]
  assert "join" in worker_1 and worker_1.index("join") < len(worker_1) - 1  # it stepped again
  lines = [json.loads(line) for line in (workdir / trace.FILE).read_text().splitlines()]
  assert [line["kind"] for line in lines].count("header") == 1
  # Each start of the run traced its workers' processes: 3 starts and the restart.
  assert len(recorded.processes) >= 2 * 3 + 1
  assert pid in [p["pid"] for p in recorded.processes if p["worker"] == 1]


def _an_empty_address_starts_a_ray_of_its_own(cluster) -> None:
  """ray.address='' (and no RAY_ADDRESS) is an embedded Ray that the run starts and
  ends, not `cluster`, the one ray.cluster_utils last started on the machine, which
  Ray's own default (address None) joins; its processes run at this process's
  priority."""
  from easgd.train.runtimes.ray import runtime as ray_runtime  # noqa: PLC0415 (after the devices are set)

  try:
    assert ray_runtime.connect(config_with({"runtime": "ray"}))
    assert ray.get_runtime_context().gcs_address != cluster.address

    @ray.remote(num_cpus=0)
    def niceness():
      return os.nice(0)

    # Its processes (the workers and servers) run at this process's priority, not
    # below it as Ray's default (nice 15) would, where a busy machine stops them.
    # (At nice 19 Ray's default, capped there, reads the same: nothing to tell apart.)
    if os.nice(0) < 19:
      assert ray.get(niceness.remote()) == os.nice(0)
  finally:
    ray.shutdown()
