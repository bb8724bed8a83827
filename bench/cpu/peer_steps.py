"""The variants that bench/cpu/peers.py times, each built in a process of its own.

A variant's process builds one step (`jax_variant`, `torch_variant`), warms it
up, prints one JSON line, then answers commands read from its standard input
("run N", "split N", "peak", "exit") with one JSON line each (`worker_main`).
bench/cpu/profile_step.py builds the same steps to profile them.
"""

import importlib.util
import json
import os
import sys
import time

SHAPES = {"lenet5": (28, 28, 1), "resnet20": (32, 32, 3)}
LEARNING_RATE = 0.1
PARTITION = 1024  # resident training images per worker of sync_easgd


def _seconds(fn) -> float:
  start = time.perf_counter()
  fn()
  return time.perf_counter() - start


def jax_variant(spec, name, batch_size):
  import jax  # noqa: PLC0415 (the torch workers never import JAX)

  jax.config.update("jax_num_cpu_devices", spec.get("devices", 1))
  import jax.numpy as jnp  # noqa: PLC0415
  import numpy as np  # noqa: PLC0415
  import optax  # noqa: PLC0415
  from jax.sharding import NamedSharding  # noqa: PLC0415
  from jax.sharding import PartitionSpec as P  # noqa: PLC0415

  from easgd import models, rules, steps  # noqa: PLC0415
  from easgd.infra import sharding  # noqa: PLC0415
  from easgd.infra.compile import compile_program, options_for  # noqa: PLC0415
  from easgd.rules import AXIS, model_state  # noqa: PLC0415

  if spec["kind"] == "peak":
    n = 2048
    a = jax.random.normal(jax.random.PRNGKey(0), (n, n), jnp.float32)
    dot = jax.jit(jnp.dot)
    dot(a, a).block_until_ready()

    def peak():
      best = min(_seconds(lambda: dot(a, a).block_until_ready()) for _ in range(10))
      return {"flops_per_second": 2 * n**3 / best}

    return {"peak": peak}

  model = models.get_model(name, 10)
  shape = SHAPES[name]
  devices = spec["devices"]
  mesh = sharding.make_mesh(devices)

  def init_params(key):  # as train.py builds and compiles it: one program
    return model_state.model_tree(model.init(key, jnp.zeros((1, *shape))))

  tree = jax.jit(init_params)(jax.random.PRNGKey(0))
  loss_fn = steps.make_loss_fn(model, lambda x: x.astype(jnp.float32) / 255.0)
  rng = np.random.default_rng(0)
  options = options_for("cpu") if spec.get("options", True) else {}
  state = {}

  if spec["kind"] == "plain":
    batch_sharding = NamedSharding(mesh, P(AXIS))
    replicated = NamedSharding(mesh, P())
    images = jax.device_put(rng.integers(0, 256, (batch_size, *shape), np.uint8), batch_sharding)
    labels = jax.device_put(rng.integers(0, 10, batch_size, np.int32), batch_sharding)
    state["tree"] = jax.device_put(tree, replicated)
    batch = {"image": images, "label": labels}

    def step(tree, images, labels):
      (_, aux), grads = jax.value_and_grad(loss_fn, has_aux=True)(
        tree, {"image": images, "label": labels}
      )
      updates = jax.tree.map(lambda g: -LEARNING_RATE * g, grads)
      return optax.apply_updates(tree, model_state.stats_step(updates, tree, aux))

    compiled = compile_program(
      jax.jit(step, donate_argnums=0).lower(state["tree"], images, labels), "cpu", options
    )
    # The batch is an argument, as in the step (a captured array would be a constant).
    forward = jax.jit(lambda tree, batch: loss_fn(tree, batch)[0])
    backward = jax.jit(jax.grad(lambda tree, batch: loss_fn(tree, batch)[0]))
    parts = {
      "forward": compile_program(forward.lower(state["tree"], batch), "cpu", options),
      "forward+backward": compile_program(backward.lower(state["tree"], batch), "cpu", options),
    }

    def run(count):
      for _ in range(count):
        state["tree"] = compiled(state["tree"], images, labels)
      jax.block_until_ready(state["tree"])

    def split(count):
      out = {}
      for part, fn in parts.items():
        jax.block_until_ready(fn(state["tree"], batch))
        out[part] = _seconds(
          lambda fn=fn: jax.block_until_ready([fn(state["tree"], batch) for _ in range(count)])
        )
      return out

  else:
    images = sharding.place(
      mesh, rng.integers(0, 256, (devices, PARTITION, *shape), np.uint8), P(AXIS)
    )
    labels = sharding.place(mesh, rng.integers(0, 10, (devices, PARTITION), np.int32), P(AXIS))
    hyper = rules.Hyper(devices, LEARNING_RATE, comm_period=4, moving_rate=0.9 / max(devices, 2))
    rule = rules.make_rule("sync_easgd", hyper)
    state["train"] = steps.init_state(rule, tree, jax.random.PRNGKey(1), mesh)
    program = steps.build_train_step(rule, loss_fn, mesh, state["train"], batch_size // devices)
    compiled = compile_program(program.lower(state["train"], images, labels, {}), "cpu", options)

    def run(count):
      for i in range(count):
        state["train"], metrics = compiled(state["train"], images, labels, {})
        if i % 8 == 7:  # bound the programs in flight (collectives on CPU devices)
          jax.block_until_ready(metrics)
      jax.block_until_ready(state["train"])

    split = None

  analysis = compiled.cost_analysis()
  analysis = analysis[0] if isinstance(analysis, (list, tuple)) else analysis
  # XLA's cost analysis counts one device's share of an SPMD program.
  flops = float(analysis.get("flops", 0.0)) * devices
  return {"run": run, "split": split, "compiled": compiled, "ready": {"flops_per_step": flops}}


def torch_variant(spec, name, batch_size):
  import torch  # noqa: PLC0415 (optional)

  torch.set_num_threads(spec["threads"])
  path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "torch_models.py")
  module_spec = importlib.util.spec_from_file_location("torch_models", path)
  torch_models = importlib.util.module_from_spec(module_spec)
  module_spec.loader.exec_module(torch_models)

  torch.manual_seed(0)
  net = torch_models.build(name)
  shape = SHAPES[name]
  images = torch.randint(0, 256, (batch_size, shape[2], shape[0], shape[1])).float() / 255.0
  labels = torch.randint(0, 10, (batch_size,))
  if spec["layout"] == "channels_last":
    net = net.to(memory_format=torch.channels_last)
    images = images.contiguous(memory_format=torch.channels_last)
  optimizer = torch.optim.SGD(net.parameters(), lr=LEARNING_RATE)
  loss_fn = torch.nn.CrossEntropyLoss()
  net.train()

  def run(count):
    for _ in range(count):
      optimizer.zero_grad(set_to_none=True)
      loss_fn(net(images), labels).backward()
      optimizer.step()

  def split(count):
    out = {}
    for part in ("forward", "forward+backward"):

      def go(part=part):
        for _ in range(count):
          if part == "forward":
            with torch.no_grad():
              loss_fn(net(images), labels)
          else:
            optimizer.zero_grad(set_to_none=True)
            loss_fn(net(images), labels).backward()

      go()
      out[part] = _seconds(go)
    return out

  return {"run": run, "split": split, "ready": {"version": torch.__version__}}


def worker_main(spec, name, batch_size):
  """One variant's process: build, warm up, then answer the parent's commands."""
  # The replies go to the process's original standard output; anything a
  # library prints goes to standard error instead, not into the protocol.
  replies = os.fdopen(os.dup(sys.stdout.fileno()), "w")
  os.dup2(sys.stderr.fileno(), sys.stdout.fileno())
  build = torch_variant if spec["kind"] == "torch" else jax_variant
  handlers = build(spec, name, batch_size)
  if "run" in handlers:
    handlers["run"](2)  # warm-up
  print(json.dumps(handlers.get("ready", {})), file=replies, flush=True)
  for line in sys.stdin:
    command, *count = line.split()
    if command == "exit":
      return
    count = int(count[0]) if count else 0
    if command == "run":
      reply = {"seconds": _seconds(lambda count=count: handlers["run"](count))}
    elif command == "split":
      reply = handlers["split"](count) if handlers.get("split") else {}
    else:
      reply = handlers[command]()
    print(json.dumps(reply), file=replies, flush=True)
