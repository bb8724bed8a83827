"""Every script of bench/ and studies/ runs end to end as a user starts it, in a tiny
setting (a few steps, one seed, the smallest network it takes), so that none rots
unnoticed: a script that crashes, or prints no result, fails here.

What each script measures is its own business (bench/README.md); here it must finish
with exit 0, print its result and write its files. The GPU scripts refuse a machine
without a GPU in one line (tests/bench/test_bench_arguments.py), and the modules the
others import run through them.
"""

import os
import pathlib
import re
import subprocess
import sys

import pytest

import runs

REPO = pathlib.Path(runs.REPO)
FOLDERS = ("bench", "bench/cpu", "studies")

# Imported by the scripts below, run through them.
IMPORTED = {
  "bench/cpu/peer_steps.py",
  "bench/cpu/torch_models.py",
  "studies/__init__.py",
  "studies/fault_injections.py",
  "studies/harness.py",
}
# They measure a GPU; without one they refuse (tests/bench/test_bench_arguments.py).
GPU_ONLY = {"bench/gpu.py", "bench/gpu_check.py"}
# Run end to end by another test.
ELSEWHERE = {
  "studies/heterogeneous.py": "tests/studies/test_studies.py::"
  "test_a_study_with_parallel_runs_writes_the_table_of_the_study_run_in_series",
}

MLP = "--set=model='mlp'"
# script: (its arguments, its result in what it prints (a regular expression), the
# files it writes, each with its result or None); {tmp} is the test's own folder.
RUNS = {
  "bench/deterministic_sums.py": (
    ("--workers=8", "--batch_size=2", "--steps=2", "--rounds=1", "--variants=sync_sgd"),
    r"^sync_sgd +all-reduce +\d+ img/s +worker order +\d+ img/s +ratio [\d.]+$",
    {},
  ),
  # On a CPU the pair without XLA:GPU's deterministic ops ends with the same bits too.
  "bench/gpu_determinism.py": (
    ("--steps=2", "--workers=2", "--model=mlp", "--deterministic=false"),
    r"^False +0 of \d+ +0$",
    {},
  ),
  "bench/pipeline.py": (
    (
      "--models=2",
      "--devices=2",
      "--batch_size=4",
      "--stage_steps=2",
      "--rounds=1",
      "--model=mlp",
    ),
    r"\(a\) one by one, sync_sgd +\d+",
    {},
  ),
  "bench/plan_check.py": (
    ("--batches=256", "--models=mlp", "--steps=2"),
    r"\| mlp \| 256 \| [\d.]+ \| [\d.]+ \|",
    {},
  ),
  "bench/plan_servers.py": (
    ("--model=mlp", "--workers=2", "--tau=2", "--steps=4", "--repeats=1"),
    r"S=2: predicted [\d.]+ ms a step, measured [\d.]+ ms",
    {},
  ),
  "bench/ray_replay.py": (
    ("--model=mlp", "--workers=2", "--steps=8", "--every=4", "--kill_worker=1", "--kill_at=4"),
    r"^killed worker 1 \(process \d+\) at step \d+$(.|\n)*"
    r"^step 8: (\d+) of \2 leaves hold the same bytes; largest difference 0$",
    {},
  ),
  # The 1-server exchange is read from the tau = 1 ray run, the 2-server one run anew.
  "bench/ray_vs_threads.py": (
    ("--models=mlp", "--taus=1", "--steps=4", "--workers=2", "--repeats=1"),
    r"ray/threads [\d.]+(.|\n)*servers=1: [\d.]+ MB(.|\n)*servers=2: [\d.]+ MB",
    {},
  ),
  "bench/rule_defaults.py": (
    ("--rules=sync_easgd", "--steps=4"),
    r"\| sync_easgd \| - \| [\d.]+ \| \d+ \|",
    {},
  ),
  "bench/stream.py": (
    ("--models=lenet5", "--workers=2", "--batch_size=8", "--rounds=1"),
    r"\| stream \| \d+ \| [\d.]+x \|",
    {},
  ),
  "bench/sweep_parallel.py": (
    ("--config={tmp}/sweep.py", "--steps=4", "--parallel=2", "--nodes=2"),
    r"parallel summary equals the serial one: yes\ncluster summary equals the serial one: yes",
    {},
  ),
  "bench/throughput.py": (
    ("--workers=8", "--batch_size=2", "--steps=2", "--rounds=1", "--rules=sync_easgd"),
    r"^async_easgd / sync_easgd \(tau=4\): [\d.]+x",
    {},
  ),
  "bench/cpu/batch_norm.py": (("--rounds=1",), r"\| models/batch_norm.py \| [\d.]+ \|", {}),
  "bench/cpu/compile_accuracy.py": (
    ("--seeds=0", "--steps=4", "--workdir={tmp}/runs", "--variants=options_shifted_conv1"),
    r"^options, shifted conv1 +[\d.]+ +[\d.]+$",
    {},
  ),
  "bench/cpu/conv_grad.py": (
    ("--batch_size=8",),
    r"ResNet-20's 19 convolutions, forward \+ dx \+ dw: \d+ ms",
    {},
  ),
  "bench/cpu/dtype.py": (
    ("--models=lenet5", "--rounds=1", "--batch_size=8"),
    r"\| bfloat16 \| \d+ \| [\d.]+x \|",
    {},
  ),
  "bench/cpu/peers.py": (
    ("--models=lenet5", "--batch_size=8", "--steps=1", "--rounds=1", "--only=sync_easgd, 2"),
    r"\| sync_easgd, 2 devices \| \d+ \| - \| [\d.]+% \|",
    {},
  ),
  "bench/cpu/profile_step.py": (
    ("--models=lenet5", "--steps=1", "--top=3"),
    # A convolution's thunk is named after its HLO (convolution) or its JAX op
    # (conv_general_dilated); which of them the top 3 hold varies with the load.
    r"\| (convolution|conv_general_dilated)[.\d]* \| conv\d \((forward|backward)\) \| [\d.]+ \|",
    {},
  ),
  "bench/cpu/variants.py": (
    ("--models=lenet5", "--rounds=1", "--batch_size=8"),
    r"\(the default\) \| \d+ \| [\d.]+x \|",
    {},
  ),
  "bench/cpu/xla_flags.py": (
    ("--models=lenet5", "--steps=1", "--only=xnnpack"),
    r"^\(default\) +[\d.]+ / +[\d.]+\n--xla_cpu_use_xnnpack=true +[\d.]+ / +[\d.]+$",
    {},
  ),
  "studies/asynchrony.py": (
    (
      "--workdir={tmp}/runs",
      "--docs={tmp}",
      "--total_steps=5",
      "--seeds=1",
      "--rules=sync_easgd,async_easgd",
      MLP,
    ),
    r"^\| async_easgd \| [^|]+ \| [^|]+ \| (-|\d\.\d{3}) \| \d\.\d{3} \| [\d.]+ \| \d+ "
    r"\| [\d.]+ \| [\d.]* \|$",
    {"asynchrony_table.md": None, "asynchrony.png": None},
  ),
  "studies/faults.py": (
    (
      "--workdir={tmp}/runs",
      "--trials=1",
      "--only=SIGTERM to the only process",
      "--out={tmp}/faults_table.md",
    ),
    r"^wrote .*faults_table.md; .*faults.md's table of every fault left as it is",
    {"faults_table.md": r"^\| SIGTERM to the only process \| .* \| bitwise equal \|$"},
  ),
  "studies/hierarchy.py": (
    (
      "--workdir={tmp}/runs",
      "--docs={tmp}",
      "--total_steps=5",
      "--seeds=1",
      "--runs=hierarchical_easgd,async_local_sgd-two-tier",
      "--ratios=1,100",
      MLP,
    ),
    r"^\| async_local_sgd-two-tier \| 100x \| [^|]+ \| \d\.\d{3} \| [\d.]+ \| [\d.]+ \| [\d.]+ \|$",
    {"hierarchy_table.md": None, "hierarchy.png": None},
  ),
  "studies/outer.py": (
    (
      "--workdir={tmp}/runs",
      "--docs={tmp}",
      "--total_steps=5",
      "--seeds=1",
      "--runs=diloco",
      "--compressed=bfloat16",
      "--feedback=",  # the compressed run of the best run alone
      MLP,
    ),
    r"^\| diloco \| bfloat16 \| .* \| [\d.]+ \| [\d.]+ \|$",
    {"outer_table.md": None, "outer.png": None},
  ),
  "studies/processes.py": (
    (
      "--workdir={tmp}/runs",
      "--docs={tmp}",
      "--total_steps=25",
      "--seeds=0",
      "--rules=async_easgd",
      "--n_syncs=4",
      "--downpour_workers=1",
      MLP,
    ),
    r"^\| 4 \| 1 \| [\d.]+ \| 1\.00x \| ",
    {"processes_table.md": None, "processes.png": None},
  ),
  "studies/reality.py": (
    ("--workdir={tmp}/runs", "--docs={tmp}", "--total_steps=25", "--rules=async_easgd", MLP),
    r"^\| async_easgd \| 2x slower \| [\d.]+ \|",
    {"reality_table.md": None, "reality.png": None},
  ),
  "studies/scaling.py": (
    (
      "--workdir={tmp}/runs",
      "--out={tmp}",
      "--workers=1",
      "--steps=4",
      "--rounds=1",
      "--accuracy_rules=sync_easgd",
    ),
    r"^\| sync_easgd \| (\d\.\d{3}|diverged at step \d+) \|$(.|\n)*"
    r"^## SC17's 8-GPU setting in the timing model$",
    {"scaling_tables.md": None, "scaling.png": None},
  ),
}


# What a script reads besides its arguments, written into the test's folder.
INPUTS = {
  "bench/sweep_parallel.py": {
    "sweep.py": "from easgd import sweep\n"
    "from easgd.configs import default\n\n\n"
    "def get_config():\n"
    "  config = default.get_config()\n"
    "  config.model = 'mlp'\n"
    "  return config\n\n\n"
    "def get_sweep():\n"
    "  return sweep.product({'optimizer.learning_rate': [0.05]})\n"
  },
}


def test_every_script_runs_in_the_suite():
  """A new script joins RUNS (or says why not): the suite runs every one."""
  scripts = {
    str(path.relative_to(REPO)) for folder in FOLDERS for path in (REPO / folder).glob("*.py")
  }
  assert scripts == set(RUNS) | IMPORTED | GPU_ONLY | set(ELSEWHERE)
  assert not set(RUNS) & (IMPORTED | GPU_ONLY | set(ELSEWHERE))


@pytest.mark.e2e  # processes, a few steps each
@pytest.mark.parametrize("script", sorted(RUNS))
def test_the_script_runs_end_to_end_in_a_tiny_setting(tmp_path, script):
  arguments, result, files = RUNS[script]
  for name, text in INPUTS.get(script, {}).items():
    (tmp_path / name).write_text(text)
  run = subprocess.run(
    [sys.executable, script, *(argument.format(tmp=tmp_path) for argument in arguments)],
    cwd=REPO,
    env={**os.environ, "JAX_PLATFORMS": "cpu"},
    capture_output=True,
    text=True,
    timeout=1800,  # a hang's guard only: the slowest takes about 2 minutes
    check=False,
  )
  assert run.returncode == 0, run.stderr[-3000:]
  assert re.search(result, run.stdout, re.MULTILINE), run.stdout[-3000:]
  for name, written in dict(files).items():
    assert (tmp_path / name).is_file(), name
    if written:
      assert re.search(written, (tmp_path / name).read_text(), re.MULTILINE), name
