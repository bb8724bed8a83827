"""The declared fields: one declaration each, from which the default config, each field's
check, the migration hints, the rules' own defaults and docs/configuration.md come."""

import ast
import math
import pathlib

import pytest

from easgd import cli, registry, rules
from easgd.config import fields, hyperparameters, reference, validation
from easgd.configs import default
from easgd.errors import ConfigError

REPO = pathlib.Path(__file__).resolve().parents[2]
# Values of many types: for every field, one of them is out of its type or range.
CANDIDATES = (None, "x", -1, 2**40, 1.5, -0.5, math.nan, True, (), (-1,), (0.9, 0.1))


def test_the_default_config_is_the_declared_defaults():
  config = default.get_config()
  flat = hyperparameters.flatten(config.to_dict())
  assert sorted(flat) == sorted(fields.FIELDS)
  for field in fields.FIELDS_DECLARED:
    assert hyperparameters.lookup(config, field.path) == field.default
    assert type(hyperparameters.lookup(config, field.path)) is type(field.default), field.path


def test_every_declaration_is_whole():
  assert len(fields.FIELDS) == len(fields.FIELDS_DECLARED)
  for field in fields.FIELDS_DECLARED:
    assert field.allowed.accepts(field.default), field.path
    assert field.doc and "\n" not in field.doc, field.path
    assert field.allowed.text and "\n" not in field.allowed.text, field.path
    assert field.group in fields.GROUPS, field.path


def test_every_field_refuses_a_value_out_of_its_range_in_one_line_naming_it():
  for field in fields.FIELDS_DECLARED:
    bad = next(value for value in CANDIDATES if not field.allowed.accepts(value))
    config = default.get_config()
    *groups, name = field.path.split(".")
    holder = hyperparameters.lookup(config, ".".join(groups))
    with holder.ignore_type():
      holder[name] = bad
    with pytest.raises(ConfigError) as error:
      validation.validate(config)
    message = str(error.value)
    assert message.startswith(f"config.{field.path}={bad!r} is invalid: "), message
    assert "\n" not in message


def test_the_migration_hints_come_from_the_declarations():
  for field in fields.FIELDS_DECLARED:
    for old in field.formerly:
      assert hyperparameters.moved(old) == field.path
      assert f"config.{field.path}" in hyperparameters.hint(old)
  # Every field added since keeps the value that computes what the versions before it
  # did (a field added later adds its own).
  before = {
    "deterministic_sums": False,
    "dtype": "float32",
    "runtime": "simulated",
    "cluster.replay": "",
    "outer.fragments": 1,
    "outer.sync_delay": 0,
    "outer.merge": 1.0,
    "outer.momentum_period": 1,
    "outer.momentum_activation": 0.0,
    "outer.dynamic_local_steps": False,
    "cluster.on_worker_loss": "rejoin",
    "ray.address": "",
    "ray.servers": 1,
    "ray.worker_gpus": 0.0,
    "cluster.straggler_slowdowns": (),
  }
  assert hyperparameters.EARLIER_VALUES.items() >= before.items()


def test_a_checkpoint_without_an_added_field_reads_as_its_earlier_value():
  """A field added since, at a default that computes what came before, compares equal to a
  checkpoint that lacks it, tuples (as JSON holds them) included."""
  current = hyperparameters.flatten(default.get_config().to_dict())
  added = hyperparameters.EARLIER_VALUES
  saved = hyperparameters.grouped({k: v for k, v in current.items() if k not in added})
  unchanged = [f.path for f in fields.FIELDS_DECLARED if f.added and f.earlier == f.default]
  assert "cluster.groups" in unchanged and "cluster.group_slowdowns" in unchanged
  for field in unchanged:
    assert saved[field] == current[field], field


def test_what_shapes_a_trajectory_is_declared():
  assert hyperparameters.shapes_trajectory("seed", "sync_easgd")
  assert not hyperparameters.shapes_trajectory("run.log_every", "sync_easgd")
  assert not hyperparameters.shapes_trajectory("data.source", "async_easgd")
  assert hyperparameters.shapes_trajectory("downpour.n_sync", "downpour")
  assert not hyperparameters.shapes_trajectory("downpour.n_sync", "sync_easgd")
  assert hyperparameters.shapes_trajectory("run.devices", "pipeline")
  assert not hyperparameters.shapes_trajectory("run.devices", "sync_easgd")
  assert not hyperparameters.shapes_trajectory("cluster.latency", "pipeline")
  for field in fields.FIELDS_DECLARED:
    if field.shapes == fields.Shapes.NEVER:
      assert not any(hyperparameters.shapes_trajectory(field.path, a) for a in registry.ALGORITHMS)


def test_docs_configuration_md_is_generated_from_the_declarations():
  written = (REPO / "docs" / "configuration.md").read_text()
  assert written == reference.render(), (
    "docs/configuration.md differs from the declared fields: "
    "python -m easgd.config.reference > docs/configuration.md"
  )
  for field in fields.FIELDS_DECLARED:
    assert f"| `{field.path}` |" in written


def test_a_rule_declares_defaults_only_of_fields_there_are_and_in_their_range():
  for rule in rules.RULES.values():
    for path, value in rule.defaults.items():
      assert path in fields.FIELDS, (rule.name, path)
      assert fields.FIELDS[path].allowed.accepts(value), (rule.name, path)


def _rules_with_defaults():
  return [name for name, rule in rules.RULES.items() if rule.defaults]


def test_the_momentum_rules_bring_their_momentum():
  for name, rule in rules.RULES.items():
    if rule.momentum == rules.Momentum.REQUIRED:
      assert 0 < rule.defaults["optimizer.momentum"] < 1, name


@pytest.mark.parametrize("name", _rules_with_defaults())
def test_a_rules_defaults_apply_where_nothing_set_the_field(name):
  config = default.get_config()
  config.algorithm = name
  applied = hyperparameters.with_rule_defaults(config)
  assert applied == dict(rules.RULES[name].defaults)
  for path, value in applied.items():
    assert hyperparameters.lookup(config, path) == value
  validation.validate(config)


@pytest.mark.parametrize("name", _rules_with_defaults())
def test_a_rules_defaults_go_together_and_none_apply_if_one_was_chosen(name):
  first, *_ = rules.RULES[name].defaults
  chosen = default.get_config()
  chosen.algorithm = name
  # Given on the command line, even at the default config's value.
  assert hyperparameters.with_rule_defaults(chosen, given={first}) == {}
  changed = default.get_config()
  changed.algorithm = name
  *groups, field = first.split(".")
  # The config file's own value, of the field's type.
  current = hyperparameters.lookup(changed, first)
  own = 0.5 if isinstance(current, float) else ((2, 4), (8, 0)) if isinstance(current, tuple) else 3
  hyperparameters.lookup(changed, ".".join(groups))[field] = own
  assert hyperparameters.with_rule_defaults(changed) == {}
  assert hyperparameters.lookup(changed, first) == own
  for path in rules.RULES[name].defaults:
    if path != first:
      assert hyperparameters.lookup(changed, path) == hyperparameters.lookup(
        default.get_config(), path
      )


@pytest.mark.parametrize("name", _rules_with_defaults())
def test_a_resumed_run_takes_the_values_its_checkpoint_has(name):
  config = default.get_config()
  config.algorithm = name
  saved = default.get_config().to_dict()  # a run started before the rule had defaults
  saved["algorithm"] = name
  applied = hyperparameters.with_rule_defaults(config, saved=saved)
  assert applied == {path: hyperparameters.lookup(default.get_config(), path) for path in applied}
  assert config.to_dict() == saved


def test_a_rule_without_defaults_and_the_pipeline_change_nothing():
  for name in ("sync_easgd", "pipeline"):
    config = default.get_config()
    config.algorithm = name
    assert hyperparameters.with_rule_defaults(config) == {}
    assert config.to_dict() | {"algorithm": "sync_easgd"} == default.get_config().to_dict()


def test_the_fields_a_command_line_sets_are_read_from_its_flags():
  argv = [
    "--config",
    "configs/default.py",
    "--config.optimizer.learning_rate=0.1",
    "--config.outer.comm_period",
    "8",
    "--noconfig.optimizer.nesterov",
    "--workdir=runs/x",
  ]
  assert cli.given_fields(argv) == {
    "optimizer.learning_rate",
    "outer.comm_period",
    "optimizer.nesterov",
  }


def test_no_config_path_is_spelled_in_two_library_files():
  """A dotted path is written where its field is declared and read through that
  declaration everywhere else (`Field.path`, `Field.of`, `require(field, ...)`)."""
  sources = [*sorted((REPO / "easgd").rglob("*.py")), *sorted((REPO / "models").rglob("*.py"))]
  sources += [REPO / "train.py", REPO / "sweep.py"]
  spelled: dict[str, set[str]] = {}
  for source in sources:
    for node in ast.walk(ast.parse(source.read_text())):
      if isinstance(node, ast.Constant) and node.value in fields.FIELDS and "." in node.value:
        spelled.setdefault(node.value, set()).add(str(source.relative_to(REPO)))
  assert {path: files for path, files in spelled.items() if len(files) > 1} == {}
  # The test sees the declarations themselves.
  assert spelled["outer.comm_period"] == {"easgd/rules/base.py"}
