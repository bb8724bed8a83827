"""Compressed exchanges (`config.outer.exchange_dtype`): what a worker sends, and its size.

At an exchange a worker sends a model-sized difference: the elastic
difference d_i = x_i - x~ (or the master's e), the pseudo-gradient x~ - x_i,
or the accumulated gradient G_i of the parameter-server SGD rules. With a
compressed dtype the receiver gets Q(v) in place of v, for each tensor v:

  float32   Q(v) = v                                       4 bytes an entry
  bfloat16  Q(v) = v rounded to bfloat16, to nearest even   2 bytes an entry
  int8      s = max|v| / 127 (one float32 scale per tensor) 1 byte an entry + 4
            Q(v) = s * q,  q = floor(v/s + U),  U ~ Uniform[0, 1) per entry
  int4      s = max|v| / 7, the same rounding to q in [-7, 7]     half a byte an entry + 4
  int2      s = max|v|, the same rounding to q in {-1, 0, 1}      a quarter byte an entry + 4
            (three levels in two bits; int4 and int2: the low-bit outer exchanges of
            the center family and the streaming rules, `Rule.exchange_dtypes`)

int8, int4 and int2 round stochastically: E[Q(v)] = v, so the errors of the P
workers and of successive exchanges average out instead of adding up in one
direction. Its random numbers come from (run key, step, worker, tensor), so a
run's bits are still a function of its seed. Everything else (the center, the
all-reduce's sum, the replies) stays float32; `sizes` counts both ways.

Error feedback (`outer.error_feedback`; Seide et al., "1-bit stochastic gradient
descent and its application to data-parallel distributed training of speech
DNNs", Interspeech 2014; Karimireddy et al., "Error Feedback Fixes SignSGD and
other Gradient Compression Schemes", ICML 2019) keeps what a worker's message
lost to Q and adds it to the worker's next message: with rho_i its residual (0 at
the start), a worker whose message is v sends

  Q(v + rho_i),   then   rho_i <- (v + rho_i) - Q(v + rho_i)

so that the sum of what it sent over its exchanges differs from the sum of its
messages by the last residual alone, however coarse Q is. With float32, Q is
the identity and rho_i stays 0 (validation refuses the pair: nothing to feed
back). The residual is each worker's, in its state (`worker_opt["residual"]`),
checkpointed with it; it adds nothing to the bytes sent.
"""

import jax
import jax.numpy as jnp
import numpy as np

from easgd.declare import FLAG, Field, Shapes, one_of
from easgd.rules import model_state

DTYPES = ("float32", "bfloat16", "int8", "int4", "int2")
# What every rule can send; int4 and int2 only the rules that declare them.
COMMON_DTYPES = DTYPES[:3]

EXCHANGE_DTYPE = Field(
  "outer.exchange_dtype",
  "float32",
  one_of(DTYPES),
  "what a worker's exchange message is sent as: float32, bfloat16, int8, int4 or int2 (per-"
  "tensor scale, stochastic rounding; easgd/rules/exchange.py; int4 and int2: the center "
  "family and the streaming rules)",
  Shapes.IF_READ,
  formerly=("exchange_dtype",),
  setting="exchange_dtype",
)
ERROR_FEEDBACK = Field(
  "outer.error_feedback",
  False,
  FLAG,
  "each worker adds what compression dropped from its last message to its next one "
  "(rho <- (v + rho) - Q(v + rho)); a compressed exchange_dtype of the center family or the "
  "streaming rules",
  Shapes.IF_READ,
  earlier=False,
  setting="error_feedback",
  exclusive="error feedback",
)
ENTRY_BITS = {"float32": 32, "bfloat16": 16, "int8": 8, "int4": 4, "int2": 2}
SCALE_BYTES = {"float32": 0, "bfloat16": 0, "int8": 4, "int4": 4, "int2": 4}
# The largest integer a stochastically rounded entry takes: q in [-LEVELS, LEVELS].
LEVELS = {"int8": 127, "int4": 7, "int2": 1}


def message_bytes(tree, dtype: str) -> int:
  """Bytes of one exchange message of `tree` (a model, or its shapes) sent as `dtype`
  (int4 entries packed two to a byte, int2 four)."""
  return sum(
    -(-int(np.prod(leaf.shape)) * ENTRY_BITS[dtype] // 8) + SCALE_BYTES[dtype]
    for leaf in jax.tree.leaves(tree)
  )


def sizes(tree, dtype: str, average_stats: bool = True) -> tuple[float, int]:
  """(the size the timing model moves a message at, the bytes a worker sends) for one
  exchange of the model `tree`.

  What is compressed goes one way only: a worker's message out (Q), then the
  float32 result back (the master's reply; or, for an all-reduce, the float32
  sums gathered after the compressed messages were scattered to the workers
  that add them up, as the code adds them in float32). Each direction is
  counted at its size: a message's time is taken at the mean of the two (a
  round trip, or the all-reduce's two phases, comes out exact), and a worker
  sends the compressed message (all-reduce: (P-1)/P of each phase, which
  easgd.sim.timing counts from the mean). BatchNorm statistics kept local
  are not sent.
  """
  message = tree
  if not average_stats and model_state.has_stats(tree):
    message = model_state.trainable(tree)
  full, sent = message_bytes(message, "float32"), message_bytes(message, dtype)
  return (full + sent) / 2, sent


def _stochastic(leaf: jax.Array, key: jax.Array, levels: int) -> jax.Array:
  scale = jnp.max(jnp.abs(leaf)) / float(levels)
  safe = jnp.where(scale > 0, scale, 1.0)
  noise = jax.random.uniform(key, leaf.shape, leaf.dtype)
  quantized = jnp.clip(jnp.floor(leaf / safe + noise), -float(levels), float(levels))
  return quantized * safe


def compress(tree, dtype: str, key: jax.Array | None):
  """Q(tree): what the receiver gets of one worker's message (float32 again)."""
  if dtype == "float32":
    return tree
  if dtype == "bfloat16":
    return jax.tree.map(lambda leaf: leaf.astype(jnp.bfloat16).astype(leaf.dtype), tree)
  if dtype not in LEVELS:
    raise ValueError(f"unknown exchange dtype {dtype!r}; valid: {', '.join(DTYPES)}")
  leaves, treedef = jax.tree.flatten(tree)
  keys = jax.random.split(key, len(leaves))
  quantized = [_stochastic(leaf, k, LEVELS[dtype]) for leaf, k in zip(leaves, keys, strict=True)]
  return jax.tree.unflatten(treedef, quantized)


def compress_workers(tree, dtype: str, key: jax.Array, workers: jax.Array):
  """Q of each worker's message in a stacked tree; `workers` are their global indices."""
  if dtype == "float32":
    return tree

  def one(message, worker):
    return compress(message, dtype, jax.random.fold_in(key, worker))

  return jax.vmap(one)(tree, workers)


def with_feedback(tree, residual, dtype: str, key: jax.Array, workers: jax.Array):
  """(what each worker sends, its new residual) under error feedback: Q(v + e) and
  (v + e) - Q(v + e), for the stacked messages `tree` (v) and residuals `residual` (e)
  of the workers `workers` (global indices)."""
  total = jax.tree.map(jnp.add, tree, residual)
  sent = compress_workers(total, dtype, key, workers)
  return sent, jax.tree.map(jnp.subtract, total, sent)
