"""Images/s of the rules on 8 virtual devices beside a plain single-device baseline.

    python bench/throughput.py [--workers 8] [--batch_size 32] [--steps 100] [--rounds 3]
        [--rules sync_easgd,async_easgd,...]

The baseline is a minimal jit-compiled LeNet-5 SGD step on one device with
the same images per step (workers * batch_size) already on the device. The
inner optimizer's cost is the ratio of sync_easgd with optax's SGD as its
inner step to the same rule with the local step written out by hand
(u = -eta*g, as before the inner optimizer was optax's), tau = 4. The
rules measured are every registered rule that does not require momentum
(`measured_rules()`, from the rules' declarations). They run as train.py runs
them: each step asks the rule's clock (the default config's timing model)
for its tick, and a rule's images are the local steps its workers really
took (under the parameter-server rules slow workers sit some ticks out). All
variants are timed in the same run, in interleaved rounds (the machine is
shared and noisy); the median round is reported with its ratio to the
baseline's median, and async_easgd's to sync_easgd's with the same tau.
--rules measures some of them; sync_easgd and async_easgd, the ratios' terms,
are always measured.
"""

import statistics
import time

import jax

jax.config.update("jax_num_cpu_devices", 8)

import jax.numpy as jnp  # noqa: E402
import optax  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

from easgd import assembly, rules, steps  # noqa: E402
from easgd.arguments import ArgumentParser, integer, some_of  # noqa: E402
from easgd.configs import default  # noqa: E402
from easgd.data import batches, datasets  # noqa: E402
from easgd.infra import sharding  # noqa: E402
from easgd.infra.compile import compile_program  # noqa: E402
from easgd.rules import AXIS  # noqa: E402
from easgd.sim import ticks, timing  # noqa: E402
from easgd.sim.clocks import Policy  # noqa: E402
from easgd.train import loop  # noqa: E402

TAU = 4


def measured_rules() -> list[tuple[str, int]]:
  """(rule, tau) of every variant, tau 0 where it does not apply: every registered rule
  that does not require momentum (a velocity adds one elementwise update to a step), those
  with a center at tau = TAU and the synchronous elastic ones at tau = 1 too."""
  result = []
  for name, rule in rules.RULES.items():
    if rule.momentum == rules.Momentum.REQUIRED:
      continue
    if rule.elastic and not rule.parameter_server():
      result.append((name, 1))
    result.append((name, TAU if rule.elastic or rule.pulls else 0))
  return result


def hand_written_sgd(learning_rate: float) -> optax.GradientTransformation:
  """The local step as it was written before the inner optimizer was optax's: u = -eta*g,
  no state. The optax inner step is measured against it."""

  def update(grads, state, params=None):
    del params
    return jax.tree.map(lambda g: -learning_rate * g, grads), state

  return optax.GradientTransformation(lambda params: (), update)


def timed(step_fn, state, next_args, num_steps):
  """(seconds, images, state) for `num_steps` steps, blocking every 8 to bound queued programs.

  next_args() -> (the step's arguments after the state, the images it trains on).
  """
  state, out = step_fn(state, *next_args()[0])  # warm-up (compiled already)
  jax.block_until_ready(out)
  images = 0
  start = time.perf_counter()
  for i in range(num_steps):
    args, step_images = next_args()
    state, out = step_fn(state, *args)
    images += step_images
    if i % loop.MAX_IN_FLIGHT == 0:
      jax.block_until_ready(out)
  jax.block_until_ready(out)
  return time.perf_counter() - start, images, state


def main():
  parser = ArgumentParser(prog="bench/throughput.py", description=__doc__.splitlines()[0])
  parser.add_argument("--workers", type=integer(1), default=8)
  parser.add_argument("--batch_size", type=integer(1), default=32)
  parser.add_argument("--steps", type=integer(1), default=100)
  parser.add_argument("--rounds", type=integer(1), default=3)
  names = tuple(dict.fromkeys(name for name, _ in measured_rules()))
  parser.add_argument("--rules", type=some_of(names), default=names)
  args = parser.parse_args()
  if args.workers % 8:  # the 8 virtual devices, each with as many workers
    parser.error(f"--workers={args.workers} is invalid: must be a multiple of 8 (the devices)")

  dataset = datasets.load_dataset("mnist5k")
  # LeNet-5 in float32, as train.py builds it.
  config = default.get_config()
  config.model, config.dtype = "lenet5", "float32"
  built = assembly.for_dataset(config, dataset)
  # One program, as train.py compiles it (and shares through the compilation cache).
  params, loss_fn = jax.jit(built.init_params)(jax.random.PRNGKey(0)), built.loss_fn
  images_per_step = args.workers * args.batch_size
  platform = jax.devices()[0].platform

  # Baseline: one device, one plain SGD step per dispatch on a resident batch.
  optimizer = optax.sgd(0.05)

  def baseline_step(state, images, labels):
    params, opt_state = state
    (loss, _), grads = jax.value_and_grad(loss_fn, has_aux=True)(
      params, {"image": images, "label": labels}
    )
    updates, opt_state = optimizer.update(grads, opt_state, params)
    return (optax.apply_updates(params, updates), opt_state), loss

  baseline_images = jnp.asarray(dataset.train_images[:images_per_step])
  baseline_labels = jnp.asarray(dataset.train_labels[:images_per_step])
  baseline_state = (jax.tree.map(jnp.copy, params), optimizer.init(params))
  # Every program is compiled as train.py compiles its step (easgd/infra/compile.py).
  baseline = jax.jit(baseline_step).lower(baseline_state, baseline_images, baseline_labels)
  variants = {
    "baseline (1 device, plain jit)": (
      compile_program(baseline, platform),
      baseline_state,
      lambda: ((baseline_images, baseline_labels), images_per_step),
    )
  }

  cluster = timing.Cluster.from_config(config.cluster)
  model_bytes = sum(leaf.size * leaf.dtype.itemsize for leaf in jax.tree.leaves(params))
  mesh = sharding.make_mesh(8)
  partitions = batches.partition(dataset.train_images, dataset.train_labels, args.workers, 0)
  images, labels = (sharding.place(mesh, array, P(AXIS)) for array in partitions)
  plain = rules.plain(policy=None, elastic=True)
  measured = {*args.rules, plain, rules.plain(policy=Policy.FCFS, elastic=True)}
  for name, tau, hand_written in [(n, t, False) for n, t in measured_rules() if n in measured] + [
    (plain, TAU, True)
  ]:
    # A rule without a period (tau 0 here) pushes or pulls every step: period 1.
    hyper = rules.Hyper(
      args.workers, 0.05, comm_period=tau or 1, moving_rate=0.9 / args.workers, n_sync=4
    )
    rule = rules.make_rule(name, hyper)
    if hand_written:
      rule.inner = hand_written_sgd(hyper.learning_rate)
    state = steps.init_state(rule, params, jax.random.PRNGKey(1), mesh)
    step_fn = steps.build_train_step(rule, loss_fn, mesh, state, args.batch_size)
    empty = rule.tick_inputs(ticks.Tick.empty(args.workers))
    step_fn = compile_program(step_fn.lower(state, images, labels, empty), platform)
    clock = rule.make_clock(cluster, model_bytes, seed=0)

    def next_args(rule=rule, clock=clock):
      tick = clock.next_tick()
      return (images, labels, rule.tick_inputs(tick)), int(tick.local.sum()) * args.batch_size

    label = f"{name} tau={tau}" if tau else name
    variants[label + (" hand-written SGD" if hand_written else "")] = (step_fn, state, next_args)

  seconds = {label: [] for label in variants}
  counts = {label: [] for label in variants}
  for _ in range(args.rounds):
    for label, (step_fn, state, next_args) in variants.items():
      elapsed, count, new_state = timed(step_fn, state, next_args, args.steps)
      variants[label] = (step_fn, new_state, next_args)
      seconds[label].append(elapsed)
      counts[label].append(count)

  rates = {
    label: statistics.median(c / s for c, s in zip(counts[label], seconds[label], strict=True))
    for label in variants
  }
  baseline = next(iter(rates.values()))
  print(
    f"LeNet-5, mnist5k, {args.workers} workers x batch {args.batch_size} "
    f"({images_per_step} images a step when all step), 8 {jax.devices()[0].platform} devices, "
    f"{args.steps} steps x {args.rounds} rounds (median)"
  )
  print(f"{'variant':<40} {'images/s':>10} {'vs baseline':>12}")
  for label, rate in rates.items():
    print(f"{label:<40} {rate:>10.0f} {rate / baseline:>11.2f}x")
  sync = rules.plain(policy=None, elastic=True)
  fcfs = rules.plain(policy=Policy.FCFS, elastic=True)
  ratio = rates[f"{fcfs} tau={TAU}"] / rates[f"{sync} tau={TAU}"]
  print(f"{fcfs} / {sync} (tau={TAU}): {ratio:.2f}x (goal: >= 0.7x)")
  optax_step = rates[f"{sync} tau={TAU}"] / rates[f"{sync} tau={TAU} hand-written SGD"]
  print(
    f"{sync} (tau={TAU}), optax inner SGD / hand-written SGD: {optax_step:.3f}x (goal: >= 0.95x)"
  )


if __name__ == "__main__":
  main()
