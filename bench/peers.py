"""This project beside PyTorch: the same network, batch and SGD step on this CPU.

    python bench/peers.py [--models lenet5,resnet20] [--batch_size 128] [--steps 30] [--rounds 3]
                          [--split]

For each network, in one run and in interleaved rounds (the machine is
shared and noisy), it times
  jax plain, XLA defaults
                  a minimal jit-compiled SGD step on one device (value_and_grad + update),
                  compiled as jax.jit compiles it,
  jax plain       the same compiled with the project's options (easgd/infra/compile.py),
  sync_easgd P=1  this project's compiled train step (batch drawn on device, tau = 4),
  sync_easgd P=2  the same with 2 workers of batch/2 on 2 CPU devices,
  torch           PyTorch's plain single-process step (zero_grad, forward,
                  backward, SGD step), if `torch` is importable,
and prints the median images/s, each one's ratio to torch, and the FLOP/s
each JAX step achieves (XLA's cost analysis of the compiled step times
steps/s) over the float32 matmul peak measured in the same run (a 2048^3
jnp.dot). LeNet-5 trains on 28x28x1 images, ResNet-20 on 32x32x3.

With --split it also times the forward pass alone and forward + backward
without the update, in both frameworks: where a step's time goes.

`pip install torch==2.13.0` takes PyTorch's CPU wheel; it is not among the
project's requirements.
"""

import argparse
import importlib.util
import os
import statistics
import time

import jax

jax.config.update("jax_num_cpu_devices", 2)

import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import optax  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

from easgd import models, rules, steps  # noqa: E402
from easgd.infra import sharding  # noqa: E402
from easgd.infra.compile import compile_program, options_for  # noqa: E402
from easgd.rules import AXIS, model_state  # noqa: E402

SHAPES = {"lenet5": (28, 28, 1), "resnet20": (32, 32, 3)}
LEARNING_RATE = 0.1
PARTITION = 1024  # resident training images per worker


def matmul_peak(n=2048, repeats=10) -> float:
  """float32 FLOP/s of a jit-compiled n x n x n jnp.dot (best of `repeats`)."""
  a = jax.random.normal(jax.random.PRNGKey(0), (n, n), jnp.float32)
  dot = jax.jit(jnp.dot)
  dot(a, a).block_until_ready()
  best = min(_seconds(lambda: dot(a, a).block_until_ready()) for _ in range(repeats))
  return 2 * n**3 / best


def _seconds(fn) -> float:
  start = time.perf_counter()
  fn()
  return time.perf_counter() - start


def flops_of(compiled) -> float:
  analysis = compiled.cost_analysis()
  analysis = analysis[0] if isinstance(analysis, (list, tuple)) else analysis
  return float(analysis.get("flops", 0.0))


class JaxPlain:
  """The baseline: one device, a batch already there, params <- params - eta*grad."""

  def __init__(self, name, batch_size, options):
    model = models.get_model(name, 10)
    shape = SHAPES[name]
    rng = np.random.default_rng(0)
    self.images = jnp.asarray(rng.integers(0, 256, (batch_size, *shape), np.uint8))
    self.labels = jnp.asarray(rng.integers(0, 10, batch_size, np.int32))
    tree = model_state.model_tree(model.init(jax.random.PRNGKey(0), jnp.zeros((1, *shape))))
    loss_fn = steps.make_loss_fn(model, lambda x: x.astype(jnp.float32) / 255.0)

    def step(tree, images, labels):
      (_, aux), grads = jax.value_and_grad(loss_fn, has_aux=True)(
        tree, {"image": images, "label": labels}
      )
      updates = jax.tree.map(lambda g: -LEARNING_RATE * g, grads)
      return optax.apply_updates(tree, model_state.stats_step(updates, tree, aux))

    lowered = jax.jit(step, donate_argnums=0).lower(tree, self.images, self.labels)
    self.compiled = compile_program(lowered, "cpu", options)
    self.state = tree
    self.images_per_step = batch_size
    self.devices = 1
    batch = {"image": self.images, "label": self.labels}
    forward = jax.jit(lambda tree: loss_fn(tree, batch)[0])
    backward = jax.jit(jax.grad(lambda tree: loss_fn(tree, batch)[0]))
    self.parts = {
      "forward": compile_program(forward.lower(tree), "cpu", options),
      "forward+backward": compile_program(backward.lower(tree), "cpu", options),
    }

  def time_part(self, part, count):
    fn = self.parts[part]
    jax.block_until_ready(fn(self.state))
    return _seconds(lambda: jax.block_until_ready([fn(self.state) for _ in range(count)]))

  def run(self, count):
    for _ in range(count):
      self.state = self.compiled(self.state, self.images, self.labels)
    jax.block_until_ready(self.state)


class SyncEASGD:
  """This project's sync_easgd train step, P workers on P CPU devices."""

  def __init__(self, name, batch_size, workers):
    model = models.get_model(name, 10)
    shape = SHAPES[name]
    mesh = sharding.make_mesh(workers)
    rng = np.random.default_rng(0)
    images = rng.integers(0, 256, (workers, PARTITION, *shape), np.uint8)
    labels = rng.integers(0, 10, (workers, PARTITION), np.int32)
    self.images = sharding.place(mesh, images, P(AXIS))
    self.labels = sharding.place(mesh, labels, P(AXIS))
    tree = model_state.model_tree(model.init(jax.random.PRNGKey(0), jnp.zeros((1, *shape))))
    hyper = rules.Hyper(workers, LEARNING_RATE, comm_period=4, moving_rate=0.9 / max(workers, 2))
    rule = rules.make_rule("sync_easgd", hyper)
    self.state = steps.init_state(rule, tree, jax.random.PRNGKey(1), mesh)
    loss_fn = steps.make_loss_fn(model, lambda x: x.astype(jnp.float32) / 255.0)
    per_worker = batch_size // workers
    step = steps.build_train_step(rule, loss_fn, mesh, self.state, per_worker)
    self.compiled = compile_program(step.lower(self.state, self.images, self.labels, {}), "cpu")
    self.images_per_step = per_worker * workers
    self.devices = workers

  def run(self, count):
    for i in range(count):
      self.state, metrics = self.compiled(self.state, self.images, self.labels, {})
      if i % 8 == 7:  # bound the programs in flight (collectives on CPU devices)
        jax.block_until_ready(metrics)
    jax.block_until_ready(self.state)


def _load_torch_models():
  """bench/torch_models.py (it imports torch), loaded by its path beside this file."""
  path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "torch_models.py")
  spec = importlib.util.spec_from_file_location("torch_models", path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


def torch_runner(name, batch_size):
  """PyTorch's plain step on the same network, or None without torch."""
  try:
    import torch  # noqa: PLC0415 (optional)
  except ImportError:
    return None
  torch_models = _load_torch_models()

  torch.manual_seed(0)
  net = torch_models.build(name)
  shape = SHAPES[name]
  images = torch.randint(0, 256, (batch_size, shape[2], shape[0], shape[1])).float() / 255.0
  labels = torch.randint(0, 10, (batch_size,))
  optimizer = torch.optim.SGD(net.parameters(), lr=LEARNING_RATE)
  loss_fn = torch.nn.CrossEntropyLoss()
  net.train()

  class Runner:
    images_per_step = batch_size
    compiled = None

    def run(self, count):
      for _ in range(count):
        optimizer.zero_grad(set_to_none=True)
        loss_fn(net(images), labels).backward()
        optimizer.step()

    def time_part(self, part, count):
      def go():
        for _ in range(count):
          if part == "forward":
            with torch.no_grad():
              loss_fn(net(images), labels)
          else:
            optimizer.zero_grad(set_to_none=True)
            loss_fn(net(images), labels).backward()

      go()
      return _seconds(go)

  return Runner()


def main():
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--models", default="lenet5,resnet20")
  parser.add_argument("--batch_size", type=int, default=128)
  parser.add_argument("--steps", type=int, default=30)
  parser.add_argument("--rounds", type=int, default=3)
  parser.add_argument("--split", action="store_true", help="time forward and backward apart")
  args = parser.parse_args()
  peak = matmul_peak()
  print(f"float32 matmul peak (2048^3 jnp.dot): {peak / 1e9:.1f} GFLOP/s")
  try:
    import torch  # noqa: PLC0415

    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads")
  except ImportError:
    print("torch is not installed: pip install torch==2.13.0 (CPU wheel) to compare")
  for name in args.models.split(","):
    runners = {
      "jax plain, XLA defaults": JaxPlain(name, args.batch_size, options={}),
      "jax plain": JaxPlain(name, args.batch_size, options_for("cpu")),
      "sync_easgd P=1": SyncEASGD(name, args.batch_size, 1),
      "sync_easgd P=2": SyncEASGD(name, args.batch_size, 2),
    }
    reference = torch_runner(name, args.batch_size)
    if reference is not None:
      runners["torch"] = reference
    rates = {label: [] for label in runners}
    for runner in runners.values():
      runner.run(2)  # warm-up
    for _ in range(args.rounds):
      for label, runner in runners.items():
        seconds = _seconds(lambda runner=runner: runner.run(args.steps))
        rates[label].append(args.steps * runner.images_per_step / seconds)
    print(
      f"\n{name}, batch {args.batch_size}, medians of {args.rounds} rounds of {args.steps} steps"
    )
    print(f"{'':24} {'images/s':>9} {'vs torch':>9} {'GFLOP/s':>8} {'of peak':>8}")
    torch_rate = statistics.median(rates["torch"]) if "torch" in rates else None
    for label, runner in runners.items():
      rate = statistics.median(rates[label])
      ratio = f"{rate / torch_rate:.2f}x" if torch_rate else "-"
      if runner.compiled is not None:
        # XLA's cost analysis counts one device's share of an SPMD program.
        achieved = flops_of(runner.compiled) * runner.devices * rate / runner.images_per_step
        flops = f"{achieved / 1e9:8.1f} {achieved / peak:8.1%}"
      else:
        flops = f"{'-':>8} {'-':>8}"
      print(f"{label:24} {rate:9.0f} {ratio:>9} {flops}")
    if args.split:
      print("ms a step:               forward  forward+backward  whole step")
      for label in ("jax plain, XLA defaults", "jax plain", "torch"):
        if label not in runners:
          continue
        runner = runners[label]
        parts = [runner.time_part(part, args.steps) for part in ("forward", "forward+backward")]
        whole = 1e3 * runner.images_per_step / statistics.median(rates[label])
        cells = "".join(f"{1e3 * p / args.steps:16.2f}" for p in parts)
        print(f"{label:24}{cells}{whole:12.2f}")


if __name__ == "__main__":
  main()
