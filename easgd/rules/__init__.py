"""Update rules: pure functions over one sharded training state.

base:             the interface every rule implements (`Rule`), and what rules declare.
state:            the training state (`TrainState`) a checkpoint holds.
hyper:            the hyper-parameters (`Hyper`) a rule reads from the config.
spmd:             the helpers of a step inside shard_map: sums over workers, per-worker maps.
local:            the workers' local step with their inner optimizer, and its metrics.
optimizers:       the inner optimizer and its schedule, the outer optimizer (optax).
exchange:         compressed exchange messages.
sync:             Sync SGD.
outer:            the center family: Sync EASGD, Sync MEASGD, DiLoCo, Local SGD, Lookahead.
streaming:        the streaming rules: Streaming DiLoCo and its elastic sibling.
fragments:        a model cut into fragments of whole layers, for the streaming rules.
parameter_server: the master-and-workers family, driven by the simulator's ticks.
async_local:      Asynchronous Local SGD's master (Delayed Nesterov, DyLU), of that family.
model_state:      parameters and BatchNorm statistics in one tree.
registry:         `config.algorithm` -> rule class.

The names below are the interface the rest of the project uses.
"""

from easgd.rules.base import Momentum, Pull, Rule, TickInputs
from easgd.rules.hyper import Hyper
from easgd.rules.registry import RULES, make_rule, names, plain
from easgd.rules.spmd import AXIS
from easgd.rules.state import LossFn, TrainState

__all__ = [
  "AXIS",
  "RULES",
  "Hyper",
  "LossFn",
  "Momentum",
  "Pull",
  "Rule",
  "TickInputs",
  "TrainState",
  "make_rule",
  "names",
  "plain",
]
