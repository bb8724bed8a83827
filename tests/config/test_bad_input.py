"""Bad input by class: every numeric field at its type, sign, zero and non-finite
boundaries, every path argument, and the argument parsers of the tools.

Each field's allowed values are written here apart from easgd.config.validation, as a
predicate; every probe value outside it must be refused in one line that names
the field, and every value inside it accepted. The refusal holds whether or not
the configured algorithm reads the field.
"""

import argparse
import math
import os
import re

import pytest

from easgd import arguments, launch, rules
from easgd.config import hyperparameters, validation
from easgd.errors import ConfigError
from runs import config_with

REQUIRED = rules.Momentum.REQUIRED


def _integer(value) -> bool:
  return isinstance(value, int) and not isinstance(value, bool)


def _number(value) -> bool:
  return isinstance(value, (int, float)) and not isinstance(value, bool) and not math.isnan(value)


def integer_at_least(low):
  return lambda v: _integer(v) and v >= low


def finite_at_least(low, inclusive=True):
  return lambda v: _number(v) and math.isfinite(v) and (v >= low if inclusive else v > low)


def fraction(high=1.0):  # [0, high)
  return lambda v: _number(v) and 0 <= v < high


# Two-tier servers, under which a parameter-server rule reads their fields.
TWO_TIER = {"algorithm": "async_easgd", "outer.two_tier": True}

# field -> (its allowed values, the config under which the algorithm reads it)
FIELDS = {
  "seed": (lambda v: _integer(v) and 0 <= v < 2**32, {}),
  "workers": (integer_at_least(1), {}),
  "data.batch_size": (integer_at_least(1), {}),
  "data.device_budget": (finite_at_least(0, inclusive=False), {}),
  "run.total_steps": (integer_at_least(1), {}),
  "run.eval_every": (integer_at_least(0), {}),
  "run.checkpoint_every": (integer_at_least(0), {}),
  "run.log_every": (integer_at_least(0), {}),
  # 0 picks a default; else it must divide the default 8 workers.
  "run.devices": (lambda v: _integer(v) and v >= 0 and (v == 0 or 8 % v == 0), {}),
  "outer.comm_period": (integer_at_least(1), {}),
  # beta = workers * moving_rate < 1 with the default 8 workers; 0 picks beta = 0.9.
  "outer.moving_rate": (fraction(1 / 8), {}),
  "optimizer.learning_rate": (finite_at_least(0, inclusive=False), {}),
  "optimizer.momentum": (fraction(), {"algorithm": "sync_sgd"}),
  "optimizer.weight_decay": (finite_at_least(0), {}),
  "optimizer.b1": (fraction(), {"optimizer.name": "adamw"}),
  "optimizer.b2": (fraction(), {"optimizer.name": "adamw"}),
  "optimizer.eps": (finite_at_least(0, inclusive=False), {"optimizer.name": "adamw"}),
  "optimizer.warmup_steps": (
    lambda v: _integer(v) and 0 <= v < 600,
    {"optimizer.schedule": "warmup_cosine"},
  ),
  "optimizer.decay_factor": (
    lambda v: _number(v) and 0 < v <= 1,
    {"optimizer.schedule": "warmup_step"},
  ),
  "outer.learning_rate": (finite_at_least(0, inclusive=False), {"algorithm": "diloco"}),
  "outer.momentum": (fraction(), {"algorithm": "diloco", "outer.nesterov": False}),
  # The streaming rules' fragments divide the default period of 4 steps, and the
  # delay is below it.
  "outer.fragments": (lambda v: _integer(v) and v in (1, 2, 4), {"algorithm": "streaming_diloco"}),
  "outer.sync_delay": (lambda v: _integer(v) and 0 <= v < 4, {"algorithm": "streaming_diloco"}),
  "outer.merge": (lambda v: _number(v) and 0 < v <= 1, {"algorithm": "streaming_diloco"}),
  # Delayed Nesterov's N, and its c in [0, 1/N] (here N = 1).
  "outer.momentum_period": (integer_at_least(1), {"algorithm": "async_local_sgd"}),
  "outer.momentum_activation": (
    lambda v: _number(v) and 0 <= v <= 1,
    {"algorithm": "async_local_sgd", "outer.momentum_period": 1},
  ),
  "downpour.n_sync": (integer_at_least(1), {"algorithm": "downpour"}),
  # beta_2 = groups * rate < 1 with hierarchical_easgd's default levels' 4 groups of 2.
  "outer.global_moving_rate": (fraction(1 / 4), {"algorithm": "hierarchical_easgd"}),
  "outer.global_every": (integer_at_least(1), TWO_TIER),
  "outer.merge_weight": (lambda v: _number(v) and 0 < v <= 1, TWO_TIER),
  "outer.global_learning_rate": (finite_at_least(0, inclusive=False), TWO_TIER),
  "outer.global_momentum": (fraction(), TWO_TIER),
  "outer.global_momentum_period": (integer_at_least(1), TWO_TIER),
  # Below the default run's 600 steps: a run that never switches is refused.
  "outer.switch_step": (
    lambda v: _integer(v) and 0 <= v < 600,
    {"algorithm": "post_local_sgd"},
  ),
  # NoLoCo's groups divide the default 8 workers; its pull is any finite kappa >= 0.
  "outer.group_size": (lambda v: _integer(v) and v in (1, 2, 4, 8), {"algorithm": "noloco"}),
  "outer.consensus": (finite_at_least(0), {"algorithm": "noloco"}),
  # PALSGD's p in [0, 1); its pull rate any finite rate > 0 (p = 0 here: no pull to bound).
  "outer.pull_probability": (fraction(), {"algorithm": "palsgd"}),
  "outer.pull_rate": (finite_at_least(0, inclusive=False), {"algorithm": "palsgd"}),
  # A round's quorum: a fraction of the default 8 workers, or a count of 2 to 8; its
  # deadline any number of seconds >= 0, inf waiting for every worker.
  "outer.quorum": (
    lambda v: _number(v) and (0 < v <= 1 or (math.isfinite(v) and v == int(v) and 2 <= v <= 8)),
    {"algorithm": "sync_easgd"},
  ),
  "outer.deadline": (lambda v: _number(v) and v >= 0, {"algorithm": "sync_easgd"}),
  "pipeline.models": (integer_at_least(1), {"algorithm": "pipeline"}),
  "pipeline.stage_steps": (integer_at_least(1), {"algorithm": "pipeline"}),
  "cluster.compute_time": (finite_at_least(0, inclusive=False), {}),
  "cluster.speed_spread": (finite_at_least(0), {}),
  "cluster.jitter": (finite_at_least(0), {}),
  "cluster.latency": (finite_at_least(0), {}),
  "cluster.master_time": (finite_at_least(0), {}),
  # A bandwidth may be infinite: that link is not modelled.
  "cluster.bandwidth": (lambda v: _number(v) and v > 0, {}),
  "cluster.server_bandwidth": (lambda v: _number(v) and v > 0, {}),
  "cluster.straggler_slowdown": (finite_at_least(1), {}),
  "cluster.between_latency": (finite_at_least(0), {"cluster.groups": (4, 4)}),
  "cluster.between_bandwidth": (lambda v: _number(v) and v > 0, {"cluster.groups": (4, 4)}),
  # A group of the two.
  "cluster.server_group": (lambda v: _integer(v) and v in (0, 1), {"cluster.groups": (4, 4)}),
  "cluster.servers": (integer_at_least(1), {"algorithm": "async_easgd"}),
  "ray.servers": (integer_at_least(1), {"algorithm": "async_easgd", "runtime": "ray"}),
  "ray.worker_gpus": (finite_at_least(0), {"algorithm": "async_easgd", "runtime": "ray"}),
  "device.memory": (finite_at_least(0), {}),
  "device.flops": (finite_at_least(0), {}),
}

# The boundaries of every class: type (a string, a bool, a float for an integer),
# sign, zero, one, the table's upper bounds (600 steps, 2**32), and the non-finite values.
PROBES = ("x", True, -1, 0, 1, 0.5, 1.5, -0.5, 600, 2**32, math.nan, math.inf, -math.inf)


def test_every_numeric_field_is_in_the_table():
  numeric = {
    field
    for field, value in _flat(config_with()).items()
    if isinstance(value, (int, float)) and not isinstance(value, bool)
  }
  assert numeric == set(FIELDS)


def _flat(config):
  return hyperparameters.flatten(config.to_dict())


def _mistakes(field, base) -> list:
  """The probes that validation answers against the field's range: (value, what it said)."""
  allowed, _ = FIELDS[field]
  mistakes = []
  for probe in PROBES:
    config = config_with(base)
    # What validation sees: ConfigDict stores a bool given for a float as 1.0.
    value = _set(config, field, probe)
    try:
      validation.validate(config)
      said = None
    except ConfigError as error:
      said = str(error)
    if allowed(value):
      if said is not None:
        mistakes.append((value, said))
    elif (
      said is None or "\n" in said or not said.startswith(f"config.{field}={value!r} is invalid")
    ):
      mistakes.append((value, said))
  return mistakes


@pytest.mark.parametrize("field", sorted(FIELDS))
def test_each_numeric_field_refuses_exactly_the_values_outside_its_range(field):
  assert _mistakes(field, FIELDS[field][1]) == []


# What each field must be whatever reads it, where the table's range also holds
# a combination that only its readers check (beta = workers * moving_rate < 1,
# a warm-up shorter than the run); the rest check the table's range everywhere.
ALWAYS = {
  "outer.moving_rate": fraction(),
  "run.devices": integer_at_least(0),
  "optimizer.warmup_steps": integer_at_least(0),
  "outer.fragments": integer_at_least(1),
  "outer.sync_delay": integer_at_least(0),
  "outer.momentum_period": integer_at_least(1),
  "outer.switch_step": lambda v: _integer(v) and 0 <= v < 2**31,
  "cluster.server_group": integer_at_least(0),  # the pipeline has no cluster to place it in
  "outer.global_moving_rate": fraction(),
  "outer.group_size": integer_at_least(1),
}
# A valid config for each algorithm: the momentum rules need a momentum.
ALGORITHMS = {
  name: {
    **rule.defaults,  # what the rule needs beside (the hierarchical rules' levels)
    "algorithm": name,
    "optimizer.momentum": 0.9 if rule.momentum == REQUIRED else 0.0,
  }
  for name, rule in rules.RULES.items()
} | {"pipeline": {"algorithm": "pipeline"}}


def test_every_algorithm_has_a_valid_base():
  for base in ALGORITHMS.values():
    validation.validate(config_with(base))


@pytest.mark.parametrize("field", sorted(FIELDS))
def test_a_field_is_checked_whichever_algorithm_reads_it(field):
  """Every algorithm, read or not: each value outside the field's range is refused."""
  allowed = ALWAYS.get(field, FIELDS[field][0])
  mistakes = []
  for name, base in ALGORITHMS.items():
    for probe in PROBES:
      config = config_with(base)
      value = _set(config, field, probe)
      if allowed(value):
        continue
      try:
        validation.validate(config)
        said = None
      except ConfigError as error:
        said = str(error)
      if said is None or not said.startswith(f"config.{field}={value!r} is invalid"):
        mistakes.append((name, value, said))
  assert mistakes == []


def _set(config, field, value):
  *groups, name = field.split(".")
  target = config
  for group in groups:
    target = target[group]
  # A ConfigDict keeps a field's type; bypass it as a config file could not:
  # the checks must hold for any value whatever its type.
  with target.ignore_type():
    target[name] = value
  return target[name]


@pytest.mark.parametrize("value", ["float16", "bf16", "Float32", "", 32, None, True])
def test_an_unknown_dtype_is_refused_in_one_line_naming_it(value):
  config = config_with()
  value = _set(config, "dtype", value)
  with pytest.raises(ConfigError) as error:
    validation.validate(config)
  said = str(error.value)
  assert "\n" not in said and said.startswith(f"config.dtype={value!r} is invalid"), said
  assert "valid: float32, bfloat16" in said
  for dtype in ("float32", "bfloat16"):
    validation.validate(config_with(dtype=dtype))


@pytest.mark.parametrize("kind", ["file", "under a file", "missing"])
def test_a_data_dir_that_is_not_a_directory_is_named(tmp_path, kind):
  (tmp_path / "file").write_text("x")
  path = {"file": "file", "under a file": "file/data", "missing": "nowhere"}[kind]
  config = config_with({"run.data_dir": str(tmp_path / path)})
  with pytest.raises(ConfigError, match=r"config.run.data_dir=.* is invalid: must be a directory"):
    validation.validate(config)
  validation.validate(config_with({"run.data_dir": str(tmp_path)}))


@pytest.mark.parametrize(
  "check,path,message",
  [
    (arguments.directory, "", "--flag is empty"),
    (arguments.directory, "file", "is not a directory"),
    (arguments.directory, "file/run", "lies under"),
    (arguments.directory, "locked/run", "cannot be written"),
    (arguments.output_file, "", "give the path of the file to write"),
    (arguments.output_file, "directory", "give the path of the file to write"),
    (arguments.output_file, "file/table.md", "is not a directory"),
    (arguments.output_file, "locked/table.md", "cannot be written"),
  ],
)
def test_every_path_argument_is_checked_by_class(
  tmp_path, capsys, monkeypatch, check, path, message
):
  (tmp_path / "file").write_text("x")
  (tmp_path / "directory").mkdir()
  locked = tmp_path / "locked"
  locked.mkdir()
  locked.chmod(0o500)
  if os.access(locked, os.W_OK):  # root may write anywhere: deny it as the OS would another
    access = os.access
    monkeypatch.setattr(
      arguments.os, "access", lambda p, mode: str(p) != str(locked) and access(p, mode)
    )
  with pytest.raises(SystemExit) as exit_info:
    check("--flag")(path and str(tmp_path / path))
  assert exit_info.value.code == 2
  err = capsys.readouterr().err
  assert err.count("\n") == 1 and err.startswith("error: --flag") and message in err, err
  assert sorted(os.listdir(tmp_path)) == ["directory", "file", "locked"]  # nothing made
  assert os.listdir(locked) == [] and (tmp_path / "file").read_text() == "x"


def test_a_relative_path_names_the_file_it_lies_under_as_given(tmp_path, capsys, monkeypatch):
  (tmp_path / "notes").write_text("x")
  monkeypatch.chdir(tmp_path)
  with pytest.raises(SystemExit):
    arguments.check_workdir("notes/run")
  assert "lies under 'notes', which is a file" in capsys.readouterr().err


@pytest.mark.parametrize(
  "argv,message",
  [
    (["--processes", "x", "--", "train.py"], "argument --processes: 'x' is not an integer"),
    (["--processes", "0", "--", "train.py"], "argument --processes: 0 is invalid: must be an"),
    (["--processes", "2", "--port", "-1", "--", "train.py"], "--port: -1 is invalid"),
    (["--processes", "2", "--port", "70000", "--", "train.py"], "must be a port in [0, 65535]"),
    (["--processes", "2", "--grace", "nan", "--", "train.py"], "--grace: nan is invalid"),
    (["--processes", "2"], "no command given"),
    (["--processes", "2", "--", "missing.py"], "'missing.py' is not a file"),
    (["--", "train.py"], "the following arguments are required: --processes"),
  ],
)
def test_the_launcher_answers_bad_arguments_in_one_line(capsys, argv, message):
  with pytest.raises(SystemExit) as exit_info:
    launch.main(argv)
  assert exit_info.value.code == 2
  err = capsys.readouterr().err
  assert err.count("\n") == 1 and message in err, err


@pytest.mark.parametrize(
  "content,refused",
  [
    (None, False),  # nothing there yet
    (b"Made by `python studies/outer.py --workdir runs/outer`\n| rule |", False),  # its own
    (b"my notes\n", True),  # someone else's file of the same name
    ("directory", True),
  ],
)
def test_a_tool_overwrites_only_a_file_it_wrote(tmp_path, capsys, content, refused):
  path = tmp_path / "outer_table.md"
  if content == "directory":
    path.mkdir()
  elif content is not None:
    path.write_bytes(content)
  if not refused:
    arguments.check_overwritable(str(path), b"studies/outer.py")
    return
  with pytest.raises(SystemExit) as exit_info:
    arguments.check_overwritable(str(path), b"studies/outer.py")
  assert exit_info.value.code == 2
  err = capsys.readouterr().err
  assert err.count("\n") == 1 and "outer_table.md" in err
  if content != "directory":
    assert path.read_bytes() == content  # untouched


@pytest.mark.parametrize(
  "parse,text,message",
  [
    (arguments.number(0), "x", "'x' is not a number"),
    (arguments.number(0), "nan", "nan is invalid: must be a finite number >= 0"),
    (arguments.number(0), "-1", "-1 is invalid: must be a finite number >= 0"),
    (arguments.number(0, inclusive=False), "0", "0 is invalid: must be a finite number > 0"),
    (arguments.integer(1), "1.5", "'1.5' is not an integer"),
    (arguments.integer(1), "0", "0 is invalid: must be an integer >= 1"),
    *(
      (
        arguments.file_name(".png"),
        name,
        f"{name!r} is invalid: must be a file name ending in .png, without a folder",
      )
      for name in ("plot.txt", ".png", "docs/plot.png", "../plot.png")
    ),
  ],
)
def test_every_argument_type_is_checked_by_class(parse, text, message):
  with pytest.raises(argparse.ArgumentTypeError, match=f"^{re.escape(message)}$"):
    parse(text)


def test_an_argument_within_its_bounds_is_its_value():
  assert arguments.number(0, inclusive=False)("0.25") == 0.25
  assert arguments.integer(1)("3") == 3
  assert arguments.file_name(".png")("quorum.png") == "quorum.png"


@pytest.mark.parametrize(
  ("algorithm", "field", "value"),
  [
    *(
      (name, field, value)
      for name in sorted(ALGORITHMS)
      if "outer.quorum" not in hyperparameters.reads(name)
      for field, value in (("outer.quorum", 0.75), ("outer.missed", "late"))
    ),
    ("sync_sgd", "outer.missed", "late"),
    ("post_local_sgd", "outer.missed", "late"),
    ("post_local_sgd", "outer.world_size", "fixed"),
  ],
)
def test_a_round_policy_a_rule_cannot_honour_is_refused_in_one_line(algorithm, field, value):
  """Quorum rounds belong to the synchronous rules whose exchange can close without some
  workers (the parameter-server rules, the pipeline, the hierarchical and
  gossip rules have none); sync_sgd's and post_local_sgd's shared x cannot take a
  gradient late, and post_local_sgd's average of models no absent zeros."""
  takes = "outer.quorum" in hyperparameters.reads(algorithm)
  quorum = {"outer.quorum": 0.75} if takes else {}
  config = config_with({**ALGORITHMS[algorithm], **quorum, field: value})
  with pytest.raises(ConfigError) as error:
    validation.validate(config)
  said = str(error.value)
  assert "\n" not in said and said.startswith(f"config.{field}={value!r} is invalid"), said
