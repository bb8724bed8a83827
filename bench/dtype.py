"""LeNet-5's and ResNet-20's training steps computing in float32 and in bfloat16 (config.dtype).

    python bench/dtype.py [--models lenet5,resnet20] [--rounds 5] [--batch_size 128]

Each is a plain SGD step (float32 parameters, the model computing in the
dtype, the loss in float32), compiled with the project's options and timed
in interleaved rounds in one process; it prints the median images/s of each
and bfloat16's ratio to float32. bfloat16 is meant for accelerators, whose
matrix units take it at several times the float32 rate; a CPU without such
units converts it around every operation, so expect a ratio below 1 here.
"""

import jax
import jax.numpy as jnp
import numpy as np
from peer_steps import SHAPES  # bench/peer_steps.py, beside this file
from peers import model_names
from variants import print_rates, time_interleaved  # bench/variants.py

from easgd import arguments, models, steps
from easgd.infra.compile import compile_program
from easgd.rules import model_state

STEPS = {"lenet5": 30, "resnet20": 3}
DTYPES = ("float32", "bfloat16")


def compiled_step(name: str, dtype: str, batch_size: int):
  """The compiled plain SGD step of network `name` computing in `dtype`, and its arguments."""
  model = models.get_model(name, 10, dtype)
  shape = SHAPES[name]
  rng = np.random.default_rng(0)
  images = jnp.asarray(rng.integers(0, 256, (batch_size, *shape), np.uint8))
  labels = jnp.asarray(rng.integers(0, 10, batch_size, np.int32))
  tree = model_state.model_tree(jax.jit(model.init)(jax.random.PRNGKey(0), jnp.zeros((1, *shape))))
  loss_fn = steps.make_loss_fn(model, lambda x: x.astype(jnp.float32) / 255.0)

  def step(tree, images, labels):
    (_, aux), grads = jax.value_and_grad(loss_fn, has_aux=True)(
      tree, {"image": images, "label": labels}
    )
    updates = jax.tree.map(lambda g: -0.1 * g, grads)
    return jax.tree.map(jnp.add, tree, model_state.stats_step(updates, tree, aux))

  lowered = jax.jit(step, donate_argnums=0).lower(tree, images, labels)
  return compile_program(lowered, jax.devices()[0].platform), tree, images, labels


def main():
  parser = arguments.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--models", default="lenet5,resnet20", type=model_names)
  parser.add_argument("--rounds", type=arguments.integer(1), default=5)
  parser.add_argument("--batch_size", type=arguments.integer(1), default=128)
  args = parser.parse_args()
  print(f"device: {jax.devices()[0].device_kind}")
  for name in args.models:
    programs = {dtype: compiled_step(name, dtype, args.batch_size) for dtype in DTYPES}
    rates = time_interleaved(programs, STEPS[name], args.batch_size, args.rounds)
    print(
      f"\n{name}, batch {args.batch_size}: medians of {args.rounds} rounds of {STEPS[name]} steps"
    )
    print_rates("dtype", rates, "float32")


if __name__ == "__main__":
  main()
