"""Update rules: pure functions over one sharded training state.

base:             the interface (`Rule`, `TrainState`, `Hyper`) and shared steps.
optimizers:       the inner optimizer and its schedule, the outer optimizer (optax).
exchange:         compressed exchange messages.
sync:             Sync SGD.
outer:            the center family: Sync EASGD, Sync MEASGD, DiLoCo, Local SGD, Lookahead.
streaming:        the streaming rules: Streaming DiLoCo and its elastic sibling.
fragments:        a model cut into fragments of whole layers, for the streaming rules.
parameter_server: the master-and-workers family, driven by the simulator's ticks.
model_state:      parameters and BatchNorm statistics in one tree.
registry:         `config.algorithm` -> rule class.

The names below are the interface the rest of the project uses.
"""

from easgd.rules.base import AXIS, Hyper, LossFn, Momentum, Pull, Rule, TickInputs, TrainState
from easgd.rules.registry import RULES, make_rule, names, plain

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
