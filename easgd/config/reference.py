"""docs/configuration.md, generated from the declared fields (easgd.config.fields)
and the rules' own defaults (`Rule.defaults`).

  python -m easgd.config.reference > docs/configuration.md

tests/config/test_fields.py keeps the file equal to what this prints.
"""

import math

from easgd.config import fields
from easgd.rules import RULES

INTRO = """\
# Configuration fields

Every field of the default config (configs/default.py), with its default, the
values it allows, whether it shapes the run's trajectory, and what it means.
Override any with `--config.GROUP.FIELD=VALUE`; a config file starts from the
default config and sets what differs.

This page is generated from the fields' declarations, which each part of
the package makes beside its code (`easgd.declare.Field`; a rule's on its
class, `Rule.declares`) and `easgd/config/fields.py` assembles
(`python -m easgd.config.reference > docs/configuration.md`); a test keeps it
equal to them.

**Shapes the trajectory**: *always* (but `workers` and `cluster.*` for the
pipeline, which has neither); *if read*: only for an algorithm that
reads it (each rule declares the fields it reads, `Rule.reads`; an optimizer
field only where the optimizer and its schedule use it; `run.total_steps`
under a schedule other than constant; `run.devices` for the pipeline);
*never*: it may change when a run is resumed. Only the fields that shape it
are hyper-parameters (TensorBoard's HParams) and must match a checkpoint's;
of those, the ones marked *changes mid-run* may take another value when a run
resumes if the command asks for it by name (train.py `--changed_fields`,
population-based training's explore: docs/running.md), which the run records.
"""

RULE_DEFAULTS = """\
## The rules' own defaults

Where the default config's value would fail a rule, the rule declares its
own (`Rule.defaults`), so that `--config.algorithm=X` alone trains every
rule. A rule's defaults apply together, and none of them if the command line
sets any of their fields or the config file gives any of them another value
than the default config's (a file that sets one to the default config's value
is not told apart: set it on the command line). A resumed run takes the
values its checkpoint has. A log line names the defaults applied.
"""


def _value(value) -> str:
  """A default as a config file writes it."""
  if isinstance(value, float) and math.isinf(value):
    return 'float("inf")'
  return repr(value)


def _cell(text: str) -> str:
  return text.replace("|", "\\|")


def render() -> str:
  """The whole of docs/configuration.md."""
  lines = [INTRO]
  for group, about in fields.GROUPS.items():
    lines.append(f"## {f'`{group}.*`' if group else 'Top level'}\n")
    lines.append(f"{about}\n")
    lines.append("| field | default | allowed | shapes the trajectory | meaning |")
    lines.append("| --- | --- | --- | --- | --- |")
    for field in fields.FIELDS_DECLARED:
      if field.group != group:
        continue
      cells = (
        f"`{field.path}`",
        f"`{_cell(_value(field.default))}`",
        _cell(field.allowed.text),
        field.shapes.value + ("; changes mid-run" if field.mid_run else ""),
        _cell(field.doc),
      )
      lines.append(f"| {' | '.join(cells)} |")
    lines.append("")
  lines.append(RULE_DEFAULTS)
  lines.append("| rule | its own defaults |")
  lines.append("| --- | --- |")
  for name, rule in RULES.items():
    own = ", ".join(f"`{path}={_value(value)}`" for path, value in rule.defaults.items())
    lines.append(f"| `{name}` | {own or 'none: the default config trains it'} |")
  return "\n".join(lines) + "\n"


if __name__ == "__main__":
  print(render(), end="")
