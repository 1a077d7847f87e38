"""The three-pool cache and decode attention: equivalences, memory, and shape buckets."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from wq_jax import attention, cache
from wq_jax.buckets import bucket

VISUAL_START = 5


def random_kv(seed, layers=3, batch=2, kv_heads=2, tokens=160, head_dim=32):
  k1, k2 = jax.random.split(jax.random.PRNGKey(seed))
  shape = (layers, batch, kv_heads, tokens, head_dim)
  # An offset per channel, like the outlier channels of real keys.
  offset = jax.random.normal(k1, (1, 1, kv_heads, 1, head_dim)) * 3
  return jax.random.normal(k1, shape) + offset, jax.random.normal(k2, shape)


def build(k, v, plan, seq_lens, window_size=8, num_visual=None, **kw):
  num_visual = num_visual or plan.shape[1] * window_size + 3
  return cache.build_cache(k, v, plan, visual_start=VISUAL_START, num_visual=num_visual, seq_lens=seq_lens,
                           max_new_tokens=4, window_size=window_size, **kw)


def query(seed, batch=2, heads=4, head_dim=32):
  return jax.random.normal(jax.random.PRNGKey(seed), (batch, heads, head_dim))


def test_all_high_precision_equals_attention_over_the_original_cache():
  k, v = random_kv(0)
  plan = np.full((3, 12), 16)
  seq_lens = [140, 123]
  c = build(k, v, plan, seq_lens, meta_dtype=jnp.float32)
  q = query(1)
  valid = jnp.arange(k.shape[3])[None] < jnp.array(seq_lens)[:, None]
  for l in range(3):
    got = attention.decode_attention(q, c.layer(l))
    want = attention.reference_attention(q, k[l], v[l], valid)
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("value_channel_group", [0, 8])
@pytest.mark.parametrize("heads,kv_heads", [(4, 2), (7, 1), (8, 8)])
def test_quantized_equals_dequantize_then_attend(value_channel_group, heads, kv_heads):
  k, v = random_kv(2, kv_heads=kv_heads)
  rng = np.random.default_rng(3)
  plan = rng.choice([16, 4, 2], size=(3, 12), p=[0.2, 0.3, 0.5]).astype(np.int32)
  plan[1] = 2  # a layer with an empty high-precision range
  c = build(k, v, plan, [150, 131], value_channel_group=value_channel_group)
  q = query(4, heads=heads)
  for l in range(3):
    kk, vv, valid = cache.dequantized_layer(c, l)
    want = attention.reference_attention(q, kk, vv, valid)
    got = attention.decode_attention(q, c.layer(l))
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-4, atol=1e-5)


def test_quantization_error_is_small_against_full_precision():
  k, v = random_kv(5)
  plan = np.full((3, 12), 4)
  seq_lens = [140, 140]
  c = build(k, v, plan, seq_lens, meta_dtype=jnp.float32)
  q = query(6)
  valid = jnp.arange(k.shape[3])[None] < 140
  for l in range(3):
    got = attention.decode_attention(q, c.layer(l))
    want = attention.reference_attention(q, k[l], v[l], valid)
    assert float(jnp.abs(got - want).max()) < 0.15


def test_a_permutation_of_windows_changes_nothing():
  k, v = random_kv(7)
  s, w = 8, 12
  rng = np.random.default_rng(8)
  plan = rng.choice([16, 4, 2], size=(3, w)).astype(np.int32)
  perm = rng.permutation(w)
  tokens = np.arange(k.shape[3])
  window_tokens = VISUAL_START + (perm[:, None] * s + np.arange(s)).reshape(-1)
  order = tokens.copy()
  order[VISUAL_START:VISUAL_START + w * s] = window_tokens
  c1 = build(k, v, plan, [150, 150])
  c2 = build(k[:, :, :, order], v[:, :, :, order], plan[:, perm], [150, 150])
  q = query(9)
  for l in range(3):
    a = attention.decode_attention(q, c1.layer(l))
    b = attention.decode_attention(q, c2.layer(l))
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-6)


def test_append_writes_each_request_at_its_own_length():
  k, v = random_kv(10)
  plan = np.full((3, 12), 2)
  c = build(k, v, plan, [140, 120])
  before = np.asarray(c.rest_len)
  layer = c.layer(1)
  k_new = jnp.ones((2, 2, 32)) * 7
  layer = layer.append(k_new, -k_new)
  c2 = c.replace_layer(1, layer).advance()
  np.testing.assert_array_equal(np.asarray(c2.rest_len), before + 1)
  for b in range(2):
    np.testing.assert_array_equal(np.asarray(c2.rest_k[1, b, :, before[b]]), 7)
    np.testing.assert_array_equal(np.asarray(c2.rest_v[1, b, :, before[b]]), -7)
    np.testing.assert_array_equal(np.asarray(c2.rest_k[0, b, :, before[b]]), 0)
  # The appended token takes part in the next attention, and nothing past it does.
  q = query(11)
  kk, vv, valid = cache.dequantized_layer(c2, 1)
  np.testing.assert_allclose(np.asarray(attention.decode_attention(q, layer)),
                             np.asarray(attention.reference_attention(q, kk, vv, valid)), rtol=1e-4, atol=1e-5)


def test_rest_holds_text_tail_and_room_for_generated_tokens():
  k, v = random_kv(12)
  plan = np.full((3, 12), 4)
  seq_lens = [140, 111]
  c = build(k, v, plan, seq_lens)
  windows_end = VISUAL_START + 12 * 8
  expected = [VISUAL_START + n - windows_end for n in seq_lens]
  np.testing.assert_array_equal(np.asarray(c.rest_len), expected)
  assert c.capacity >= max(expected) + 4
  np.testing.assert_array_equal(np.asarray(c.rest_k[2, 1, :, VISUAL_START:expected[1]]),
                                np.asarray(k[2, 1, :, windows_end:111]))


def test_bytes_follow_the_plan_within_ten_percent():
  """The cache holds codes + metadata for the planned windows, plus at most bucket padding."""
  layers, windows, s, h, kv = 8, 40, 8, 32, 2
  k, v = random_kv(13, layers=layers, kv_heads=kv, tokens=VISUAL_START + windows * s + 20, head_dim=h)
  rng = np.random.default_rng(14)
  for mix in ([0.15, 0.35, 0.5], [0.0, 0.0, 1.0], [1.0, 0.0, 0.0], [0.05, 0.9, 0.05]):
    plan = rng.choice([16, 4, 2], size=(layers, windows), p=mix).astype(np.int32)
    c = build(k, v, plan, [k.shape[3]] * 2, num_visual=windows * s + 5)
    exact = cache.planned_bytes(plan, batch=2, kv_heads=kv, head_dim=h, window_size=s, rest_tokens=c.capacity,
                                dtype=k.dtype)
    assert exact <= c.nbytes <= 1.10 * exact, (mix, c.nbytes, exact)


def test_nearby_plans_share_shape_buckets():
  """Plans of one video length that differ in a few windows (similar prompts or videos) mostly
  map to the same cache shapes, so the decode step rarely recompiles; any plan lands on one of
  a logarithmic number of sizes (see the bucket test)."""
  layers, windows = 28, 612  # LLaVA-OV-7B at 100 frames
  rng = np.random.default_rng(15)

  def shapes(plan):
    layout = cache.plan_layout(plan, visual_start=3, num_visual=windows * 32, seq_lens=[windows * 32 + 50],
                               window_size=32)
    return (tuple(len(s) for s in layout.pool_sources) +
            tuple(bucket(int(c.max()), mantissa_bits=0) for c in layout.counts))

  base = rng.choice([16, 4, 2], size=(layers, windows), p=[0.15, 0.35, 0.5]).astype(np.int32)
  same = 0
  for _ in range(40):
    plan = base.copy()
    flips = rng.integers(0, plan.size, size=20)  # 20 of 17136 windows change their bit width
    plan.reshape(-1)[flips] = rng.choice([16, 4, 2], size=20)
    same += shapes(plan) == shapes(base)
  assert same >= 30


def test_decode_step_compiles_once_per_bucket():
  k, v = random_kv(16, layers=2, tokens=VISUAL_START + 32 * 8 + 10)
  step = jax.jit(lambda q, c: attention.decode_attention(q, c.layer(1)))
  rng = np.random.default_rng(17)
  caches = []
  base = rng.choice([16, 4, 2], size=(2, 32), p=[0.2, 0.3, 0.5]).astype(np.int32)
  for _ in range(4):  # a different plan with the same counts per layer and precision
    plan = np.stack([rng.permutation(row) for row in base])
    caches.append(build(k, v, plan, [k.shape[3]] * 2, num_visual=32 * 8))
  signatures = {jax.tree_util.tree_structure(c) for c in caches}
  shapes = {tuple(x.shape for x in jax.tree_util.tree_leaves(c)) for c in caches}
  q = query(18)
  for c in caches:
    step(q, c).block_until_ready()
  assert len(shapes) == len(signatures) == 1
  assert step._cache_size() == 1


def test_bad_plans_are_refused():
  k, v = random_kv(19)
  with pytest.raises(ValueError, match="windows"):
    build(k, v, np.full((3, 5), 16), [150, 150], num_visual=12 * 8)
  with pytest.raises(ValueError, match="plan values"):
    build(k, v, np.full((3, 12), 8), [150, 150])


def test_unknown_implementation_is_named():
  k, v = random_kv(20)
  c = build(k, v, np.full((3, 12), 16), [150, 150])
  with pytest.raises(ValueError, match="cuda-magic"):
    attention.decode_attention(query(0), c.layer(0), implementation="cuda-magic")


def test_buckets_pad_less_than_a_sixteenth_and_are_few():
  sizes = {bucket(n) for n in range(1, 20000)}
  for n in range(1, 20000):
    assert n <= bucket(n) < n * (1 + 1 / 16) + 1
  assert len(sizes) < 16 * 15 + 32  # 16 an octave
  assert bucket(0) == 0 and bucket(100, mantissa_bits=0) == 128
