"""The 16-bit segments' Mosaic GPU kernel (`pallas_kernels/mosaic_dense.py`) in the interpret mode against float64,
alone and in the launch of a layer's quantized pools (`quantized_decode`'s `mosaic_dense`)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from pallas_kernels import mosaic_int2 as mi
from test_mosaic_int2 import random_pool  # tests/ is on the path: pytest's rootdir-less import mode

pytestmark = pytest.mark.skipif(not mi.available(), reason="the Mosaic GPU kernels need jax >= 0.11")


@pytest.fixture(scope="module")
def interpret():
  import jax
  return mi.interpret_params() if jax.default_backend() == "cpu" else None


def segments_case(seed, pairs, dtype, lengths=(150, (64, 70, 1))):
  """Two segments: 150 tokens from token 40 of a 200-token array (its last step's tile clamped back into the
  array, rows before the step masked), and a stacked rest (the second half's rows) of per-pair lengths."""
  import jax.numpy as jnp

  from pallas_kernels import mosaic_dense as md
  rng = np.random.default_rng(seed)
  h = mi.HEAD_DIM
  array = lambda *shape: jnp.asarray(rng.normal(size=shape), dtype)
  first = md.Segment(array(pairs, 200, h), array(pairs, 200, h), jnp.arange(pairs), jnp.full((pairs,), 40),
                     jnp.full((pairs,), lengths[0]))
  rest = md.Segment(array(2 * pairs, 80, h), array(2 * pairs, 80, h), jnp.arange(pairs) + pairs,
                    jnp.zeros((pairs,), jnp.int32), jnp.asarray(lengths[1][:pairs]))
  return [first, rest]


@pytest.mark.parametrize("warpgroups,working,splits,stages,lagged_max,dtype", [
    (1, 1, 2, 2, True, "bfloat16"),  # a warpgroup a CTA, two splits
    (4, 4, 4, 1, True, "bfloat16"),  # four programs a CTA, one slot each
    (4, 2, 4, 2, True, "bfloat16"),  # two of four warpgroups at work, two slots each (the default's)
    (4, 2, 4, 2, True, "float16"),  # the same over an f16 cache
    (4, 3, 6, 2, False, "bfloat16"),  # three at work, the maximum reduced every step
    (4, 2, 8, 2, True, "bfloat16"),  # more splits than some segments' steps: programs with nothing to read
])
def test_matches_attention_over_the_segments(interpret, dtype, warpgroups, working, splits, stages, lagged_max):
  import jax.numpy as jnp

  from pallas_kernels import mosaic_dense as md
  pairs, g = 3, 7
  q = jnp.asarray(np.random.default_rng(1).normal(size=(pairs, g, mi.HEAD_DIM)) * 0.3, jnp.float32)
  segments = segments_case(0, pairs, dtype)
  plan = md.dense_plan(q, segments, splits=splits, warpgroups=warpgroups, working=working, stages=stages,
                       lagged_max=lagged_max, interpret=interpret)
  o_t, m, l = mi.launch(plan)
  assert o_t.shape == (pairs, splits, mi.HEAD_DIM, md.HEADS)
  got = np.asarray(mi.merge(o_t, m, l, g))
  # q and P are rounded to the cache's dtype before the tensor cores, as the Triton kernel rounds them
  np.testing.assert_allclose(got, md.reference(q, segments), atol=1e-2, rtol=0)
  exact = md.reference(jnp.asarray(q, dtype).astype(jnp.float32), segments)
  np.testing.assert_allclose(got, exact, atol=4e-3, rtol=0)


def test_lagged_maximum_follows_scores_that_rise_late(interpret):
  """Scores far above the first steps' maximum in a later step (and segment): the vote's branch reduces it again."""
  import jax.numpy as jnp

  from pallas_kernels import mosaic_dense as md
  pairs, g = 2, 7
  q = jnp.asarray(np.random.default_rng(2).normal(size=(pairs, g, mi.HEAD_DIM)) * 0.3, jnp.float32)
  segments = segments_case(3, pairs, "bfloat16")
  spike = segments[1].k.at[pairs:, 60].set(segments[1].k[pairs:, 60] + 40 * jnp.sign(q[:, 0]).astype(jnp.bfloat16))
  segments[1] = dataclasses.replace(segments[1], k=spike)
  o_t, m, l = mi.launch(md.dense_plan(q, segments, splits=2, warpgroups=4, working=2, interpret=interpret))
  exact = md.reference(jnp.asarray(q, jnp.bfloat16).astype(jnp.float32), segments)
  np.testing.assert_allclose(np.asarray(mi.merge(o_t, m, l, g)), exact, atol=4e-3, rtol=0)


def test_refuses_what_it_cannot_take():
  import jax.numpy as jnp

  from pallas_kernels import mosaic_dense as md
  q = jnp.zeros((3, 7, mi.HEAD_DIM), jnp.float32)
  segments = segments_case(0, 3, "bfloat16")
  small = md.Segment(segments[1].k[:, :32], segments[1].v[:, :32], segments[1].row, segments[1].start,
                     segments[1].length)
  with pytest.raises(ValueError, match="segments of >= 64 tokens"):
    md.dense_plan(q, [segments[0], small], splits=2)
  with pytest.raises(ValueError, match="<= 8 heads"):
    md.dense_plan(jnp.zeros((3, 9, mi.HEAD_DIM), jnp.float32), segments, splits=2)
  mixed = md.Segment(segments[1].k.astype(jnp.float16), segments[1].v, segments[1].row, segments[1].start,
                     segments[1].length)
  with pytest.raises(ValueError, match="one dtype"):
    md.dense_plan(q, [segments[0], mixed], splits=2)
  with pytest.raises(ValueError, match="must divide splits"):
    md.dense_plan(q, segments, splits=3, warpgroups=4, working=2)


@pytest.mark.parametrize("variant", ["dense", "dense_int2_only", "dense_one_warpgroup"])
def test_in_the_launch_of_the_quantized_pools(interpret, variant, monkeypatch):
  """`mosaic_dense`: a layer's FP16 windows (a range at an odd window, its last tile clamped) and its stacked rest
  segment in the one Mosaic launch of its quantized pools (INT2 and INT4; `dense_int2_only`: INT2 alone, INT4 with
  the dense segments left to Triton), merged by the combine, against float64; no Triton launch where all went."""
  import jax
  import jax.numpy as jnp

  from pallas_kernels import quantized_decode as qd
  b, kh, g, h, window, layers = 2, 2, 7, mi.HEAD_DIM, mi.WINDOW, 2
  rng = np.random.default_rng(9)

  shapes = ((16, 4), (4, 4), (2, 9))
  k_pools, v_pools = (tuple(random_pool(rng, b, kh, bits, w) for bits, w in shapes) for _ in range(2))
  offsets, counts, slice_windows = jnp.array([1, 0, 3]), jnp.array([3, 3, 5]), (4, 3, 6)
  rest_k, rest_v = (jnp.asarray(rng.normal(size=(layers, b, kh, 80, h)), jnp.bfloat16) for _ in range(2))
  rest_len, layer = jnp.array([64, 75]), jnp.array(1)
  qg = jnp.asarray(rng.normal(size=(b, kh, g, h)), jnp.float32)
  config = dict(dense=qd.MOSAIC_DENSE, dense_int2_only=qd.default_with({}, mosaic_dense=True, int4_mosaic=False),
                dense_one_warpgroup=qd.DecodeConfig(int2_mosaic=True, int4_mosaic=True, mosaic_dense=True))[variant]
  together = []  # the plans of each launch_together
  monkeypatch.setattr(mi, "launch_together", lambda plans, _launch=mi.launch_together: (
      together.append(len(plans)), _launch(plans))[1])
  pool_tokens = tuple(w * window for w in slice_windows)
  attend = lambda: qd.quantized_decode(qg, k_pools, v_pools, offsets, counts, rest_k, rest_v, rest_len,
                                       window_size=window, tokens_hint=sum(pool_tokens) + 80, pool_tokens=pool_tokens,
                                       q_scale=h ** -0.5, config=config, rest_layer=layer,
                                       interpret=interpret is not None)
  triton = "wq_quantized_decode" in str(jax.make_jaxpr(attend)())
  out = attend()
  want = qd.reference(qg * h ** -0.5, k_pools, v_pools, offsets, counts, rest_k[1], rest_v[1], rest_len,
                      window_size=window)
  np.testing.assert_allclose(np.asarray(out), np.asarray(want), atol=5e-3, rtol=0)
  all_mosaic = variant != "dense_int2_only"
  assert triton == (not all_mosaic)
  assert set(together) == ({3} if all_mosaic else set())  # INT2, INT4 and the dense plan


def test_dense_ctas_take_their_share_of_the_sms():
  """At batch 8 (32 pairs) on 132 SMs a quarter is 33 dense CTAs: a CTA a pair, two splits; the quantized pools
  share the other 99 SMs' wave. Half: 66, two CTAs a pair."""
  from pallas_kernels import quantized_decode as qd
  config = dataclasses.replace(qd.MOSAIC_DENSE, multiprocessors=132)
  quantized, splits = qd.dense_launch_config(config, 32, 2)
  assert splits == 2 and quantized.multiprocessors == 99
  assert quantized.mosaic_programs_per_multiprocessor == config.mosaic_programs_per_multiprocessor // 2
  _, splits = qd.dense_launch_config(dataclasses.replace(config, mosaic_dense_share=0.5), 32, 2)
  assert splits == 4
  _, splits = qd.dense_launch_config(config, 240, 2)  # more pairs than its CTAs: still a CTA a pair
  assert splits == 2


def test_the_launch_lowers_for_cuda():
  """The quantized pools and the dense plan in one launch lower as one Mosaic GPU custom call."""
  import jax
  import jax.numpy as jnp

  from pallas_kernels import mosaic_dense as md
  from pallas_kernels import quantized_decode as qd
  n, g, h = 8, 7, mi.HEAD_DIM
  config = qd.large_batch(qd.DecodeConfig(multiprocessors=132, mosaic_dense=True))
  S = jax.ShapeDtypeStruct

  def launch(q, k16, v16, rest_k, rest_v, *pool):
    segments = [md.Segment(k16, v16, jnp.arange(n), jnp.full((n,), 32), jnp.full((n,), 4000)),
                md.Segment(rest_k, rest_v, jnp.arange(n), jnp.zeros((n,), jnp.int32), jnp.full((n,), 64))]
    quantized, splits = qd.dense_launch_config(config, n, 1)
    windows = pool[0].shape[1] // mi.WINDOW
    pool_splits, options = qd.mosaic_plan(n, windows, 2, quantized)
    plans = [mi.range_plan(q, *pool, 0, windows, windows=windows, splits=pool_splits, **options),
             md.dense_plan(q, segments, splits=splits, warpgroups=options["warpgroups"], working=2,
                           approx_math=options.get("approx_math", False))]
    return mi.launch_together(plans)
  codes, meta = S((n, 2048, h // 4), np.uint8), S((n, 2048 // mi.WINDOW, h), np.float16)
  text = jax.jit(launch).trace(S((n, g, h), np.float32), *[S((n, 4096, h), jnp.bfloat16)] * 2,
                               *[S((n, 80, h), jnp.bfloat16)] * 2, codes, meta, meta, codes, meta, meta).lower(
      lowering_platforms=("cuda",)).as_text()
  assert text.count("mosaic_gpu") >= 1 and "wq_quantized_decode" not in text
