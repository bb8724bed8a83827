"""The Runtime interface and its registry: which runtime runs a config, what each
refuses, and a runtime added by one class and one registry line."""

import jax
import numpy as np
import pytest

from easgd.errors import ConfigError
from easgd.rules import RULES
from easgd.train import trainer
from easgd.train.runtimes import registry as runtimes
from easgd.train.runtimes.rule_runtime import RuleRuntime
from easgd.train.runtimes.simulated.runtime import SimulatedTrainee
from runs import config_with, small_config


@pytest.mark.parametrize(
  ("algorithm", "runtime", "chosen"),
  [
    ("sync_easgd", "simulated", "simulated"),
    ("async_easgd", "simulated", "simulated"),
    ("async_easgd", "threads", "threads"),
    ("pipeline", "simulated", "pipeline"),
  ],
)
def test_the_registry_picks_the_runtime_the_config_names_or_its_algorithm_needs(
  algorithm, runtime, chosen
):
  config = config_with({"runtime": runtime}, algorithm=algorithm)
  assert runtimes.select(config).name == chosen


@pytest.mark.parametrize(
  ("algorithm", "runtime", "message"),
  [
    ("sync_easgd", "mpi", r"^config.runtime='mpi' is invalid: valid: simulated, threads, ray$"),
    ("sync_easgd", "pipeline", r"^config.runtime='pipeline' is invalid: valid: simulated, threads"),
    (
      "post_local_sgd",
      "threads",
      r"^config.runtime='threads' is invalid: threads runs the parameter-server rules \(.*\) "
      r"and the synchronous rules with local steps \(.*diloco.*\); post_local_sgd runs on "
      r"simulated$",
    ),
    ("pipeline", "threads", r"^config.runtime='threads' is invalid: the pipeline runs on a"),
  ],
)
def test_a_runtime_that_does_not_run_the_algorithm_is_refused_in_one_line(
  algorithm, runtime, message
):
  with pytest.raises(ConfigError, match=message):
    runtimes.select(config_with({"runtime": runtime}, algorithm=algorithm))


def test_every_rule_has_a_runtime_and_every_runtime_declares_itself():
  for algorithm in RULES:
    assert "simulated" in [
      name for name, runtime in runtimes.RUNTIMES.items() if algorithm in runtime.algorithms()
    ]
  for name, runtime in runtimes.RUNTIMES.items():
    assert runtime.name == name
    assert runtime.algorithms()
    assert isinstance(runtime.spans_processes, bool) and isinstance(runtime.streams, bool)


class LockStep(RuleRuntime):
  """A toy runtime: the synchronous rules, every worker stepping every tick as the
  simulated runtime's own clock has them."""

  name = "lockstep"
  spans_processes = False
  streams = False
  trainees: list = []  # what it built, for the test to see

  @classmethod
  def algorithms(cls):
    return tuple(name for name, rule in RULES.items() if not rule.parameter_server())

  def trainee(self, state, clock_state, resumed_at):
    config = self.setup.config
    clock = self.rule.make_clock(self.cluster, self.model_bytes, config.seed, self.sent_bytes)
    if clock_state is not None:
      clock.load_state_dict(clock_state)
    self.trainees.append(SimulatedTrainee(self.setup, self.rule, state, clock, resumed_at))
    return self.trainees[-1]


@pytest.mark.e2e  # two whole runs
def test_a_runtime_is_one_class_and_one_registry_line(tmp_path, monkeypatch):
  monkeypatch.setitem(runtimes.RUNTIMES, LockStep.name, LockStep)  # the registry line
  assert "lockstep" in runtimes.named()
  overrides = {"run.total_steps": 6, "run.eval_every": 6, "run.checkpoint_every": 3}
  toy = trainer.train_and_evaluate(
    small_config(overrides, runtime="lockstep"), str(tmp_path / "toy")
  )
  assert LockStep.trainees, "the loop did not drive the toy runtime's trainee"
  plain = trainer.train_and_evaluate(small_config(overrides), str(tmp_path / "simulated"))
  for a, b in zip(jax.tree.leaves(toy.state), jax.tree.leaves(plain.state), strict=True):
    assert np.array_equal(np.asarray(a), np.asarray(b))
  assert toy.metrics["eval/center_accuracy"] == plain.metrics["eval/center_accuracy"]
  refusal = r"lockstep runs .*sync_easgd.*; async_easgd runs on simulated, threads, ray$"
  with pytest.raises(ConfigError, match=refusal):
    runtimes.select(config_with({"runtime": "lockstep"}, algorithm="async_easgd"))


def test_a_field_only_another_runtime_reads_is_refused_not_ignored():
  config = config_with({"cluster.replay": "trace.jsonl"}, algorithm="pipeline")
  with pytest.raises(
    ConfigError,
    match=r"^config.cluster.replay='trace.jsonl' is invalid: only the simulated and threads "
    r"runtimes read it, and pipeline runs on pipeline here: leave it ''$",
  ):
    runtimes.select(config)


@pytest.mark.parametrize(
  ("algorithm", "overrides", "pinned"),
  [
    ("sync_easgd", {}, None),
    ("sync_easgd", {"deterministic_sums": True}, "8"),
    ("async_easgd", {"deterministic_sums": True, "run.devices": 4}, "4"),
    # A trace replays on the machine that recorded it with the pool it had there.
    ("async_easgd", {"cluster.replay": "trace.jsonl"}, None),
    ("async_easgd", {"runtime": "threads"}, None),
    ("async_easgd", {"runtime": "ray"}, None),
  ],
)
def test_deterministic_sums_size_the_cpu_thread_pool_by_the_run(algorithm, overrides, pinned):
  """XLA:CPU splits a convolution's sums by its pool's size: with
  deterministic_sums every layout of the run, on any machine, sizes it alike."""
  config = config_with(overrides, algorithm=algorithm)
  runtime = runtimes.RUNTIMES[config.runtime]
  assert runtime.environment(config, "cpu") == ({} if pinned is None else {"PJRT_NPROC": pinned})
  assert runtime.environment(config, "tpu") == {}


def test_runtime_ray_without_the_package_ray_is_refused_in_one_line(monkeypatch):
  import importlib.util  # noqa: PLC0415

  from easgd.train.runtimes.ray.runtime import RayRuntime  # noqa: PLC0415

  find_spec = importlib.util.find_spec
  monkeypatch.setattr(
    importlib.util,
    "find_spec",
    lambda name, *args, **kwargs: None if name == "ray" else find_spec(name, *args, **kwargs),
  )
  config = config_with({"runtime": "ray"}, algorithm="async_easgd")
  with pytest.raises(ConfigError, match=r"^config.runtime='ray' needs the package ray"):
    RayRuntime.check(config)


def test_a_ray_started_here_has_the_gpus_cuda_visible_devices_shows(monkeypatch):
  from ray._private import accelerators  # noqa: PLC0415

  from easgd.train.runtimes.ray import runtime as ray_runtime  # noqa: PLC0415

  manager = accelerators.get_accelerator_manager_for_resource("GPU")
  monkeypatch.setattr(manager, "get_current_node_num_accelerators", lambda: 2)
  monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
  assert ray_runtime.local_gpus() == 2
  for visible, gpus in (("", 0), ("1", 1), ("0,1,2", 2)):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
    assert ray_runtime.local_gpus() == gpus, visible
