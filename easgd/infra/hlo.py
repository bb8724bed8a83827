"""What a compiled program sends between devices, read from its HLO text."""

import re

import numpy as np

# XLA's names for the collectives (the async forms' -start ops carry the data).
COLLECTIVES = ("collective-permute", "all-reduce", "all-gather", "all-to-all", "reduce-scatter")
_DTYPE_BYTES = {"f32": 4, "f64": 8, "bf16": 2, "f16": 2, "s32": 4, "u32": 4, "s64": 8, "u64": 8}
_SHAPE = re.compile(r"\b(f32|f64|bf16|f16|s32|u32|s64|u64|pred|s8|u8)\[([\d,]*)\]")
_OP = re.compile(r"=\s*(.*?)\s(" + "|".join(COLLECTIVES) + r")(-start)?\(")


def _shape_bytes(text: str) -> int:
  total = 0
  for dtype, dims in _SHAPE.findall(text):
    size = int(np.prod([int(d) for d in dims.split(",") if d])) if dims else 1
    total += size * _DTYPE_BYTES.get(dtype, 1)
  return total


def collectives(hlo_text: str) -> list[tuple[str, int]]:
  """(kind, bytes of its result on one device) for each collective op in the program.

  Ops inside loops are listed once, as written in the program.
  """
  found = []
  for line in hlo_text.splitlines():
    match = _OP.search(line)
    if match:
      result_type, kind, start = match.groups()
      if start:
        # An async -start op's result is a tuple of buffers (operand, result,
        # context): its largest member is what is sent or received.
        found.append((kind, max(_shape_bytes(f"{d}[{s}]") for d, s in _SHAPE.findall(result_type))))
      else:
        found.append((kind, _shape_bytes(result_type)))
  return found
