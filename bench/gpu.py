"""Images/s and model FLOP utilisation on one GPU, beside a plain Flax/optax step.

    python bench/gpu.py [--models lenet5,resnet20,resnet50] [--dtypes float32,bfloat16]
                        [--batches lenet5=1024:8192,resnet20=512:2048,resnet50=256]
                        [--workers 4] [--steps 20] [--rounds 5] [--json FILE]

For each model, computation dtype and batch B (images a step), three programs
train on the same device, timed in interleaved rounds (the median round is
reported):
  flax        a plain Flax/optax training step of the same network: SGD with
              momentum 0.9 on a batch of B images already on the device;
  sync_sgd    this project's step with one worker of batch B (P = 1): the plain
              step, drawing its batch from the data on the device as train.py does;
  sync_easgd  this project's Sync EASGD step with P workers of batch B/P each on
              the one device (tau = 4, the same SGD inside), as the default config
              runs on one GPU.
All three run with XLA:GPU's deterministic ops, as train.py sets them
(easgd/infra/platform.py). Each row gives images/s, the ratio to `flax`'s,
the model FLOPs of a step (XLA's cost analysis of the plain step, lowered for
the host's CPU: XLA:GPU's leaves out what it hands to cuDNN), the model
FLOP utilisation (those FLOPs a second over the
device's peak, stated below; float32 matrix products and convolutions run as
TF32 on the GPU by default, so TF32's peak is float32's), the peak memory
from XLA's memory analysis, and the step's FLOPs over that peak beside the
measured step time: the planner (python -m easgd.plan) predicts a local step
so, as its FLOPs over `device.flops`, which the ImageNet configs set to the
device's bfloat16 peak. `--nondeterministic` leaves XLA:GPU's deterministic
ops out, to measure what they cost.

Goals (issue "Where researchers run it"): sync_easgd at >= 0.95x flax; ResNet-50
in bfloat16 at >= 80% of the best published single-GPU training throughput
(bench/README.md cites it). Without a GPU the script refuses in one line.
"""

import json
import statistics
import sys
import time

import jax

from easgd.arguments import ArgumentParser, fail, integer, output_file
from easgd.infra import platform

MODELS = ("lenet5", "resnet20", "resnet50")
DTYPES = ("float32", "bfloat16")
# The inputs each network is built for: (side, channels, classes).
INPUTS = {"lenet5": (28, 1, 10), "resnet20": (32, 3, 10), "resnet50": (224, 3, 1000)}
DEFAULT_BATCHES = "lenet5=1024:8192,resnet20=512:2048,resnet50=256"
# Dense peaks by the vendors' datasheets (FLOP/s), by a name in jax's device_kind:
# (bfloat16 tensor cores, TF32 tensor cores, which float32 products use by default).
PEAKS = {
  "H200": (989.4e12, 494.7e12),
  "H100": (989.4e12, 494.7e12),
  "A100": (312e12, 156e12),
}
TAU = 4
MOMENTUM = 0.9
LEARNING_RATE = 0.01


def require_gpu() -> jax.Device:
  """The first GPU, or one line and exit 2."""
  try:
    devices = jax.devices()
  except RuntimeError as error:
    fail(f"bench/gpu.py measures a GPU; JAX found no devices ({error})")
  if devices[0].platform != "gpu":
    fail(
      f"bench/gpu.py measures a GPU; JAX finds only {devices[0].platform} devices here "
      '(install the CUDA build: pip install -e ".[cuda12]", README)'
    )
  return devices[0]


def peak_flops(device: jax.Device, dtype: str) -> float | None:
  """The device's dense peak for `dtype`'s products, if its kind is known."""
  for name, (bfloat16, tf32) in PEAKS.items():
    if name in device.device_kind:
      return bfloat16 if dtype == "bfloat16" else tf32
  return None


def parse_batches(text: str) -> dict[str, list[int]]:
  """'lenet5=1024:8192,resnet50=256' -> {model: [batches]}."""
  batches = {}
  for part in text.split(","):
    model, _, sizes = part.partition("=")
    if model not in MODELS or not sizes:
      fail(f"--batches {text!r}: each entry is MODEL=B[:B...] with MODEL one of {MODELS}")
    try:
      batches[model] = [int(size) for size in sizes.split(":")]
    except ValueError:
      fail(f"--batches {text!r}: batch sizes are integers")
    if any(size < 1 for size in batches[model]):
      fail(f"--batches {text!r}: batch sizes are >= 1")
  return batches


def model_flops(step, state, images, labels) -> float:
  """FLOPs of one plain training step, by XLA's cost analysis of it lowered for the CPU.

  XLA:GPU's own analysis leaves out what it hands to cuDNN (every convolution),
  or answers nothing: the step is lowered, not run, for the host's CPU device.
  The count is the CPU program's, whose few CPU-only paths (models/layers.py,
  models/batch_norm.py) differ from the GPU's by well under 1% of the FLOPs.
  """
  cpu = jax.devices("cpu")[0]
  on_cpu = jax.device_put((state, images, labels), cpu)
  analysis = jax.jit(step).lower(*on_cpu).cost_analysis()
  if isinstance(analysis, list):  # one dict per program in older jaxlibs
    analysis = analysis[0]
  return float(analysis["flops"])


def peak_bytes(compiled) -> int:
  from easgd.plan import compiled_bytes  # noqa: PLC0415 (the planner's own measure)

  return compiled_bytes(compiled)


class Program:
  """A compiled step with its state and arguments: run(steps) -> seconds."""

  def __init__(self, label, compiled, state, args, images_per_step):
    self.label, self.compiled, self.state, self.args = label, compiled, state, args
    self.images_per_step = images_per_step
    self.bytes = peak_bytes(compiled)

  def run(self, steps: int) -> float:
    self.state, out = self.compiled(self.state, *self.args)  # a step outside the timing
    jax.block_until_ready(out)
    start = time.perf_counter()
    for _ in range(steps):
      self.state, out = self.compiled(self.state, *self.args)
    jax.block_until_ready((self.state, out))
    return time.perf_counter() - start


def flax_program(model, normalize, images, labels, rng) -> Program:
  """The plain Flax/optax step: nothing of this project but the network."""
  import jax.numpy as jnp  # noqa: PLC0415
  import optax  # noqa: PLC0415

  variables = model.init(rng, jnp.zeros((1, *images.shape[1:])))
  optimizer = optax.sgd(LEARNING_RATE, momentum=MOMENTUM)
  has_stats = "batch_stats" in variables

  def loss_of(params, stats, images, labels):
    inputs = normalize(images)
    if has_stats:
      logits, updated = model.apply(
        {"params": params, "batch_stats": stats}, inputs, train=True, mutable=["batch_stats"]
      )
      stats = updated["batch_stats"]
    else:
      logits = model.apply({"params": params}, inputs, train=True)
    loss = optax.softmax_cross_entropy_with_integer_labels(logits.astype(jnp.float32), labels)
    return loss.mean(), stats

  def step(state, images, labels):
    params, stats, opt_state = state
    (loss, stats), grads = jax.value_and_grad(loss_of, has_aux=True)(params, stats, images, labels)
    updates, opt_state = optimizer.update(grads, opt_state, params)
    return (optax.apply_updates(params, updates), stats, opt_state), loss

  params = variables["params"]
  state = (params, variables.get("batch_stats", {}), optimizer.init(params))
  compiled = jax.jit(step, donate_argnums=0).lower(state, images, labels).compile()
  program = Program("flax", compiled, state, (images, labels), images.shape[0])
  program.flops_per_image = model_flops(step, state, images, labels) / images.shape[0]
  return program


def project_program(name, workers, batch, model, normalize, dataset, rng) -> Program:
  """This project's step of rule `name`: `workers` workers of `batch` images on one device,
  compiled as train.py compiles it."""
  import jax.numpy as jnp  # noqa: PLC0415
  from jax.sharding import PartitionSpec as P  # noqa: PLC0415

  from easgd import rules, steps  # noqa: PLC0415
  from easgd.infra import sharding  # noqa: PLC0415
  from easgd.infra.compile import compile_program  # noqa: PLC0415
  from easgd.rules import AXIS, model_state  # noqa: PLC0415
  from easgd.sim import ticks  # noqa: PLC0415

  images, labels = dataset
  mesh = sharding.make_mesh(1)
  hyper = rules.Hyper(
    workers, LEARNING_RATE, momentum=MOMENTUM, comm_period=TAU, moving_rate=0.9 / workers
  )
  rule = rules.make_rule(name, hyper)
  params = model_state.model_tree(model.init(rng, jnp.zeros((1, *images.shape[1:]))))
  state = steps.init_state(rule, params, rng, mesh)
  # Each worker's partition holds its batch: [P, batch, ...] on the device.
  partitions = (
    sharding.place(mesh, images.reshape(workers, batch, *images.shape[1:]), P(AXIS)),
    sharding.place(mesh, labels.reshape(workers, batch), P(AXIS)),
  )
  loss_fn = steps.make_loss_fn(model, normalize)
  program = steps.build_train_step(rule, loss_fn, mesh, state, batch)
  tick = rule.tick_inputs(ticks.Tick.empty(workers))
  compiled = compile_program(program.lower(state, *partitions, tick), mesh.devices.flat[0].platform)
  label = name if workers == 1 else f"{name} P={workers}"
  return Program(label, compiled, state, (*partitions, tick), workers * batch)


def measure(model_name, dtype, batch, workers, steps_count, rounds, device):
  """The rows of one (model, dtype, batch)."""
  import jax.numpy as jnp  # noqa: PLC0415
  import numpy as np  # noqa: PLC0415

  from easgd import models  # noqa: PLC0415

  side, channels, classes = INPUTS[model_name]
  model = models.get_model(model_name, classes, dtype)

  def normalize(images):
    return images.astype(jnp.float32) / 255.0 - 0.5

  host = np.random.default_rng(0)
  images = host.integers(0, 256, (batch, side, side, channels), dtype=np.uint8)
  labels = host.integers(0, classes, (batch,), dtype=np.int32)
  rng = jax.random.PRNGKey(0)
  on_device = jax.device_put((images, labels), device)
  programs = [flax_program(model, normalize, *on_device, rng)]
  programs.append(project_program("sync_sgd", 1, batch, model, normalize, on_device, rng))
  if batch % workers == 0:
    per_worker = batch // workers
    programs.append(
      project_program("sync_easgd", workers, per_worker, model, normalize, on_device, rng)
    )
  seconds = {program.label: [] for program in programs}
  for _ in range(rounds):
    for program in programs:
      seconds[program.label].append(program.run(steps_count))
  peak = peak_flops(device, dtype)
  # Model FLOPs: those of the plain step, per image, for every program alike.
  per_image = programs[0].flops_per_image
  rows = []
  for program in programs:
    step_time = statistics.median(seconds[program.label]) / steps_count
    rows.append(
      {
        "model": model_name,
        "dtype": dtype,
        "batch": batch,
        "program": program.label,
        "images_per_sec": program.images_per_step / step_time,
        "step_ms": 1e3 * step_time,
        "gflop": per_image * program.images_per_step / 1e9,
        "mfu": None if peak is None else per_image * program.images_per_step / step_time / peak,
        "memory_gib": program.bytes / 2**30,
        "flops_over_peak_ms": None
        if peak is None
        else 1e3 * per_image * program.images_per_step / peak,
      }
    )
  baseline = rows[0]["images_per_sec"]
  for row in rows:
    row["vs_flax"] = row["images_per_sec"] / baseline
  return rows


def print_table(rows, device) -> None:
  now = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
  print(f"{device.device_kind}, jax {jax.__version__}, {now}")
  header = (
    f"{'model':<9} {'dtype':<9} {'batch':>6} {'program':<14} {'images/s':>10} {'vs flax':>8} "
    f"{'step ms':>8} {'GFLOP':>8} {'MFU':>6} {'GiB':>6} {'FLOPs/peak ms':>13}"
  )
  print(header)
  for row in rows:
    mfu = "-" if row["mfu"] is None else f"{100 * row['mfu']:.1f}%"
    bound = "-" if row["flops_over_peak_ms"] is None else f"{row['flops_over_peak_ms']:.2f}"
    print(
      f"{row['model']:<9} {row['dtype']:<9} {row['batch']:>6} {row['program']:<14} "
      f"{row['images_per_sec']:>10.0f} {row['vs_flax']:>7.2f}x {row['step_ms']:>8.2f} "
      f"{row['gflop']:>8.1f} {mfu:>6} {row['memory_gib']:>6.2f} {bound:>13}"
    )


def main():
  parser = ArgumentParser(prog="bench/gpu.py", description=__doc__.splitlines()[0])
  parser.add_argument("--models", default=",".join(MODELS))
  parser.add_argument("--dtypes", default=",".join(DTYPES))
  parser.add_argument("--batches", default=DEFAULT_BATCHES)
  parser.add_argument("--workers", type=integer(1), default=4)
  parser.add_argument("--steps", type=integer(1), default=20)
  parser.add_argument("--rounds", type=integer(1), default=5)
  parser.add_argument("--json", type=output_file("--json"), default=None)
  parser.add_argument(
    "--nondeterministic",
    action="store_true",
    help="without XLA:GPU's deterministic ops (train.py sets them): what they cost",
  )
  args = parser.parse_args()
  chosen = args.models.split(",")
  dtypes = args.dtypes.split(",")
  if not set(chosen) <= set(MODELS):
    fail(f"--models {args.models!r}: valid: {', '.join(MODELS)}")
  if not set(dtypes) <= set(DTYPES):
    fail(f"--dtypes {args.dtypes!r}: valid: {', '.join(DTYPES)}")
  batches = parse_batches(args.batches)
  if not args.nondeterministic:
    platform.make_gpu_deterministic()  # as train.py runs; before JAX starts its backends
  device = require_gpu()
  rows = []
  for model_name in chosen:
    for dtype in dtypes:
      for batch in batches.get(model_name, []):
        new = measure(model_name, dtype, batch, args.workers, args.steps, args.rounds, device)
        rows += new
        print_table(new, device)
        sys.stdout.flush()
  print()
  print_table(rows, device)
  if args.json:
    with open(args.json, "w") as file:
      json.dump(
        {"device": device.device_kind, "jax": jax.__version__, "rows": rows}, file, indent=1
      )


if __name__ == "__main__":
  main()
