"""Registers the Pallas kernels as implementations of `wq_jax.attention.decode_attention`.

    "pallas"              quantized_decode.py: split-K flash decoding, Pallas Triton lowering; at large
                          batches, or 32 (request, KV head) pairs and more on long videos (JAX >= 0.11, GPU), its
                          INT2, INT4 and KIVI pools through mosaic_int2.py's Mosaic GPU kernel
                          (`DecodeConfig.mosaic_min_pairs`, `mosaic_min_pairs_long`, MOSAIC_DEFAULT)
    "pallas:triton"       the Triton kernel for every pool at every batch
    "pallas:mosaic_int2"  the same, with the INT2 pool through mosaic_int2.py's Mosaic GPU kernel
                          (JAX >= 0.11 only; pools it does not serve go through the Triton kernel)
    "pallas:mosaic_int2_bias"  that, with the key minimums' biases computed in the Mosaic kernel
                          (`bias_in_kernel`; slower in the 7B step, session 22)
    "pallas:mosaic_int2_keys"  that, with the keys dequantized in registers: no bias (`dequantize_keys`)
    "pallas:mosaic_int2_lagged"  that, with P against the maximum agreed so far (`lagged_max`)
    "pallas:mosaic_int2_int4"  that, and the INT4 pool through the same kernel (slower than the Triton INT4
                          launch at batch 60, session 23)
    "pallas:mosaic_int2_wg4"  keys dequantized, lagged maximum, four programs (warpgroups) a CTA
    "pallas:mosaic_int2_wg4_merged"  that, with the two launches' partials merged in one Pallas launch
                                     (9.98 ms against 10.09, 32 x 100, s24)
    "pallas:mosaic_int2_wg4_pdl"  that kernel launched under PDL, where XLA allows it (no faster, s24)
    "pallas:mosaic_int2_wg4_after"  the merged one, the values' codes through the V wgmma as they are, each
                                    step's product scaled after it (slower, session 24)
    "pallas:mosaic_int2_wg4_in_place"  the merged one, O^T accumulated in place and magic exponents (9.71 ms
                                       against 9.96, 32 x 100, s25)
    "pallas:mosaic_int2_wg4_all"  that, with the scales and minimums loaded by ldmatrix (slower, s25)
    "pallas:mosaic_int2_wg4_ftz"  the in-place one with ex2.approx.ftz (9.62 ms against 9.65, 32 x 100, s25)
    "pallas:mosaic_int2_wg4_ftz_block2"  that, two 64-token steps a pipeline iteration (slower, s25)
    "pallas:mosaic_int2_wg4_ftz_j4"  the ftz one, 4 splits a pair at least, not 8 (9.42 ms against 9.73,
                                     32 x 100, s25)
    "pallas:mosaic_int2_wg4_vregs"  that, V^T as the V wgmma's register operand: what "pallas" runs at large
                                    batches (the kernel 16 % faster, s26)
    "pallas:mosaic_int2_wg4_vregs_int4"  that, and the INT4 pool through the same kernel (untimed, s27)
    "pallas:mosaic_int2_wg4_lean"  the V^T one with the keys' channels permuted and a block's copies issued by
                                   one warp (untimed, s27)
    "pallas:mosaic_int2_wg4_kivi"  vregs_int4, and KIVI's pools through the Mosaic kernel (untimed, s27)
    "pallas:mosaic_wg4_lean_all"  the lean kernel for INT2, INT4 and KIVI's pools (s28's kernel winners)
    "pallas:mosaic_wg4_lean_folded"  that, the magic number folded into the minimums: what "pallas" runs at
                                     large batches in s30-s31 (the INT2 kernel 3-4 % faster on an H100)
    "pallas:mosaic_wg4_lean_int4_keys"  that, and INT4 pools' keys permuted as INT2's (no faster on an H100, s30)
    "pallas:mosaic_wg4_lean_eight"  lean_folded with the softmax on 8 columns, not 16 half masked: what "pallas"
                                     ran at large batches in s32-s36 (all-INT2 5 % faster on H100 and H200); since
                                     s37 the default takes KIVI's INT2 pools' values from registers
    "pallas:mosaic_wg4_lean_eight_vldsm"  that, INT2 and INT4 pools' value codes by `ldmatrix.trans` (< 1 % faster
                                          on an H100, s35)
    "pallas:mosaic_wg4_kivi_scaled_p"  lean_eight with KIVI's INT2 and INT4 values from registers, P times a
                                       token's scale (s37, H100: kivi2's step at 32 x 100 4.6 % faster)
    "pallas:mosaic_four_splits"  the default's kernels with 4 splits a pair at least, a CTA's four warpgroups one
                                 pair's (the default until s37; since s38 2 splits where one wave holds them, batch
                                 >= 45: 60 x 5's step 1.6-2.3 % faster on an H100)
    "pallas:mosaic_paired"  the default, INT2 pools' blocks of two steps under one softmax (s38; no faster on an
                            H100, s39: its hot loop executes 345.5 SASS a 64 keys against 333)
    "pallas:mosaic_wide"  s38's default: INT2 windows' pools with both wgmmas 16 columns wide, half of them waste
                          (since s39 the default runs them 8 wide: the 7B step at 32 x 100 3.3 % faster on an H100)
    "pallas:triton_first"  the default, its Triton launch (16-bit windows and the rest) before the Mosaic ones
                           by a data dependency (s45, H100: the 7B step 1-2 % slower)
    "pallas:mosaic_stages3"  the default, INT2 windows' pools with 3 (4) pipeline stages, not 2 (s45)
    "pallas:mosaic_stages4"
    "pallas:mosaic_kivi_wide"  the default, KIVI's INT2 pools' score wgmma 16 columns wide (until s46; since, 8
                               wide: kivi2's step at 32 x 100 2.8 % faster on an H100)
    "pallas:mosaic_wide_output"  the default, its Mosaic launches' partials 16 columns wide, 8 empty (until s46)
    "pallas:mosaic_spread"  the default (since s47): each warpgroup's copies issued by its warp g % 4 (s46)
    "pallas:mosaic_warp0_copies"  the default, each warpgroup's copies issued by its warp 0 (until s47)
    "pallas:mosaic_no_vldsm"  the default, V's INT2 codes by byte loads, not ldmatrix.trans (until s48)
    "pallas:mosaic_factored"  the default, INT2 windows' pools with the factored keys (s49: the scales in q's
                              operand, the keys as magic + code, the minimums a bias a window)
    "pallas:mosaic_one_launch"  the default, a layer's Mosaic pools (INT2, INT4, KIVI's) in one launch at every
                                batch, each CTA its own pool's kernel (`mosaic_int2.launch_together`); the default
                                does so below 64 (request, KV head) pairs since s52 (batch 8 x 32k: 7-8 % shorter
                                serial span on an H100)
    "pallas:mosaic_separate"  the default with a launch a Mosaic pool at every batch, as until s52
    "pallas:mosaic_dense"     (s53) the default with a layer's 16-bit segments in its Mosaic launch where its pools
                              share one (below 64 pairs), no Triton launch
    "pallas:fused_combine"  the default, its partials merged in one Pallas launch at every batch (XLA's kernels
                            merge them where the large-batch kernel does not run)
    "pallas:split128"  the default with splits of 128 tokens or more (the default until s35; 256 since)
    "pallas:combine_one_block"  the default, its merged combine (large batches) on one program a (request, KV
                                head), the grid before s33 (no channel blocks)

Ablation C's unreordered cache (`wq_jax.interleaved`) is not a `LayerCache`: under any of these names
`decode_attention` reads it with `interleaved_decode.py`'s paged kernel (one format at a time through the
cache's page table; since session 41 its INT4 and INT2 windows through the Mosaic kernel's page table where the
reordered pools of those widths take that kernel, except under "pallas:triton", which keeps the Triton paged
kernel for every format; since s46 those Mosaic launches take the name's configuration, as its pools do), and with
XLA's every-format reader where that kernel cannot read it (float32 caches).

On a CPU backend the same kernels run with `interpret=True` (that is how CI
tests them; the Mosaic GPU kernel in Mosaic GPU's interpret mode, under JAX >= 0.11).
"""
from __future__ import annotations

import functools

import jax
from jaxtyping import Array, Float

from pallas_kernels import mosaic_int2, quantized_decode
from wq_jax import attention
from wq_jax.cache import LayerCache, Pool


def _arrays(pool: Pool, used_windows: int) -> quantized_decode.PoolArrays | None:
  """A pool as the kernel takes it; None where no layer has a window there."""
  if used_windows == 0 or pool.data.shape[2] == 0:
    return None
  return quantized_decode.PoolArrays(pool.data, pool.scale, pool.minimum, pool.bits, pool.channel_group)


CONFIGS: dict[str, quantized_decode.DecodeConfig] = {}  # what each name registered here runs


def layer_attention(qg: Float[Array, "B K G H"], layer: LayerCache, *, scale: float,
                    config: quantized_decode.DecodeConfig) -> Float[Array, "B K G H"]:
  """The kernel with tiling `config` on one layer of a cache (what each registered name runs; the benchmarks call
  it with their own configurations), in q's dtype (`decode_attention` casts to it anyway: the merge's launch
  then stores it so, with no convert kernel after). The launches are planned on the tokens a layer can own in
  each pool, not on the pools' arrays, which hold every layer's windows."""
  k_pools = tuple(_arrays(p, n) for p, n in zip(layer.k_pools, layer.slice_windows))
  v_pools = tuple(_arrays(p, n) for p, n in zip(layer.v_pools, layer.slice_windows))
  # The most tokens a layer can own: it sets the split count, so it must be static.
  pool_tokens = tuple(n * layer.window_size for n in layer.slice_windows)
  return quantized_decode.quantized_decode(
      qg, k_pools, v_pools, layer.offsets, layer.counts, layer.rest_k, layer.rest_v, layer.rest_len,
      window_size=layer.window_size, tokens_hint=sum(pool_tokens) + layer.capacity,
      pool_tokens=pool_tokens, config=config, q_scale=scale, rest_layer=layer.layer, out_dtype=qg.dtype,
      interpret=jax.default_backend() == "cpu")


def register_variant(name: str, config: quantized_decode.DecodeConfig) -> None:
  """Registers the kernel with tiling `config` as implementation `name` (benchmarks time variants
  end to end this way)."""
  CONFIGS[name] = config
  attention.register(name, scales_q=True)(functools.partial(layer_attention, config=config))


register_variant("pallas", quantized_decode.DecodeConfig())
register_variant("pallas:triton", quantized_decode.TRITON_ONLY)
register_variant("pallas:fused_combine", quantized_decode.DecodeConfig(fused_combine=True))
register_variant("pallas:combine_one_block", quantized_decode.DecodeConfig(combine_channel_blocks=1))
# s33-s50's merge at 32 x 100 (128 pairs: 4 blocks of 32 channels, 4 warps a program), beside s51's (8 blocks, 1 warp)
register_variant("pallas:combine_four_warps", quantized_decode.DecodeConfig(combine_channel_blocks=4, combine_warps=4))
register_variant("pallas:split128", quantized_decode.DecodeConfig(min_tokens_per_split=128))  # the default until s35
if mosaic_int2.available():
  register_variant("pallas:mosaic_int2", quantized_decode.DecodeConfig(int2_mosaic=True))
  register_variant("pallas:mosaic_int2_bias", quantized_decode.MOSAIC_BIAS_IN_KERNEL)
  register_variant("pallas:mosaic_int2_keys", quantized_decode.MOSAIC_DEQUANTIZED_KEYS)
  register_variant("pallas:mosaic_int2_lagged", quantized_decode.MOSAIC_LAGGED_MAX)
  register_variant("pallas:mosaic_int2_int4", quantized_decode.MOSAIC_INT2_INT4)
  register_variant("pallas:mosaic_int2_wg4", quantized_decode.MOSAIC_FOUR_WARPGROUPS)
  register_variant("pallas:mosaic_int2_wg4_merged", quantized_decode.MOSAIC_FOUR_WARPGROUPS_MERGED)
  register_variant("pallas:mosaic_int2_wg4_pdl", quantized_decode.MOSAIC_FOUR_WARPGROUPS_PDL)
  register_variant("pallas:mosaic_int2_wg4_after", quantized_decode.MOSAIC_FOUR_WARPGROUPS_VALUES_AFTER)
  register_variant("pallas:mosaic_int2_wg4_in_place", quantized_decode.MOSAIC_FOUR_WARPGROUPS_IN_PLACE)
  register_variant("pallas:mosaic_int2_wg4_all", quantized_decode.MOSAIC_FOUR_WARPGROUPS_ALL)
  register_variant("pallas:mosaic_int2_wg4_ftz", quantized_decode.MOSAIC_FOUR_WARPGROUPS_FTZ)
  register_variant("pallas:mosaic_int2_wg4_ftz_block2", quantized_decode.MOSAIC_FOUR_WARPGROUPS_FTZ_BLOCK2)
  register_variant("pallas:mosaic_int2_wg4_ftz_j4", quantized_decode.MOSAIC_FOUR_WARPGROUPS_FTZ_J4)
  register_variant("pallas:mosaic_int2_wg4_vregs", quantized_decode.MOSAIC_FOUR_WARPGROUPS_VREGS)
  register_variant("pallas:mosaic_int2_wg4_vregs_int4", quantized_decode.MOSAIC_FOUR_WARPGROUPS_VREGS_INT4)
  register_variant("pallas:mosaic_int2_wg4_lean", quantized_decode.MOSAIC_FOUR_WARPGROUPS_LEAN)
  register_variant("pallas:mosaic_int2_wg4_kivi", quantized_decode.MOSAIC_KIVI)
  register_variant("pallas:mosaic_wg4_lean_all", quantized_decode.MOSAIC_LEAN_ALL)
  register_variant("pallas:mosaic_wg4_lean_folded", quantized_decode.MOSAIC_LEAN_FOLDED)
  register_variant("pallas:mosaic_wg4_lean_int4_keys", quantized_decode.MOSAIC_LEAN_INT4_KEYS)
  register_variant("pallas:mosaic_wg4_lean_eight", quantized_decode.MOSAIC_LEAN_EIGHT)
  register_variant("pallas:mosaic_wg4_lean_eight_vldsm", quantized_decode.MOSAIC_LEAN_EIGHT_VLDSM)
  register_variant("pallas:mosaic_wg4_kivi_scaled_p", quantized_decode.MOSAIC_KIVI_SCALED_P)
  register_variant("pallas:mosaic_four_splits", quantized_decode.MOSAIC_FOUR_SPLITS)
  register_variant("pallas:mosaic_paired", quantized_decode.MOSAIC_PAIRED)
  register_variant("pallas:mosaic_wide", quantized_decode.MOSAIC_WIDE)
  register_variant("pallas:triton_first", quantized_decode.DecodeConfig(triton_first=True))
  register_variant("pallas:mosaic_stages3", quantized_decode.MOSAIC_STAGES3)
  register_variant("pallas:mosaic_stages4", quantized_decode.MOSAIC_STAGES4)
  register_variant("pallas:mosaic_kivi_wide", quantized_decode.MOSAIC_KIVI_WIDE)
  register_variant("pallas:mosaic_wide_output", quantized_decode.MOSAIC_WIDE_OUTPUT)
  register_variant("pallas:mosaic_spread", quantized_decode.MOSAIC_SPREAD)
  register_variant("pallas:mosaic_warp0_copies", quantized_decode.MOSAIC_WARP0_COPIES)
  register_variant("pallas:mosaic_no_vldsm", quantized_decode.MOSAIC_NO_VLDSM)
  register_variant("pallas:mosaic_factored", quantized_decode.MOSAIC_FACTORED)
  # s52: a layer's Mosaic pools in one launch at every batch (the default: below 64 pairs), or a launch each (until s52)
  register_variant("pallas:mosaic_one_launch", quantized_decode.DecodeConfig(mosaic_one_launch=True))
  register_variant("pallas:mosaic_separate", quantized_decode.DecodeConfig(mosaic_one_launch=False))
  register_variant("pallas:mosaic_dense", quantized_decode.DecodeConfig(mosaic_dense=True))
