"""Split-K flash decoding over one layer of the three-pool KV cache (Pallas, Triton lowering).

Axes: B batch, K KV heads, G query heads per KV head (padded to Gp >= 16, the
smallest tensor-core tile), H head dim, S window size, W windows in a pool,
T tokens, R rest tokens, J splits of the key axis, C channels per value group,
P codes a byte.

The layout, as arrays (wq_jax.cache builds it):
    pool data       [B, K, W*S, H] high precision, or uint8 codes [B, K, W*S, H/P]
                    packed "split" style: byte j holds channels j, j + H/P, ...
    scale, minimum  [B, K, W, H]: one pair per window and channel (a value is
                    scale * code + minimum), or, for values grouped per token
                    (KIVI), [B, K, W*S, H/C]
    ranges          the layer owns windows [offset[p], offset[p] + count[p]) of pool p
    rest            [B, K, R, H]; request b has rest_len[b] valid tokens

One program serves one (request, KV head, split) and all G query heads of that
KV head. It streams its share of every segment once: the high-precision pools
and the rest in one online softmax (phase 0), each quantized pool in its own
(one phase each; the combine step merges phases like more splits).

A quantized step reads `tile` windows of codes, [tile * S, H/P] bytes (two
windows for INT2 pools, one for INT4 pools, whose two-window loop needs too
many registers for three programs an SM; `DecodeConfig`),
and dequantizes them in registers into P half-precision tiles, part k holding
channels [k H/P, (k + 1) H/P): the "split" packing makes every part a plain
shift and mask of the same bytes, and a block of columns of q (keys) or of the
output (values), so no register shuffles are needed. On the GPU one PTX
snippet per part turns four bytes into four halves with a byte permute, the
part's bits masked in place and OR-ed into the bits of 2^(10 - k bits), whose
mantissa bit k bits is worth 1 (code c of part k becomes 2^(10 - k bits) + c
exactly), one f16x2 subtract and one f16x2 fma with the window's scale and
minimum. The tiles then meet the tensor cores as in a high-precision step: one K dot per
part, one softmax update, one P.V dot per part.

Small calls, whose time is each program's serial latency, run one program a
phase instead (`DecodeConfig.parallel_phases`, by default where that grid fits
two waves of resident programs): batch 1 x 1k went from 13.2 to 8.7 us of GPU time.

INT4 pools take a launch of their own by default (`DecodeConfig.int4_launch`)
where they hold enough tokens to fill it, with their own warps and splits; the
combine merges its phases with the others'.

Every array is passed whole, as rows, and all sizes (tokens a pool holds, rest
capacity, split count) are data, so the compiled kernel depends on head shapes
only and one compilation serves every batch and video length.

Three layers: `_kernel` over refs, `quantized_decode` (the pallas_call with its
grid and BlockSpecs, and the combine), and `reference` (pure jnp: dequantize,
then attend). A Mosaic GPU version would be one more module with the same
signature, registered under another name; `mosaic_int2.py` is its INT2 part (`DecodeConfig.int2_mosaic`).
"""
from __future__ import annotations

import dataclasses
import functools
import itertools
import math
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from pallas_kernels import mosaic_dense, mosaic_int2
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu
from jaxtyping import Array, Float, Int

_NEG = -1e30  # the running max starts finite, so exp2(m_old - m_new) is never inf - inf
# Scores are kept in base 2 (q carries log2 e), so the softmax takes exp2: one MUFU.EX2 an element where
# exp is a libdevice routine of several instructions around it.
_LOG2E = math.log2(math.e)
# Entries of the int32 `sizes` operand (pool p at _TOKENS + p). _PAIRS is B * K: a stacked rest segment's
# (layer, request, head) starts at row (layer * _PAIRS + request * K + head) * capacity.
_SPLITS, _TOKENS, _REST_CAPACITY, _PAIRS = 0, 1, 4, 5


@functools.partial(jax.tree_util.register_dataclass, data_fields=["data", "scale", "minimum"],
                   meta_fields=["bits", "channel_group"])
@dataclasses.dataclass(frozen=True)
class PoolArrays:
  """One pool of the cache, for keys or values (the fields of wq_jax.cache.Pool)."""
  data: jax.Array  # [B, K, W*S, H] values, or [B, K, W*S, H/P] uint8 codes
  scale: jax.Array | None  # [B, K, W, H], or [B, K, W*S, H/C] with channel_group C
  minimum: jax.Array | None  # -scale * zero-point: a value is scale * code + minimum
  bits: int
  channel_group: int = 0


@dataclasses.dataclass(frozen=True)
class DecodeConfig:
  """Tiling knobs; the defaults were chosen on an H200 (benchmarks/decode_attention.py)."""
  tile_windows: int = 2  # quantized windows a loop step reads
  # INT4 pools' own step (None: tile_windows). At 2 windows the INT4 loop needs ~170 registers, and a
  # warp's registers come in units of 8 a thread: 3 programs of 4 warps no longer fit an SM. At 1
  # window it needs ~145 (KIVI's INT2 loop needs 146 at 2).
  int4_tile_windows: int | None = 1
  # INT4 pools in a launch of their own with this tiling (its num_warps, programs_per_multiprocessor,
  # tile_windows...); None: one launch for every segment. At 2 warps and 2 windows a step INT4 ran
  # 116 µs at batch 8, 32k tokens, against 157 in the 4-warp launch (INT2 runs 3x slower at 2 warps),
  # and the mixed plan 153 against 163 (H200, 2026-12-03).
  int4_launch: DecodeConfig | None = dataclasses.field(default_factory=lambda: DecodeConfig(
      num_warps=2, tile_windows=2, int4_tile_windows=None, programs_per_multiprocessor=6, int4_launch=None,
      mosaic_min_pairs=None))
  # ... where the INT4 pools hold at least this many tokens over all (request, KV head) pairs. A launch
  # costs a few µs of GPU time: at batch 1 x 1k (1.4k such tokens) the second launch and the split of
  # its results made the call 21.4 µs against 14.8 in one launch; at batch 8 x 32k (367k) it saved 10.
  int4_launch_min_tokens: int = 1 << 18
  dense_tokens: int = 64  # high-precision and rest tokens a loop step reads
  programs_per_multiprocessor: int = 3  # resident at once: 4 warps of <= 168 registers leave room for three
  multiprocessors: int | None = None  # None: the device's count (132 on an H200)
  round_to_waves: bool = True  # pick the split count by whole waves of programs (else: fill one wave)
  program_tokens: int = 256  # a program's fixed cost, in keys streamed (for the split count)
  # 256 since session 35 (128 before): short calls' programs then read 256 keys or more, fewer programs each
  # paying a start. Mixed plan, GPU span a call, H100 (`decode_attention_s35_b{1,8}_{1k,8k}_variants_h100.md`):
  # 1 x 1k 8.8 against 10.8 µs, 1 x 8k 16.0 against 20.0, 8 x 1k 13.2 against 18.2; the 7B step, where the
  # weights bound it, the same at 1 x 100 and 20 x 5 (6.048 against 6.059 ms windowquant, 6.063 against 6.053
  # fp16; `decode_throughput_*_s35_split256_h100.md`). Long calls' splits are longer than this anyway.
  min_tokens_per_split: int = 256
  num_warps: int = 4
  num_stages: int = 3
  # One program a phase (segment kind) instead of one running them in turn; None: where that grid still
  # fits `parallel_phase_waves` waves of resident programs (small calls, whose time is each program's
  # serial latency).
  parallel_phases: bool | None = None
  # Mixed plan, µs of GPU time, a program a phase against phases in turn (H200, 2026-12-03, one run each):
  # 1 x 1k (0.24 waves) 8.7 / 13.2; 8 x 1k and 1 x 8k (1.94 waves) 16.7 / 18.0 and 17.9 / 19.4;
  # 8 x 8k (2.9) 48.0 / 48.3; 1 x 32k (3.0) 32.6 / 31.3.
  parallel_phase_waves: float = 2.0
  inline_asm: bool = True  # unpack codes with f16x2 PTX (GPU); plain jnp ops otherwise (and in interpret mode)
  # With inline_asm, the softmax's exp2 as `ex2.approx.ftz.f32` (`_exp2_ftz`): one instruction, not four.
  fast_exp2: bool = True
  # Carry the softmax's running sum as a tile and sum its rows once a loop, not once a step (a reduction
  # across warps: shared memory and a barrier a step). Off for the factored form, whose steps sum p anyway.
  deferred_sum: bool = True
  factored: bool = False  # scales folded into q (keys) and applied to P.V sums (values); else dequantize each code
  # Merge the partial softmaxes in one Pallas launch (`combine_kernel`) rather than XLA's four or more small kernels
  # (max, weights and sum, weighted sum, slice to G rows). Off by default at small batches: with one program a
  # (request, KV head) merging its parts in turn (until session 33) it was slower where it was meant to help,
  # 22-42 µs a launch at batch 1 against ~6 µs of XLA's kernels (1 x 100 frames: 6.85 against 6.44 ms a step,
  # fp16, H200, 2026-12-03); `LARGE_BATCH_MOSAIC` takes it. Since session 33 its grid adds channel blocks, and
  # at small batches it still loses: 1 x 100, windowquant 6.274 against 6.067 ms, fp16 6.180 against 6.092 (H100,
  # `decode_throughput_*_s33_fused_combine_h100.md`).
  fused_combine: bool = False
  combine_channel_blocks: int | None = None  # the combine's channel blocks; None: `combine_channel_blocks`
  # Warps a combine program, and programs a multiprocessor its grid aims at (`combine_channel_blocks`). Since s51
  # one warp and ~8 programs an SM (4 channels a block at least), where s33-s50 had four warps and ~2 (16 at least).
  # H100, the merge's GPU µs (`results/s51_combine_b{8,32,60}_h100.md`, `s51_b8_combine_serial_h100.md`): batch
  # 8 x 32k (32 pairs, 32 blocks) 5.7 / 5.5 against 7.3 / 7.1; 32 x 19,968 (128 pairs, 8 blocks) 4.2 against 6.2;
  # 60 x 32k (240 pairs, 4 blocks) 4.7 against 4.7.
  combine_warps: int = 1
  combine_programs_per_multiprocessor: int = 8
  # The INT2 pool (window-wise key and value scales, window 32, head dim 128, G <= 8) in a launch of
  # `mosaic_int2.py`'s Mosaic GPU kernel (JAX >= 0.11), merged with the other launches' partials by the
  # combine. On for every launch here ("pallas:mosaic_int2" and the other MOSAIC_* configurations); the
  # default turns it on for large launches only (`mosaic_min_pairs` below). With these options (session 22's
  # variant) the 7B step at 32 x 100 was 11.50 ms against the Triton kernel's 10.73: the XLA work for the
  # key minimums' bias outweighed the kernel's gain (`decode_profile_*_mosaic_s22_gpu.md`).
  int2_mosaic: bool = False
  int4_mosaic: bool = False  # the INT4 pool through the same kernel, in a launch of its own (see MOSAIC_INT2_INT4)
  # KIVI's pools (values per token and group of 32 channels) through the Mosaic kernel too, their values through
  # shared memory (`mosaic_int2`'s `values_per_token`; see MOSAIC_KIVI), where their width is served
  kivi_mosaic: bool = False
  # The bit widths of KIVI's pools whose values come from registers: the V wgmma on the exact codes against P times
  # each token's scale, the minimums summed beside l (`mosaic_int2`'s `token_scaled_p`); other KIVI pools' values
  # go through shared memory
  kivi_token_scaled_bits: tuple = ()
  # INT4 pools with `permuted_keys` too (`mosaic_int2.key_order`'s 64-channel parts; untimed, s30). Off, INT4
  # pools go without it (the option was INT2's until session 30).
  int4_permuted_keys: bool = False
  # INT4 pools keep a configuration's `values_by_ldmatrix` (s35's MOSAIC_LEAN_EIGHT_VLDSM served both widths so).
  # Off in MOSAIC_DEFAULT (s48), whose V-by-ldmatrix kernel was timed and checked on INT2 windows' pools only.
  int4_values_by_ldmatrix: bool = True
  # KIVI's INT2 pools with the score wgmma 8 columns wide (`mosaic_int2`'s `narrow_scores`: their keys are a
  # window's per channel, as WindowQuant's, and dequantized; the V wgmma stays 16 wide, the values not being V^T in
  # registers). The large-batch default since s46 (`MOSAIC_DEFAULT`): kivi2's 7B step at 32 x 100 2.8 % faster on
  # an H100, 8.883 ms against 9.142 (`decode_throughput_*_s46_h100_step_gpu_h100.md`).
  kivi_narrow_scores: bool = False
  mosaic_programs_per_multiprocessor: int = 3  # its 148 registers a thread leave room for three
  # `mosaic_int2.int2_decode` keywords, as (name, value) pairs: the fastest variant (H200, 2026-12-04,
  # `mosaic_int2_s21_run2_h200.md`, 32k tokens), the V wgmma waited for in the next step and the values
  # dequantized before the key wgmma: 578 µs against 637 (`fast`) and Triton's 645 at batch 60, 317 against
  # 351 and 345 at batch 32, 94 against 98 and 101 at batch 8. (Until session 22 its partials were sometimes
  # not finite past one wave: a race on the query's buffer, fixed in `mosaic_int2.py`.)
  mosaic_options: tuple = tuple(mosaic_int2.VARIANTS["deferred_values_first"].items())
  # Where int2_mosaic is off, the INT2 pool still goes through the Mosaic kernel (as `LARGE_BATCH_MOSAIC`
  # configures it; on a GPU with JAX >= 0.11) where a launch has at least this many (request, KV head) pairs
  # and the pool at least `mosaic_min_pool_tokens` tokens a layer; None: never. There it wins, in the 7B step
  # at 32 x 100 (128 pairs, pool bound 32k tokens) 10.13 ms against 10.92 with the Triton kernel, and one
  # layer at 32k tokens 278 µs against 345 at batch 32, 544 against 646 at batch 60 (session 23,
  # `decode_throughput_*_s23_gpu.md`, `mosaic_int2_s23_h200.md`); at batch 8 the two tie (151 µs against
  # 152 on the mix) and at 1 x 100 it loses the step (6.84 ms against 5.48: kernels XLA adds there at batch 1).
  # Session 24: with the merged combine `LARGE_BATCH_MOSAIC` now takes, 9.98 ms at 32 x 100 (timed as
  # "pallas:mosaic_int2_wg4_merged"; until `quantized_decode` took the combine from the launch's config, the
  # default's large launches kept XLA's merge: 10.09 ms in the same run). Session 28: every pool the
  # large-batch kernel serves (INT2, INT4, KIVI's) of 8k tokens or more, not INT2 pools of 16k only: the mixed
  # plan at batch 60 x 32k (its INT4 pool 11.5k tokens) 711.6 µs against 739.5 with the INT4 pool in Triton
  # (`decode_attention_b60_pool8k_s28.md`, `decode_attention_b60_s28.md`). Session 33: pools of 512 tokens or
  # more (8k until then). The 7B step at 60 x 5 frames (pools of 27-29 windows a layer) on an H100, every pool
  # through the Mosaic kernel against every pool through Triton's, ms: windowquant 6.963 against 7.083, kivi2
  # 7.117 against 7.381, kivi4 7.261 against 7.634, rtn4 6.973 against 7.040
  # (`decode_throughput_*_s33_small_h100.md`, one run).
  mosaic_min_pairs: int | None = 128
  mosaic_min_pool_tokens: int = 1 << 9
  # ... and, since session 43, at fewer pairs (down to `mosaic_min_pairs_long`) where a pool it serves holds
  # `mosaic_long_pool_tokens` or more a layer. One layer, mixed plan, H100, µs by the clock, Triton default against
  # the large-batch launches (`decode_attention_s43_b8_mosaic_*_h100.md`, one run each): batch 8 x 32k 121.9
  # against 106.5 (INT2 pool 16k tokens), 8 x 16k 83.9 against 70.0 (8k), 16 x 32k 243.5 against 173.1; the Triton
  # launches keep 8 x 8k (61.5 against 77.9; 4k), 4 x 32k (16 pairs: 80.5 against 82.1) and 2 x 128k (8 pairs:
  # 126.9 against 123.0 by the clock, 115.0 against 123.8 by GPU span). s23's tie at batch 8 was an older kernel.
  mosaic_min_pairs_long: int | None = 32
  mosaic_long_pool_tokens: int = 1 << 13
  mosaic_min_splits: int = 8  # `mosaic_splits` starts its search here, or at one wave of programs if more
  # The Triton launch before the Mosaic ones, by a data dependency (the Mosaic launches take q through an
  # optimization barrier with its partials): s44 read batch 8's all-INT2 profile on an H200 as the Triton launch
  # of the rest segment alone (80 tokens a pair) waiting for SMs the Mosaic CTAs hold, 12.7 µs on the critical
  # path. Off ("pallas:triton_first" turns it on): s45, H100, the mixed plan's span at batch 8 x 32k 5 % shorter,
  # the all-INT2 plan's 14 % longer, the 7B step 1.5-1.9 % slower (`results/s45_triton_first_*_h100.md`).
  triton_first: bool = False
  # A layer's Mosaic pools (INT2 and INT4 windows', KIVI's) in one launch (`mosaic_int2.launch_together`: a CTA runs
  # its own pool's kernel, the launch allocates the most shared memory any of them takes), not a launch each: True
  # always, False never, None (the default since s52) where the launch has fewer than `mosaic_one_launch_below_pairs`
  # (request, KV head) pairs. With `mosaic_one_launch_shares_wave` the pools share one wave's programs: each pool's
  # grid is sized for `mosaic_programs_per_multiprocessor` / pools programs an SM (`mosaic_launch_config`). At batch 8
  # x 32k (mix; 32 pairs) the INT2 and INT4 pools' launches were a wave of 128 CTAs each, ~1k keys a program, each
  # launch with its own fill and drain. H100, GPU span of a layer's call, serial graph (`results/s52_*_h100.md`):
  # 32k 87.2 / 87.6 / 86.8 µs against 94.7 / 94.6 / 93.6 with a launch a pool (2.18 TB/s, 73 % of the copy, against
  # 2.01), 16k 54.2 against 61.3; under the concurrent graph 102.2 / 101.8 / 102.4 against 102.5 / 99.0 / 106.9, and
  # 71.3 against 75.4 at 16k. One launch without the shared wave (256 CTAs, two waves): 93.1 / 91.9. At 128 and 240
  # pairs (32 x 19,968, 60 x 32k; each program thousands of keys) one launch is no faster: 182.2-184.8 µs against
  # 184.1, 519.3-522.7 against 513.7.
  mosaic_one_launch: bool | None = None
  mosaic_one_launch_below_pairs: int = 64
  mosaic_one_launch_shares_wave: bool = True
  # (s53) Where a layer's Mosaic pools go in one launch, its 16-bit segments (FP16 windows and the rest) go there
  # too, as `mosaic_dense.dense_plan`'s CTAs, not as a Triton launch after it: at batch 8 x 32k that launch was ~34
  # µs of ~87 (H100, s52), streaming memory while the quantized CTAs before it were bound by their SMs' issue.
  # The dense CTAs take `mosaic_dense_share` of the SMs and the quantized pools share the others' wave; a dense CTA
  # has `mosaic_dense_working` programs of `mosaic_dense_stages` K/V slots each (`mosaic_dense.dense_plan`).
  mosaic_dense: bool = False
  mosaic_dense_share: float = 0.25
  mosaic_dense_working: int = 2
  mosaic_dense_stages: int = 2
  mosaic_dense_lagged_max: bool = True  # `mosaic_dense.dense_plan`'s options
  mosaic_dense_in_place: bool = True


# The Mosaic INT2 launch with its key minimums' biases computed in the kernel, not by an XLA einsum over the
# bound's windows before it ("pallas:mosaic_int2_bias"). Slower in the 7B step (session 22, 32 x 100: 11.68
# ms against Triton's 11.01; its kernel 5.94 ms a step against 5.05 without): the biases are computed before
# the loop, in series with it.
MOSAIC_BIAS_IN_KERNEL = DecodeConfig(
    int2_mosaic=True, mosaic_options=tuple(mosaic_int2.VARIANTS["deferred_values_first_bias"].items()))
# The keys dequantized in registers as the values are: no bias anywhere, q^T stored once
# ("pallas:mosaic_int2_keys"; the kernel alone no faster, session 23).
MOSAIC_DEQUANTIZED_KEYS = DecodeConfig(
    int2_mosaic=True, mosaic_options=tuple(mosaic_int2.VARIANTS["deferred_dequantized_keys"].items()))
# That, with P taken against the maximum agreed so far (`lagged_max`: one barrier a step, not three;
# "pallas:mosaic_int2_lagged"): 8-10 % faster at batch 8-60 (session 23), the 7B step at 32 x 100 10.54 ms.
MOSAIC_LAGGED_MAX = DecodeConfig(
    int2_mosaic=True, mosaic_options=tuple(mosaic_int2.VARIANTS["deferred_dequantized_keys_lagged"].items()))
# That for the INT4 pool too, in a Mosaic launch of its own ("pallas:mosaic_int2_int4"): 1.08 x the Triton INT4
# launch at batch 8 x 32k, 0.91 x at batch 60 (session 23, `mosaic_int4_s23_h200.md`).
MOSAIC_INT2_INT4 = dataclasses.replace(MOSAIC_LAGGED_MAX, int4_mosaic=True)
# Four programs a CTA of 512 threads (ptxas must fit 128 registers: 4 programs an SM), the keys dequantized
# and the lagged maximum, without the deferred V wgmma (its second V and P buffers would take four
# warpgroups' shared memory to ~242 KB, past the H200's 227) ("pallas:mosaic_int2_wg4"; `mosaic_plan`
# rounds the splits up to a multiple of 4), its partials and the Triton launch's merged by XLA. Session 22's
# wrong results (its warpgroups shared Pallas' one reduction scratch) are fixed (`mosaic_int2._column_reduce`):
# the checks and 6-call race runs passed on the H200 (session 23, `mosaic_int2_races_s23.json`), and at batch
# 32 x 32k it is the fastest variant, 278 µs against Triton's 345 (`mosaic_int2_s23_h200.md`).
MOSAIC_FOUR_WARPGROUPS = DecodeConfig(
    int2_mosaic=True, mosaic_programs_per_multiprocessor=4,
    mosaic_options=tuple(mosaic_int2.VARIANTS["values_first_wg4_keys_lagged"].items()))
MOSAIC_FOUR_WARPGROUPS_MERGED = dataclasses.replace(MOSAIC_FOUR_WARPGROUPS, fused_combine=True)
# The four-warpgroup kernel launched under PDL (`grid_dependency_wait`): it may start while the kernel before it
# drains, where XLA's `xla_gpu_enable_pdl` lets custom calls that ask for it ("pallas:mosaic_int2_wg4_pdl"):
# no faster (10.02 ms against 10.09 at 32 x 100, session 24; XLA's PDL is on by default in jaxlib 0.11.2).
MOSAIC_FOUR_WARPGROUPS_PDL = dataclasses.replace(
    MOSAIC_FOUR_WARPGROUPS, mosaic_options=tuple(mosaic_int2.VARIANTS["values_first_wg4_keys_lagged_pdl"].items()))
# The large-batch configuration with the values' codes through the V wgmma as they are and each step's product
# scaled after it (`values_scaled_after`; "pallas:mosaic_int2_wg4_after"): its kernel 347 µs against 277 at batch
# 32 x 32k, 670 against 541 at 60 (session 24, `mosaic_int2_s24_h200.md`), and the 7B step at 32 x 100 11.18 ms
# against the default's 10.02 (`decode_throughput_*_after_s24_gpu.md`, same run).
MOSAIC_FOUR_WARPGROUPS_VALUES_AFTER = dataclasses.replace(
    MOSAIC_FOUR_WARPGROUPS_MERGED,
    mosaic_options=tuple(mosaic_int2.VARIANTS["values_first_wg4_keys_lagged_after"].items()))
# The large-batch configuration with O^T accumulated in place (rescaled only where the maximum moves; the V
# wgmma waited for in the next step) and magic exponents (no 4^-p on the scales; one LOP3 a part since s25)
# ("pallas:mosaic_int2_wg4_in_place"): its kernel 260.7 µs against 274.7 at batch 32 x 32k, 507.6 against 535.3
# at 60, and the 7B step at 32 x 100 9.71 ms against 9.96 (session 25, `mosaic_int2_s25_lop3_h200.md`,
# `decode_throughput_*_s25_lop3_gpu.md`, same runs).
MOSAIC_FOUR_WARPGROUPS_IN_PLACE = dataclasses.replace(
    MOSAIC_FOUR_WARPGROUPS_MERGED,
    mosaic_options=tuple(mosaic_int2.VARIANTS["values_first_wg4_keys_lagged_in_place_magic"].items()))
# That, with the scales and minimums reaching the threads by `ldmatrix` ("pallas:mosaic_int2_wg4_all"): slower,
# 270.2 / 529.8 µs at batch 32 / 60 (session 25), though 51 SASS a step fewer.
MOSAIC_FOUR_WARPGROUPS_ALL = dataclasses.replace(
    MOSAIC_FOUR_WARPGROUPS_MERGED,
    mosaic_options=tuple(mosaic_int2.VARIANTS["values_first_wg4_keys_lagged_all"].items()))
# The in-place kernel with ex2.approx.ftz for every exp2 (Mosaic's `approx_math`; no compare and predicated
# multiplies around each MUFU.EX2: 656 SASS a step against 750) ("pallas:mosaic_int2_wg4_ftz"): 251.0 µs against
# 255.1 at batch 32 x 32k, 491.6 against 497.9 at 60; the 7B step at 32 x 100 9.62 ms against 9.65 (session 25,
# `mosaic_int2_s25_ftz_h200.md`, `decode_throughput_*_s25_ftz_gpu.md`, same runs). With two steps a pipeline
# iteration ("pallas:mosaic_int2_wg4_ftz_block2") 259.6 / 507.7 µs and 9.87 ms: slower (ptxas spills at 128
# registers).
MOSAIC_FOUR_WARPGROUPS_FTZ = dataclasses.replace(
    MOSAIC_FOUR_WARPGROUPS_MERGED, mosaic_options=tuple(mosaic_int2.VARIANTS["wg4_large_batch_ftz"].items()))
MOSAIC_FOUR_WARPGROUPS_FTZ_BLOCK2 = dataclasses.replace(
    MOSAIC_FOUR_WARPGROUPS_MERGED, mosaic_options=tuple(mosaic_int2.VARIANTS["wg4_large_batch_ftz_block2"].items()))
# That with 4 splits a pair at least where the default took 8 ("pallas:mosaic_int2_wg4_ftz_j4"): at 128 pairs one
# wave of programs, twice as many steps each, half the partials to write and merge. At 19,968 tokens (the 7B's
# INT2 pool at 100 frames is ~19.6k) 154.1 µs against 162.3 with 8 splits (12: 169.2) at batch 32, 300.3 against
# 312.8 at 60; the 7B step at 32 x 100 9.42 ms against 9.73 (session 25, `mosaic_int2_s25_splits_h200.md`,
# `decode_throughput_*_s25_splits_gpu.md`, same runs).
MOSAIC_FOUR_WARPGROUPS_FTZ_J4 = dataclasses.replace(MOSAIC_FOUR_WARPGROUPS_FTZ, mosaic_min_splits=4)
# That with V^T as the V wgmma's register operand (`values_in_registers`: no V stored to shared memory nor read
# back by the wgmma, a byte a token and one f16 scale and minimum a part and window; "pallas:mosaic_int2_wg4_vregs"):
# the kernel 128.3 µs against 153.2 at batch 32 x 19,968 tokens, 250.4 against 297.4 at 60 (session 26,
# `mosaic_int2_s26_vregs_h200.md`, same run; ncu had put the V path at 116 of the 168 shared-memory wavefronts
# a warp and step, with the data pipe 80 % busy).
MOSAIC_FOUR_WARPGROUPS_VREGS = dataclasses.replace(
    MOSAIC_FOUR_WARPGROUPS_FTZ_J4, mosaic_options=tuple(mosaic_int2.VARIANTS["wg4_large_batch_ftz_vregs"].items()))
# That, with the INT4 pool through the same kernel in a launch of its own (`int4_mosaic`; magic exponents and V^T in
# registers for INT4 since session 27: a token's two code bytes, parts of 64 channels) ("pallas:mosaic_int2_wg4_
# vregs_int4"; untimed: written while no device was lent; 671 SASS in its main loop offline against the INT2
# kernel's 622, `mosaic_sass_s27_int4.md`). For INT4-heavy caches at large batches (rtn4, the mixed plan), whose
# INT4 pools the Triton launch serves by default.
MOSAIC_FOUR_WARPGROUPS_VREGS_INT4 = dataclasses.replace(MOSAIC_FOUR_WARPGROUPS_VREGS, int4_mosaic=True)
# The V^T kernel with the keys' channels permuted (8- and 16-byte loads of a thread's codes and scales) and each
# block's copies issued by one warp of the four ("pallas:mosaic_int2_wg4_lean"; untimed: 561 SASS in its main
# loop offline against 622, `mosaic_sass_s27_prepared.md`; INT2 pools only: `permuted_keys` is INT2's).
MOSAIC_FOUR_WARPGROUPS_LEAN = dataclasses.replace(
    MOSAIC_FOUR_WARPGROUPS_VREGS,
    mosaic_options=tuple(mosaic_int2.VARIANTS["wg4_large_batch_ftz_vregs_permuted_keys_one_warp_fetch"].items()))
# The V^T kernel's configuration with KIVI's pools (INT2 and INT4) through the Mosaic kernel too, their values
# through shared memory (`values_per_token`), and INT4 pools through it as in MOSAIC_FOUR_WARPGROUPS_VREGS_INT4
# ("pallas:mosaic_int2_wg4_kivi"; untimed, s27: 641 SASS in its INT2 main loop offline against 655 for session
# 25's kernel with a window's value metadata). By default kivi2 and kivi4 take the Triton kernel, whose KIVI path
# ran 2.5 x its floor at 32 x 100 (session 26): so that KIVI is compared kernel against kernel.
MOSAIC_KIVI = dataclasses.replace(MOSAIC_FOUR_WARPGROUPS_VREGS_INT4, kivi_mosaic=True)
# The winners of session 28's kernel benches together ("pallas:mosaic_wg4_lean_all"): INT2 pools through the lean
# kernel (permuted keys, copies by one warp: 229.2 µs against the V^T kernel's 251.1 at batch 60 x 19,968), INT4
# pools through the V^T kernel with copies by one warp (260.0 against 305.7, and Triton's 353.5), KIVI's pools
# through the Mosaic kernel (278.0 against Triton's 547.1 without the two cuts; `mosaic_*_s28_h200.md`).
# `pool_options` keeps `permuted_keys` to INT2 pools.
MOSAIC_LEAN_ALL = dataclasses.replace(MOSAIC_KIVI, mosaic_options=MOSAIC_FOUR_WARPGROUPS_LEAN.mosaic_options)
# That with the magic number folded into the minimums in the register paths (`folded_minimums`: the INT2 keys and
# values, INT4's values, not KIVI's pools; "pallas:mosaic_wg4_lean_folded"): 536 SASS in the INT2 main loop
# offline against 561 (`mosaic_sass_s30_folded.md`). Timed on an H100 (s30, the only card lent): the INT2 kernel
# 114.1 µs against 119.3 at batch 32 x 19,968, 222.5 against 230.3 at 60 (`mosaic_int2_s30_folded_h100.md`; INT4,
# memory-bound there, unchanged); the batch-60 x 32k mix 577.6 µs of GPU time against 587.2
# (`decode_attention_s30_b60_variants_h100.md`); the 7B step at 32 x 100 9.270 ms against 9.368, windowquant
# (`decode_throughput_*_s30_folded_step_gpu.md`). Its float64 checks passed, with a larger error where a
# window's key minimums are large (1.8e-3 against 8e-5, the rising-scores case; limit 5e-3).
MOSAIC_LEAN_FOLDED = dataclasses.replace(
    MOSAIC_LEAN_ALL, mosaic_options=tuple(mosaic_int2.VARIANTS["wg4_large_batch_ftz_lean_folded"].items()))
# That with INT4 pools' keys permuted too (`int4_permuted_keys`: a thread's 16 code bytes a row and 16 channels'
# scales and minimums by 16-byte loads, 38 loads a thread and step fewer; "pallas:mosaic_wg4_lean_int4_keys";
# s30: 584 SASS in the INT4 main loop offline against 623 folded and 631 unfolded, 63 shared loads against 101,
# `mosaic_sass_s30_int4.md`; on an H100 no faster, 287.3 µs against 287.8 at batch 60, where INT4 streams 92 % of
# the copy bandwidth, `mosaic_int4_s30_h100.md`; untimed on an H200, where INT4 ran 3.08 TB/s of ~4.0).
MOSAIC_LEAN_INT4_KEYS = dataclasses.replace(MOSAIC_LEAN_FOLDED, int4_permuted_keys=True)
# The folded configuration with its softmax on 8 columns for both windows of a step (`eight_column_softmax`:
# with the keys dequantized a score is q . k in either window, so the 8 columns a thread always masked go;
# "pallas:mosaic_wg4_lean_eight"): 459 SASS in the INT2 main loop offline against 536 (FADD 52 -> 26, FMNMX
# 32 -> 16; `mosaic_sass_s31_eight.md`). Timed on an H100 (s32, same runs; the error against XLA's path the
# same, 3.8e-3): the batch-60 x 32k mix 568.1 µs against 582.9, all-INT2 365.9 against 385.8
# (`decode_attention_s32_b60_bars_h100.md`); the 7B step at 32 x 100 9.107 ms against 9.260, 8.986 against 9.131
# with the concurrent graph (`decode_throughput_*_s32_step_h100.md`). The large-batch default since session 32.
MOSAIC_LEAN_EIGHT = dataclasses.replace(
    MOSAIC_LEAN_FOLDED, mosaic_options=tuple(mosaic_int2.VARIANTS["wg4_large_batch_ftz_lean_folded_eight"].items()))
# That with the INT2 and INT4 pools' value codes brought by `ldmatrix.trans` (`values_by_ldmatrix`: a thread's
# rows of V^T two parts of two adjacent bytes, 2 loads a step where 16 (INT2) or 32 (INT4) byte loads and their
# `prmt` were, and its scales and minimums as pairs of channels; "pallas:mosaic_wg4_lean_eight_vldsm"). s35, H100:
# correct, < 1 % faster (`mosaic_int2_s35_vldsm_h100.md`); untimed on an H200. KIVI's pools take
# MOSAIC_LEAN_EIGHT's path (`pool_options`).
MOSAIC_LEAN_EIGHT_VLDSM = dataclasses.replace(
    MOSAIC_LEAN_EIGHT,
    mosaic_options=tuple(mosaic_int2.VARIANTS["wg4_large_batch_ftz_lean_folded_eight_vldsm"].items()))
# That with KIVI's INT2 and INT4 pools' values from registers (`kivi_token_scaled_bits`: the V wgmma on exact codes in
# two tiles of 64 channels, each against P times the token's scale of their groups;
# "pallas:mosaic_wg4_kivi_scaled_p"). s37: 521 SASS in the INT2 main loop offline against 515 through shared
# memory (`mosaic_sass_s37_kivi.md`), without the V stores and the wgmma's reads of them, which bounded the values'
# path (s26). On an H100 (s37, float64 checks passed): the INT2 kernel at 19,968 tokens 112.9 µs against 129.7
# at batch 32, 220.9 against 254.6 at 60 (`mosaic_kivi_s37_h100.md`); the 7B step's kivi2 at 32 x 100 9.169 ms
# against 9.615, at 60 x 5 7.034 against 7.025, kivi4 at 60 x 5 7.155 against 7.054
# (`decode_throughput_*_s37_kivi_scaled*_h100.md`).
MOSAIC_KIVI_SCALED_P = dataclasses.replace(MOSAIC_LEAN_EIGHT, kivi_token_scaled_bits=(2, 4))
# What the default runs for large launches since s37: MOSAIC_LEAN_EIGHT with KIVI's INT2 pools' values from
# registers (where they won, above); KIVI's INT4 pools keep the shared-memory path (1.4 % slower at 60 x 5 the
# other way, untimed at 32 x 100).
# Since s38 with 2 splits a pair where one wave of CTAs holds them (over 176 pairs on an H200 or H100: batch >= 45),
# a CTA's four warpgroups then the splits of two pairs (`mosaic_int2.int2_decode`): at 60 x 5 frames (a layer's
# pools ~1k tokens) 4 splits were 1.8 waves of 4-step programs (the Mosaic kernel 27 µs a layer on an H100,
# 0.5 TB/s). H100, one run each (`decode_throughput_*_s38_two_splits_h100.md`, `s38_two_splits_*_h100.md`): the 7B
# step at 60 x 5 windowquant 6.698 ms against 6.806, kivi2 6.793 against 6.955; one layer at batch 60, all-INT2
# pools, GPU span 39.5 µs against 46.0 at 1k tokens, 353.6 against 361.7 at 32k.
MOSAIC_WIDE = dataclasses.replace(MOSAIC_LEAN_EIGHT, kivi_token_scaled_bits=(2,), mosaic_min_splits=2)
MOSAIC_FOUR_SPLITS = dataclasses.replace(MOSAIC_WIDE, mosaic_min_splits=4)  # s37's default: 4 splits at least
# Since s39 INT2 windows' pools run both wgmmas 8 columns wide, not 16 (`mosaic_int2`'s `narrow_scores` and
# `narrow_values`: with the keys dequantized S^T's columns 8-15 copied 0-7 and P's were zero); INT4's and KIVI's pools
# keep s38's kernel (`pool_options`: untimed narrow). H100, one run each: the INT2 kernel 107.5 / 206.7 µs at batch
# 32 / 60 x 19,968 against 108.6 / 209.5 (`results/mosaic_int2_s39_overlapped_h100.md`); the 7B step at 32 x 100,
# windowquant, 8.535 ms against 8.822 (`results/decode_throughput_*_s39_narrow_step_gpu_h100.md`). MOSAIC_WIDE
# ("pallas:mosaic_wide") is s38's default.
# Since s47 each warpgroup's copies are issued by its warp g % 4, one group's a scheduler (`fetch_warp_by_group`:
# every group's warp 0 sat on scheduler 0, 16 % more instructions on it a round, offline), for INT2 windows' pools and
# C's paged INT2 launches (`pool_options`). H100, one run each, float64 checks first: the INT2 kernel 99.8 / 193.2 µs
# at batch 32 / 60 x 19,968 against 103.4 / 201.1 (`results/mosaic_int2_s47_spread_h100.md`); the 7B step at
# 32 x 100 C 9.217 ms against 9.563, windowquant 8.421 against 8.468 (`decode_throughput_*_s47_spread_C_gpu_h100.md`).
# Since s48 INT2 windows' pools (and C's paged INT2 launches) read V's codes by `ldmatrix.trans` (s35's
# `values_by_ldmatrix`, now with both wgmmas narrow): two loads a step where 16 byte loads and their `prmt` were, and
# a window's scales and minimums as pairs of channels. H100, one run, float64 checks first
# (`results/mosaic_int2_s48_half_vldsm_h100.md`): the INT2 kernel 95.3 / 185.4 µs at batch 32 / 60 x 19,968 against
# 100.3 / 194.5, and 90.4 against 96.5 at batch 16, where 64 CTAs on half the SMs make the SMs the bound, as on an
# H200. INT4's pools go without it (`int4_values_by_ldmatrix`). MOSAIC_NO_VLDSM ("pallas:mosaic_no_vldsm") is s47's.
MOSAIC_DEFAULT = dataclasses.replace(MOSAIC_WIDE, mosaic_options=tuple(
    mosaic_int2.VARIANTS["wg4_large_batch_ftz_lean_folded_eight_narrow_both_spread_vldsm"].items()),
    kivi_narrow_scores=True, int4_values_by_ldmatrix=False)


def default_with(options: dict, **fields) -> DecodeConfig:
  """MOSAIC_DEFAULT with these `mosaic_int2` options (and DecodeConfig `fields`) changed: a variant of the default."""
  options = dict(MOSAIC_DEFAULT.mosaic_options, **options)
  return dataclasses.replace(MOSAIC_DEFAULT, mosaic_options=tuple(options.items()), **fields)


# (s43) The default's Mosaic launches with CTAs of two warpgroups, the splits sized for one such CTA a multiprocessor
# (116 registers a thread offline): at batch 8 x 32k (32 pairs) four warpgroups a CTA take all of an SM's registers,
# so the Triton launch's memory-bound 16-bit programs cannot run beside the instruction-bound INT2 ones; these CTAs
# leave half of each SM to them (`decode_attention.py`'s `mosaic_wg2`). Slower on an H100 (s43, one layer at batch
# 8 x 32k, mix: 115.0 µs against four warpgroups' 105.9, `decode_attention_s43_b8_wg2_h100.md`): not a default.
MOSAIC_TWO_WARPGROUPS = default_with(dict(warpgroups=2), mosaic_programs_per_multiprocessor=2)
# (s38) The default with a block of two steps under one softmax for INT2 pools (`mosaic_int2`'s `paired_steps`: one
# vote, barrier and branch a 128 keys); INT4's and KIVI's pools keep a softmax a step. No faster on an H100 (s39:
# the 7B step at 32 x 100 8.884 ms against 8.848; ncu: 2 % more instructions executed, the offline count's cut being
# the vote's rare branch; `results/decode_attention_notes.md`, "Session 39").
MOSAIC_PAIRED = dataclasses.replace(MOSAIC_WIDE, mosaic_options=tuple(
    mosaic_int2.VARIANTS["wg4_large_batch_ftz_lean_folded_eight_paired"].items()))
# (s45) The default with 3 and 4 pipeline stages for INT2 windows' pools (more code bytes in flight a warpgroup; INT4's
# and KIVI's pools keep 2: `pool_options`). s36 timed deeper pipelines on an H100 only, slower by ~4 %, where the
# kernel streams 80 % of the copy; on an H200 it streams 57 % at the same speed as on the H100 (s44), so what bounds
# it there may be the bytes in flight. s45, H100: the kernel 0.7-3.8 % slower at 3-4 stages
# (`mosaic_int2_s45_depth_h100.md`); untimed on an H200: `kernel_experiments.sh depth`.
MOSAIC_STAGES3, MOSAIC_STAGES4 = (default_with(dict(stages=stages)) for stages in (3, 4))
# (s45) KIVI's INT2 pools' score wgmma 8 wide (`kivi_narrow_scores`), the default since s46; "pallas:mosaic_kivi_wide"
# runs it 16 wide, as until s46 (H100: kivi2's 7B step at 32 x 100 9.142 ms against the default's 8.883)
MOSAIC_KIVI_WIDE = default_with({}, kivi_narrow_scores=False)
# (s46) Each warpgroup's copies issued by its warp g % 4 (`fetch_warp_by_group`): the default since s47, and
# "pallas:mosaic_spread" its name still; "pallas:mosaic_warp0_copies" issues them by each group's warp 0, as until s47
MOSAIC_SPREAD = MOSAIC_DEFAULT
MOSAIC_WARP0_COPIES = default_with(dict(fetch_warp_by_group=False))
# (s48) The default without V's codes by ldmatrix: s47's default, for the comparison in one run
MOSAIC_NO_VLDSM = default_with(dict(values_by_ldmatrix=False))
# (s49) INT2 windows' pools with the factored keys (`mosaic_int2`'s `factored_keys`: q^T times a step's scales as the
# score wgmma's B, the keys as magic + code with no scale, minimum or fma, the minimums and magic numbers a bias a
# window from one XLA pass); INT4's, KIVI's and C's paged launches keep the default's (`unfactored`). On half an
# H100's SMs the keys' scaling cost 13 % of the kernel (`mosaic_int2_s49_half_scaling`); s50: the factored kernel
# no faster (`mosaic_int2_s50_half_factored_h100`), its bias pass slow: windowquant's 7B step 11.85 ms against 8.48
MOSAIC_FACTORED = default_with(dict(narrow_scores=False, factored_keys=True))
# (s46) The default with the Mosaic launches' partials 16 columns wide, 8 of them empty, as they were until s46 (the
# eight-column softmax's outputs are 8 since): the comparison in one run (`kernel_experiments.sh narrow_out`)
MOSAIC_WIDE_OUTPUT = default_with(dict(sixteen_columns_out=True))
# (s52) The default with a layer's Mosaic pools in one launch at every batch, each pool's grid as alone (256 CTAs at
# batch 8 x 32k: `decode_attention.py`'s "mosaic_one_launch"); and with a launch a pool at every batch, as until s52
MOSAIC_ONE_LAUNCH = default_with({}, mosaic_one_launch=True, mosaic_one_launch_shares_wave=False)
MOSAIC_SEPARATE_LAUNCHES = default_with({}, mosaic_one_launch=False)
# (s53) The default with the 16-bit segments in the Mosaic launch (`mosaic_dense`), by the share of SMs they take
MOSAIC_DENSE = default_with({}, mosaic_dense=True)
# What the default runs for large launches (`for_launch`): MOSAIC_DEFAULT since session 39 (MOSAIC_WIDE in s38,
# MOSAIC_FOUR_SPLITS in s37), MOSAIC_LEAN_EIGHT in s32-s36, MOSAIC_LEAN_FOLDED in sessions 30-31 (above), before
# it MOSAIC_LEAN_ALL (since session 28: the 7B step at 32 x 100 8.52 ms against 8.81 for windowquant, rtn4 9.06
# against 10.13, kivi2 9.04 against 12.94, kivi4 9.58 against 10.32, `decode_throughput_*_s28_lean_all_gpu.md`),
# with the launches' partials merged in one Pallas launch (`combine_kernel`; `combine_with_heads_last_kernel`
# until s33) where XLA takes five or more small kernels a layer. The merged combine: 9.98 ms against 10.09 with
# XLA's merge at 32 x 100 (session 24); for two Mosaic launches (INT2 and INT4 pools) it replaces a transposed,
# concatenated copy and the combine kernel (~40 µs of 545 at batch 60 x 32k, mix; untimed).
LARGE_BATCH_MOSAIC = {k: getattr(MOSAIC_DEFAULT, k) for k in (
    "mosaic_programs_per_multiprocessor", "mosaic_options", "fused_combine", "mosaic_min_splits", "int4_mosaic",
    "kivi_mosaic", "kivi_token_scaled_bits", "kivi_narrow_scores", "int4_values_by_ldmatrix")}
LARGE_BATCH_BITS = (2, 4) if LARGE_BATCH_MOSAIC["int4_mosaic"] else (2,)  # the widths its launches serve
# The Triton kernel for every pool, at every batch ("pallas:triton": the baseline the Mosaic benches compare to).
TRITON_ONLY = DecodeConfig(mosaic_min_pairs=None)


@dataclasses.dataclass(frozen=True)
class _Segment:
  """What the kernel knows statically about one pool."""
  index: int  # pool position in `offsets` / `counts`
  bits: int
  value_group: int  # C, or 0: value scales per window and channel
  block: int  # a step: tokens of a high-precision pool, windows of a quantized one


# ----------------------------------------------------------------------------- kernel


def _exp2_ftz(x):
  """2^x as one MUFU.EX2, results below 2^-126 flushed to zero (softmax weights that small are 0 either way).

  `jnp.exp2` lowers to `ex2.approx.f32`, around which ptxas adds a compare, two predicated multiplies
  to keep denormals: four instructions an element, ~4 % of the all-INT2 step (ncu, H200, 2026-12-03;
  run 13: 3-4 % faster without them).
  """
  return plgpu.elementwise_inline_asm("ex2.approx.ftz.f32 $0, $1;", args=[x], constraints="=f,f", pack=1,
                                      result_shape_dtypes=[jax.ShapeDtypeStruct(x.shape, jnp.float32)])[0]


def _online_softmax(m, l, s, exp2=jnp.exp2):
  """Folds scores [Gp, n] into the running max and sum; returns them, the rescale and p.

  The sum l is a [Gp] vector, or a [Gp, n] tile of per-column sums (`_sum_tile`): then a step adds p
  to it without summing its row, which, with tokens spread over the warps, is a reduction across
  them through shared memory and a barrier; the loop's end sums the tile once (`_sum_rows`).
  """
  m_new = jnp.maximum(m, jnp.max(s, axis=1))
  corr = exp2(m - m_new)
  p = exp2(s - m_new[:, None])
  l = l * corr[:, None] + p if l.ndim == 2 else l * corr + jnp.sum(p, axis=1)
  return m_new, l, corr, p


def _sum_tile(l, n: int, deferred: bool):
  """The running sum l [Gp] as a loop of steps of n scores carries it: l itself, or a [Gp, n] tile
  whose rows sum to l (`_online_softmax`)."""
  if not deferred:
    return l
  return jnp.where(lax.broadcasted_iota(jnp.int32, (l.shape[0], n), 1) == 0, l[:, None], 0.0)


def _sum_rows(l):
  """The running sum as a [Gp] vector, from what `_sum_tile` made of it."""
  return jnp.sum(l, axis=1) if l.ndim == 2 else l


def _split_range(num_steps, split, num_splits):
  """The steps [lo, hi) of `split` when `num_steps` are dealt in contiguous runs."""
  per = (num_steps + num_splits - 1) // num_splits
  lo = jnp.minimum(split * per, num_steps)
  return lo, jnp.minimum(lo + per, num_steps)


def _dot_t(a, b):
  """a [M, E] . b [N, E]^T -> [M, N] in float32."""
  return lax.dot_general(a, b, (((1,), (1,)), ((), ())), preferred_element_type=jnp.float32)


def _dot(a, b):
  """a [M, N] . b [N, E] -> [M, E] in float32."""
  return lax.dot_general(a, b, (((1,), (0,)), ((), ())), preferred_element_type=jnp.float32)


def _dense_segment(state, q, k_ref, v_ref, base, size, t_lo, t_hi, *, block, split, num_splits, deferred_sum,
                   exp2=jnp.exp2):
  """Tokens [t_lo, t_hi) of a high-precision segment of `size` tokens at rows base... of k_ref, v_ref."""
  dtype = k_ref.dtype
  qd = q.astype(dtype)
  lo, hi = _split_range(pl.cdiv(t_hi - t_lo, block), split, num_splits)

  def step(i, carry):
    m, l, acc = carry
    start = t_lo + i * block
    first = jnp.minimum(start, size - block)  # stay inside the segment; mask what is not ours
    tok = first + lax.broadcasted_iota(jnp.int32, (1, block), 1)
    rows = pl.ds(base + first, block)
    s = jnp.where((tok >= start) & (tok < t_hi), _dot_t(qd, k_ref[rows, :]), -jnp.inf)
    m, l, corr, p = _online_softmax(m, l, s, exp2)
    return m, l, acc * corr[:, None] + _dot(p.astype(dtype), v_ref[rows, :])

  m, l, acc = state
  m, l, acc = lax.fori_loop(lo, hi, step, (m, _sum_tile(l, block, deferred_sum), acc))
  return m, _sum_rows(l), acc


# -- quantized tiles


def _dequant_asm(bits: int, part: int) -> str:
  """PTX: 4 bytes of codes -> 4 halves s * code + m of one part (two f16x2 registers, in order).

  The byte permutes put bytes (0, 1) and (2, 3) in the low bytes of two
  halves, so output element e comes from input byte e whatever the register
  layout. The part's bits, masked in place (no shift), sit at mantissa bit
  k b (k the part, b the bits); OR-ed into the bits of 2^(10 - k b), whose
  mantissa bit k b is worth exactly 1, they make the half 2^(10 - k b) + c
  exactly. Subtracting 2^(10 - k b) leaves c, and one f16x2 fma with the
  scale and the minimum gives s c + m.
  Operands: $0 $1 out, $2 codes, $3 $4 scales, $5 $6 minimums.
  """
  mask = ((1 << bits) - 1) << (part * bits)
  magic = (15 + 10 - part * bits) << 10  # the half 2^(10 - k b): exponent field 15 + 10 - k b, mantissa 0
  magic = f"{magic | magic << 16:#010x}"
  lines = ["{", ".reg .b32 t, magic;", f"mov.b32 magic, {magic};"]
  for half, select in enumerate(("0x3120", "0x1302")):
    lines += [f"prmt.b32 t, $2, $2, {select};",
              f"lop3.b32 t, t, {mask | mask << 16:#010x}, {magic}, 0xea;",  # (a & b) | c
              "sub.f16x2 t, t, magic;",
              f"fma.rn.f16x2 ${half}, t, ${3 + half}, ${5 + half};"]
  return "\n".join(lines + ["}"])


def _dequantize(codes, scales, minimums, *, bits: int, inline_asm: bool):
  """Codes [T, H/P] uint8 -> P half tiles [T, H/P]: part k is s * ((codes >> k*bits) & mask) + m.

  Part k holds channels [k*H/P, (k+1)*H/P) ("split" packing), so parts meet q
  and the output as column blocks, without any shuffling of registers.
  """
  mask = (1 << bits) - 1
  out = []
  for k, (s, m) in enumerate(zip(scales, minimums)):
    if inline_asm:
      out += plgpu.elementwise_inline_asm(
          _dequant_asm(bits, k), args=[codes, s, m],
          constraints="=r,=r,r,r,r,r,r", pack=4,
          result_shape_dtypes=[jax.ShapeDtypeStruct(codes.shape, jnp.float16)])
    else:
      out.append(((codes >> jnp.uint8(k * bits)) & jnp.uint8(mask)).astype(jnp.float16) * s + m)
  return out


def _raw_asm(bits: int, part: int) -> str:
  """PTX: 4 bytes of codes -> the 4 halves 1 + c / 2^bits of one part (two f16x2 registers, in order).

  The byte permute puts bytes (0, 1), then (2, 3), in the low bytes of two
  halves; a left shift lifts the part's code to the top `bits` of the
  mantissa and one lop3 keeps it and ORs in 1.0. Two instructions a pair of
  codes, no arithmetic. Operands: $0 $1 out, $2 codes.
  """
  keep = ((1 << bits) - 1) << (10 - bits)
  lines = ["{", ".reg .b32 t;"]
  for half, select in enumerate(("0x3120", "0x1302")):
    lines += [f"prmt.b32 t, $2, $2, {select};",
              f"shl.b32 t, t, {10 - bits - part * bits};",
              f"lop3.b32 ${half}, t, {keep | keep << 16:#010x}, 0x3c003c00, 0xea;"]  # (a & b) | c
  return "\n".join(lines + ["}"])


def _raw_codes(codes, *, bits: int, part: int, inline_asm: bool):
  """Codes [T, H/P] uint8 -> part `part` as exact halves 1 + c / 2^bits [T, H/P]."""
  if inline_asm:
    return plgpu.elementwise_inline_asm(
        _raw_asm(bits, part), args=[codes], constraints="=r,=r,r", pack=4,
        result_shape_dtypes=[jax.ShapeDtypeStruct(codes.shape, jnp.float16)])[0]
  c = (codes >> jnp.uint8(part * bits)) & jnp.uint8((1 << bits) - 1)
  return c.astype(jnp.float16) * jnp.float16(1.0 / (1 << bits)) + jnp.float16(1.0)


def _window_meta(s_ref, m_ref, first, tile, width, part, window):
  """Scale and minimum of `tile` windows for one part's channels, as half tiles [tile * S, width]."""
  rows, cols = pl.ds(first, tile), pl.ds(part * width, width)

  def per_token(x):
    return jnp.broadcast_to(x[:, None, :], (tile, window, width)).reshape(tile * window, width)

  return per_token(s_ref[rows, cols].astype(jnp.float16)), per_token(m_ref[rows, cols].astype(jnp.float16))


def _token_meta(s_ref, m_ref, rows, size, width, part, group):
  """Per-token scale and minimum of C-channel groups (KIVI values) for one part, as [T, width] halves.

  Loads only the part's column of groups. Loading the [T, H/C] rows whole and picking a part's groups
  with a masked sum compiles to fewer instructions, but ran 10 % slower on an H200 (182 against 164 µs
  on all-INT2 KIVI at batch 8, 32k tokens, 2026-12-03).
  """
  n = max(1, width // group)  # groups in a part
  cols = pl.ds(part * width // group, n)  # the part's groups, or the one group holding the part

  def per_channel(x):
    return jnp.broadcast_to(x[:, :, None], (size, n, width // n)).reshape(size, width)

  return per_channel(s_ref[rows, cols].astype(jnp.float16)), per_channel(m_ref[rows, cols].astype(jnp.float16))


def _quantized_segment(q_parts, refs, bk, tokens, offset, count, *, seg, window, split, num_splits,
                       inline_asm, deferred_sum, exp2=jnp.exp2):
  """Windows [offset, offset + count) of a quantized pool, `seg.block` windows a step.

  Codes are dequantized in registers into P half tiles, one per part of the
  packing, and each part meets its block of q's columns (keys) or of the
  output (values) in its own tensor-core dot.
  """
  k_ref, ks_ref, km_ref, v_ref, vs_ref, vm_ref = refs
  parts = 8 // seg.bits
  width = k_ref.shape[1]  # H / P
  tile = seg.block
  size = tile * window
  pool_windows = tokens // window
  lo, hi = _split_range(pl.cdiv(count, tile), split, num_splits)
  dequantize = functools.partial(_dequantize, bits=seg.bits, inline_asm=inline_asm)
  q_parts = [qk.astype(jnp.float16) for qk in q_parts]

  def step(i, carry):
    m, l, accs = carry
    start = offset + i * tile
    first = jnp.minimum(start, pool_windows - tile)  # stay inside the pool; mask what is not ours
    win = first + lax.broadcasted_iota(jnp.int32, (1, size), 1) // window
    rows = pl.ds(bk * tokens + first * window, size)
    meta = bk * pool_windows + first
    k_meta = [_window_meta(ks_ref, km_ref, meta, tile, width, k, window) for k in range(parts)]
    keys = dequantize(k_ref[rows, :], [s for s, _ in k_meta], [mn for _, mn in k_meta])
    s = functools.reduce(jnp.add, [_dot_t(qk, kk) for qk, kk in zip(q_parts, keys)])  # no add of a zero
    s = jnp.where((win >= start) & (win < offset + count), s, -jnp.inf)
    m, l, corr, p = _online_softmax(m, l, s, exp2)
    if seg.value_group:
      v_meta = [_token_meta(vs_ref, vm_ref, rows, size, width, k, seg.value_group) for k in range(parts)]
    else:
      v_meta = [_window_meta(vs_ref, vm_ref, meta, tile, width, k, window) for k in range(parts)]
    values = dequantize(v_ref[rows, :], [s for s, _ in v_meta], [mn for _, mn in v_meta])
    p = p.astype(jnp.float16)
    return m, l, tuple(a * corr[:, None] + _dot(p, v) for a, v in zip(accs, values))

  m, l, accs = _fresh(q_parts[0].shape[0], width, parts)
  m, l, accs = lax.fori_loop(lo, hi, step, (m, _sum_tile(l, size, deferred_sum), accs))
  return m, _sum_rows(l), accs


def _factored_segment(q_parts, refs, bk, tokens, offset, count, *, seg, window, split, num_splits,
                      inline_asm, exp2=jnp.exp2):
  """Windows [offset, offset + count) of a quantized pool, `seg.block` windows a step, never dequantized.

  With r = 1 + c / 2^b (the code as a half, two instructions a pair) and the
  window's per-channel scale s and minimum m, a value is s c + m = S r + M
  with S = 2^b s and M = m - S. So a window's scores are (q S) . r + q . M:
  S is folded into q (a [G, H/P] product a window, not one a code) and q . M
  is one bias a row; its values contribute (P . r) S + (sum P) M. The codes
  only meet the tensor cores. Values grouped per token (KIVI) are
  dequantized instead: their scales cannot leave the token axis.
  """
  k_ref, ks_ref, km_ref, v_ref, vs_ref, vm_ref = refs
  parts = 8 // seg.bits
  width = k_ref.shape[1]  # H / P
  tile = seg.block
  lift = float(1 << seg.bits)
  pool_windows = tokens // window
  lo, hi = _split_range(pl.cdiv(count, tile), split, num_splits)
  raw = functools.partial(_raw_codes, bits=seg.bits, inline_asm=inline_asm)

  def folded(s_ref, m_ref, row, part):  # S and the minimum m of one window and part, float32 [H/P]
    cols = pl.ds(part * width, width)
    return s_ref[row, cols].astype(jnp.float32) * lift, m_ref[row, cols].astype(jnp.float32)

  def step(i, carry):
    m, l, accs = carry
    start = offset + i * tile
    first = jnp.minimum(start, pool_windows - tile)  # stay inside the pool; mask what is not ours
    scores = []
    for w in range(tile):
      win = first + w
      codes = k_ref[pl.ds(bk * tokens + win * window, window), :]
      s, bias = 0.0, 0.0
      for k, qk in enumerate(q_parts):
        scale, minimum = folded(ks_ref, km_ref, bk * pool_windows + win, k)
        a = (qk * scale[None, :]).astype(jnp.float16)
        s = s + _dot_t(a, raw(codes, part=k))
        bias = bias + qk * minimum[None, :] - a.astype(jnp.float32)  # M = m - S, with S as the dot saw it
      ours = (win >= start) & (win < offset + count)
      scores.append(jnp.where(ours, s + jnp.sum(bias, axis=1)[:, None], -jnp.inf))
    m_new = functools.reduce(jnp.maximum, [jnp.max(s, axis=1) for s in scores], m)
    corr = exp2(m - m_new)
    probs = [exp2(s - m_new[:, None]).astype(jnp.float16) for s in scores]
    sums = [jnp.sum(p.astype(jnp.float32), axis=1) for p in probs]  # what the tensor cores will add up
    accs = [acc * corr[:, None] for acc in accs]
    for w, (p, total) in enumerate(zip(probs, sums)):
      win = first + w
      rows = pl.ds(bk * tokens + win * window, window)
      codes = v_ref[rows, :]
      if seg.value_group:
        metas = [_token_meta(vs_ref, vm_ref, rows, window, width, k, seg.value_group) for k in range(parts)]
        values = _dequantize(codes, [x for x, _ in metas], [y for _, y in metas], bits=seg.bits,
                             inline_asm=inline_asm)
        accs = [acc + _dot(p, v) for acc, v in zip(accs, values)]
      else:
        for k in range(parts):
          scale, minimum = folded(vs_ref, vm_ref, bk * pool_windows + win, k)
          accs[k] = accs[k] + _dot(p, raw(codes, part=k)) * scale[None, :] + total[:, None] * (minimum - scale)[None, :]
    return m_new, l * corr + sum(sums), tuple(accs)

  return lax.fori_loop(lo, hi, step, _fresh(q_parts[0].shape[0], width, parts))


def _fresh(rows: int, width: int, parts: int):
  """An empty softmax state: running max, running sum and `parts` accumulators [rows, width]."""
  return (jnp.full((rows,), _NEG, jnp.float32), jnp.zeros((rows,), jnp.float32),
          tuple(jnp.zeros((rows, width), jnp.float32) for _ in range(parts)))


def _kernel(offsets_ref, counts_ref, rest_len_ref, layer_ref, sizes_ref, q_ref, *refs, segments: tuple[_Segment, ...],
            kv_heads, group, padded_group, window, rest_block, with_rest: bool, phases: int,
            parallel_phases: bool, q_scale: float, cfg: DecodeConfig):
  """One (request, KV head, split): its share of every segment, as partial softmaxes (o, m, l).

  Phase 0 holds the high-precision pools and the rest segment (if `with_rest`:
  a launch of quantized pools alone has none); each quantized pool is one
  more phase (the combine merges phases like splits). A program runs its
  phases one after another, or, with `parallel_phases`, one program runs
  one phase (program = (request, KV head, split) * phases + phase).
  """
  *in_refs, o_ref, m_ref, l_ref = refs
  it = iter(in_refs)
  seg_refs = [tuple(next(it) for _ in range(2 if seg.bits == 16 else 6)) for seg in segments]
  rest_refs = (next(it), next(it)) if with_rest else None

  program = pl.program_id(0)
  our_phase = program % phases if parallel_phases else None
  program = program // phases if parallel_phases else program
  num_splits = sizes_ref[_SPLITS]
  split, bk = program % num_splits, program // num_splits
  b = bk // kv_heads
  head_dim = q_ref.shape[1]

  def load_q(cols):  # q's G rows of this KV head, zeros below them up to Gp rows (the tensor cores' tile)
    rows = pl.ds(bk * group, padded_group)
    real = lax.broadcasted_iota(jnp.int32, (padded_group, 1), 0) < group
    q = plgpu.load(q_ref.at[rows, cols], mask=jnp.broadcast_to(real, (padded_group, cols.size)), other=0.0)
    return q.astype(jnp.float32) * (q_scale * _LOG2E)  # scores in base 2: the softmax takes exp2

  def write(phase, m, l, accs):  # accs: column blocks of the output, in order
    at = () if parallel_phases else (phase,)  # a parallel program's blocks hold its phase alone
    m_ref[(*at, slice(None))], l_ref[(*at, slice(None))] = m, l
    width = head_dim // len(accs)
    for k, acc in enumerate(accs):
      o_ref[(*at, slice(None), pl.ds(k * width, width))] = acc

  exp2 = _exp2_ftz if cfg.inline_asm and cfg.fast_exp2 else jnp.exp2

  def dense_phase():
    q = load_q(pl.ds(0, head_dim))  # f32 [Gp, H]
    m, l, (o,) = _fresh(padded_group, head_dim, 1)
    state = m, l, o
    for seg, refs_ in zip(segments, seg_refs):
      if seg.bits == 16:
        offset, count, tokens = offsets_ref[seg.index], counts_ref[seg.index], sizes_ref[_TOKENS + seg.index]
        state = _dense_segment(state, q, *refs_, bk * tokens, tokens, offset * window, (offset + count) * window,
                               block=seg.block, split=split, num_splits=num_splits,
                               deferred_sum=cfg.deferred_sum, exp2=exp2)
    capacity = sizes_ref[_REST_CAPACITY]
    rows = (layer_ref[0] * sizes_ref[_PAIRS] + bk) * capacity  # the stacked segment's rows of this layer
    m, l, o = _dense_segment(state, q, *rest_refs, rows, capacity, 0, rest_len_ref[b],
                             block=rest_block, split=split, num_splits=num_splits, deferred_sum=cfg.deferred_sum,
                             exp2=exp2)
    return m, l, (o,)

  def quantized_phase(seg, refs_):
    width = head_dim * seg.bits // 8
    q_parts = [load_q(pl.ds(k * width, width)) for k in range(8 // seg.bits)]
    offset, count, tokens = offsets_ref[seg.index], counts_ref[seg.index], sizes_ref[_TOKENS + seg.index]
    # The factored form sums each window's row of p anyway (its value sums need it): no deferred sum.
    segment = _factored_segment if cfg.factored else functools.partial(_quantized_segment,
                                                                       deferred_sum=cfg.deferred_sum)
    return segment(q_parts, refs_, bk, tokens, offset, count, seg=seg, window=window,
                   split=split, num_splits=num_splits, inline_asm=cfg.inline_asm, exp2=exp2)

  bodies = [dense_phase] if with_rest else []
  bodies += [functools.partial(quantized_phase, seg, refs_) for seg, refs_ in zip(segments, seg_refs) if seg.bits != 16]
  assert len(bodies) == phases
  for phase, body in enumerate(bodies):
    if parallel_phases:
      pl.when(our_phase == phase)(lambda phase=phase, body=body: write(phase, *body()))
    else:
      write(phase, *body())


# ----------------------------------------------------------------------------- pallas_call


def _pow2_floor(n: int) -> int:
  return 1 << (max(n, 1).bit_length() - 1)


def _multiprocessors(cfg: DecodeConfig) -> int:
  if cfg.multiprocessors:
    return cfg.multiprocessors
  return int(getattr(jax.devices()[0], "core_count", 0) or 132)  # CPU (interpret mode): an H200's count


def _tile_windows(cfg: DecodeConfig, bits: int) -> int:
  """Windows a step of a quantized pool reads."""
  return cfg.int4_tile_windows if bits == 4 and cfg.int4_tile_windows else cfg.tile_windows


def num_splits(batch: int, kv_heads: int, tokens: int, cfg: DecodeConfig) -> int:
  """J: splits of the key axis, none with fewer than `min_tokens_per_split` tokens.

  Programs of a grid take about equal time, so a grid of n programs over
  `slots` resident ones costs ceil(n / slots) waves of one program's time:
  with 32 (request, head) pairs on 132 slots, 17 splits (544 programs) cost
  five waves of 1/17 of the keys where 16 cost four. Each program also pays
  a fixed start (q, four pipeline fills, its partial softmaxes), counted as
  `program_tokens` keys. Take the J of least waves * (start + keys / J).
  """
  pairs = batch * kv_heads
  slots = _multiprocessors(cfg) * cfg.programs_per_multiprocessor
  most = max(1, tokens // cfg.min_tokens_per_split)
  if not cfg.round_to_waves:  # the first grid that fills the device
    return min(most, -(-slots // pairs))

  def cost(j):
    return -(-pairs * j // slots) * (cfg.program_tokens + -(-tokens // j))

  return min(range(1, most + 1), key=cost)


def quantized_decode(
    qg: Float[Array, "B K G H"],
    k_pools: Sequence[PoolArrays | None],
    v_pools: Sequence[PoolArrays | None],
    offsets: Int[Array, "3"],
    counts: Int[Array, "3"],
    rest_k: Float[Array, "B K R H"] | Float[Array, "L B K R H"],
    rest_v: Float[Array, "B K R H"] | Float[Array, "L B K R H"],
    rest_len: Int[Array, "B"],
    *,
    window_size: int,
    tokens_hint: int | None = None,
    pool_tokens: tuple[int, ...] | None = None,
    config: DecodeConfig = DecodeConfig(),
    q_scale: float = 1.0,
    rest_layer: Int[Array, ""] | None = None,
    out_dtype=jnp.float32,
    interpret: bool = False,
) -> Float[Array, "B K G H"]:
  """softmax(q_scale qg . K^T) V over a layer's pools and rest segment (qg in any float dtype; the
  kernel scales it in float32 as it loads it), in `out_dtype` (rounded from float32 once: where the merge is
  a Pallas launch, as that launch stores it).

  A pool given as None is skipped (the layer has no window there).
  `tokens_hint` (static) bounds the layer's tokens and `pool_tokens` its tokens
  in each pool (default: the pools' sizes); they set the split counts. With
  `rest_layer`, rest_k and rest_v are every layer's and the kernel reads
  layer `rest_layer`'s rows in place.
  """
  # `config` as this launch takes it (`for_launch`): a large one merges its sets as `LARGE_BATCH_MOSAIC` says.
  sets, config = _partial_softmax_sets(qg, k_pools, v_pools, offsets, counts, rest_k, rest_v, rest_len,
                                       window_size=window_size, tokens_hint=tokens_hint, pool_tokens=pool_tokens,
                                       config=config, q_scale=q_scale, rest_layer=rest_layer, interpret=interpret)
  if config.fused_combine:
    return combine_kernel(sets, qg.shape[2], config=config, out_dtype=out_dtype, interpret=interpret)
  if len(sets) > 1:  # the launches' partials (Gp and 8 rows) merged where they lie: no concatenated copy
    return combine_sets(sets, qg.shape[2]).astype(out_dtype)
  # Slicing o, m and l to G rows before the combine made it 1.7 us slower at batch 1 x 1k (H200).
  return combine_splits(*sets[0])[:, :, :qg.shape[2]].astype(out_dtype)


def partial_softmaxes(qg, k_pools, v_pools, offsets, counts, rest_k, rest_v, rest_len, *, window_size: int,
                      tokens_hint: int | None = None, pool_tokens: tuple[int, ...] | None = None,
                      config: DecodeConfig = DecodeConfig(), q_scale: float = 1.0, rest_layer=None,
                      interpret: bool = False):
  """`quantized_decode` up to its launches: the splits' and phases' unnormalized outputs
  o [B, K, J', Gp, H] and their m (running maxima of the scores in base 2), l [B, K, J', Gp], for
  `combine_splits`."""
  return _concatenated(_partial_softmax_sets(
      qg, k_pools, v_pools, offsets, counts, rest_k, rest_v, rest_len, window_size=window_size,
      tokens_hint=tokens_hint, pool_tokens=pool_tokens, config=config, q_scale=q_scale, rest_layer=rest_layer,
      interpret=interpret)[0])


def _concatenated(sets):
  """Sets of partials as one (o, m, l) along the splits: later sets' rows padded to the first set's."""
  if len(sets) == 1:
    return sets[0]
  gp = sets[0][1].shape[3]
  padded = [sets[0]]
  for o, m, l in sets[1:]:
    o = _rows_first(o)
    rows = ((0, 0),) * 3 + ((0, gp - m.shape[3]),)
    padded.append((jnp.pad(o, rows + ((0, 0),)), jnp.pad(m, rows, constant_values=_NEG), jnp.pad(l, rows)))
  return tuple(jnp.concatenate(x, axis=2) for x in zip(*padded))


def _rows_first(o):
  """A set's o as [B, K, J', R, H]: the Mosaic launch's comes heads last, [B, K, J, H, P, R] (its columns are
  a window parity's R rows), and is transposed here only where a caller wants it so."""
  if o.ndim == 5:
    return o
  b, k, j, h, p, r = o.shape
  return o.transpose(0, 1, 2, 4, 5, 3).reshape(b, k, j * p, r, h)


def _partial_softmax_sets(qg, k_pools, v_pools, offsets, counts, rest_k, rest_v, rest_len, *, window_size: int,
                          tokens_hint: int | None = None, pool_tokens: tuple[int, ...] | None = None,
                          config: DecodeConfig = DecodeConfig(), q_scale: float = 1.0, rest_layer=None,
                          interpret: bool = False) -> tuple[list[tuple[jax.Array, jax.Array, jax.Array]],
                                                             DecodeConfig]:
  """`partial_softmaxes` as a list of sets: the Triton launches' (a set each, Gp rows: the INT4 pools' launch
  apart where it pays), then a set a pool the Mosaic kernel serves (its own 8 rows, o heads last: see
  `_rows_first`; the pools in one launch or a launch each: `mosaic_launches`), and with `mosaic_dense` the 16-bit
  segments' set from that launch in place of Triton's; and `config` as this launch took it (`for_launch`'s where a
  Mosaic launch is made, else the caller's)."""
  b, kh, g, h = qg.shape
  gp = max(16, 1 << (g - 1).bit_length())
  present = [i for i, kp in enumerate(k_pools) if kp is not None and kp.data.shape[2] > 0]
  if pool_tokens is None:  # the most tokens a layer owns in each pool
    pool_tokens = tuple(kp.data.shape[2] if kp is not None else 0 for kp in k_pools)
  if tokens_hint is None:
    tokens_hint = rest_k.shape[-2] + sum(pool_tokens[i] for i in present)
  q = qg.reshape(b * kh * g, h)  # the kernel pads a head's G rows to Gp and scales them as it loads them
  layer = jnp.zeros((1,), jnp.int32) if rest_layer is None else jnp.reshape(rest_layer, (1,)).astype(jnp.int32)
  launch = functools.partial(_launch, q, gp, k_pools, v_pools, offsets, counts, rest_k, rest_v, rest_len, layer,
                             window_size=window_size, q_scale=q_scale, interpret=interpret)
  requested = config
  large = [pool_tokens[i] for i in present if mosaic_serves(k_pools[i], v_pools[i], g, h, window_size,
                                                             LARGE_BATCH_BITS, LARGE_BATCH_MOSAIC["kivi_mosaic"])]
  config = for_launch(config, b * kh, max(large, default=0), interpret=interpret)
  served = (2,) * config.int2_mosaic + (4,) * config.int4_mosaic
  mosaic = [i for i in present if mosaic_serves(k_pools[i], v_pools[i], g, h, window_size, served,
                                                config.kivi_mosaic)]
  if config is not requested:  # the default's large launch: only the pools long enough to win there
    mosaic = [i for i in mosaic if pool_tokens[i] >= config.mosaic_min_pool_tokens]
  if mosaic:  # those pools in Mosaic GPU launches (`mosaic_launches`), the others as configured
    others = tuple(None if j in mosaic else p for j, p in enumerate(k_pools))
    triton = dataclasses.replace(config, int2_mosaic=False, int4_mosaic=False, mosaic_min_pairs=None)
    plans_of = lambda c: [
        _mosaic_pool_plan(qg, k_pools[i], v_pools[i], offsets[i], counts[i], windows=pool_tokens[i] // window_size,
                          config=c, q_scale=q_scale, interpret=interpret) for i in mosaic]
    segments = dense_segments(qg, others, v_pools, offsets, counts, rest_k, rest_v, rest_len, rest_layer,
                              window_size=window_size) if config.mosaic_dense else None
    if segments is not None and mosaic_launch_config(config, b * kh, len(mosaic) + 1)[0]:
      quantized, splits = dense_launch_config(config, b * kh, len(mosaic))
      plans = [*plans_of(quantized), _dense_plan(qg, segments, splits=splits, config=config, q_scale=q_scale,
                                                 interpret=interpret)]
      if mosaic_int2.can_launch_together(plans):
        return [mosaic_set(*p, b, kh) for p in mosaic_int2.launch_together(plans)], config
    triton_sets, _ = _partial_softmax_sets(
        qg, others, v_pools, offsets, counts, rest_k, rest_v, rest_len, window_size=window_size,
        tokens_hint=tokens_hint - sum(pool_tokens[i] for i in mosaic), pool_tokens=pool_tokens, config=triton,
        q_scale=q_scale, rest_layer=rest_layer, interpret=interpret)
    if config.triton_first:  # the Mosaic launches start once the Triton launch has written its partials
      qg, triton_sets = lax.optimization_barrier((qg, triton_sets))
    partials = mosaic_launches(plans_of, config, b * kh, len(mosaic))
    return [*triton_sets, *[mosaic_set(*p, b, kh) for p in partials]], config
  int4 = [i for i in present if k_pools[i].bits == 4]
  if int4 and int4_launch_pays(config, b * kh * sum(pool_tokens[i] for i in int4)):
    others = [i for i in present if i not in int4]
    parts = [launch(others, True, tokens_hint - sum(pool_tokens[i] for i in int4), config),
             launch(int4, False, sum(pool_tokens[i] for i in int4), config.int4_launch)]
    return parts, requested  # two sets, merged where they lie
  return [launch(present, True, tokens_hint, config)], requested


def for_launch(config: DecodeConfig, pairs: int, pool_tokens: int, *, interpret: bool) -> DecodeConfig:
  """`config`, or, where a pool the large-batch kernel serves would be large enough for it to win
  (`mosaic_min_pairs` pairs, `pool_tokens` >= `mosaic_min_pool_tokens` tokens a layer in the largest such
  pool; or `mosaic_min_pairs_long` pairs and `mosaic_long_pool_tokens`; not in interpret mode),
  `LARGE_BATCH_MOSAIC`'s configuration (the caller sends it only the pools of `mosaic_min_pool_tokens` or more;
  `mosaic_serves` still decides whether the kernel can take a pool)."""
  if config.int2_mosaic or config.mosaic_min_pairs is None or interpret:
    return config
  many = pairs >= config.mosaic_min_pairs and pool_tokens >= config.mosaic_min_pool_tokens
  long = (config.mosaic_min_pairs_long is not None and pairs >= config.mosaic_min_pairs_long
          and pool_tokens >= config.mosaic_long_pool_tokens)
  return large_batch(config) if many or long else config


def large_batch(config: DecodeConfig) -> DecodeConfig:
  """`config` as its large launches take it: `LARGE_BATCH_MOSAIC`'s Mosaic launches and merged combine."""
  return dataclasses.replace(config, int2_mosaic=True, mosaic_min_pairs=None, **LARGE_BATCH_MOSAIC)


def mosaic_serves(kp: PoolArrays, vp: PoolArrays, g: int, h: int, window: int, bits: tuple = (2,),
                  kivi: bool = False) -> bool:
  """Whether `mosaic_int2.py` serves this pool: keys and values of one of `bits` widths (2, 4) with scales
  a window and channel (with `kivi`, also KIVI's values: a token and group of 32 channels), windows of 32,
  head dim 128, at most 8 query heads a KV head, JAX >= 0.11."""
  values_ok = not vp.channel_group or (kivi and vp.channel_group == 32)
  return (kp.bits in bits and vp.bits == kp.bits and not kp.channel_group and values_ok and g <= 8
          and window == mosaic_int2.WINDOW and h == mosaic_int2.HEAD_DIM and mosaic_int2.available())


def pool_options(options: dict, bits: int, kivi: bool, int4_permuted_keys: bool = False,
                 kivi_token_scaled: bool = False, kivi_narrow_scores: bool = False,
                 int4_values_by_ldmatrix: bool = True) -> dict:
  """A configuration's `mosaic_int2` options as a pool of `bits` (and, with `kivi`, KIVI's values) takes them:
  an INT4 pool keeps `permuted_keys` only with `int4_permuted_keys` (and not KIVI's); `folded_minimums` is the
  register paths' for windows' values and keys, and KIVI's pools go without it (their values are not in
  registers, and folding the keys alone made ptxas spill: 593 SASS in the main loop either way, offline, s30),
  as without `values_by_ldmatrix`. `kivi_token_scaled`: KIVI's values from registers (`token_scaled_p`);
  `kivi_narrow_scores`: KIVI's INT2 pools keep `narrow_scores`; `int4_values_by_ldmatrix`: INT4 pools keep
  `values_by_ldmatrix`."""
  options = kivi_options(options) if kivi else dict(options)
  if kivi or bits != 2:  # the factored keys are INT2 windows' (s49): the others keep their keys' scales
    options = mosaic_int2.unfactored(options)
  # `paired_steps` is INT2's windows' (KIVI's values are not in registers; INT4's two-step blocks need 241 KB of
  # shared memory a CTA of four warpgroups, over 227): the others a softmax a step
  if (kivi or bits != 2) and options.pop("paired_steps", False):
    options["steps_per_block"] = 1
  if bits != 2 and (kivi or not int4_permuted_keys):
    options["permuted_keys"] = False
  if bits != 2 and not int4_values_by_ldmatrix:
    options.pop("values_by_ldmatrix", None)
  if kivi or bits != 2:  # the 8-wide wgmmas are INT2 windows' (timed there; KIVI's V^T is not in registers)
    if not (kivi and bits == 2 and kivi_narrow_scores):
      options.pop("narrow_scores", None)
    options.pop("narrow_values", None)
    options.pop("stages", None)  # deeper pipelines too (INT4's and KIVI's blocks are larger: shared memory)
    options.pop("fetch_warp_by_group", None)  # and the spread copies (s47: kivi2's step no faster with them)
  if kivi:  # KIVI's values go through shared memory, or (`token_scaled_p`) scale P
    options["folded_minimums"] = False
    options.pop("values_by_ldmatrix", None)
    if kivi_token_scaled:
      options["token_scaled_p"] = True
  return options


def kivi_options(options: dict) -> dict:
  """`mosaic_int2` options for a pool of KIVI's values: theirs per token (`values_per_token`), through shared
  memory; the paths that read a window's value metadata off."""
  return dict(options, values_per_token=True, values_in_registers=False, values_scaled_after=False,
              ldmatrix_metadata=False, metadata_in_thread_order=False)


def _mosaic_pool_plan(qg, kp: PoolArrays, vp: PoolArrays, first, count, *, windows: int, config: DecodeConfig,
                      q_scale: float, interpret: bool) -> mosaic_int2.KernelPlan:
  """The Mosaic GPU kernel over the layer's windows [first, first + count) of a pool (`windows` >= count, static),
  as a `mosaic_int2.KernelPlan`. Its partials (`mosaic_set`): m and l [B, K, PJ, 8] as `_launch`'s but of 8 rows
  (P window parities a split, 1 or 2; rows from G on are padding), and o as the kernel writes it, heads last:
  [B, K, J, H, P, 8] (transposing it cost the 7B step 0.14 ms at 32 x 100, session 22)."""
  b, kh, g, h = qg.shape
  n = b * kh
  q = qg.reshape(n, g, h).astype(jnp.float32) * (q_scale * _LOG2E)
  flat = lambda x: x.reshape(n, *x.shape[2:])
  splits, options = mosaic_plan(n, windows, kp.bits, config, kivi=bool(vp.channel_group))
  return mosaic_int2.range_plan(
      q, flat(kp.data), flat(kp.scale), flat(kp.minimum), flat(vp.data), flat(vp.scale), flat(vp.minimum),
      first, count, windows=windows, splits=splits,
      interpret=mosaic_int2.interpret_params() if interpret else None, **options)


def mosaic_launch_config(config: DecodeConfig, pairs: int, pools: int) -> tuple[bool, DecodeConfig]:
  """Whether a layer's `pools` Mosaic pools at `pairs` (request, KV head) pairs go in one launch
  (`DecodeConfig.mosaic_one_launch`), and the configuration their plans take: with `mosaic_one_launch_shares_wave`,
  `mosaic_programs_per_multiprocessor` shared between the pools."""
  together = config.mosaic_one_launch
  if together is None:
    together = pairs < config.mosaic_one_launch_below_pairs
  if not (together and pools > 1):
    return False, config
  if config.mosaic_one_launch_shares_wave:
    config = dataclasses.replace(config, mosaic_programs_per_multiprocessor=max(
        1, config.mosaic_programs_per_multiprocessor // pools))
  return True, config


def mosaic_launches(plans_of, config: DecodeConfig, pairs: int, pools: int) -> list:
  """The partials (o_t, m, l) of a layer's Mosaic pools, `plans_of(config)` their `mosaic_int2.KernelPlan`s: in one
  launch where `mosaic_launch_config` says so and the plans can share it, else a launch each, as configured."""
  together, shared = mosaic_launch_config(config, pairs, pools)
  if together:
    plans = plans_of(shared)
    if mosaic_int2.can_launch_together(plans):
      return mosaic_int2.launch_together(plans)
  return [mosaic_int2.launch(plan) for plan in plans_of(config)]


def dense_segments(qg, k_pools, v_pools, offsets, counts, rest_k, rest_v, rest_len, rest_layer, *,
                   window_size: int) -> list[mosaic_dense.Segment] | None:
  """The layer's 16-bit segments as `mosaic_dense.Segment`s (its FP16 windows' range, then the rest: of layer
  `rest_layer` where stacked), where `k_pools` (the pools left to Triton) hold nothing else and `dense_plan` takes
  them; else None (`v_pools` the layer's)."""
  b, kh, g, h = qg.shape
  n = b * kh
  present = [i for i, kp in enumerate(k_pools) if kp is not None and kp.data.shape[2] > 0]
  if any(k_pools[i].bits != 16 for i in present):
    return None
  pairs = jnp.arange(n, dtype=jnp.int32)
  flat = lambda x: x.reshape(-1, *x.shape[-2:])
  segments = [mosaic_dense.Segment(flat(k_pools[i].data), flat(v_pools[i].data), pairs,
                                   offsets[i] * window_size, counts[i] * window_size) for i in present]
  layer = 0 if rest_layer is None else jnp.asarray(rest_layer, jnp.int32).reshape(())
  segments.append(mosaic_dense.Segment(flat(rest_k), flat(rest_v), layer * n + pairs, jnp.zeros((n,), jnp.int32),
                                       jnp.repeat(rest_len.astype(jnp.int32), kh)))
  return segments if mosaic_dense.serves(segments, g, h) else None


def dense_launch_config(config: DecodeConfig, pairs: int, pools: int) -> tuple[DecodeConfig, int]:
  """The configuration of the quantized pools' plans in a launch beside the 16-bit segments (`mosaic_dense`), and
  the dense plan's splits: its CTAs take `mosaic_dense_share` of the SMs (a CTA a pair's `mosaic_dense_working`
  splits, at least one a pair), the pools share the others' wave."""
  sms = _multiprocessors(config)
  dense_ctas = max(1, round(sms * config.mosaic_dense_share))
  rest = dataclasses.replace(config, multiprocessors=max(1, sms - dense_ctas), mosaic_one_launch=True)
  if pools > 1:
    _, rest = mosaic_launch_config(rest, pairs, pools)
  return rest, config.mosaic_dense_working * max(1, dense_ctas // pairs)


def _dense_plan(qg, segments, *, splits: int, config: DecodeConfig, q_scale: float, interpret: bool):
  """`mosaic_dense.dense_plan` over the segments, q scaled as the quantized plans take it."""
  b, kh, g, h = qg.shape
  q = qg.reshape(b * kh, g, h).astype(jnp.float32) * (q_scale * _LOG2E)
  groups = dict(config.mosaic_options).get("warpgroups", 1)
  return mosaic_dense.dense_plan(q, segments, splits=splits, warpgroups=groups,
                                 working=min(config.mosaic_dense_working, groups), stages=config.mosaic_dense_stages,
                                 lagged_max=config.mosaic_dense_lagged_max, in_place=config.mosaic_dense_in_place,
                                 approx_math=dict(config.mosaic_options).get("approx_math", False),
                                 interpret=mosaic_int2.interpret_params() if interpret else None)


def mosaic_plan(pairs: int, windows: int, bits: int, config: DecodeConfig, kivi: bool = False) -> tuple[int, dict]:
  """The splits and `mosaic_int2` options of a Mosaic launch over at most `windows` windows a pair."""
  options = pool_options(dict(config.mosaic_options), bits, kivi=kivi, int4_permuted_keys=config.int4_permuted_keys,
                         kivi_token_scaled=bits in config.kivi_token_scaled_bits,
                         kivi_narrow_scores=config.kivi_narrow_scores,
                         int4_values_by_ldmatrix=config.int4_values_by_ldmatrix)
  splits = mosaic_splits(pairs, max(1, -(-windows // 2)), config)
  return mosaic_int2.cta_splits(splits, options.get("warpgroups", 1), pairs), options  # what a CTA can take


def mosaic_set(o_t, m, l, b: int, kh: int):
  """A Mosaic launch's partials as a set for the combine: m and l [B, K, PJ, 8], o heads last [B, K, J, H, P, 8],
  with P window parities a split: 2 where its columns are [n, J, H, 16] (column c head c % 8 of parity c // 8),
  1 where the kernel keeps both parities' heads in 8 columns (`eight_column_softmax`)."""
  _, splits, h, columns = o_t.shape
  half = mosaic_int2.COLUMNS // 2
  parities = columns // half
  m, l = (x.reshape(b, kh, parities * splits, half) for x in (m, l))
  return o_t.reshape(b, kh, splits, h, parities, half), m, l


def mosaic_splits(pairs: int, steps: int, config: DecodeConfig) -> int:
  """Splits of each (request, KV head) pair's `steps` 64-token steps for the Mosaic INT2 launch: one wave
  of programs where the pairs leave room for `mosaic_min_splits` (8) or more, else at least that many, raised
  until the last wave is at least half full. Measured (H200, 32k tokens, three programs an SM,
  `mosaic_int2_s21_run2_h200.md`): batch 8 12 splits (one wave) 94 µs, 8 splits 101; batch 32 8 splits (2.6
  waves) 317 µs, 3 (one wave) 325; batch 60 8 splits 578 µs, 12 583, 3 632. With four programs an SM (the
  large-batch kernel, 19,968 tokens, `mosaic_int2_s25_splits_h200.md`) 4 splits won: batch 32 154 µs against
  162 at 8 and 169 at 12, batch 60 300 against 313, so `LARGE_BATCH_MOSAIC` started at 4; since s38 at 2, which
  only pairs that fill a wave at 2 take (batch >= 45 of 4 KV heads), a CTA's four programs two pairs' splits.
  Fewer splits than a CTA's programs count only where a CTA can take them (`mosaic_int2.cta_splits`): 3 would
  become 4 after the search, a second wave of a few CTAs (batch 34: 544 programs in 528 slots)."""
  slots = _multiprocessors(config) * config.mosaic_programs_per_multiprocessor
  limit = max(1, min(steps, 64))
  groups = dict(config.mosaic_options).get("warpgroups", 1)
  for j in range(min(max(config.mosaic_min_splits, slots // pairs), limit), limit + 1):
    if j < groups and mosaic_int2.cta_splits(j, groups, pairs) != j:
      continue
    programs = pairs * j
    if programs <= slots or programs % slots == 0 or programs % slots >= slots // 2:
      return j
  return limit


def int4_launch_pays(config: DecodeConfig, int4_tokens: int) -> bool:
  """Whether INT4 pools holding `int4_tokens` over all (request, KV head) pairs take their own launch."""
  return config.int4_launch is not None and int4_tokens >= config.int4_launch_min_tokens


def phases_in_parallel(config: DecodeConfig, programs: int, phases: int) -> bool:
  """Whether a launch of `programs` (request, KV head, split) programs runs each of its `phases` in a
  program of its own: as configured, or (None) where that grid still fits `parallel_phase_waves` waves of
  resident programs, so that each program's serial latency shrinks to one segment's without the extra
  programs costing more waves than that saves."""
  if phases < 2 or config.parallel_phases is False:
    return False
  slots = _multiprocessors(config) * config.programs_per_multiprocessor
  return bool(config.parallel_phases) or programs * phases <= config.parallel_phase_waves * slots


def _launch(q, gp, k_pools, v_pools, offsets, counts, rest_k, rest_v, rest_len, rest_layer, pools: list[int],
            with_rest: bool, tokens_hint: int, config: DecodeConfig, *, window_size: int, q_scale: float,
            interpret: bool):
  """One pallas_call over the pools at indices `pools` (and the rest segment, if `with_rest`; of layer
  `rest_layer` [1] where it is stacked [L, B, K, R, H]): partial softmaxes o [B, K, J * phases, Gp, H],
  m and l [B, K, J * phases, Gp]."""
  b, kh = rest_k.shape[-4:-2]
  g, h = q.shape[0] // (b * kh), q.shape[1]
  splits = num_splits(b, kh, max(tokens_hint, 1), config)

  def rows(x):  # [(L,) B, K, n, H] -> [(L*)B*K*n, H]: a (request, head) is a run of rows
    return x.reshape(-1, x.shape[-1])

  segments, operands, tokens = [], [], [0, 0, 0]
  for index in pools:
    kp, vp = k_pools[index], v_pools[index]
    tokens[index] = kp.data.shape[2]
    if kp.bits == 16:
      block = min(config.dense_tokens, _pow2_floor(tokens[index]))
    else:
      block = min(_tile_windows(config, kp.bits), _pow2_floor(tokens[index] // window_size))
    segments.append(_Segment(index, kp.bits, vp.channel_group, block))
    arrays = [kp.data, vp.data] if kp.bits == 16 else [kp.data, kp.scale, kp.minimum, vp.data, vp.scale, vp.minimum]
    operands += [rows(x) for x in arrays]
  if with_rest:
    operands += [rows(rest_k), rows(rest_v)]
  sizes = np.array([splits, *tokens, rest_k.shape[-2], b * kh, 0, 0], np.int32)
  phases = int(with_rest) + sum(seg.bits != 16 for seg in segments)

  n = b * kh * splits
  parallel = phases_in_parallel(config, n, phases)
  kernel = functools.partial(
      _kernel, segments=tuple(segments), kv_heads=kh, group=g, padded_group=gp, window=window_size,
      rest_block=min(config.dense_tokens, _pow2_floor(rest_k.shape[-2])), with_rest=with_rest,
      phases=phases, parallel_phases=parallel, q_scale=q_scale,
      cfg=dataclasses.replace(config, inline_asm=config.inline_asm and not interpret))
  if parallel:  # program i: phase i % phases of (request, head, split) i // phases
    out_specs = [pl.BlockSpec((None, None, gp, h), lambda i: (i // phases, i % phases, 0, 0)),
                 pl.BlockSpec((None, None, gp), lambda i: (i // phases, i % phases, 0)),
                 pl.BlockSpec((None, None, gp), lambda i: (i // phases, i % phases, 0))]
  else:
    out_specs = [pl.BlockSpec((None, phases, gp, h), lambda i: (i, 0, 0, 0)),
                 pl.BlockSpec((None, phases, gp), lambda i: (i, 0, 0)),
                 pl.BlockSpec((None, phases, gp), lambda i: (i, 0, 0))]
  # Whole arrays, indexed by element (not by block) so that no size becomes a constant of the code.
  whole = lambda x: pl.BlockSpec(tuple(pl.Element(d) for d in x.shape), lambda i: (0,) * x.ndim)
  inputs = [offsets.astype(jnp.int32), counts.astype(jnp.int32), rest_len.astype(jnp.int32), rest_layer, sizes, q,
            *operands]
  o, m, l = pl.pallas_call(
      kernel,
      grid=(n * phases if parallel else n,),
      in_specs=[whole(x) for x in inputs],
      out_specs=out_specs,
      out_shape=partial_softmax_shapes(n, phases, gp, h),
      compiler_params=plgpu.CompilerParams(num_warps=config.num_warps, num_stages=config.num_stages),
      interpret=interpret,
      name="wq_quantized_decode",
  )(*inputs)
  shape = (b, kh, splits * phases, gp)  # each phase of each split is one partial softmax
  return o.reshape(*shape, h), m.reshape(shape), l.reshape(shape)


def partial_softmax_shapes(programs: int, phases: int, rows: int, head_dim: int) -> list[jax.ShapeDtypeStruct]:
  """A launch's partial softmaxes, float32: o [programs, phases, rows, H], m and l [programs, phases, rows]."""
  return [jax.ShapeDtypeStruct((programs, phases, rows, head_dim), jnp.float32),
          jax.ShapeDtypeStruct((programs, phases, rows), jnp.float32),
          jax.ShapeDtypeStruct((programs, phases, rows), jnp.float32)]


def combine_splits(o: Float[Array, "B K J G H"], m: Float[Array, "B K J G"], l: Float[Array, "B K J G"]):
  """Merges the splits' unnormalized outputs by their running maxima (of scores in base 2, as the
  kernel keeps them)."""
  m_max = jnp.max(m, axis=2, keepdims=True)
  w = jnp.exp2(m - m_max)
  total = jnp.sum(w * l, axis=2)
  out = jnp.sum(w[..., None] * o, axis=2)  # a reduce XLA fuses with the rest, not a batched matmul
  return out / jnp.where(total > 0, total, 1.0)[..., None]


def combine_sets(sets, groups: int) -> jax.Array:
  """`combine_splits` over several sets of partials (o [B, K, J_i, R_i, H], or heads last as `_rows_first`
  reads it; m and l [B, K, J_i, R_i], R_i >= `groups` rows), each read where it lies, then the first `groups`
  rows: no concatenated or transposed copy."""
  rows = lambda x: x[:, :, :, :groups]
  m_max = functools.reduce(jnp.maximum, [jnp.max(rows(m), axis=2, keepdims=True) for _, m, _ in sets])
  weights = [jnp.exp2(rows(m) - m_max) for _, m, _ in sets]
  total = sum(jnp.sum(w * rows(l), axis=2) for w, (_, _, l) in zip(weights, sets))
  out = sum(_weighted_rows(w, o) for w, (o, _, _) in zip(weights, sets))
  return out / jnp.where(total > 0, total, 1.0)[..., None]


def _weighted_rows(w, o):
  """sum_j w[b, k, j, g] o[b, k, j, g, h] -> [B, K, G, H], with o heads last ([B, K, J/P, H, P, R]) read in
  place: the sum runs over its split and parity axes and only the [B, K, H, G] result is transposed."""
  if o.ndim == 5:
    return jnp.sum(w[..., None] * o[:, :, :, :w.shape[3]], axis=2)
  b, k, j, h, p, _ = o.shape
  w = w.reshape(b, k, j, 1, p, w.shape[3])
  return jnp.swapaxes(jnp.sum(w * o[..., :w.shape[5]], axis=(2, 4)), 2, 3)


def combine_channel_blocks(pairs: int, head_dim: int, config: DecodeConfig) -> int:
  """Channel blocks of `combine_kernel`'s grid: the most (a power of two, 4 channels a block at least) that keep
  its pairs x blocks programs within `combine_programs_per_multiprocessor` an SM, so that a small batch's merge
  is many short programs' loads in flight, not a few programs' serial ones."""
  if config.combine_channel_blocks:
    return config.combine_channel_blocks
  blocks, most = 1, config.combine_programs_per_multiprocessor * _multiprocessors(config) // max(pairs, 1)
  while 2 * blocks <= most and head_dim // (2 * blocks) >= 4:
    blocks *= 2
  return blocks


_COMBINE_CHUNK = 2048  # elements of o a combine program loads at most at once (4096 took 255 registers at 64
# channels a block and 4 warps, offline). At one warp (s51) that bound is 64 a thread; batch 8 x 32k's sets load
# 8-16 parts of 8 rows x 4 channels, 8-16 a thread


def _combine_body(*refs, kinds: tuple, rows: int, group: int, width: int):
  """One (request, KV head) and one block of `width` channels: the largest running maximum over every set's
  parts first, then the parts weighed by exp2(m - that maximum) and summed, a chunk of parts a load (no chain
  of rescaled merges, no load waiting on another). `kinds`: (heads_last, parts, chunk, parities) of each set, whose
  (o, m, l) refs come in order, then the output's. A heads-last set's split holds window parity p's heads in
  columns 8p ... 8p + 7 (of its `parities`, 1 or 2); its sums are kept [width, 8] and transposed once."""
  bk, block = pl.program_id(0), pl.program_id(1)
  cols = pl.ds(block * width, width)
  out_ref = refs[-1]

  def chunks(i, fn, state):  # fn(i, first, c, fresh, state) over set i's parts, c at a time
    _, parts, c, _ = kinds[i]
    n = pl.cdiv(parts, c)

    def body(k, state):  # the last chunk starts early to stay in bounds; rows seen before are not fresh
      first = jnp.minimum(k * c, parts - c)
      fresh = first + lax.broadcasted_iota(jnp.int32, (c, 1), 0) >= k * c
      return fn(i, bk * parts + first, c, fresh, state)
    if n <= 4:
      for k in range(n):
        state = body(k, state)
      return state
    return lax.fori_loop(0, n, body, state)

  def heads(i, parity):
    return pl.ds(parity * rows, rows) if kinds[i][0] else pl.ds(0, rows)

  def most(i, first, c, fresh, m_max):
    m_ref = refs[3 * i + 1]
    for parity in range(kinds[i][3]):
      m_max = jnp.maximum(m_max, jnp.max(m_ref[pl.ds(first, c), heads(i, parity)], axis=0))
    return m_max

  m_max = jnp.full((rows,), _NEG, jnp.float32)
  for i in range(len(kinds)):
    m_max = chunks(i, most, m_max)

  def add(i, first, c, fresh, state):
    l_sum, o_rows, o_heads_last = state
    o_ref, m_ref, l_ref = refs[3 * i:3 * i + 3]
    for parity in range(kinds[i][3]):
      r = pl.ds(first, c)
      w = jnp.where(fresh, jnp.exp2(m_ref[r, heads(i, parity)] - m_max[None, :]), 0.0)  # [c, rows]
      l_sum = l_sum + jnp.sum(w * l_ref[r, heads(i, parity)], axis=0)
      if kinds[i][0]:  # o [c, width, rows]
        o_heads_last = o_heads_last + jnp.sum(w[:, None, :] * o_ref[r, cols, heads(i, parity)], axis=0)
      else:  # o [c, rows, width]
        o_rows = o_rows + jnp.sum(w[:, :, None] * o_ref[r, heads(i, parity), cols], axis=0)
    return l_sum, o_rows, o_heads_last

  state = (jnp.zeros((rows,), jnp.float32), jnp.zeros((rows, width), jnp.float32),
           jnp.zeros((width, rows), jnp.float32))
  for i in range(len(kinds)):
    state = chunks(i, add, state)
  l, o_rows, o_heads_last = state
  o = o_rows + o_heads_last.T if any(k[0] for k in kinds) else o_rows
  out = o / jnp.where(l > 0, l, 1.0)[:, None]
  real = lax.broadcasted_iota(jnp.int32, out.shape, 0) < group
  plgpu.store(out_ref.at[pl.ds(bk * group, rows), cols], out.astype(out_ref.dtype), mask=real)


def combine_kernel(sets, group: int, *, channel_blocks: int | None = None, config: DecodeConfig = DecodeConfig(),
                   out_dtype=jnp.float32, interpret: bool = False) -> Float[Array, "B K G H"]:
  """`combine_sets` as one launch, its grid (request x KV head, channel block): the Triton launches' partials
  (o [B, K, J, Gp, H], m and l [B, K, J, Gp]) and the Mosaic launches' (o heads last [B, K, J', H, P, 8], m and
  l [B, K, PJ', 8], G <= 8, P parities a split), each read where it lies. XLA's merge takes four or more small
  kernels a layer (a concatenated, transposed copy too where two Mosaic launches write); until session 33 this
  launch had one program a (request, KV head) merging its parts in a chain (25 µs at batch 8 x 32k on an H100,
  s32).
  The output in `out_dtype`, rounded as it is stored (the model's bf16: no convert kernel after it, s39)."""
  heads_last = [o.ndim == 6 for o, _, _ in sets]
  b, kh = sets[0][0].shape[:2]
  h = sets[0][0].shape[3 if heads_last[0] else 4]  # heads last: [B, K, J, H, P, 8]
  n = b * kh
  rows = max(8, 1 << (group - 1).bit_length())
  inputs, kinds = [], []
  for (o, m, l), last in zip(sets, heads_last):
    if last and (rows > mosaic_int2.COLUMNS // 2 or o.shape[3] != h or o.shape[4] not in (1, 2)
                 or o.shape[5] != rows):
      raise ValueError(f"combine_kernel: a heads-last set needs G <= 8 and o [B, K, J, {h}, 1 or 2, 8]; "
                       f"got G = {group}, o {o.shape}")
    if not last and m.shape[3] < rows:
      raise ValueError(f"combine_kernel: a set of {m.shape[3]} rows for {group} heads")
    parts = o.shape[2]
    kinds.append((last, parts, o.shape[4] if last else 1))  # (heads_last, parts, parities)
    # a part's rows: o [Gp, H] or heads last [H, 2 * 8]; m and l [Gp] or [2 * 8]
    inputs += [o.reshape(n * parts, o.shape[3], -1), m.reshape(n * parts, -1), l.reshape(n * parts, -1)]
  blocks = channel_blocks or combine_channel_blocks(n, h, config)
  if interpret and not channel_blocks:  # a program is a Python step on the CPU: CI's time (block counts up to 32
    blocks = min(blocks, 8)             # are tested by name)
  width = h // blocks
  chunk = lambda parts: min(_pow2_floor(max(1, _COMBINE_CHUNK // (rows * width))), _pow2_floor(parts))  # a load's
  kinds = tuple((last, parts, chunk(parts), parities) for last, parts, parities in kinds)
  whole = lambda x: pl.BlockSpec(tuple(pl.Element(d) for d in x.shape), lambda i, c: (0,) * x.ndim)
  out = pl.pallas_call(
      functools.partial(_combine_body, kinds=kinds, rows=rows, group=group, width=width),
      grid=(n, blocks),
      in_specs=[whole(x) for x in inputs],
      out_specs=pl.BlockSpec((pl.Element(n * group), pl.Element(h)), lambda i, c: (0, 0)),
      out_shape=jax.ShapeDtypeStruct((n * group, h), out_dtype),
      compiler_params=plgpu.CompilerParams(num_warps=config.combine_warps, num_stages=1),
      interpret=interpret,
      name="wq_combine",
  )(*inputs)
  return out.reshape(b, kh, group, h)


# ----------------------------------------------------------------------------- reference


def _dequantized(pool: PoolArrays, window: int, h: int):
  """A whole pool as float32 [B, K, T, H]: scale * code + minimum, per window or per token group."""
  if pool.bits == 16:
    return pool.data.astype(jnp.float32)
  parts = [(pool.data >> (pool.bits * i)) & ((1 << pool.bits) - 1) for i in range(8 // pool.bits)]
  codes = jnp.concatenate(parts, axis=-1)[..., :h].astype(jnp.float32)  # "split" packing
  sc, mn = pool.scale.astype(jnp.float32), pool.minimum.astype(jnp.float32)
  if pool.channel_group:  # [B, K, T, H/C] -> per channel
    sc, mn = (jnp.repeat(x, pool.channel_group, axis=-1) for x in (sc, mn))
  else:  # [B, K, W, H] -> per token
    sc, mn = (jnp.repeat(x, window, axis=2) for x in (sc, mn))
  return codes * sc + mn


def reference(qg, k_pools, v_pools, offsets, counts, rest_k, rest_v, rest_len, *, window_size: int):
  """`quantized_decode` in pure jnp: dequantize every pool, one softmax over them (masked to the
  layer's windows) and the rest."""
  b, h = qg.shape[0], qg.shape[-1]
  qg = qg.astype(jnp.float32)
  logits, masks, used = [], [], []
  for index, (kp, vp) in enumerate(zip(k_pools, v_pools)):
    if kp is None or kp.data.shape[2] == 0:
      continue
    window = jnp.arange(kp.data.shape[2]) // window_size
    masks.append(jnp.broadcast_to((window >= offsets[index]) & (window < offsets[index] + counts[index]),
                                  (b, window.size)))
    logits.append(jnp.einsum("BKGH,BKTH->BKGT", qg, _dequantized(kp, window_size, h)))
    used.append(vp)
  logits.append(jnp.einsum("BKGH,BKTH->BKGT", qg, rest_k.astype(jnp.float32)))
  masks.append(jnp.arange(rest_k.shape[2])[None] < rest_len[:, None])
  mask = jnp.concatenate(masks, axis=1)[:, None, None]
  probs = jax.nn.softmax(jnp.where(mask, jnp.concatenate(logits, axis=-1), -jnp.inf), axis=-1)
  parts = jnp.split(probs, list(itertools.accumulate(x.shape[-1] for x in logits))[:-1], axis=-1)
  out = jnp.einsum("BKGT,BKTH->BKGH", parts[-1], rest_v.astype(jnp.float32))
  for part, vp in zip(parts[:-1], used):
    out = out + jnp.einsum("BKGT,BKTH->BKGH", part, _dequantized(vp, window_size, h))
  return out
