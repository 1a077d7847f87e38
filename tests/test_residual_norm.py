"""The fused residual add and RMS norm (`pallas_kernels.residual_norm`) against the add and `layers.rms_norm`,
in interpret mode on fresh random rows."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from pallas_kernels import residual_norm as rn


@pytest.mark.parametrize("rows,width,dtype", [(1, 448, jnp.bfloat16), (3, 3584, jnp.bfloat16), (5, 96, jnp.float32),
                                              (2, 24, jnp.float32)])
def test_matches_add_then_rms_norm(rows, width, dtype):
  keys = jax.random.split(jax.random.PRNGKey(rows * width), 3)
  h = (4 * jax.random.normal(keys[0], (rows, width))).astype(dtype)
  delta = jax.random.normal(keys[1], (rows, width)).astype(dtype)
  scale = (1 + 0.1 * jax.random.normal(keys[2], (width,))).astype(dtype)
  total, normed = rn.add_rms_norm(h, delta, scale, 1e-6, interpret=True)
  want_total, want_normed = rn.reference(h, delta, scale, 1e-6)
  assert total.dtype == want_total.dtype and normed.dtype == want_normed.dtype
  np.testing.assert_array_equal(np.asarray(total, np.float32), np.asarray(want_total, np.float32))
  # bf16: the same roundings, so equal but for the rare row whose f32 sum of squares rounds another way
  tol = 1e-6 if dtype == jnp.float32 else 2 ** -7
  np.testing.assert_allclose(np.asarray(normed, np.float32), np.asarray(want_normed, np.float32), rtol=tol, atol=tol)


def test_rows_are_read_in_power_of_two_chunks():
  assert rn.chunk_of(3584) == 512 and rn.chunk_of(448) == 64 and rn.chunk_of(4096) == 512 and rn.chunk_of(24) == 8


def test_bad_shapes_are_refused():
  with pytest.raises(ValueError, match="h and delta"):
    rn.add_rms_norm(jnp.zeros((2, 8)), jnp.zeros((2, 16)), jnp.ones((8,)), 1e-6, interpret=True)
  with pytest.raises(ValueError, match="scale"):
    rn.add_rms_norm(jnp.zeros((2, 8)), jnp.zeros((2, 8)), jnp.ones((4,)), 1e-6, interpret=True)


def test_lowers_for_cuda_at_the_7b_width():
  """Triton's lowering takes it on any machine (D = 3,584: seven loads of 512 a pass)."""
  rows = jax.ShapeDtypeStruct((32, 3584), jnp.bfloat16)
  fused = jax.jit(lambda h, d, s: rn.add_rms_norm(h, d, s, 1e-6))
  traced = fused.trace(rows, rows, jax.ShapeDtypeStruct((3584,), jnp.bfloat16))
  try:
    text = traced.lower(lowering_platforms=("cuda",)).as_text()
  except RuntimeError as e:  # JAX 0.11's Triton lowering asks for a GPU device (0.10's does not)
    if "No supported GPU devices" not in str(e):
      raise
    pytest.skip("this JAX lowers Pallas Triton kernels only with a GPU")
  assert "triton" in text and "wq_add_rms_norm" in text
