"""Update rules: pure functions over one sharded training state.

base:             the interface every rule implements (`Rule`), and what rules declare.
state:            the training state (`TrainState`) a checkpoint holds.
hyper:            the hyper-parameters (`Hyper`), one for each field a rule declares.
spmd:             the helpers of a step inside shard_map: sums over workers, per-worker maps.
optimizers:       the inner optimizer and its schedule, the workers' local step and its
                  metrics, the outer optimizer (optax).
exchange:         compressed exchange messages.
model_state:      parameters and BatchNorm statistics in one tree.
fragments:        a model cut into fragments of whole layers, for the streaming rules.
checks:           what the rules ask of the config across fields, from their declarations.
registry:         `config.algorithm` -> rule class, over the rules' own modules: a module
                  a family or a rule (sync, outer, streaming, parameter_server, ...), its
                  equations in its docstring.

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
