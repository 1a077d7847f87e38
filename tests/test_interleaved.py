"""Ablation C: the unreordered layout attends exactly like the reordered cache, in the same bytes."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from wq_jax import attention, cache
from wq_jax.interleaved import build_interleaved_cache


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_unreordered_equals_reordered(dtype):
  layers, batch, kv, h, s, w = 3, 2, 2, 32, 8, 12
  t = 5 + w * s + 30
  k = jax.random.normal(jax.random.PRNGKey(0), (layers, batch, kv, t, h)).astype(dtype)
  v = jax.random.normal(jax.random.PRNGKey(1), (layers, batch, kv, t, h)).astype(dtype)
  plan = np.random.default_rng(2).choice([16, 4, 2], size=(layers, w)).astype(np.int32)
  args = dict(visual_start=5, num_visual=w * s + 3, seq_lens=[t, t - 7], max_new_tokens=3, window_size=s)
  reordered = cache.build_cache(k, v, plan, **args)
  unreordered = build_interleaved_cache(k, v, plan, **args)
  q = jax.random.normal(jax.random.PRNGKey(3), (batch, 4, h))
  for l in range(layers):
    a = attention.decode_attention(q, reordered.layer(l))
    b = attention.decode_attention(q, unreordered.layer(l))
    # In bf16 the reordered reader rounds q and p to the cache dtype for its 16-bit segments.
    tol = 1e-4 if dtype == jnp.float32 else 2e-3
    np.testing.assert_allclose(np.asarray(a, np.float32), np.asarray(b, np.float32), rtol=tol, atol=tol)
  # Same records, no reordering: bytes within the buckets of each other.
  assert 0.9 < unreordered.nbytes / reordered.nbytes < 1.1
  # Appending works the same way.
  layer = unreordered.layer(1).append(k[1, :, :, 0], v[1, :, :, 0])
  c2 = unreordered.replace_layer(1, layer).advance()
  np.testing.assert_array_equal(np.asarray(c2.rest_len), np.asarray(unreordered.rest_len) + 1)
