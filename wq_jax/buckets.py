"""Shape buckets: a few sizes for many plans, so plans do not recompile the decode step.

`bucket(n)` rounds n up to a number whose binary form has at most
`MANTISSA_BITS` significant bits: at most 1/2^MANTISSA_BITS padding (6.25 %),
and only 16 sizes per octave, so the count of distinct shapes is logarithmic.
"""
from __future__ import annotations

MANTISSA_BITS = 4


def bucket(n: int, mantissa_bits: int = MANTISSA_BITS) -> int:
  """The smallest size >= n with at most `mantissa_bits` significant bits."""
  if n < 0:
    raise ValueError(f"a size cannot be negative: {n}")
  if n < (1 << mantissa_bits):
    return n
  shift = n.bit_length() - mantissa_bits
  step = 1 << shift
  return -(-n // step) * step


def round_up(n: int, multiple: int) -> int:
  return -(-n // multiple) * multiple
