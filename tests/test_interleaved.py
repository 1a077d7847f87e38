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
  # Appending works the same way, into a layer's own rest segment or the stacked one in place.
  for stacked in (False, True):
    layer = unreordered.layer(1, stacked=stacked).append(k[1, :, :, 0], v[1, :, :, 0])
    c2 = unreordered.replace_layer(1, layer).advance()
    np.testing.assert_array_equal(np.asarray(c2.rest_len), np.asarray(unreordered.rest_len) + 1)
    row = np.asarray(unreordered.rest_len)
    np.testing.assert_array_equal(np.asarray(c2.rest_k[1, np.arange(batch), :, row]),
                                  np.asarray(k[1, :, :, 0].astype(c2.rest_k.dtype)))
    np.testing.assert_array_equal(np.asarray(c2.rest_k[0]), np.asarray(unreordered.rest_k[0]))


def _random_cache(dtype, *, batch, kv, h, s, w, layers=1, rest=30, seed=0, formats=(16, 4, 2)):
  t = 5 + w * s + rest
  k = jax.random.normal(jax.random.PRNGKey(seed), (layers, batch, kv, t, h)).astype(dtype)
  v = jax.random.normal(jax.random.PRNGKey(seed + 1), (layers, batch, kv, t, h)).astype(dtype)
  plan = np.random.default_rng(seed + 2).choice(formats, size=(layers, w)).astype(np.int32)
  lens = [t - 3 * i for i in range(batch)]  # uneven rest segments
  return build_interleaved_cache(k, v, plan, visual_start=5, num_visual=w * s + 3, seq_lens=lens,
                                 max_new_tokens=3, window_size=s)


@pytest.mark.parametrize("dtype,h,g,batch,formats", [
    (jnp.bfloat16, 128, 7, 3, (16, 4, 2)),
    (jnp.float16, 64, 8, 1, (16, 4, 2)),
    (jnp.bfloat16, 64, 1, 2, (4, 2)),  # no 16-bit window: phase 0 is the rest alone
    (jnp.bfloat16, 32, 2, 2, (16, 2)),  # no INT4 window: an empty phase
])
def test_paged_kernel_matches_the_xla_reader(dtype, h, g, batch, formats):
  """The paged Pallas reader (interpret mode) against XLA's every-format reader, on fresh random caches."""
  from pallas_kernels import quantized_decode
  from pallas_kernels.interleaved_decode import interleaved_decode
  from wq_jax.interleaved import interleaved_attention
  c = _random_cache(dtype, batch=batch, kv=2, h=h, s=8, w=10, layers=2, seed=h + g, formats=formats)
  qg = jax.random.normal(jax.random.PRNGKey(9), (batch, 2, g, h)) * h ** -0.5
  want = interleaved_attention(qg, c.layer(1))
  # Several splits (each a share of every format and of the rest), and one; a window a quantized step, and two
  # (an odd count's last step holds one); the layer's own rest segment, and every layer's stacked (as decode
  # passes it, read in place).
  several = quantized_decode.DecodeConfig(min_tokens_per_split=16, multiprocessors=8, tile_windows=1)
  one = quantized_decode.DecodeConfig(min_tokens_per_split=1 << 20, tile_windows=2)
  for config, stacked in ((several, False), (one, True)):
    layer = c.layer(1, stacked=stacked)
    np.testing.assert_allclose(np.asarray(interleaved_attention(qg, layer)), np.asarray(want), rtol=1e-6)
    got = interleaved_decode(qg, layer, config=config, interpret=True)
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=3e-3, atol=3e-3)


def test_pallas_attention_reads_the_interleaved_cache(monkeypatch):
  """decode_attention(implementation="pallas") on ablation C's cache runs the paged kernel (its own choice of
  formats for the Mosaic kernel; none under "pallas:triton"), and agrees with "xla"; a cache the kernel cannot
  read (float32) goes to XLA's reader with a warning that says why, and the kernel itself, asked directly, says
  so in its error."""
  from pallas_kernels import interleaved_decode as paged
  c = _random_cache(jnp.bfloat16, batch=2, kv=2, h=64, s=8, w=6, seed=5)
  q = jax.random.normal(jax.random.PRNGKey(4), (2, 8, 64)).astype(jnp.bfloat16)
  a = attention.decode_attention(q, c.layer(0), implementation="xla")
  asked, kernel = [], paged.interleaved_decode
  monkeypatch.setattr(paged, "interleaved_decode", lambda qg, layer, **kw: asked.append(kw) or kernel(qg, layer, **kw))
  b = attention.decode_attention(q, c.layer(0), implementation="pallas")
  np.testing.assert_allclose(np.asarray(a, np.float32), np.asarray(b, np.float32), rtol=1e-2, atol=1e-2)
  attention.decode_attention(q, c.layer(0), implementation="pallas:triton")
  from pallas_kernels.registration import CONFIGS  # its Mosaic launches take the name's configuration (s46)
  assert asked == [dict(mosaic=None, mosaic_config=CONFIGS["pallas"]),
                   dict(mosaic=(), mosaic_config=CONFIGS["pallas:triton"])]
  f32 = _random_cache(jnp.float32, batch=1, kv=2, h=64, s=8, w=4, seed=6)
  q32 = q[:1].astype(jnp.float32)
  with pytest.warns(UserWarning, match="16-bit caches"):
    got = attention.decode_attention(q32, f32.layer(0), implementation="pallas")
  np.testing.assert_array_equal(np.asarray(got), np.asarray(attention.decode_attention(q32, f32.layer(0))))
  from pallas_kernels.interleaved_decode import interleaved_decode
  with pytest.raises(ValueError, match="16-bit caches.*'xla' can"):
    interleaved_decode(jnp.zeros((1, 2, 4, 64)), f32.layer(0), interpret=True)


def test_page_table_lists_each_format_in_window_order():
  from wq_jax.interleaved import page_table
  plan = np.array([[2, 16, 4, 2, 16]], np.int32)
  record_start = np.array([[0, 192, 704, 1024, 1216]], np.int64)
  starts, counts = page_table(plan, record_start)
  np.testing.assert_array_equal(counts, [[2, 1, 2]])
  np.testing.assert_array_equal(starts, [[96, 608, 352, 0, 512]])  # 16-bit units: 16-bit, INT4, INT2 records


@pytest.mark.parametrize("bits", [2, 4])
def test_a_part_is_its_channels_in_order(bits):
  """A part's two byte-parity tiles, interleaved, are channels 2 n p ... 2 n (p + 1) in order (jnp path)."""
  from pallas_kernels.interleaved_decode import _part_codes
  from wq_jax import quant
  h, s = 64, 8
  codes = jax.random.randint(jax.random.PRNGKey(bits), (s, h), 0, 1 << bits)
  packed = quant.pack(codes, bits)  # uint8 [S, H b / 8], "split" packing
  words = jax.lax.bitcast_convert_type(packed.reshape(s, -1, 2), jnp.uint16)
  n = h * bits // 16
  for p in range(8 // bits):
    got = _part_codes(words, bits=bits, part=p, inline_asm=False)
    np.testing.assert_array_equal(np.asarray(got), np.asarray(codes[:, 2 * n * p:2 * n * (p + 1)]))


@pytest.mark.parametrize("bits", [2, 4])
def test_mosaic_views_find_each_record(bits):
  """What the Mosaic kernel's paged reading takes of a real cache (`mosaic_int2.heap_views`): a window of
  `bits` bits at page-table unit u has its codes in rows u / (n / 2) ... (rows of n code bytes), its scales in row
  u / H + S n / 2H and its minimums in the next (rows of H f16), as the kernel computes them; the page table's
  format order is the kernel's."""
  from pallas_kernels import interleaved_decode as paged
  from pallas_kernels import mosaic_int2 as mi
  from wq_jax import quant
  from wq_jax.cache import POOL_BITS
  from wq_jax.interleaved import layer_windows
  assert paged.FORMATS == POOL_BITS
  batch, kv, h, s = 2, 2, mi.HEAD_DIM, mi.WINDOW
  plan = np.array([[2, 16, 4, 2, 4, 2]], np.int32)
  t = 4 + plan.shape[1] * s + 8
  k = jax.random.normal(jax.random.PRNGKey(bits), (1, batch, kv, t, h)).astype(jnp.bfloat16)
  c = build_interleaved_cache(k, k, plan, visual_start=4, num_visual=plan.shape[1] * s, seq_lens=[t, t],
                              max_new_tokens=2, window_size=s)
  layer = c.layer(0)
  codes, meta = mi.heap_views(layer.k_heap, bits)
  want = np.asarray(layer_windows(layer.k_heap, layer, h)).reshape(batch, kv, -1, s, h)
  packed = h * bits // 8
  first = sum(int(np.sum(plan == b)) for b in POOL_BITS[:POOL_BITS.index(bits)])
  for i, w in enumerate(np.nonzero(plan[0] == bits)[0]):
    unit = int(layer.format_starts[first + i])
    window_codes = codes[:, unit // (packed // 2):unit // (packed // 2) + s].reshape(batch, kv, s, packed)
    row = unit // h + s * packed // (2 * h)
    scale, minimum = (meta[:, r].reshape(batch, kv, 1, h).astype(jnp.float32) for r in (row, row + 1))
    got = quant.unpack(window_codes, bits, h).astype(jnp.float32) * scale + minimum
    np.testing.assert_array_equal(np.asarray(got), want[:, :, w])


def test_mosaic_formats_follow_the_pools_rule(monkeypatch):
  """C's INT4 and INT2 windows go to the Mosaic kernel where the reordered pools of those widths would (>= 128
  request x KV-head pairs and layers of >= 512 window tokens, or >= 32 pairs and 8k tokens; window 32, H 128,
  G <= 8, f16 scales, a page table a warpgroup holds), never in interpret mode."""
  import types

  from pallas_kernels import interleaved_decode as paged
  from pallas_kernels import mosaic_int2 as mi
  from pallas_kernels import quantized_decode as qd
  monkeypatch.setattr(mi, "available", lambda: True)  # as under JAX >= 0.11
  layer = lambda windows=624, window=32, meta="float16": types.SimpleNamespace(
      plan=np.zeros(windows, np.int32), window_size=window, meta_dtype=meta)
  formats = lambda l=None, pairs=128, groups=7, h=128, interpret=False: paged.mosaic_formats(
      l or layer(), pairs, groups, h, interpret)
  assert formats() == qd.LARGE_BATCH_BITS
  assert formats(pairs=32) == qd.LARGE_BATCH_BITS  # since s43: 32 pairs and more where a layer holds 8k tokens
  assert formats(layer(windows=255), pairs=127) == formats(pairs=31) == ()
  assert formats(interpret=True) == formats(groups=9) == formats(h=64) == ()
  assert formats(layer(windows=15)) == formats(layer(window=16)) == formats(layer(meta="bfloat16")) == ()
  assert formats(layer(windows=mi.MAX_PAGES + 1)) == ()
  monkeypatch.setattr(mi, "available", lambda: False)
  assert formats() == ()
