"""Shape buckets: a few sizes for many plans, so plans do not recompile the decode step.

`bucket(n)` rounds n up to a multiple of a power of two chosen so that the
quotient lies in [2^m, 2^(m+1)) (m = `MANTISSA_BITS`): less than 1/2^m padding
(6.25 %), and 2^m sizes per octave, so the count of distinct shapes is
logarithmic in n.
"""
from __future__ import annotations

MANTISSA_BITS = 4


def bucket(n: int, mantissa_bits: int = MANTISSA_BITS) -> int:
  """The smallest size >= n of the form q * 2^e with q < 2^(mantissa_bits + 1)."""
  if n < 0:
    raise ValueError(f"a size cannot be negative: {n}")
  if n < (2 << mantissa_bits):
    return n
  shift = n.bit_length() - mantissa_bits - 1
  step = 1 << shift
  return -(-n // step) * step


def round_up(n: int, multiple: int) -> int:
  return -(-n // multiple) * multiple
