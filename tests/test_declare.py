"""The declaring mechanism: a field declared once, and a settings class built from
declarations (the rules' Hyper and the timing model's Cluster are two)."""

import dataclasses

import ml_collections
import pytest

from easgd import declare
from easgd.declare import FLAG, REQUIRED, Field, integer, number

RATE = Field("toy.rate", 0.5, number(0), "a rate", setting="rate", off=REQUIRED)
STEPS = Field("toy.steps", 4, integer(1), "steps", setting="steps", off=1)
NAMES = Field("toy.names", ("a",), declare.text("names"), "names", setting="names", convert=tuple)
SHOWN = Field("toy.shown", True, FLAG, "not a setting")


@declare.settings((STEPS, RATE, NAMES, SHOWN))
class Toy:
  """A settings class with no methods of its own."""


def test_a_settings_class_holds_each_setting_at_its_off_value_the_required_first():
  assert [field.name for field in dataclasses.fields(Toy)] == ["rate", "steps", "names"]
  toy = Toy(0.25)
  assert (toy.rate, toy.steps, toy.names) == (0.25, 1, ("a",))
  with pytest.raises(TypeError):
    Toy()  # rate has no neutral value
  with pytest.raises(dataclasses.FrozenInstanceError):
    toy.steps = 2


def test_a_settings_class_reads_a_config_through_each_fields_convert():
  config = ml_collections.ConfigDict({"toy": {"rate": 0.1, "steps": 8, "names": ["b", "c"]}})
  assert Toy.from_config(config) == Toy(0.1, 8, ("b", "c"))


def test_a_path_declared_twice_is_refused_and_one_declaration_twice_is_one():
  assert declare.unique((STEPS, RATE, STEPS)) == (STEPS, RATE)
  twin = Field("toy.steps", 2, integer(1), "steps again")
  with pytest.raises(ValueError, match=r"^config.toy.steps is declared twice$"):
    declare.unique((STEPS, twin))


def test_an_exclusive_field_is_off_at_a_config_value():
  with pytest.raises(ValueError, match="toy.mode: an exclusive field's off value"):
    Field("toy.mode", "on", declare.text("a mode"), "a mode", exclusive="mode", convert=bool)
