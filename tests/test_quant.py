"""Quantization (SPEC Eqs. 14-16) against a numpy computation, and packing round trips."""
import jax.numpy as jnp
import numpy as np
import pytest

from wq_jax import quant


def numpy_rtn(x, bits, axis):
  q_max = 2**bits - 1
  x_min = x.min(axis=axis, keepdims=True)
  x_max = x.max(axis=axis, keepdims=True)
  s = (x_max - x_min) / q_max
  z = -np.round(x_min / s)
  q = np.clip(np.round(x / s) + z, 0, q_max)
  return q, s, z


@pytest.mark.parametrize("bits", [2, 4, 8])
@pytest.mark.parametrize("shape,axis", [((3, 33, 7), 1), ((5, 17), -1), ((2, 9, 4, 13), 0)])
def test_matches_numpy_and_error_within_half_step(bits, shape, axis):
  rng = np.random.default_rng(bits * 100 + len(shape))
  x = (rng.standard_normal(shape) * 3 + rng.standard_normal(shape[-1:]) * 5).astype(np.float32)
  qt = quant.quantize(jnp.asarray(x), bits, axis)
  q_ref, s_ref, z_ref = numpy_rtn(x, bits, axis)
  expected_meta_shape = list(x.shape)
  expected_meta_shape[axis] = 1
  assert qt.scale.shape == tuple(expected_meta_shape) == qt.zero.shape
  np.testing.assert_allclose(np.asarray(qt.scale), s_ref, rtol=1e-6)
  np.testing.assert_array_equal(np.asarray(qt.zero), z_ref)
  codes = np.asarray(quant.unpack(qt.codes, bits, x.shape[-1]))
  # float32 division may land a hair off a .5 boundary: allow a code to differ by one, rarely.
  assert np.mean(codes != q_ref) < 1e-3 and np.abs(codes - q_ref).max() <= 1
  x_hat = np.asarray(quant.dequantize(qt))
  assert x_hat.shape == x.shape
  assert np.all(np.abs(x_hat - x) <= s_ref / 2 * (1 + 1e-5) + 1e-6)


@pytest.mark.parametrize("bits", [2, 4])
def test_codes_take_the_bit_width_in_memory(bits):
  x = jnp.asarray(np.random.default_rng(0).standard_normal((4, 32, 128)), jnp.float32)
  qt = quant.quantize(x, bits, axis=1)
  assert qt.codes.dtype == jnp.uint8
  assert qt.codes.size == x.size * bits // 8


@pytest.mark.parametrize("bits", [2, 4, 8])
@pytest.mark.parametrize("length", [1, 3, 5, 7, 13, 64, 129])
def test_pack_round_trip_at_odd_sizes(bits, length):
  rng = np.random.default_rng(length)
  q = rng.integers(0, 2**bits, size=(3, length)).astype(np.uint8)
  packed = quant.pack(jnp.asarray(q), bits)
  assert packed.shape == (3, -(-length // (8 // bits)))
  np.testing.assert_array_equal(np.asarray(quant.unpack(packed, bits, length)), q)


def test_split_packing_puts_contiguous_slices_in_each_byte():
  q = np.arange(8, dtype=np.uint8) % 4  # 8 codes, 4 a byte: byte j holds elements j, j+2, j+4, j+6
  packed = np.asarray(quant.pack(jnp.asarray(q), 2))
  for j in range(2):
    assert [(packed[j] >> (2 * i)) & 3 for i in range(4)] == [q[j + 2 * i] for i in range(4)]


@pytest.mark.parametrize("bits", [2, 4])
@pytest.mark.parametrize("value", [0.0, 3.7, -1.25e-3, 1e6])
def test_constant_groups_are_exact_and_finite(bits, value):
  x = jnp.full((2, 32, 5), value, jnp.float32)
  qt = quant.quantize(x, bits, axis=1)
  x_hat = np.asarray(quant.dequantize(qt))
  assert np.all(np.isfinite(np.asarray(qt.scale)))
  np.testing.assert_array_equal(x_hat, np.asarray(x))


def test_narrow_scale_dtype_still_covers_the_range():
  rng = np.random.default_rng(1)
  x = jnp.asarray(rng.standard_normal((64, 32, 16)) * 7 + 3, jnp.float32)
  qt = quant.quantize(x, 2, axis=1, scale_dtype=jnp.float16)
  assert qt.scale.dtype == jnp.float16
  s = np.asarray(qt.scale, np.float32)
  err = np.abs(np.asarray(quant.dequantize(qt)) - np.asarray(x))
  assert np.all(err <= s / 2 * (1 + 1e-3) + 1e-5)


def test_unsupported_bits_are_refused():
  with pytest.raises(ValueError, match="bits"):
    quant.quantize(jnp.ones((4, 4)), 3, axis=0)
