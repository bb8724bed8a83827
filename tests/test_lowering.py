"""Every program the project compiles, lowered for GPUs and TPUs: no CPU-only path in it.

Some layers compute differently on the CPU, through lax.platform_dependent,
whose lowering keeps only the branches of the platforms it is lowered for:
BatchNorm's sums as products (models/batch_norm.py), the shifted convolution
and materialize's division (models/layers.py). Each of those modules names the
functions of its CPU-only paths (CPU_ONLY_PATHS) and of the paths the other
platforms take in their place (ACCELERATOR_PATHS); the ops of each such
function carry its name in their locations, backward pass included
(layers.named_after_itself).

Each program is exported (jax.export) for ("cuda", "tpu") from abstract
arguments, on the CPU: nothing is compiled or run, and the export refuses what
another platform could not load (a custom call without compatibility
guarantees). Its text must name no CPU-only path, and must name the
accelerator paths of the layers its model runs (in the forward and the
backward pass of a training program). As a control that the names are found
where they are, some programs are lowered for the CPU too, where the CPU-only
paths must be named. The CPU's compiler options (easgd.infra.compile) must go
to CPU programs only.

The programs are those the trainers, the threads runtime, the pipeline, the
evaluator and the checkpointer compile (easgd.plan compiles the same steps).
Left out: easgd.data.stream's permutation, a host program compiled for the
CPU by design.
"""

import dataclasses
import functools
import re
import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from easgd import assembly, evaluation, models, rules, steps
from easgd.data import augment as augment_lib
from easgd.infra import checkpoint, sharding
from easgd.infra import compile as compile_lib
from easgd.models import batch_norm, layers
from easgd.pipeline import programs as pipeline
from easgd.rules import AXIS
from easgd.sim import ticks
from easgd.train.runtimes.threads import runtime as threads
from runs import config_with

ACCELERATORS = ("cuda", "tpu")
CPU_ONLY_PATHS = batch_norm.CPU_ONLY_PATHS + layers.CPU_ONLY_PATHS

# A small run: 4 workers (or the pipeline's 4 models) on 4 devices, batches of 8
# drawn from partitions of 16, CIFAR's augmentation. ImageNet's ResNet-50 takes
# 32x32 images: its program has the same layers at any side, and traces faster.
WORKERS = 4
BATCH = 8
PARTITION = 16
CLASSES = 10
IMAGE_SHAPES = {"lenet5": (28, 28, 1), "resnet20": (32, 32, 3), "resnet50": (32, 32, 3)}
AUGMENT = augment_lib.get("crop_flip")
SYNC, ASYNC = "sync_easgd", "async_easgd"

# The programs that run a model in training mode (a forward and a backward pass).
TRAINING = ("train_step", "batch_step", "threads_local", "pipeline_step")
# Those that run a model at all (in the init programs, model.init's forward pass is
# dead code: only the parameters it creates are kept).
WITH_MODEL = TRAINING + ("evaluation_workers", "evaluation_center")


@dataclasses.dataclass(frozen=True)
class Program:
  """One compiled program: what builds it (`kind`), for which model, dtype and rule."""

  kind: str
  model: str = "lenet5"
  dtype: str = "float32"
  rule: str = ""

  def __str__(self):
    return "/".join(part for part in (self.kind, self.rule, self.model, self.dtype) if part)

  def accelerator_paths(self) -> tuple[str, ...]:
    """The ACCELERATOR_PATHS this program's model runs on GPUs and TPUs."""
    if self.kind not in WITH_MODEL:
      return ()
    paths = ()
    if self.model == "lenet5" and self.dtype == "float32":
      paths += layers.ACCELERATOR_PATHS  # conv1: one input channel, float32
    if self.kind in TRAINING and self.model in models.BATCH_NORM_MODELS:
      paths += batch_norm.ACCELERATOR_PATHS  # evaluation normalizes with running averages
    return paths


# --- The abstract arguments.


@functools.cache
def _mesh():
  return sharding.make_mesh(WORKERS)


def _on_mesh(spec, shape, dtype):
  return jax.ShapeDtypeStruct(shape, dtype, sharding=NamedSharding(_mesh(), spec))


def _unplaced(tree):
  return jax.tree.map(lambda leaf: jax.ShapeDtypeStruct(leaf.shape, leaf.dtype), tree)


def _rows(tree):
  """One worker's rows of the stacked `tree`, as the threads runtime holds them."""
  return jax.tree.map(lambda leaf: jax.ShapeDtypeStruct((1, *leaf.shape[1:]), leaf.dtype), tree)


def _key():
  return jax.ShapeDtypeStruct((2,), jnp.uint32)


def _data(count: int, model: str, size: int, spec: P | None = None):
  """Images [count, size, H, W, C] and labels [count, size], laid out on the mesh with
  `spec` if it is given."""
  shapes = ((count, size, *IMAGE_SHAPES[model]), jnp.uint8), ((count, size), jnp.int32)
  if spec is None:
    return tuple(jax.ShapeDtypeStruct(*shape) for shape in shapes)
  return tuple(_on_mesh(spec, *shape) for shape in shapes)


@functools.cache
def _network(name: str, dtype: str) -> types.SimpleNamespace:
  """The model and the functions of it the programs take, as train.py builds them."""
  shape = IMAGE_SHAPES[name]
  config = config_with({"model": name, "dtype": dtype})
  # Normalisation constants change no program's structure.
  normalization = assembly.Normalization.stand_in(shape[-1])
  built = assembly.network(config, CLASSES, shape, normalization)
  return types.SimpleNamespace(
    loss_fn=built.loss_fn,
    apply_fn=built.apply_fn,
    init_params=built.init_params,
    params=jax.eval_shape(built.init_params, _key()),
  )


@functools.cache
def _rule(name: str) -> rules.Rule:
  momentum = 0.9 if rules.RULES[name].momentum == rules.Momentum.REQUIRED else 0.0
  hyper = rules.Hyper(WORKERS, 0.1, momentum=momentum, comm_period=2, moving_rate=0.2)
  return rules.make_rule(name, hyper)


def _tick(rule: rules.Rule):
  """The rule's tick inputs, abstract and replicated, as the trainer hands them."""
  inputs = rule.tick_inputs(ticks.Tick.empty(WORKERS))
  return jax.tree.map(lambda a: _on_mesh(P(), np.shape(a), jnp.asarray(a).dtype), inputs)


@functools.cache
def _state(rule: str, model: str, dtype: str):
  """The rule's abstract training state, laid out on the mesh by its init program."""
  program, args = _build(Program("init_state", model, dtype, rule))
  return jax.eval_shape(program, *args)


def _pipeline_runner():
  return pipeline.Pipeline(WORKERS, WORKERS, stage_steps=2)


@functools.cache
def _pipeline_state(model: str, dtype: str):
  program, args = _build(Program("pipeline_init", model, dtype))
  return jax.eval_shape(program, *args)


# --- The programs, built as the project builds them: (jitted program, abstract arguments).


def _train_step(program: Program):
  rule, network = _rule(program.rule), _network(program.model, program.dtype)
  state = _state(program.rule, program.model, program.dtype)
  jitted = steps.build_train_step(rule, network.loss_fn, _mesh(), state, BATCH, AUGMENT)
  return jitted, (state, *_data(WORKERS, program.model, PARTITION, P(AXIS)), _tick(rule))


def _batch_step(program: Program):
  rule, network = _rule(program.rule), _network(program.model, program.dtype)
  state = _state(program.rule, program.model, program.dtype)
  jitted = steps.build_batch_step(rule, network.loss_fn, _mesh(), state, AUGMENT)
  return jitted, (state, *_data(WORKERS, program.model, BATCH, P(AXIS)), _tick(rule))


def _init_state(program: Program):
  params = _network(program.model, program.dtype).params
  return steps.init_program(_rule(program.rule), params, _key(), _mesh()), (params, _key())


def _init_params(program: Program):
  return jax.jit(_network(program.model, program.dtype).init_params), (_key(),)


def _threads_local(program: Program):
  rule, network = _rule(program.rule), _network(program.model, program.dtype)
  state = _state(program.rule, program.model, program.dtype)
  local, _ = threads.programs(rule, network.loss_fn, BATCH, AUGMENT)
  jitted = threads.on_device(local, threads.LOCAL_SPECS, jax.devices()[0])
  worker = jax.ShapeDtypeStruct((1,), jnp.int32)
  images, labels = _data(1, program.model, PARTITION)
  workers = _rows(state.workers)
  args = (workers, _rows(state.worker_opt), worker, _unplaced(state.rng), images, labels)
  return jitted, (*args, worker, workers)


def _threads_master(program: Program):
  rule, network = _rule(program.rule), _network(program.model, program.dtype)
  state = _state(program.rule, program.model, program.dtype)
  _, master = threads.programs(rule, network.loss_fn, BATCH, AUGMENT)
  jitted = threads.on_device(master, threads.MASTER_SPECS, jax.devices()[0])
  fields = {f: _rows(state.worker_opt[f]) for f in rule.request_fields()}
  row = {"workers": _rows(state.workers), **fields, "worker_steps": _rows(state.worker_steps)}
  scalar = jax.ShapeDtypeStruct((), jnp.int32)
  center = _unplaced((state.center, state.center_opt))
  return jitted, (*center, row, _unplaced(state.rng), scalar, scalar, scalar, scalar)


def _pipeline_init(program: Program):
  arrays = [jax.ShapeDtypeStruct((WORKERS,), jnp.uint32)]
  arrays += [jax.ShapeDtypeStruct((WORKERS,), jnp.float32)] * len(pipeline.HYPER_FIELDS)
  init_params = _network(program.model, program.dtype).init_params
  return pipeline.init_program(_pipeline_runner(), init_params, arrays, _mesh()), arrays


def _pipeline_step(program: Program):
  loss_fn = _network(program.model, program.dtype).loss_fn
  state = _pipeline_state(program.model, program.dtype)
  jitted = pipeline.build_step(_pipeline_runner(), loss_fn, _mesh(), state, BATCH, AUGMENT)
  return jitted, (state, *_data(WORKERS, program.model, PARTITION, P(AXIS)))


def _pipeline_move(program: Program):
  state = _pipeline_state(program.model, program.dtype)
  return pipeline.build_move(_pipeline_runner(), _mesh(), state), (state,)


def _evaluation_workers(program: Program):
  state = _state(program.rule, program.model, program.dtype)
  jitted, _ = evaluation.programs(_mesh(), _network(program.model, program.dtype).apply_fn)
  return jitted, (state.workers, *_data(WORKERS, program.model, BATCH, P()))


def _evaluation_center(program: Program):
  state = _state(program.rule, program.model, program.dtype)
  _, jitted = evaluation.programs(_mesh(), _network(program.model, program.dtype).apply_fn)
  return jitted, (state.center, *_data(WORKERS, program.model, BATCH, P(AXIS)))


def _center_with_stats_of(program: Program):
  state = _state(program.rule, program.model, program.dtype)
  return evaluation.center_with_stats_of, (state.center, state.workers)


def _consensus_distance(program: Program):
  state = _state(program.rule, program.model, program.dtype)
  return evaluation.consensus_distance, (state.workers, state.center)


def _fingerprint(program: Program):
  return checkpoint.fingerprint, (_state(program.rule, program.model, program.dtype),)


def _fingerprint_and_finite(program: Program):
  state = _state(program.rule, program.model, program.dtype)
  return checkpoint._fingerprint_and_finite, (state,)  # checked_fingerprint's


def _finite_slots(program: Program):
  state = _pipeline_state(program.model, program.dtype)
  return checkpoint.finite_slots, ((state.models, state.opt),)


BUILDERS = {
  "train_step": _train_step,
  "batch_step": _batch_step,
  "init_state": _init_state,
  "init_params": _init_params,
  "threads_local": _threads_local,
  "threads_master": _threads_master,
  "pipeline_init": _pipeline_init,
  "pipeline_step": _pipeline_step,
  "pipeline_move": _pipeline_move,
  "evaluation_workers": _evaluation_workers,
  "evaluation_center": _evaluation_center,
  "center_with_stats_of": _center_with_stats_of,
  "consensus_distance": _consensus_distance,
  "fingerprint": _fingerprint,
  "fingerprint_and_finite": _fingerprint_and_finite,
  "finite_slots": _finite_slots,
}


@functools.cache
def _build(program: Program):
  """The jitted program and its arguments, kept so that its lowerings share one trace."""
  return BUILDERS[program.kind](program)


def _lowered(program: Program, platforms: tuple[str, ...]) -> str:
  """The program exported for `platforms`, as text with its ops' locations."""
  jitted, args = _build(program)
  return jax.export.export(jitted, platforms=platforms)(*args).mlir_module()


def _named(text: str, name: str) -> bool:
  """Whether `text` names the function `name` (a call-stack frame or a named scope)."""
  return re.search(rf"\b{re.escape(name)}\b", text) is not None


def _lacking(text: str, name: str, passes: set[str]) -> str:
  """ "" if `text` has ops under `name` in each of `passes`, else the passes that have none."""
  missing = passes - _passes(text, name)
  return " and ".join(sorted(missing))


def _passes(text: str, name: str) -> set[str]:
  """The passes ("forward", "backward") with ops under the named scope `name`; an op of
  the backward pass has a transposition in its name."""
  names = re.findall(rf'loc\("([^"]*/{re.escape(name)}/[^"]*)"', text)
  return {"backward" if "transpose(" in op_name else "forward" for op_name in names}


# --- Which programs.

MODELS = [(model, dtype) for model in IMAGE_SHAPES for dtype in models.DTYPES]
PROGRAMS = [
  *[Program("train_step", rule=name) for name in rules.RULES],
  # The other networks' steps in each dtype, float32 under a synchronous rule and
  # bfloat16 under a parameter-server one: a network's code is the same under
  # every rule, and every rule's code is lowered with LeNet-5 above.
  *[
    Program("train_step", model, dtype, SYNC if dtype == "float32" else ASYNC)
    for model, dtype in MODELS
    if (model, dtype) != ("lenet5", "float32")  # above
  ],
  Program("batch_step", rule=ASYNC),  # its network's code is train_step's
  *[Program("init_state", rule=name) for name in rules.RULES],
  # In float32 only: the parameters are float32 whatever the dtype, and the forward
  # pass, the one part in the dtype, is dead code there.
  *[Program("init_params", model) for model in IMAGE_SHAPES],
  *[
    Program(kind, model, dtype, SYNC)
    for kind in ("evaluation_workers", "evaluation_center")
    for model, dtype in MODELS
  ],
  *[
    Program(kind, "resnet20", rule=SYNC) for kind in ("center_with_stats_of", "consensus_distance")
  ],
  *[
    Program(kind, rule=name)
    for kind in ("threads_local", "threads_master")
    for name in rules.names(parameter_server=True)
  ],
  *[Program(kind) for kind in ("pipeline_init", "pipeline_step", "pipeline_move", "finite_slots")],
  Program("pipeline_step", "resnet20"),
  *[Program(kind, rule=ASYNC) for kind in ("fingerprint", "fingerprint_and_finite")],
]


# The quick tier's share (-m "not e2e"): LeNet-5's float32 programs, for one
# synchronous and one parameter-server rule, less batch_step and pipeline_init, whose
# network code is train_step's and pipeline_step's; and ResNet-20's synchronous step
# (the BatchNorm paths). Every rule's and network's programs, a second or several
# each, run with the whole suite.
def _quick(program: Program) -> bool:
  if program == Program("train_step", "resnet20", "float32", SYNC):
    return True
  lenet5 = (program.model, program.dtype) == ("lenet5", "float32")
  repeated = program.kind in ("batch_step", "pipeline_init")
  return lenet5 and program.rule in ("", SYNC, ASYNC) and not repeated


def _marked(program: Program, *values):
  """`program` (and the test's other `values`) as a case, e2e unless `_quick`."""
  marks = [] if _quick(program) else [pytest.mark.e2e]
  return pytest.param(program, *values, id=str(program), marks=marks)


@pytest.mark.parametrize("program", [_marked(program) for program in PROGRAMS])
def test_lowered_for_gpus_and_tpus_a_program_takes_no_cpu_only_path(program):
  text = _lowered(program, ACCELERATORS)
  found = [name for name in CPU_ONLY_PATHS if _named(text, name)]
  if found:
    # Lowered for one platform at a time, to say which take them.
    taking = [p for p in ACCELERATORS if any(_named(_lowered(program, (p,)), n) for n in found)]
    pytest.fail(f"{program}, lowered for {' and '.join(taking)}, takes the CPU-only paths {found}")
  platforms = " and ".join(ACCELERATORS)
  passes = {"forward", "backward"} if program.kind in TRAINING else {"forward"}
  for name in program.accelerator_paths():
    missing = _lacking(text, name, passes)
    assert not missing, f"{program}, lowered for {platforms}, lacks {name} in its {missing} pass"


# Lowered for the CPU, where the paths below are taken: in these passes.
CPU_CONTROLS = [
  (
    Program("train_step", rule=SYNC),
    {"_shifted_conv": {"forward"}, "_materialize_on_cpu": {"forward"}},
  ),
  (
    Program("train_step", "resnet20", rule=ASYNC),
    {"_sums_by_product": {"forward", "backward"}, "_materialize_on_cpu": {"forward"}},
  ),
  (Program("threads_local", rule=ASYNC), {"_shifted_conv": {"forward"}}),
  (Program("pipeline_step", "resnet20"), {"_sums_by_product": {"forward", "backward"}}),
  (Program("evaluation_center", rule=SYNC), {"_shifted_conv": {"forward"}}),
]


@pytest.mark.parametrize(
  "program,expected",
  [_marked(program, expected) for program, expected in CPU_CONTROLS],
)
def test_lowered_for_the_cpu_a_program_takes_the_cpu_only_paths(program, expected):
  text = _lowered(program, ("cpu",))
  for name, passes in expected.items():
    assert name in CPU_ONLY_PATHS
    missing = _lacking(text, name, passes)
    assert not missing, f"{program}, lowered for cpu, lacks {name} in its {missing} pass"


def test_the_cpu_compiler_options_go_to_cpu_programs_only():
  assert any(name.startswith("xla_cpu") for name in compile_lib.options_for("cpu"))
  for platform in ("gpu", "cuda", "rocm", "tpu"):  # a device's platform, or a lowering's
    options = [name for name in compile_lib.options_for(platform) if name.startswith("xla_cpu")]
    assert not options, f"{platform} programs would be compiled with {options}"


# The GPUs' own path: the workers' local steps one call per worker (rules.spmd.map_workers).
GPU_ONLY_PATH = "map_unrolled"


@pytest.mark.parametrize("kind", ["train_step", "pipeline_step"])
def test_on_gpus_alone_the_workers_step_one_call_per_worker(kind):
  program = Program(kind, rule=SYNC if kind == "train_step" else "")
  # Ops under the loop's scope (its scan's body carries the scan's names, not the scope's).
  assert _passes(_lowered(program, ("cuda",)), GPU_ONLY_PATH), f"{program}, lowered for cuda"
  for platform in ("tpu", "cpu"):
    text = _lowered(program, (platform,))
    assert not _passes(text, GPU_ONLY_PATH), f"{program}, lowered for {platform}, loops"
