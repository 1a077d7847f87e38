"""Asymmetric round-to-nearest quantization with bit-packed codes (SPEC Eqs. 14-16).

    s = (x_max - x_min) / (2^b - 1)      z = -round(x_min / s)
    q = clamp(round(x / s) + z, 0, 2^b - 1)        x_hat = s * (q - z)

Codes are packed along the last axis, "split" style: with P = 8 // b codes a
byte, byte j of a row holds the codes of elements j, j + C/P, j + 2C/P, ...
(C the last-axis length rounded up to a multiple of P). A kernel therefore
unpacks a row of bytes into P *contiguous* slices with one shift and mask each,
with no interleave.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import struct

SUPPORTED_BITS = (2, 4, 8)


@struct.dataclass
class QuantizedTensor:
  """Codes plus per-group (scale, zero); `zero` is the integer zero-point z."""
  codes: jax.Array  # uint8, x's shape with the last axis packed to ceil(C / P)
  scale: jax.Array  # x's shape with the quantized axis of length 1
  zero: jax.Array  # same shape as scale, integer values stored as floats
  bits: int = struct.field(pytree_node=False)
  length: int = struct.field(pytree_node=False)  # unpacked last-axis length C

  @property
  def shape(self) -> tuple[int, ...]:
    return (*self.codes.shape[:-1], self.length)

  @property
  def nbytes(self) -> int:
    return sum(int(a.size) * a.dtype.itemsize for a in (self.codes, self.scale, self.zero))


def codes_per_byte(bits: int) -> int:
  _check_bits(bits)
  return 8 // bits


def packed_length(length: int, bits: int) -> int:
  per_byte = codes_per_byte(bits)
  return -(-length // per_byte)


def pack(q: jax.Array, bits: int) -> jax.Array:
  """Packs integer codes in [0, 2^bits) along the last axis into uint8."""
  per_byte = codes_per_byte(bits)
  length = q.shape[-1]
  stride = packed_length(length, bits)
  q = q.astype(jnp.uint8)
  q = jnp.pad(q, [(0, 0)] * (q.ndim - 1) + [(0, stride * per_byte - length)])
  parts = q.reshape(*q.shape[:-1], per_byte, stride)
  packed = jnp.zeros(parts.shape[:-2] + (stride,), jnp.uint8)
  for i in range(per_byte):
    packed = packed | (parts[..., i, :] << jnp.uint8(bits * i))
  return packed


def unpack(codes: jax.Array, bits: int, length: int) -> jax.Array:
  """Inverse of `pack`: uint8 codes of the last axis back to `length` values."""
  per_byte = codes_per_byte(bits)
  mask = jnp.uint8((1 << bits) - 1)
  parts = [(codes >> jnp.uint8(bits * i)) & mask for i in range(per_byte)]
  return jnp.concatenate(parts, axis=-1)[..., :length]


def quantize(x: jax.Array, bits: int, axis: int, scale_dtype=jnp.float32) -> QuantizedTensor:
  """Quantizes `x` with one (scale, zero) per slice along `axis` (min/max over `axis`).

  Every element is reconstructed within scale/2. A constant group is exact
  (its scale is |x_min|, its zero-point -sign(x_min)), never NaN. A scale
  stored in a narrower `scale_dtype` is rounded up so the range still fits.
  """
  q, scale, zero = quantize_codes(x, bits, axis, scale_dtype)
  return QuantizedTensor(codes=pack(q, bits), scale=scale, zero=zero, bits=bits, length=x.shape[-1])


def quantize_codes(x: jax.Array, bits: int, axis: int, scale_dtype=jnp.float32):
  """`quantize` without the packing: (codes uint8 in x's shape, scale, zero)."""
  _check_bits(bits)
  q_max = (1 << bits) - 1
  xf = x.astype(jnp.float32)
  x_min = jnp.min(xf, axis=axis, keepdims=True)
  x_max = jnp.max(xf, axis=axis, keepdims=True)
  span = (x_max - x_min) / q_max
  constant = span <= 0
  scale = jnp.where(constant, jnp.where(x_min == 0, 1.0, jnp.abs(x_min)), span)
  scale = _round_up(scale, scale_dtype)
  scale_f = scale.astype(jnp.float32)
  zero = -jnp.round(x_min / scale_f)
  q = jnp.clip(jnp.round(xf / scale_f) + zero, 0, q_max).astype(jnp.uint8)
  return q, scale, zero.astype(scale_dtype)


def dequantize(qt: QuantizedTensor, dtype=jnp.float32) -> jax.Array:
  """x_hat = scale * (q - zero), in `x`'s shape."""
  q = unpack(qt.codes, qt.bits, qt.length).astype(jnp.float32)
  x_hat = qt.scale.astype(jnp.float32) * (q - qt.zero.astype(jnp.float32))
  return x_hat.astype(dtype)


def _round_up(scale: jax.Array, dtype) -> jax.Array:
  """Casts a positive scale to `dtype`, stepping up one ulp where the cast went down."""
  cast = scale.astype(dtype)
  if jnp.dtype(dtype) == jnp.float32:
    return cast
  bumped = jnp.nextafter(cast, jnp.array(jnp.inf, dtype))
  return jnp.where(cast.astype(jnp.float32) < scale, bumped, cast)


def _check_bits(bits: int) -> None:
  if bits not in SUPPORTED_BITS:
    raise ValueError(f"bits must be one of {SUPPORTED_BITS}, got {bits}")
