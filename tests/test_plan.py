"""The planner reads memory and FLOPs from the compiled step and refuses what cannot be planned."""

import os
import types

import pytest

from easgd import plan
from easgd.configs import default
from easgd.errors import ConfigError
from easgd.infra import sharding

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def small_config(**cluster):
  config = default.get_config()
  config.workers, config.run.devices, config.data.batch_size = 2, 2, 16
  config.outer.moving_rate = 0.4
  config.cluster.update(cluster)
  return config


@pytest.mark.e2e  # compiles the whole step at four batch sizes
@pytest.mark.parametrize("source", ["device", "stream"])
def test_memory_terms_predict_another_compiled_batch(source):
  config = small_config()
  config.data.source = source
  compiler = plan.StepCompiler(config, sharding.make_mesh(2))
  memory = plan.measure_memory(compiler, 16)  # fitted on batches 32 and 64
  # One worker a device: its 2,000 examples (28x28 uint8 and an int32 label),
  # or, streamed, none resident: each step's batch is an argument that grows with it.
  assert memory.data == (2000 * (28 * 28 + 4) if source == "device" else 0)
  # The state holds the center, one worker and their momentum-free optimizer
  # states: at least two copies of LeNet-5's 61,706 float32 parameters.
  assert 2 * 61_706 * 4 <= memory.state < 3 * 61_706 * 4
  assert memory.per_example > 0
  compiled = plan.compiled_bytes(compiler.compile(100))
  assert memory.total(100) == pytest.approx(compiled, rel=0.01)


@pytest.mark.e2e  # compiles the whole step at several batch sizes
def test_largest_batch_fits_one_more_does_not_and_flops_are_a_training_steps():
  config = small_config()
  config.device.memory, config.device.flops = 20e6, 1e9
  found = plan.make_plan(config)
  assert found.memory_batch < found.partition  # the memory binds, not the data
  compiler = plan.StepCompiler(config, sharding.make_mesh(2))
  assert plan.compiled_bytes(compiler.compile(found.largest_batch)) <= 20e6
  assert plan.compiled_bytes(compiler.compile(found.largest_batch + 1)) > 20e6
  assert found.checked_bytes <= 20e6
  # LeNet-5 forward, per example, in multiply-adds x 2: conv1 28*28*6*25, conv2
  # 10*10*16*150, dense 400*120 + 120*84 + 84*10. Training is about 3 forwards.
  forward = 2 * (28 * 28 * 6 * 25 + 10 * 10 * 16 * 150 + 400 * 120 + 120 * 84 + 84 * 10)
  assert found.step_flops == pytest.approx(3 * forward * config.data.batch_size, rel=0.2)
  assert found.timing.compute_time == pytest.approx(found.step_flops / 1e9)


def test_pipeline_and_zero_memory_are_refused():
  config = small_config()
  config.device.memory = 0.0
  with pytest.raises(ConfigError, match=r"config.device.memory=0.0 is invalid"):
    plan.check_plannable(config)
  config = small_config()
  config.algorithm, config.pipeline.models = "pipeline", 2
  with pytest.raises(ConfigError, match="'pipeline' is not planned"):
    plan.check_plannable(config)


@pytest.mark.e2e
def test_cli_reports_memory_time_and_the_workers_that_pay(starter):
  argv = ["-m", "easgd.plan", "--config=configs/default.py", "--config.algorithm=async_easgd"]
  argv += ["--config.workers=4"]
  code, out, stderr = starter.run(argv, REPO, timeout=300)
  assert code == 0, stderr
  assert "largest batch: 1000, set by the partition of 1000 examples" in out
  assert "S1 activations" in out and "S2 state" in out and "S3 batch-independent" in out
  assert "communication dominates from P = " in out
  assert "parameter servers needed for 4 workers: 1" in out
  assert "run them with --config.runtime=ray --config.ray.servers=1" in out
  assert out.count("\n") > 20
  # A device too small for batch 1, known once the step is compiled (here from the
  # compilation cache, as the run above compiled it): one line, exit 2.
  code, out, stderr = starter.run([*argv, "--config.device.memory=1e5"], REPO, timeout=300)
  assert code == 2 and out == ""
  errors = [line for line in stderr.splitlines() if line.startswith("error:")]
  assert len(errors) == 1 and "no batch fits in config.device.memory" in errors[0]
  assert stderr.rstrip().endswith(errors[0])


@pytest.mark.parametrize(
  "overrides,message",
  [
    (["--config.device.memory=0"], "config.device.memory=0.0 is invalid"),
    (["--config.cluster.bandwidth=0"], "config.cluster.bandwidth=0.0 is invalid: must be > 0"),
  ],
)
@pytest.mark.e2e
def test_cli_bad_input_exits_2_with_one_line(starter, overrides, message):
  argv = ["-m", "easgd.plan", "--config=configs/default.py", *overrides]
  code, stdout, stderr = starter.run(argv, REPO, timeout=300)
  assert code == 2
  errors = [line for line in stderr.splitlines() if line.startswith("error:")]
  assert len(errors) == 1 and message in errors[0]
  assert stderr.rstrip().endswith(errors[0]) and stdout == ""


class _FakeCompiler:
  """Compiled bytes of a step whose temporaries have a floor and grow in 64-byte
  steps, nearly but not exactly linearly: what XLA's buffer assignment gives."""

  streamed = False  # the partitions are an argument of every batch's step
  data_bytes = 0

  def __init__(self):
    self.compiled = []

  def input_bytes(self, batch_size):
    return self.data_bytes

  def compile(self, batch_size):
    self.compiled.append(batch_size)
    temporaries = max(900_000, 300_000 + 64 * ((41_000 * batch_size + batch_size**2) // 64))
    stats = types.SimpleNamespace(
      argument_size_in_bytes=2_000_000,
      temp_size_in_bytes=temporaries,
      output_size_in_bytes=500_000,
      alias_size_in_bytes=500_000,
    )
    return types.SimpleNamespace(memory_analysis=lambda: stats)


@pytest.mark.parametrize("device_memory", [2.95e6, 3.5e6, 20e6])
def test_the_largest_batch_is_found_exactly_despite_a_floor_and_curvature(device_memory):
  compiler = _FakeCompiler()
  size = lambda b: plan.compiled_bytes(compiler.compile(b))  # noqa: E731
  memory = plan.Memory(data=0, state=2_000_000, per_example=41_000, fixed=300_000, floor=900_000)
  largest, checked = plan.search_largest_batch(compiler, memory, device_memory, limit=5000)
  # Near-linear: a handful of compiles, not a scan.
  assert len(compiler.compiled) <= 12
  assert checked == size(largest) <= device_memory
  assert size(largest + 1) > device_memory


@pytest.mark.parametrize("batch_size,partition", [(1, 5000), (16, 5000), (1000, 1500), (8, 8)])
def test_the_rule_is_fitted_within_the_partition_and_its_floor_is_batch_ones(batch_size, partition):
  compiler = _FakeCompiler()
  compiler.partition, compiler.data_bytes = partition, 0
  memory = plan.measure_memory(compiler, batch_size)
  assert max(compiler.compiled) <= partition
  size = lambda b: plan.compiled_bytes(compiler.compile(b))  # noqa: E731
  # The line passes through the larger batch it was fitted on, and the floor
  # holds it up to what batch 1 needs.
  fitted = min(partition, max(4 * batch_size, 64))
  assert memory.total(fitted) == pytest.approx(size(fitted), rel=1e-6)
  assert memory.total(1) == size(1)
  # A config batch that does not fit does not hide the smaller ones that do.
  device_memory = size(max(1, batch_size // 4))
  largest, checked = plan.search_largest_batch(compiler, memory, device_memory, partition)
  assert checked <= device_memory
  assert largest == partition or size(largest + 1) > device_memory
