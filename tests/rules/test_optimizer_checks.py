"""Bad optimizer, schedule, outer and exchange settings: one line each, naming the field."""

import pytest

from easgd.config import validation
from easgd.errors import ConfigError
from runs import config_with

DILOCO = {"algorithm": "diloco"}
ADAMW = {"optimizer.name": "adamw", "optimizer.learning_rate": 1e-3}
COSINE = {"optimizer.schedule": "warmup_cosine"}
STEP = {"optimizer.schedule": "warmup_step"}
BAD = [
  ({"optimizer.name": "lion"}, r"config.optimizer.name='lion' is invalid: valid: sgd, adamw"),
  ({"optimizer.schedule": "linear"}, r"config.optimizer.schedule='linear' .*valid: constant,"),
  ({"outer.optimizer": "lamb", **DILOCO}, r"config.outer.optimizer='lamb' .*valid: sgd, adam"),
  ({**STEP, "optimizer.boundaries": (0.5, 1.0)}, r"boundaries=\(0.5, 1.0\) .*in \(0, 1\)"),
  ({**STEP, "optimizer.boundaries": (0.0, 0.5)}, r"boundaries=\(0.0, 0.5\) .*in \(0, 1\)"),
  ({**STEP, "optimizer.boundaries": (0.75, 0.5)}, r"boundaries=\(0.75, 0.5\) .*increasing"),
  ({**STEP, "optimizer.boundaries": ()}, r"config.optimizer.boundaries=\(\) .*increasing"),
  (
    {**STEP, "optimizer.warmup_steps": 400, "run.total_steps": 600},
    r"config.optimizer.boundaries=\(0.5, 0.75\) .*first decay \(step 300 .*warm-up's 400 steps",
  ),
  (
    {**COSINE, "optimizer.warmup_steps": 600, "run.total_steps": 600},
    r"config.optimizer.warmup_steps=600 .*< run.total_steps=600",
  ),
  ({"optimizer.warmup_steps": 10}, r"warmup_steps=10 .*constant schedule has no warm-up"),
  ({**COSINE, "optimizer.warmup_steps": -1}, r"warmup_steps=-1 .*integer >= 0"),
  ({"optimizer.decay_factor": 0.0}, r"config.optimizer.decay_factor=0.0 .*\(0, 1\]"),
  ({"outer.learning_rate": 0.0, **DILOCO}, r"config.outer.learning_rate=0.0 .*> 0"),
  ({"optimizer.warmup_steps": True, **COSINE}, r"warmup_steps=True .*integer >= 0"),
  ({"optimizer.boundaries": (0.5, float("nan")), **STEP}, r"boundaries=\(0.5, nan\)"),
  ({"outer.learning_rate": -0.7, **DILOCO}, r"config.outer.learning_rate=-0.7 .*> 0"),
  ({"outer.learning_rate": float("nan"), **DILOCO}, r"outer.learning_rate=nan .*finite number > 0"),
  (
    {"outer.learning_rate": float("inf"), "algorithm": "lookahead"},
    r"config.outer.learning_rate=inf .*finite number > 0",
  ),
  ({"optimizer.nesterov": True}, r"optimizer.nesterov=True .*Nesterov needs a momentum"),
  (
    {"outer.momentum": 0.0, **DILOCO},
    r"config.outer.nesterov=True .*Nesterov needs a momentum: outer.momentum in",
  ),
  (
    {"outer.momentum": 0.5, "outer.pull": "reset", "outer.moving_rate": 0.1, **DILOCO},
    r"config.outer.moving_rate=0.1 .*diloco's reset pull has no alpha",
  ),
  (
    {"algorithm": "local_sgd", "outer.moving_rate": 0.05},
    r"config.outer.moving_rate=0.05 .*local_sgd's reset pull has no alpha",
  ),
  (
    {"algorithm": "async_sgd", "optimizer.name": "adamw", "optimizer.learning_rate": 1e-3},
    r"config.optimizer.name='adamw' .*async_sgd takes sgd .*rules that take adamw: sync_sgd",
  ),
  (
    {"algorithm": "downpour", "optimizer.name": "adamw"},
    r"config.optimizer.name='adamw' .*downpour takes sgd",
  ),
  ({"seed": 2**32 - 2, "algorithm": "pipeline"}, r"config.seed=4294967294 .*seed \+ m"),
  (
    {"algorithm": "pipeline", "pipeline.per_model.seed": (0, 1, 2, 2**32)},
    r"config.pipeline.per_model.seed=\(0, 1, 2, 4294967296\) .*\[0, 2\*\*32\)",
  ),
  ({"outer.momentum": 1.0, **DILOCO}, r"config.outer.momentum=1.0 .*\[0, 1\)"),
  ({"outer.pull": "reset"}, r"outer.pull='reset' .*sync_easgd pulls elastic; .*diloco"),
  (
    {"outer.pull": "reset", "algorithm": "async_easgd"},
    r"outer.pull='reset' .*async_easgd pulls elastic",
  ),
  (
    {"outer.pull": "elastic", "algorithm": "local_sgd"},
    r"outer.pull='elastic' .*local_sgd pulls reset; rules that take elastic: sync_easgd",
  ),
  ({"outer.pull": "elastic", "algorithm": "sync_sgd"}, r"sync_sgd has no pull"),
  (
    {"algorithm": "lookahead", "outer.optimizer": "adam"},
    r"outer.optimizer='adam' .*lookahead has no choice of outer optimizer \(only sgd\); .*diloco",
  ),
  ({"algorithm": "sync_sgd", "outer.optimizer": "adam"}, r"sync_sgd has no choice of outer"),
  (
    {
      "algorithm": "pipeline",
      "optimizer.nesterov": True,
      "pipeline.per_model.momentum": (0.9, 0.0, 0.9, 0.9),
    },
    r"config.optimizer.nesterov=True .*Nesterov needs a momentum",
  ),
  ({"outer.pull": "soft", **DILOCO}, r"outer.pull='soft' .*valid: '' \(the rule's own\)"),
  ({"outer.exchange_dtype": "float16"}, r"exchange_dtype='float16' .*float32, bfloat16, int8"),
  (
    {"outer.exchange_dtype": "int8", "algorithm": "pipeline"},
    r"exchange_dtype='int8' .*valid for pipeline: float32 \(its models move whole",
  ),
  ({**ADAMW, "optimizer.momentum": 0.9}, r"optimizer.momentum=0.9 .*adamw has no momentum"),
  (
    {**ADAMW, "optimizer.momentum": 0.9, "optimizer.nesterov": True},
    r"optimizer.momentum=0.9 .*adamw has no momentum",
  ),
  ({"optimizer.b2": 1.0}, r"config.optimizer.b2=1.0 .*\[0, 1\)"),
  ({"optimizer.eps": 0.0}, r"config.optimizer.eps=0.0 .*> 0"),
  (
    {**ADAMW, "algorithm": "sync_measgd"},
    r"config.optimizer.name='adamw' .*sync_measgd takes sgd \(it is defined by its momentum SGD\)",
  ),
  (
    {"outer.optimizer": "adam", **DILOCO},
    r"config.outer.momentum=0.9 .*adam outer optimizer has moments of its own",
  ),
  (
    {"outer.optimizer": "adam", "outer.momentum": 0.0, "outer.nesterov": True, **DILOCO},
    r"config.outer.nesterov=True .*adam outer optimizer has moments of its own",
  ),
  # A reset rule reads no alpha; an elastic pull does.
  ({"outer.pull": "elastic", "outer.moving_rate": 1.0, **DILOCO}, r"moving_rate=1.0 .*\(0, 1\)"),
]


@pytest.mark.parametrize("overrides,message", BAD)
def test_bad_optimizer_settings_are_named_in_one_line(overrides, message):
  with pytest.raises(ConfigError, match=message) as error:
    validation.validate(config_with(overrides))
  assert "\n" not in str(error.value)


@pytest.mark.parametrize(
  "overrides",
  [
    DILOCO,
    {**DILOCO, **ADAMW, "outer.pull": "elastic"},
    {**DILOCO, "outer.pull": "elastic", "outer.moving_rate": 0.05},
    {**DILOCO, "outer.optimizer": "adam", "outer.momentum": 0.0, "outer.nesterov": False},
    {"algorithm": "local_sgd", "outer.pull": "reset"},
    {"algorithm": "lookahead", "workers": 1, "outer.learning_rate": 0.5},
    {"algorithm": "sync_measgd", "optimizer.momentum": 0.9, "optimizer.nesterov": True},
    {"algorithm": "sync_easgd", **ADAMW, **COSINE, "optimizer.warmup_steps": 50},
    {"algorithm": "async_easgd", **STEP, "optimizer.warmup_steps": 10},
    {"algorithm": "downpour", "outer.exchange_dtype": "int8"},
    {
      "algorithm": "pipeline",
      "optimizer.nesterov": True,
      "pipeline.per_model.momentum": (0.9,) * 4,
    },
    {"algorithm": "sync_sgd", "outer.exchange_dtype": "bfloat16", "optimizer.momentum": 0.9},
  ],
)
def test_the_family_settings_that_make_sense_are_accepted(overrides):
  validation.validate(config_with(overrides))
