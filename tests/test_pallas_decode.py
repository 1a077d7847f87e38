"""The Pallas decode kernel (interpret mode on CPU) against "dequantize, then attend" and the XLA path.

One compiled kernel serves every layer of a case (the layer's ranges are
values), so each case checks uneven, empty and full pools at the price of one
compile. The last test lowers the kernels for CUDA (Triton) without a GPU.
"""
import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from pallas_kernels import mosaic_int2 as mi
from pallas_kernels import quantized_decode as qd
from pallas_kernels import registration
from wq_jax import attention, cache

VISUAL_START = 5
WINDOW = 16
ONE_LAUNCH = dict(int4_launch=None)  # every pool in one pallas_call (by default INT4 pools take their own)
TILED = qd.DecodeConfig(tile_windows=2, int4_tile_windows=None, dense_tokens=32,
                        min_tokens_per_split=64, **ONE_LAUNCH)  # every quantized pool two windows a step
ONE_WINDOW = qd.DecodeConfig(tile_windows=1, dense_tokens=32, min_tokens_per_split=64, **ONE_LAUNCH)


def make_cache(seed, *, batch, kv_heads, head_dim, windows, value_group=0, dtype=jnp.float32):
  """Three layers: a random mix, one with no high-precision window, one with only high precision."""
  rng = np.random.default_rng(seed)
  tail = 3  # visual tokens past the last window stay in the rest segment
  tokens = VISUAL_START + windows * WINDOW + tail + 9
  k1, k2, k3 = jax.random.split(jax.random.PRNGKey(seed), 3)
  shape = (3, batch, kv_heads, tokens, head_dim)
  offset = jax.random.normal(k3, (1, 1, kv_heads, 1, head_dim)) * 3  # outlier channels, as real keys have
  k = (jax.random.normal(k1, shape) + offset).astype(dtype)
  v = jax.random.normal(k2, shape).astype(dtype)
  plan = rng.choice([16, 4, 2], size=(3, windows), p=[0.2, 0.3, 0.5]).astype(np.int32)
  plan[1] = rng.choice([4, 2], size=windows)
  plan[2] = 16
  seq_lens = [tokens - int(rng.integers(0, 9)) for _ in range(batch)]
  return cache.build_cache(k, v, plan, visual_start=VISUAL_START, num_visual=windows * WINDOW + tail,
                           seq_lens=seq_lens, max_new_tokens=4, window_size=WINDOW,
                           value_channel_group=value_group)


def kernel_fn(config):
  """The kernel on one layer, through the registration's pool conversion."""
  @jax.jit
  def run(qg, layer):
    return qd.quantized_decode(qg, *pool_arrays(layer), layer.offsets, layer.counts, layer.rest_k, layer.rest_v,
                               layer.rest_len, window_size=layer.window_size, config=config, interpret=True)
  return run


def pool_arrays(layer):
  return [tuple(registration._arrays(p, n) for p, n in zip(pools, layer.slice_windows))
          for pools in (layer.k_pools, layer.v_pools)]


def check_case(seed, *, batch, kv_heads, group, head_dim, windows=7, value_group=0, dtype=jnp.float32,
               config=TILED, rtol=2e-3):
  c = make_cache(seed, batch=batch, kv_heads=kv_heads, head_dim=head_dim, windows=windows,
                 value_group=value_group, dtype=dtype)
  q = jax.random.normal(jax.random.PRNGKey(seed + 100), (batch, kv_heads * group, head_dim))
  qg = q.reshape(batch, kv_heads, group, head_dim) * head_dim ** -0.5
  run = kernel_fn(config)
  xla = jax.jit(lambda q, layer: attention.decode_attention(q, layer))
  dequantized = jax.jit(attention.reference_attention)
  file_reference = jax.jit(lambda qg, layer: qd.reference(
      qg, *pool_arrays(layer), layer.offsets, layer.counts, layer.rest_k, layer.rest_v, layer.rest_len,
      window_size=WINDOW))
  for l in range(c.num_layers):
    layer = c.layer(l)
    got = run(qg, layer).reshape(batch, kv_heads * group, head_dim)
    assert bool(jnp.isfinite(got).all())
    want = dequantized(q, *cache.dequantized_layer(c, l))
    tol = rtol * float(jnp.abs(want).max())
    for name, other in [("dequantize, then attend", want), ("xla", xla(q, layer)),
                        ("the kernel file's reference", file_reference(qg, layer).reshape(got.shape))]:
      np.testing.assert_allclose(np.asarray(got), np.asarray(other, np.float32), rtol=0, atol=tol,
                                 err_msg=f"layer {l} against {name}")


# More splits than steps: most programs see nothing, and their (m, l, o) must not disturb the sum.
MANY_SPLITS = qd.DecodeConfig(tile_windows=1, dense_tokens=16, min_tokens_per_split=1, multiprocessors=64,
                              round_to_waves=False, **ONE_LAUNCH)
# Scales folded into q and into the P.V sums instead of dequantizing each code (an option).
FACTORED = qd.DecodeConfig(tile_windows=2, dense_tokens=32, min_tokens_per_split=64, factored=True, **ONE_LAUNCH)
# INT4 pools stepping a window at a time beside INT2 pools stepping two.
INT4_ONE = qd.DecodeConfig(tile_windows=2, int4_tile_windows=1, dense_tokens=32, min_tokens_per_split=64,
                           **ONE_LAUNCH)
# INT4 pools in a launch of their own, with other splits: the combine merges both launches' phases.
INT4_APART = qd.DecodeConfig(tile_windows=2, dense_tokens=32, min_tokens_per_split=64, int4_launch_min_tokens=0,
                             int4_launch=qd.DecodeConfig(num_warps=2, tile_windows=2, int4_tile_windows=None,
                                                         min_tokens_per_split=16, round_to_waves=False))

# A program runs every phase (segment kind) in turn, or one program runs one phase (by default: small calls).
IN_TURN = dataclasses.replace(TILED, parallel_phases=False)
IN_PARALLEL = dataclasses.replace(INT4_APART, parallel_phases=True)
# The softmax's running sum reduced across the row every step (by default a tile, reduced once a loop).
SUM_A_STEP = dataclasses.replace(TILED, deferred_sum=False)


@pytest.mark.parametrize("batch,kv_heads,group,head_dim,value_group,config", [
    (3, 2, 7, 128, 0, TILED),         # Qwen2-7B's GQA ratio, odd batch
    (1, 2, 8, 64, 16, ONE_WINDOW),      # KIVI values: per token over 16 channels
    (3, 1, 1, 64, 0, MANY_SPLITS),    # multi-head (ratio 1), empty splits
    (1, 2, 2, 128, 32, TILED),        # KIVI with a group as wide as an INT2 byte block
    (2, 1, 7, 64, 32, TILED),         # KIVI groups wider than an INT2 part (a group holds two parts)
    # the configurations' own paths at one request (CI's time: the odd batches are the cases above)
    (1, 2, 7, 128, 0, FACTORED),
    (1, 2, 8, 64, 16, FACTORED),      # KIVI values stay dequantized per token
    (1, 2, 7, 128, 0, INT4_ONE),
    (1, 2, 7, 128, 0, INT4_APART),
    (1, 2, 8, 64, 16, INT4_APART),    # KIVI values in both launches
    (1, 2, 7, 128, 0, IN_TURN),
    (1, 2, 8, 64, 16, IN_TURN),
    (1, 2, 7, 128, 0, IN_PARALLEL),
    (1, 2, 8, 64, 32, IN_PARALLEL),
    (1, 2, 7, 128, 0, SUM_A_STEP),
])
def test_matches_dequantize_then_attend(batch, kv_heads, group, head_dim, value_group, config):
  check_case(batch * 10 + group, batch=batch, kv_heads=kv_heads, group=group, head_dim=head_dim,
             value_group=value_group, config=config)


@pytest.mark.parametrize("batch,tokens", [(8, 32768), (60, 32768), (1, 1024), (32, 19600), (60, 1500)])
def test_split_count_fills_whole_waves(batch, tokens):
  """The grid never ends in a nearly empty wave (544 programs on 132 slots once cost five waves)."""
  cfg = qd.DecodeConfig(multiprocessors=132)
  slots = 132 * cfg.programs_per_multiprocessor
  j = qd.num_splits(batch, 4, tokens, cfg)
  programs = batch * 4 * j
  assert 1 <= j <= tokens // cfg.min_tokens_per_split
  waves = -(-programs // slots)
  assert programs / (waves * slots) >= 0.9 or waves == 1, (j, programs)


@pytest.mark.parametrize("batch,steps", [(8, 256), (60, 256), (32, 154), (1, 154), (1, 3), (20, 9)])
def test_mosaic_split_count_weighs_waves(batch, steps):
  """The Mosaic INT2 launch's splits: never more than the steps, and never a last wave under half full
  where fewer or more splits would fill it (batch 60 once got 2 splits: 480 programs on 396 slots)."""
  cfg = qd.DecodeConfig(multiprocessors=132)
  slots = 132 * cfg.mosaic_programs_per_multiprocessor
  j = qd.mosaic_splits(batch * 4, steps, cfg)
  assert 1 <= j <= steps
  programs = batch * 4 * j
  waves = -(-programs // slots)
  assert waves == 1 or programs - (waves - 1) * slots >= slots // 2, (j, programs)
  if batch * 4 < slots and steps >= slots:  # a single wave with room left is filled
    assert programs > slots // 2, (j, programs)


def test_large_launches_take_the_mosaic_kernel():
  """The default tiling puts the INT2, INT4 and KIVI pools through the Mosaic kernel (`MOSAIC_DEFAULT`'s: s32's
  `MOSAIC_LEAN_EIGHT` with KIVI's INT2 values from registers since s37) only where it won (on an H200; below 128
  pairs on an H100, s43): many (request, KV head) pairs and a pool of 512 tokens or more, or 32 pairs and a pool of
  8k, not in interpret mode; an explicit configuration is left as it is, and TRITON_ONLY never switches."""
  default = qd.DecodeConfig()
  big = qd.for_launch(default, 128, 1 << 15, interpret=False)
  assert big.int2_mosaic and big.mosaic_min_pairs is None
  assert big.int4_mosaic and big.kivi_mosaic
  assert dict(big.mosaic_options) == dict(qd.MOSAIC_LEAN_EIGHT.mosaic_options, narrow_scores=True,
                                          narrow_values=True,  # s32's kernel, its wgmmas 8 wide since s39
                                          fetch_warp_by_group=True,  # and its copies spread since s47
                                          values_by_ldmatrix=True)  # and V's codes by ldmatrix since s48
  assert dict(big.mosaic_options)["eight_column_softmax"]
  assert big.mosaic_programs_per_multiprocessor == 4 and big.fused_combine  # the two sets merged in one launch
  assert dataclasses.replace(big, mosaic_min_pairs=128) == qd.MOSAIC_DEFAULT
  assert qd.MOSAIC_WIDE == dataclasses.replace(qd.MOSAIC_LEAN_EIGHT, kivi_token_scaled_bits=(2,),
                                               mosaic_min_splits=2)
  assert qd.MOSAIC_DEFAULT == dataclasses.replace(qd.MOSAIC_WIDE, mosaic_options=tuple(
      dict(qd.MOSAIC_LEAN_EIGHT.mosaic_options, narrow_scores=True, narrow_values=True,
           fetch_warp_by_group=True,  # a group's copies by its warp g % 4 since s47
           values_by_ldmatrix=True).items()),  # V's INT2 codes by ldmatrix since s48 (INT4's not)
      kivi_narrow_scores=True,  # KIVI's INT2 pools' score wgmma 8 wide too since s46
      int4_values_by_ldmatrix=False)
  assert big.int4_values_by_ldmatrix is False
  if qd._multiprocessors(big) == 132:  # an H200's (or a CPU's stand-in): 4 x 132 slots hold 128 pairs x 4 splits
    assert qd.mosaic_splits(128, 306, big) == 4 and qd.mosaic_splits(128, 306, qd.MOSAIC_FOUR_WARPGROUPS) == 8
    # since s38: batch 60's 240 pairs at 2 splits (a CTA two pairs' splits), 4 before
    assert qd.mosaic_splits(240, 15, big) == 2 and qd.mosaic_splits(240, 15, qd.MOSAIC_FOUR_SPLITS) == 4
    # where 3 splits would be rounded up to 4 (a second wave of 4 CTAs), the search goes on as with 4 at least
    assert qd.mosaic_splits(136, 306, big) == qd.mosaic_splits(136, 306, qd.MOSAIC_FOUR_SPLITS) == 6
  assert dataclasses.replace(big, int2_mosaic=False, mosaic_min_pairs=128,
                             **{k: getattr(default, k) for k in qd.LARGE_BATCH_MOSAIC}) == default
  short = default.mosaic_min_pool_tokens - 32
  # below 128 pairs (since s43) only long pools: batch 8 x 16k's 8k-token INT2 pool, not 8 x 8k's 4k, nor 16 pairs
  for pairs, tokens, interpret in ((127, 1 << 12, False), (128, short, False), (128, 1 << 15, True),
                                   (31, 1 << 15, False), (32, (1 << 13) - 32, False), (32, 1 << 15, True)):
    assert qd.for_launch(default, pairs, tokens, interpret=interpret) is default
  assert qd.for_launch(default, 32, 1 << 13, interpret=False) == big
  assert qd.for_launch(qd.TRITON_ONLY, 1024, 1 << 17, interpret=False) is qd.TRITON_ONLY
  assert qd.for_launch(qd.MOSAIC_LAGGED_MAX, 1024, 1 << 17, interpret=False) is qd.MOSAIC_LAGGED_MAX
  assert default.int4_launch.mosaic_min_pairs is None  # the INT4 launch's own tiling never switches


def test_pool_options_keep_permuted_keys_to_int2():
  """MOSAIC_LEAN_ALL's options as each pool takes them: INT2 keeps the permuted keys, INT4 goes without them (the
  kernel refuses them there), KIVI's values go through shared memory; the copies by one warp stay for all.
  MOSAIC_LEAN_FOLDED's folded minimums stay off KIVI's pools."""
  lean = dict(qd.MOSAIC_LEAN_ALL.mosaic_options)
  assert lean["permuted_keys"] and lean["fetch_by_one_warp"] and lean["values_in_registers"]
  assert qd.pool_options(lean, 2, kivi=False) == lean
  int4 = qd.pool_options(lean, 4, kivi=False)
  assert not int4["permuted_keys"] and int4["values_in_registers"] and int4["fetch_by_one_warp"]
  kivi4 = qd.pool_options(lean, 4, kivi=True)
  assert kivi4["values_per_token"] and not kivi4["values_in_registers"] and not kivi4["permuted_keys"]
  assert qd.pool_options(lean, 2, kivi=True)["permuted_keys"]
  assert lean == dict(qd.MOSAIC_LEAN_ALL.mosaic_options)  # the configuration's own options untouched
  folded = dict(qd.MOSAIC_LEAN_FOLDED.mosaic_options)  # the folded minimums: windows' pools, not KIVI's
  assert qd.pool_options(folded, 2, kivi=False)["folded_minimums"]
  assert qd.pool_options(folded, 4, kivi=False)["folded_minimums"]  # INT4's values in registers
  assert not any(qd.pool_options(folded, bits, kivi=True)["folded_minimums"] for bits in (2, 4))
  assert qd.pool_options(folded, 4, kivi=False, int4_permuted_keys=True)["permuted_keys"]  # opted in (s30)
  assert not qd.pool_options(folded, 4, kivi=True, int4_permuted_keys=True)["permuted_keys"]
  scaled = qd.MOSAIC_KIVI_SCALED_P  # KIVI's values from registers (s37): KIVI's pools only
  assert all(qd.pool_options(dict(scaled.mosaic_options), bits, kivi=True, kivi_token_scaled=True)["token_scaled_p"]
             for bits in (2, 4))
  assert "token_scaled_p" not in qd.pool_options(dict(scaled.mosaic_options), 2, kivi=False, kivi_token_scaled=True)
  assert qd.LARGE_BATCH_MOSAIC["kivi_token_scaled_bits"] == (2,)  # the default: KIVI's INT2 pools (s37)
  by_ldmatrix = dict(qd.MOSAIC_LEAN_EIGHT_VLDSM.mosaic_options)  # V's codes by ldmatrix: windows' pools (s35)
  assert all(qd.pool_options(by_ldmatrix, bits, kivi=False)["values_by_ldmatrix"] for bits in (2, 4))
  assert not any(qd.pool_options(by_ldmatrix, bits, kivi=True).get("values_by_ldmatrix") for bits in (2, 4))
  deep = dict(qd.MOSAIC_STAGES3.mosaic_options)  # deeper pipelines: INT2 windows' pools only (s45)
  assert qd.pool_options(deep, 2, kivi=False)["stages"] == 3
  assert not any("stages" in qd.pool_options(deep, bits, kivi) for bits, kivi in ((4, False), (2, True), (4, True)))
  narrow = dict(qd.MOSAIC_DEFAULT.mosaic_options)  # KIVI's INT2 pools' narrow score wgmma, where asked (s45)
  assert not any(k in qd.pool_options(narrow, 2, kivi=True) for k in ("narrow_scores", "narrow_values"))
  kivi_narrow = qd.pool_options(narrow, 2, kivi=True, kivi_narrow_scores=True)
  assert kivi_narrow["narrow_scores"] and "narrow_values" not in kivi_narrow
  assert "narrow_scores" not in qd.pool_options(narrow, 4, kivi=True, kivi_narrow_scores=True)
  # the large-batch default asks for them since s46; "pallas:mosaic_kivi_wide" does not
  assert qd.LARGE_BATCH_MOSAIC["kivi_narrow_scores"] and qd.large_batch(qd.DecodeConfig()).kivi_narrow_scores
  assert not qd.MOSAIC_KIVI_WIDE.kivi_narrow_scores
  assert not qd.for_launch(qd.MOSAIC_KIVI_WIDE, 128, 1 << 16, interpret=False).kivi_narrow_scores
  # what `kernel_experiments.sh kivi_check` holds to float64 on a device is the default's KIVI INT2 kernel
  default_kivi2 = qd.pool_options(dict(qd.MOSAIC_DEFAULT.mosaic_options), 2, kivi=True, kivi_token_scaled=True,
                                  kivi_narrow_scores=True)
  set_options = lambda options: {k: v for k, v in options.items() if v}
  assert set_options(default_kivi2) == set_options(mi.VARIANTS["wg4_large_batch_ftz_kivi_eight_scaled_p_narrow"])
  paired = dict(qd.MOSAIC_PAIRED.mosaic_options)  # two steps under one softmax (s38): INT2 windows' pools only
  assert qd.pool_options(paired, 2, kivi=False) == paired and paired["steps_per_block"] == 2
  for bits, kivi in ((4, False), (2, True), (4, True)):
    options = qd.pool_options(paired, bits, kivi=kivi)
    assert "paired_steps" not in options and options["steps_per_block"] == 1
  narrow = dict(qd.MOSAIC_DEFAULT.mosaic_options)  # both wgmmas 8 wide (s39): INT2 windows' pools only
  assert qd.pool_options(narrow, 2, kivi=False)["narrow_values"] and narrow["narrow_scores"]
  for bits, kivi in ((4, False), (2, True), (4, True)):
    options = qd.pool_options(narrow, bits, kivi=kivi)
    assert "narrow_scores" not in options and "narrow_values" not in options
  # copies issued by warp g % 4 of each group (s47's default): INT2 windows' pools (and C's paged INT2 launches,
  # `mosaic_plan` too) only; "pallas:mosaic_warp0_copies" keeps them on each group's warp 0
  spread = dict(qd.MOSAIC_DEFAULT.mosaic_options)
  assert spread["fetch_warp_by_group"] and qd.pool_options(spread, 2, kivi=False)["fetch_warp_by_group"]
  assert qd.mosaic_plan(128, 600, 2, qd.MOSAIC_DEFAULT)[1]["fetch_warp_by_group"]
  for bits, kivi in ((4, False), (2, True), (4, True)):
    assert "fetch_warp_by_group" not in qd.pool_options(spread, bits, kivi=kivi)
  assert not dict(qd.MOSAIC_WARP0_COPIES.mosaic_options)["fetch_warp_by_group"]
  assert dict(qd.MOSAIC_WARP0_COPIES.mosaic_options, fetch_warp_by_group=True) == spread
  # V's codes by ldmatrix (s48's default): INT2 windows' pools and C's paged INT2 launches; INT4's and KIVI's pools
  # go without (`int4_values_by_ldmatrix`); "pallas:mosaic_no_vldsm" is s47's default
  vldsm = dict(qd.MOSAIC_DEFAULT.mosaic_options)
  assert vldsm["values_by_ldmatrix"] and qd.mosaic_plan(128, 600, 2, qd.MOSAIC_DEFAULT)[1]["values_by_ldmatrix"]
  for bits, kivi in ((4, False), (2, True), (4, True)):
    assert "values_by_ldmatrix" not in qd.mosaic_plan(128, 600, bits, qd.MOSAIC_DEFAULT, kivi=kivi)[1]
  assert qd.pool_options(vldsm, 4, kivi=False)["values_by_ldmatrix"]  # where a configuration keeps INT4's (s35's)
  assert not dict(qd.MOSAIC_NO_VLDSM.mosaic_options)["values_by_ldmatrix"]
  assert dict(qd.MOSAIC_NO_VLDSM.mosaic_options, values_by_ldmatrix=True) == vldsm
  assert set_options(qd.mosaic_plan(128, 600, 2, qd.MOSAIC_DEFAULT)[1]) == set_options(
      mi.VARIANTS["wg4_large_batch_ftz_lean_folded_eight_narrow_both_spread_vldsm"])  # the variant timed in s48


def test_registered_as_pallas_on_a_bf16_cache():
  """decode_attention(implementation="pallas") with the default tiling, on bf16 codes built by OR-ing
  into 128.0 (exact), so only the bf16 rounding of q s and p separates it from the float32 reference."""
  c = make_cache(11, batch=2, kv_heads=1, head_dim=64, windows=9, dtype=jnp.bfloat16)
  q = jax.random.normal(jax.random.PRNGKey(12), (2, 7, 64))
  run = jax.jit(lambda q, layer: attention.decode_attention(q, layer, implementation="pallas"))
  dequantized = jax.jit(attention.reference_attention)
  for l in range(c.num_layers):
    want = dequantized(q, *cache.dequantized_layer(c, l))
    got = run(q, c.layer(l)).astype(jnp.float32)
    err = float(jnp.linalg.norm(got - want) / jnp.linalg.norm(want))
    assert err < 1e-2, (l, err)


def test_lowers_to_triton_for_cuda():
  """The Triton lowering accepts every primitive the kernel uses (bf16, KIVI values, GQA 7)."""
  c = make_cache(14, batch=1, kv_heads=2, head_dim=128, windows=8, value_group=32, dtype=jnp.bfloat16)
  qg = jax.random.normal(jax.random.PRNGKey(15), (1, 2, 7, 128))

  def run(qg, layer):
    return qd.quantized_decode(qg, *pool_arrays(layer), layer.offsets, layer.counts, layer.rest_k, layer.rest_v,
                               layer.rest_len, window_size=WINDOW)

  text = jax.jit(run).trace(qg, c.layer(0)).lower(lowering_platforms=("cuda",)).as_text()
  assert "wq_quantized_decode" in text


def test_step_width_by_pool_kind():
  """INT4 pools in a launch of their own (by default where they are many) run at 2 warps, two windows a
  step; sharing the 4-warp launch they step one (their two-window loop needs too many registers for
  three programs an SM); without an INT4 width every pool takes tile_windows."""
  cfg = qd.DecodeConfig()
  assert qd._tile_windows(cfg, 2) == 2
  assert cfg.int4_launch.num_warps == 2 and qd._tile_windows(cfg.int4_launch, 4) == 2
  assert cfg.int4_launch.int4_launch is None
  assert qd._tile_windows(INT4_ONE, 4) == 1
  assert qd._tile_windows(TILED, 4) == 2


def test_int4_launch_only_where_it_pays():
  """By default INT4 pools take a launch of their own only with enough INT4 tokens to fill it: a small
  call stays one pallas_call (a second launch cost more GPU time than it saved at batch 1 x 1k)."""
  cfg = qd.DecodeConfig()
  assert not qd.int4_launch_pays(cfg, 1 * 4 * 352)  # batch 1, 1k tokens, 35 % INT4
  assert qd.int4_launch_pays(cfg, 8 * 4 * 11_456)  # batch 8, 32k tokens
  assert not qd.int4_launch_pays(qd.DecodeConfig(int4_launch=None), 1 << 30)
  c = make_cache(16, batch=1, kv_heads=2, head_dim=64, windows=8)
  qg = jax.random.normal(jax.random.PRNGKey(17), (1, 2, 7, 64))
  layer = c.layer(1)  # INT4 and INT2 windows only

  def launches(config):
    jaxpr = jax.make_jaxpr(lambda qg, layer: qd.quantized_decode(
        qg, *pool_arrays(layer), layer.offsets, layer.counts, layer.rest_k, layer.rest_v, layer.rest_len,
        window_size=WINDOW, config=config, interpret=True))(qg, layer)
    return str(jaxpr).count("pallas_call")

  assert launches(cfg) == 1
  assert launches(INT4_APART) == 2


def test_phases_in_parallel_only_within_two_waves():
  """By default a program runs one phase only where that grid still fits two waves: batch 1 x 1k and
  8 x 1k tokens (4 heads x 8 splits x 3 phases: 96 and 768 programs on 396 slots), not batch 1 x 32k
  or 8 x 32k, whose programs fill waves already."""
  cfg = qd.DecodeConfig(multiprocessors=132, min_tokens_per_split=128)  # 8 splits at 1k
  small = 4 * qd.num_splits(1, 4, 1024, cfg)
  assert qd.phases_in_parallel(cfg, small, 3)
  assert qd.phases_in_parallel(cfg, 32 * qd.num_splits(8, 4, 1024, cfg), 3)
  assert not qd.phases_in_parallel(cfg, small, 1)  # nothing to spread
  assert not qd.phases_in_parallel(dataclasses.replace(cfg, parallel_phases=False), small, 3)
  assert not qd.phases_in_parallel(cfg, 4 * qd.num_splits(1, 4, 32768, cfg), 3)
  assert not qd.phases_in_parallel(cfg, 32 * qd.num_splits(8, 4, 32768, cfg), 3)
  assert not qd.phases_in_parallel(dataclasses.replace(cfg, parallel_phase_waves=1.0),
                                   32 * qd.num_splits(8, 4, 1024, cfg), 3)
  assert qd.phases_in_parallel(dataclasses.replace(cfg, parallel_phases=True), 10_000, 2)


@pytest.mark.parametrize("parts,group,blocks", [(13, 7, 1), (4, 8, 4), (1, 7, None), (99, 7, 2), (5, 1, 8), (6, 16, 2)])
def test_combine_kernel_matches_combine_splits(parts, group, blocks):
  """The one-launch combine of one set against XLA's, on fresh partial softmaxes: empty parts (m at its start
  value, l = 0), a looped part count (99), one to eight channel blocks and the grid's own choice, 16 heads."""
  b, kh, gp, h = 2, 2, 16, 128  # the interpret mode's time goes with the programs (b x kh x blocks): CI time
  k1, k2, k3, k4 = jax.random.split(jax.random.PRNGKey(parts * 10 + group), 4)
  o = jax.random.normal(k1, (b, kh, parts, gp, h)) * 5
  m = jax.random.normal(k2, (b, kh, parts, gp)) * 4
  l = jax.random.uniform(k3, (b, kh, parts, gp), minval=0.5, maxval=3.0)
  empty = jax.random.bernoulli(k4, 0.3, (b, kh, parts, 1))
  m, l, o = jnp.where(empty, qd._NEG, m), jnp.where(empty, 0.0, l), jnp.where(empty[..., None], 0.0, o)
  want = qd.combine_splits(o, m, l)[:, :, :group]
  got = jax.jit(lambda *a: qd.combine_kernel([a], group, channel_blocks=blocks, interpret=True))(o, m, l)
  np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-5, atol=1e-5)


def test_mosaic_pools_share_one_launch_below_64_pairs():
  """(s52) `mosaic_launch_config`: a layer's Mosaic pools in one launch below `mosaic_one_launch_below_pairs` (64),
  each pool's grid its share of a wave (batch 8 x 32k: 8 splits a pair, not 16: 64 CTAs a pool, 128 in all); a
  launch each at 128 pairs or for one pool; forced either way by `mosaic_one_launch`."""
  config = qd.large_batch(qd.DecodeConfig(multiprocessors=132))
  together, shared = qd.mosaic_launch_config(config, 32, 2)
  assert together and shared.mosaic_programs_per_multiprocessor == config.mosaic_programs_per_multiprocessor // 2
  assert qd.mosaic_plan(32, 512, 2, config)[0] == 16 and qd.mosaic_plan(32, 512, 2, shared)[0] == 8
  assert qd.mosaic_launch_config(config, 128, 2) == (False, config)
  assert qd.mosaic_launch_config(config, 32, 1) == (False, config)
  never = dataclasses.replace(config, mosaic_one_launch=False)
  assert qd.mosaic_launch_config(never, 32, 2) == (False, never)
  always = dataclasses.replace(config, mosaic_one_launch=True, mosaic_one_launch_shares_wave=False)
  assert qd.mosaic_launch_config(always, 240, 2) == (True, always)


def test_combine_channel_blocks_fill_the_device():
  """~8 one-warp programs an SM (132 here), 4 channels a block at least."""
  cfg = qd.DecodeConfig(multiprocessors=132)
  assert qd.combine_channel_blocks(240, 128, cfg) == 4  # batch 60: 960 programs
  assert qd.combine_channel_blocks(128, 128, cfg) == 8  # 32 x 100
  assert qd.combine_channel_blocks(32, 128, cfg) == 32  # batch 8: 4 channels a block, the least
  assert qd.combine_channel_blocks(4, 128, cfg) == 32
  assert qd.combine_channel_blocks(4, 64, cfg) == 16
  assert qd.combine_channel_blocks(2000, 128, cfg) == 1
  assert qd.combine_channel_blocks(4, 128, dataclasses.replace(cfg, combine_channel_blocks=2)) == 2
  assert qd.combine_channel_blocks(128, 128, dataclasses.replace(cfg, combine_programs_per_multiprocessor=2)) == 2


def test_combine_kernel_with_four_channels_a_program():
  """The merge at 32 channel blocks of 4 channels (batch 8's grid since s51), one (request, KV head), both kinds of
  set, against `combine_sets` on fresh partials."""
  keys = iter(jax.random.split(jax.random.PRNGKey(12), 8))
  sets = [_row_set(keys, 1, 1, 3, 16, 128), _heads_last_set(keys, 1, 1, 4, 128, parities=1)]
  want = _combine_sets(sets, 7)
  got = jax.jit(lambda *s: qd.combine_kernel(s, 7, channel_blocks=32, interpret=True))(*sets)
  np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-5, atol=1e-5)


_combine_sets = jax.jit(qd.combine_sets, static_argnums=1)  # the reference, compiled once (not an op at a time)


def test_combine_sets_matches_combine_splits_of_the_concatenation():
  """Two sets of partials of 16 and 8 rows (the Triton and Mosaic launches'), merged where they lie, against
  `combine_splits` over their concatenation padded to 16 rows; a set whose parts are all empty for a row."""
  b, kh, h, group = 2, 3, 64, 7
  keys = iter(jax.random.split(jax.random.PRNGKey(3), 8))
  sets = []
  for parts, rows in ((5, 16), (6, 8)):
    o = jax.random.normal(next(keys), (b, kh, parts, rows, h)) * 5
    m = jax.random.normal(next(keys), (b, kh, parts, rows)) * 4
    l = jax.random.uniform(next(keys), (b, kh, parts, rows), minval=0.5, maxval=3.0)
    sets.append((o, m, l))
  o, m, l = sets[1]
  sets[1] = (o.at[0].set(0.0), m.at[0].set(qd._NEG), l.at[0].set(0.0))  # request 0: no window in this set
  pad = ((0, 0),) * 3 + ((0, 8),)
  padded = (jnp.pad(sets[1][0], pad + ((0, 0),)), jnp.pad(sets[1][1], pad, constant_values=qd._NEG),
            jnp.pad(sets[1][2], pad))
  want = jax.jit(qd.combine_splits)(*(jnp.concatenate(x, axis=2) for x in zip(sets[0], padded)))[:, :, :group]
  got = _combine_sets(sets, group)
  np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-5, atol=1e-5)
  # the second set heads last, as the Mosaic launch writes it: 6 parts = 3 splits x 2 window parities
  o = sets[1][0]
  heads_last = o.reshape(b, kh, 3, 2, 8, h).transpose(0, 1, 2, 5, 3, 4)  # [B, K, 3, H, 2, 8]
  np.testing.assert_array_equal(np.asarray(qd._rows_first(heads_last)), np.asarray(o))
  got = _combine_sets([sets[0], (heads_last, *sets[1][1:])], group)
  np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-5, atol=1e-5)


def test_mosaic_set_reads_one_or_two_window_parities_a_split():
  """A Mosaic launch's outputs [N, J, H, C] as a set: C = 16 two parities of 8 heads a split, C = 8 one (the
  kernel's `eight_column_softmax` writes no empty columns, s46); m and l follow o's order."""
  b, kh, splits, h = 2, 3, 4, 128
  for columns in (16, 8):
    o_t = jnp.arange(b * kh * splits * h * columns, dtype=jnp.float32).reshape(b * kh, splits, h, columns)
    m = jnp.arange(b * kh * splits * columns, dtype=jnp.float32).reshape(b * kh, splits, columns)
    o, m_set, l_set = qd.mosaic_set(o_t, m, -m, b, kh)
    parities = columns // 8
    assert o.shape == (b, kh, splits, h, parities, 8) and m_set.shape == (b, kh, parities * splits, 8)
    # part p of split j: o's [.., j, :, p, :] and m's row parities * j + p
    np.testing.assert_array_equal(np.asarray(o[1, 2, 3, :, parities - 1]),
                                  np.asarray(o_t[5, 3, :, 8 * (parities - 1):]))
    np.testing.assert_array_equal(np.asarray(m_set[1, 2, parities * 3 + parities - 1]),
                                  np.asarray(m[5, 3, 8 * (parities - 1):]))
    np.testing.assert_array_equal(np.asarray(l_set), -np.asarray(m_set))


def _row_set(keys, b, kh, parts, rows, h, empty_rate=0.3):
  o = jax.random.normal(next(keys), (b, kh, parts, rows, h)) * 5
  m = jax.random.normal(next(keys), (b, kh, parts, rows)) * 4
  l = jax.random.uniform(next(keys), (b, kh, parts, rows), minval=0.5, maxval=3.0)
  empty = jax.random.bernoulli(next(keys), empty_rate, (b, kh, parts, 1))
  return jnp.where(empty[..., None], 0.0, o), jnp.where(empty, qd._NEG, m), jnp.where(empty, 0.0, l)


def _heads_last_set(keys, b, kh, splits, h, parities=2):
  """A Mosaic launch's partials: two window parities a split (16 columns), or one (`eight_column_softmax`)."""
  return (jax.random.normal(next(keys), (b, kh, splits, h, parities, 8)) * 5,
          jax.random.normal(next(keys), (b, kh, parities * splits, 8)) * 4 + 3,
          jax.random.uniform(next(keys), (b, kh, parities * splits, 8), minval=0.5, maxval=3.0))


@pytest.mark.parametrize("triton_parts,mosaic_splits,group,blocks,parities",
                         [(3, 8, 7, None, 2), (1, 2, 8, 1, 2), (5, 1, 1, 8, 2), (3, 20, 7, 2, 2), (3, 8, 7, None, 1),
                          (3, 20, 7, 2, 1)])
def test_combine_kernel_with_heads_last_set_matches_combine_sets(triton_parts, mosaic_splits, group, blocks,
                                                                 parities):
  """The one-launch merge of a Triton set (16 rows) and a Mosaic set (heads last, one or two window parities a
  split) against `combine_sets`, on fresh partials: a request with no window in the Mosaic set, and empty Triton
  parts; loops unrolled and not (20 splits); one to eight channel blocks."""
  b, kh, h = 2, 2, 128  # request 0 has Mosaic windows, request 1 none
  keys = iter(jax.random.split(jax.random.PRNGKey(triton_parts * 7 + mosaic_splits + parities), 8))
  o2, m2, l2 = _heads_last_set(keys, b, kh, mosaic_splits, h, parities)
  o2, m2, l2 = o2.at[1].set(0.0), m2.at[1].set(qd._NEG), l2.at[1].set(0.0)  # request 1: no Mosaic window
  sets = [_row_set(keys, b, kh, triton_parts, 16, h), (o2, m2, l2)]
  want = _combine_sets(sets, group)
  got = jax.jit(lambda *s: qd.combine_kernel(s, group, channel_blocks=blocks, interpret=True))(*sets)
  np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-5, atol=1e-5)


def test_combine_kernel_takes_several_sets_of_each_kind():
  """Two Triton sets (the main and the INT4 launch's, different split counts) and two Mosaic sets (the INT2 and
  INT4 pools' launches, two window parities a split and one) in one launch, against `combine_sets`, on fresh
  partials."""
  b, kh, h, group = 1, 2, 128, 7
  keys = iter(jax.random.split(jax.random.PRNGKey(5), 20))
  sets = [_row_set(keys, b, kh, 3, 16, h), _row_set(keys, b, kh, 18, 16, h),
          _heads_last_set(keys, b, kh, 2, h), _heads_last_set(keys, b, kh, 1, h, parities=1)]
  want = _combine_sets(sets, group)
  got = jax.jit(lambda *s: qd.combine_kernel(s, group, channel_blocks=2, interpret=True))(*sets)
  np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-5, atol=1e-5)


def test_combine_kernel_stores_in_the_asked_dtype():
  """With out_dtype bf16 (what the model's decode step asks for) the merge rounds once as it stores: the float32
  merge's values rounded to bf16, on fresh partials of both kinds."""
  b, kh, h, group = 2, 2, 128, 7
  keys = iter(jax.random.split(jax.random.PRNGKey(9), 8))
  sets = [_row_set(keys, b, kh, 3, 16, h), _heads_last_set(keys, b, kh, 2, h)]
  want = jax.jit(lambda *s: qd.combine_kernel(s, group, channel_blocks=2, interpret=True))(*sets)
  got = jax.jit(lambda *s: qd.combine_kernel(s, group, channel_blocks=2, out_dtype=jnp.bfloat16,
                                             interpret=True))(*sets)
  assert want.dtype == jnp.float32 and got.dtype == jnp.bfloat16
  np.testing.assert_array_equal(np.asarray(got.astype(jnp.float32)),
                                np.asarray(want.astype(jnp.bfloat16).astype(jnp.float32)))


def test_combine_kernel_refuses_heads_last_sets_past_eight_heads():
  keys = iter(jax.random.split(jax.random.PRNGKey(6), 8))
  sets = [_row_set(keys, 1, 2, 3, 16, 128), _heads_last_set(keys, 1, 2, 2, 128)]
  with pytest.raises(ValueError, match="G <= 8"):
    qd.combine_kernel(sets, 9, interpret=True)


def test_combine_kernel_lowers_to_triton_for_cuda():
  sets = [(jnp.zeros((32, 4, 3, 16, 128)), jnp.zeros((32, 4, 3, 16)), jnp.zeros((32, 4, 3, 16))),
          (jnp.zeros((32, 4, 8, 128, 2, 8)), jnp.zeros((32, 4, 16, 8)), jnp.zeros((32, 4, 16, 8)))]
  for mosaic_sets in (0, 1, 2):  # Triton alone; the INT2 pool's launch; the INT4 pool's beside it
    for blocks in (1, 8):
      chosen = sets[:1] + sets[1:] * mosaic_sets
      lowered = jax.jit(lambda *s: qd.combine_kernel(s, group=7, channel_blocks=blocks)).trace(*chosen)
      assert "wq_combine" in lowered.lower(lowering_platforms=("cuda",)).as_text()


def test_fused_combine_through_the_kernel():
  check_case(21, batch=3, kv_heads=2, group=7, head_dim=128, config=dataclasses.replace(TILED, fused_combine=True))


def test_stacked_rest_segment_in_place():
  """Decode's view over every layer's rest segment: the append writes the same token where the per-layer
  view does, and the kernel (reading layer l's rows of the stacked segment) and the XLA path give what
  they give on the layer's own segment."""
  c = make_cache(23, batch=3, kv_heads=2, head_dim=64, windows=6)
  q = jax.random.normal(jax.random.PRNGKey(24), (3, 14, 64))
  k_new, v_new = jax.random.normal(jax.random.PRNGKey(25), (2, 3, 2, 64))
  runs = {name: jax.jit(lambda q, layer, name=name: attention.decode_attention(q, layer, implementation=name))
          for name in ("pallas", "xla")}
  for l in range(c.num_layers):
    own = c.layer(l).append(k_new, v_new)
    stacked = c.layer(l, stacked=True).append(k_new, v_new)
    np.testing.assert_array_equal(np.asarray(stacked.rest_k[l]), np.asarray(own.rest_k))
    np.testing.assert_array_equal(np.asarray(stacked.rest_v[l]), np.asarray(own.rest_v))
    others = np.array([i for i in range(c.num_layers) if i != l])
    np.testing.assert_array_equal(np.asarray(stacked.rest_k[others]), np.asarray(c.rest_k[others]))
    np.testing.assert_array_equal(np.asarray(c.replace_layer(l, stacked).rest_k),
                                  np.asarray(c.replace_layer(l, own).rest_k))
    for implementation, run in runs.items():
      np.testing.assert_allclose(np.asarray(run(q, stacked)), np.asarray(run(q, own)), rtol=0, atol=1e-5,
                                 err_msg=f"layer {l}, {implementation}")
