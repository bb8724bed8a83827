"""Declaring a config field: the mechanism every part of the package declares its
own fields with, beside its code.

A field's declaration is its dotted path, its default, what values it allows
(type and range, with the words a refusal says), one line of what it means,
whether it shapes the run's trajectory, and, for fields that moved or were
added since an earlier version, their old names and the value that computes
what that version did. A field a part reads into a settings class (`settings`:
the rules' `Hyper`, the timing model's `Cluster`) names its attribute there and
its `off` value: the one at which it changes nothing, which the class takes
when it is not given.

The parts declare; easgd.config assembles the tree from their declarations
(the default config, each field's check, the migration of old names,
docs/configuration.md).
"""

import dataclasses
import enum
import functools
import math
from collections.abc import Callable, Iterable
from typing import Any

from easgd.errors import is_int


class Shapes(enum.StrEnum):
  """Whether a field can change what a run trains (its trajectory)."""

  # For every algorithm but one that has no use for its group (the pipeline
  # has no workers and no simulated cluster: `Algorithm.ignored_groups`).
  ALWAYS = "always"
  # Only for an algorithm that declares it reads it (`Algorithm.reads`);
  # an optimizer field only where the optimizer and its
  # schedule read it; run.total_steps under a schedule that spans it.
  IF_READ = "if read"
  # May change when a run is resumed; not a hyper-parameter.
  NEVER = "never"


@dataclasses.dataclass(frozen=True)
class Allowed:
  """The values a field takes: `accepts(value)`, and `text`, what a refusal says."""

  accepts: Callable[[Any], bool]
  text: str


def integer(low: int, high: int | None = None, note: str = "", words: str | None = None) -> Allowed:
  """An integer >= low (and < high)."""
  if words is None:
    words = (
      f"must be an integer >= {low}" if high is None else f"must be an integer in [{low}, {high})"
    )
  return Allowed(
    lambda v: is_int(v) and v >= low and (high is None or v < high), words + _note(note)
  )


def number(
  low: float,
  high: float | None = None,
  *,
  low_open: bool = False,
  high_open: bool = True,
  infinite: bool = False,
  note: str = "",
  words: str | None = None,
) -> Allowed:
  """A number in [low, high) by default; `infinite` lets +inf through (never NaN)."""

  def accepts(value) -> bool:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or math.isnan(value):
      return False
    if not (infinite or math.isfinite(value)):
      return False
    above = value > low if low_open else value >= low
    below = high is None or (value < high if high_open else value <= high)
    return above and below

  if words is None:
    if high is None:
      words = f"must be a finite number {'>' if low_open else '>='} {low:g}"
    else:
      words = f"must be in {'(' if low_open else '['}{low:g}, {high:g}{')' if high_open else ']'}"
  return Allowed(accepts, words + _note(note))


def one_of(choices, note: str = "", *, sort: bool = False) -> Allowed:
  """One of `choices`, listed in their order, or sorted with `sort` (a registry's)."""
  listed = sorted(choices) if sort else list(choices)
  return Allowed(lambda v: v in tuple(choices), f"valid: {', '.join(listed)}" + _note(note))


FLAG = Allowed(lambda v: isinstance(v, bool), "True or False")


def text(words: str, accepts: Callable[[str], bool] = lambda v: True) -> Allowed:
  """A string that `accepts`."""
  return Allowed(lambda v: isinstance(v, str) and accepts(v), words)


def values(each: Allowed, every: str) -> Allowed:
  """A tuple (or list) whose every value `each` accepts: the pipeline's per-model
  values; `every` says what each value must be."""
  return Allowed(
    lambda v: isinstance(v, (tuple, list)) and all(each.accepts(x) for x in v),
    f"must be () or a tuple of one value a model, every one {every}",
  )


def _note(note: str) -> str:
  return f" ({note})" if note else ""


_NOT_ADDED = object()
# `off` of a field a settings class cannot do without: no value is neutral.
REQUIRED = object()
_SAME = object()


@dataclasses.dataclass(frozen=True)
class Field:
  """One config field.

  path:     dotted, its group first (`optimizer.learning_rate`).
  default:  its value in the default config.
  allowed:  its type and range; values across fields are the rules' and
            runtimes' to check.
  doc:      one line: what it is.
  shapes:   whether it can change what a run trains (`Shapes`).
  formerly: its names in earlier versions (flat names before the groups).
  earlier:  for a field added since: the value that computes what the
            versions before it did (a checkpoint without it was written so).
  setting:  its attribute in the settings class that reads it (`settings`);
            "" for a field no settings class holds.
  off:      the setting's value at which it changes nothing (after `convert`),
            which that class takes when not given (the default unless declared;
            `REQUIRED`: none).
  convert:  config value -> the setting's value (None: the same).
  exclusive: only the algorithms that read it may set it: for the others it
            must stay `off`, and the refusal says what they lack (this phrase).
            Its config value is its setting's (no `convert`).
  mid_run:  a run may take another value of it when it resumes (a deliberate,
            recorded change: population-based training's explore), because no
            part of the state it resumes depends on it; the others, whose value
            the state's shape or meaning depends on (the workers, the model, an
            optimizer's kind), may not.
  """

  path: str
  default: Any
  allowed: Allowed
  doc: str
  shapes: Shapes = Shapes.ALWAYS
  formerly: tuple[str, ...] = ()
  earlier: Any = _NOT_ADDED
  setting: str = ""
  off: Any = _SAME
  convert: Callable[[Any], Any] | None = None
  exclusive: str = ""
  mid_run: bool = False

  def __post_init__(self):
    if self.off is _SAME:
      object.__setattr__(self, "off", self.default)
    if self.exclusive and self.convert is not None:
      raise ValueError(f"config.{self.path}: an exclusive field's off value is a config value")

  @property
  def group(self) -> str:
    """Its group ("" for the top-level fields)."""
    head, dot, _ = self.path.rpartition(".")
    return head.split(".", maxsplit=1)[0] if dot else ""

  @property
  def name(self) -> str:
    """Its last name (`learning_rate` of `optimizer.learning_rate`)."""
    return self.path.rpartition(".")[2]

  @property
  def added(self) -> bool:
    """Whether it was added since the first grouped version (it has an earlier value)."""
    return self.earlier is not _NOT_ADDED

  def of(self, config) -> Any:
    """Its value in a (grouped) config."""
    return functools.reduce(lambda group, key: group[key], self.path.split("."), config)


def unique(fields: Iterable[Field]) -> tuple[Field, ...]:
  """`fields` in their order, each once; ValueError for two declarations of one path."""
  found: dict[str, Field] = {}
  for field in fields:
    if found.setdefault(field.path, field) is not field:
      raise ValueError(f"config.{field.path} is declared twice")
  return tuple(found.values())


def settings(fields: Iterable[Field]) -> Callable[[type], type]:
  """A class decorator: the class becomes a frozen dataclass with one attribute for each
  of `fields` that names a `setting`, defaulting to its `off` value (required ones
  first, in order), and `from_config(config)` reading them all from a grouped config."""

  def build(cls: type) -> type:
    held = [field for field in unique(fields) if field.setting]
    ordered = [f for f in held if f.off is REQUIRED] + [f for f in held if f.off is not REQUIRED]
    cls.__annotations__ = {field.setting: Any for field in ordered}
    for field in ordered:
      extra = {} if field.off is REQUIRED else {"default": field.off}
      setattr(cls, field.setting, dataclasses.field(metadata={"config": field}, **extra))
    if "from_config" not in vars(cls):
      cls.from_config = classmethod(read)
    return dataclasses.dataclass(frozen=True)(cls)

  return build


def read(cls: type, config) -> Any:
  """An instance of a `settings` class with every attribute read from `config`, through
  its field's `convert`."""
  values = {}
  for attribute in dataclasses.fields(cls):
    field = attribute.metadata["config"]
    value = field.of(config)
    values[attribute.name] = field.convert(value) if field.convert else value
  return cls(**values)
