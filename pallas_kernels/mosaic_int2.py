"""INT2 decode attention for Hopper in Pallas' Mosaic GPU backend (JAX >= 0.11): wgmma, TMA, no Triton.

One program serves one (request, KV head) pair and one split of an INT2 pool's tokens, for all the query
heads of the GQA group, in the "transposed" orientation: tokens are wgmma's M, so no query row is padding.
A step reads 64 tokens (two windows of 32), and

    S^T [64, 16] = sum_p A_p @ Bq[32p:32p+32] + bias                   (keys: the factored form)

where A_p is part p of the key codes, masked in place and converted in registers ((codes & 3 << 2p) is
4^p c), Bq [128, 16] is q^T times the window's key scales and 4^-p, and bias is q . (the window's key
minimums): one number a window and head, computed before the kernel by XLA (`key_bias`, reading the
minimums once, as the kernel would) and added to a step's scores.

Column c of S^T is query head c % 8 of window c // 8 of the step (GQA groups of up to 8 heads): the two
windows of a step have different scales. (With the keys dequantized columns 8-15 are copies and P's are zero:
`narrow_scores` and `narrow_values` run both wgmmas 8 wide, B K-major; 1.0-1.3 % faster on an H100, s39, the
tensor pipe being 22.7 % busy in s36's ncu profile: its work was not the bound.) Each
column keeps its own running max and sum, so window parity is a split of the key axis that the combine
merges with the others; entries of the other window are masked to -inf.

Values are dequantized in registers (scale and minimum per window and channel), stored to shared memory
[64 tokens, 128 channels] f16, and O^T [128, 16] += V^T P with V^T read transposed by wgmma and P [64, 16]
from the softmax, through shared memory. With `values_in_registers` (the large-batch default since session 26)
V^T never goes through shared memory: each thread builds the rows of V^T the wgmma's register operand gives it,
O^T's rows permuted so that those are the four parts of one code byte a token (`value_row_channels`).

Status (H200, 2026-12-04, `benchmarks/mosaic_int2_bench.py`, `results/decode_attention_notes.md`): with
`defer_values_wgmma` and `overlap_values=False`, 32k tokens of INT2 in 578 µs at batch 60 against the
Triton kernel's 645, 94 against 101 at batch 8. In the registered path as `"pallas:mosaic_int2"`
(`DecodeConfig.int2_mosaic`): a layer's range of the INT2 pool (`range_partials`: the count of windows is
data, each split's trip count follows it) in a launch of its own, merged with the Triton launch's
partials; one layer at batch 8 x 32k, mixed plan, 150 µs against 158. In the 7B step at 32 x 100 (session
22) its launches take 5.26 ms a step against the Triton launch's 5.95, but the XLA bias around them 0.87
ms more: hence `dequantize_keys` (no bias) and `lagged_max` (one barrier a step, 8-10 % faster, session 23).
With four warpgroups a CTA, O^T in place, magic exponents and ex2.approx.ftz (`wg4_large_batch_ftz`, at least
4 splits): 251 µs against Triton's 344 at batch 32 x 32k (session 25). What `"pallas"` runs at large batches is
that with V^T built in registers as the V wgmma's operand (`values_in_registers`: the values never go through
shared memory, whose data pipe had bounded the kernel): 128 µs against 153 at batch 32 x 19,968 tokens, and the
7B step at 32 x 100 in 8.87 ms against fp16's 13.27 (session 26).

Layouts: codes [N, T, H/4] uint8 packed "split" style (byte j holds channels j, j + 32, j + 64, j + 96 at
bits 0, 2, 4, 6), scales and minimums [N, T/32, H] f16, N = batch * KV heads. Scores are base 2 (q carries
log2 e and the softmax scale). H = 128, window 32.

INT4 pools take the same kernel: codes [N, T, H/2] (byte j holds channels j and j + 64), so 2 parts of 64
channels, 16^p c, instead of 4 of 32 (the bit width follows from the codes' shape; 1.08 x the Triton INT4
launch at batch 8, 0.91 x at 60, session 23: off by default). Since session 27 the large-batch options take INT4
too (magic exponents under 2^(10 - 4p), V^T in registers from a token's two code bytes: `value_row_byte`;
`"pallas:mosaic_int2_wg4_vregs_int4"`, compiled offline but not yet timed).

A launch is a `KernelPlan` (`kernel_plan`): its body, operands, grid and shared memory. `int2_decode` launches one;
`launch_together` (s52) launches several pools' in one grid, each CTA its own pool's body and shared memory, so that
a layer's INT2 and INT4 pools cost one launch's fill and drain (`quantized_decode.mosaic_launch_config`: below 64
pairs since s52, the pools' grids sharing a wave; batch 8 x 32k 87 µs of GPU span against 94 on an H100).
"""
from __future__ import annotations

import dataclasses
import functools
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

WINDOW, STEP, HEAD_DIM, COLUMNS = 32, 64, 128, 16
# `int2_decode`'s diagnostics (wrong by design): what a step skips
KNOCKOUTS = ("", "keys", "values", "both", "key_metadata", "value_metadata", "metadata", "key_scaling",
             "value_scaling", "scaling")
_NEG = -1e30


def available() -> bool:
  """Mosaic GPU's `plgpu.kernel` and register-operand wgmma need JAX >= 0.11."""
  major, minor = (int(x) for x in jax.__version__.split(".")[:2])
  return (major, minor) >= (0, 11)


_INTERPRET_PATCHED = False


def interpret_wgmma_with_register_lhs() -> None:
  """Lets Mosaic GPU's interpret mode (JAX 0.11.2) run `plgpu.wgmma` with its A operand in registers.

  Its wgmma callback reads A from shared memory only. This wraps the interpreter's rule: where A is a
  value, one callback adds a @ b to the accumulator, reading b and the accumulator as the original does.
  Private APIs of one JAX version (checked by `tests/test_mosaic_int2.py` and the probe); applied once, by
  `interpret_params()`.
  """
  global _INTERPRET_PATCHED
  if _INTERPRET_PATCHED:
    return
  _INTERPRET_PATCHED = True
  from jax._src import callback
  from jax._src import state
  from jax._src.pallas.mosaic_gpu.interpret import gpu_callbacks, jaxpr_interpret

  original = jaxpr_interpret.JaxprInterpreter._interpret_wgmma_ref_p

  def with_value(*, token, mesh_location, thread, acc_key, acc_transforms, a, b_key, b_transforms):
    memory = gpu_callbacks._get_shared_memory()
    key = gpu_callbacks.HostAllocationKey.from_array
    acc_key, b_key = key(acc_key), key(b_key)
    clean = lambda t: jax.tree.map(int, gpu_callbacks._remove_noop_transforms(t))
    acc_range = memory.access(acc_key, clean(acc_transforms))
    b, _, _ = memory.get_buffer_content(b_key, memory.access(b_key, clean(b_transforms)), thread)
    acc, _, _ = memory.get_buffer_content(acc_key, acc_range, thread)
    memory.store_buffer_content(acc_key, acc_range, acc + np.matmul(np.asarray(a), b, dtype=acc.dtype), thread)
    return token

  def rule(self, eqn, token, get_invals):
    if isinstance(eqn.invars[1].aval, state.AbstractRef):
      return original(self, eqn, token, get_invals)
    acc, a, b, *leaves = get_invals()
    empty = jax.tree.structure([])
    acc_transforms, _, b_transforms = jax.tree.unflatten(jax.tree_util.treedef_tuple((
        eqn.params["acc_transforms_tree"] or empty, eqn.params["a_transforms_tree"] or empty,
        eqn.params["b_transforms_tree"] or empty)), leaves)
    return callback.io_callback(
        with_value, gpu_callbacks.TOKEN_SHAPE_DTYPE, token=token,
        mesh_location=self.mesh_location, thread=self.thread, acc_key=acc, acc_transforms=acc_transforms,
        a=a, b_key=b, b_transforms=b_transforms), []

  jaxpr_interpret.JaxprInterpreter._interpret_wgmma_ref_p = rule


def interpret_params():
  """Mosaic GPU's interpret mode (CPU), with wgmma's register operand."""
  from jax.experimental.pallas import mosaic_gpu as plgpu
  interpret_wgmma_with_register_lhs()
  return plgpu.InterpretGPUParams()


def code_bits(k_codes) -> int:
  """2 or 4: the bit width of codes [N, T, H * bits / 8]."""
  bits = k_codes.shape[-1] * 8 // HEAD_DIM
  if bits not in (2, 4) or k_codes.shape[-1] * 8 % HEAD_DIM:
    raise ValueError(f"codes {k_codes.shape}: need [N, T, {HEAD_DIM // 4}] (INT2) or [N, T, {HEAD_DIM // 2}] "
                     "(INT4)")
  return bits


def cta_splits(splits: int, warpgroups: int, pairs: int) -> int:
  """`splits`, or the next multiple of `warpgroups` where a CTA of that many programs cannot take it: a CTA's
  programs are splits of one pair (a multiple), or every split of warpgroups / splits pairs (a divisor, where
  the pairs divide into such CTAs)."""
  if splits % warpgroups == 0 or (warpgroups % splits == 0 and pairs % (warpgroups // splits) == 0):
    return splits
  return -(-splits // warpgroups) * warpgroups


def query_operands(q: jax.Array, part_scaled: bool = True, bits: int = 2) -> jax.Array:
  """q [N, G, H] (scaled, base 2) -> [N, H, 16] f16: q^T twice (one block of 8 columns a window of the
  step), times (2^bits)^-p for channel part p where the key parts come as (2^bits)^p c (`part_scaled`)."""
  n, g, h = q.shape
  if g > COLUMNS // 2 or h != HEAD_DIM:
    raise ValueError(f"the Mosaic INT2 kernel serves up to 8 query heads of dim {HEAD_DIM}, got {g} of {h}")
  # Column c takes head c % 8, as a sum over the heads against a 0/1 selection (exact: one term is not zero),
  # one fusion for XLA. Written as a swap of axes, a padding and a concatenation, it is the likely source of
  # the convert, transpose and concatenate kernels a layer that only the Mosaic path had in the 7B step
  # (session 23's profile).
  pick = (jnp.arange(COLUMNS)[None, :] % (COLUMNS // 2) == jnp.arange(g)[:, None]).astype(jnp.float32)
  part_scale = (2.0 ** bits) ** -(jnp.arange(h) // (h * bits // 8)) if part_scaled else jnp.ones((h,))
  qt = jnp.sum(q.astype(jnp.float32)[:, :, :, None] * pick[None, :, None, :], axis=1)
  # (s38 tried the sum in f16 after the rounding, to drop the convert kernel after the reduction: in a second
  # H100 run the 60 x 5 steps of the methods it serves were 1.5-2.5 % slower, fp16's the same; reverted)
  return (qt * part_scale[None, :, None]).astype(jnp.float16)


def query_rows(q: jax.Array) -> jax.Array:
  """q [N, G, H] (scaled, base 2) -> [N, 8, H] f16: `narrow_scores`' B operand, the G heads' rows, zero rows to 8."""
  n, g, h = q.shape
  if g > COLUMNS // 2 or h != HEAD_DIM:
    raise ValueError(f"the Mosaic INT2 kernel serves up to 8 query heads of dim {HEAD_DIM}, got {g} of {h}")
  return jnp.pad(q.astype(jnp.float16), ((0, 0), (0, COLUMNS // 2 - g), (0, 0)))


def key_bias(q: jax.Array, k_min: jax.Array) -> jax.Array:
  """q [N, G, H] . key minimums [N, W, H] -> [N, W, 16] f32: a row a window, its G heads' biases in columns
  0 ... 7 and again in 8 ... 15 (a step takes columns 0-7 of its first window's row and 8-15 of its
  second's; two rows move as one 128-byte TMA copy)."""
  g = q.shape[1]
  bias = jnp.einsum("ngh,nwh->nwg", q.astype(jnp.float32), k_min.astype(jnp.float32))
  bias = jnp.pad(bias, ((0, 0), (0, 0), (0, COLUMNS // 2 - g)))
  return jnp.concatenate([bias, bias], axis=2)


def factored_bias(q: jax.Array, k_scale: jax.Array, k_min: jax.Array, magic: bool = True,
                  bits: int = 2) -> jax.Array:
  """`factored_keys`' bias [N, W, 16] f32: q . m less the magic numbers' share of the scores, sum_c magic_c B_c, a
  window and head, B_c = f16(f16(q_c) s_c) as the kernel rounds the score wgmma's B (an f16 product of f16s is
  exact in f32 before its rounding), so that the share cancels to f32's rounding of the sums (the keys come as magic
  + code, `folded_part_constants`); `magic=False` (the interpret mode's exact codes): `key_bias` of the minimums."""
  bias = key_bias(q, k_min)
  if not magic:
    return bias
  b = q.astype(jnp.float16)[:, None] * k_scale.astype(jnp.float16)[:, :, None]  # [N, W, G, H] f16
  share = jnp.sum(b.astype(jnp.float32) * jnp.asarray(_part_magic(bits)), axis=-1)  # [N, W, G]
  share = jnp.pad(share, ((0, 0), (0, 0), (0, COLUMNS // 2 - q.shape[1])))
  return bias - jnp.concatenate([share, share], axis=2)


def factored_magic(interpret, fast_unpack: bool = True) -> bool:
  """Whether `factored_keys`' keys come as magic + code, so that its bias must take the magic numbers' share: the
  register path's (not the interpret mode's exact codes)."""
  return fast_unpack and interpret is None


def range_bias(q: jax.Array, k_min: jax.Array, first, count, windows: int,
               steps_per_block: int = 1, k_scale: jax.Array | None = None,
               magic: bool = False) -> tuple[jax.Array, jax.Array]:
  """`key_bias` over a layer's range [first, first + count) of a pool (data; `windows` >= count, static):
  the biases of `windows` windows from `first` moved back where they would run off the pool (an in-bounds
  slice, no gather), windows outside the range -1e30, then 2 x `steps_per_block` rows of -1e30 (what a
  block's last steps read past the count). Returns the bias and the row of window `first` in it. With `k_scale`,
  `factored_bias`'s (`magic`: of keys as magic + code) over the slice."""
  pool = k_min.shape[1]
  windows = min(windows, pool)
  start = jnp.clip(first, 0, pool - windows)
  index = start + jnp.arange(windows)
  sliced = lambda x: lax.dynamic_slice_in_dim(x, start, windows, axis=1)
  bias = key_bias(q, sliced(k_min)) if k_scale is None else factored_bias(q, sliced(k_scale), sliced(k_min), magic)
  bias = jnp.where(((index >= first) & (index < first + count))[None, :, None], bias, _NEG)
  return jnp.pad(bias, ((0, 0), (0, 2 * steps_per_block), (0, 0)), constant_values=_NEG), first - start


def _metadata_by_ldmatrix(ref, window, i32):
  """A [2, H] f16 ref of scales or minimums (shared memory) -> 16 registers a thread: register c holds the
  pair of channels 8c + 2 (lane % 4) (and + 1) of row `window` (the thread's). Four `ldmatrix.x4`, each of four
  8 x 8 matrices whose 8 rows all point at one 16-byte chunk of the row, so that every lane gets its own pair
  of each chunk; 4 instructions where loads of a pair take 16."""
  from jax.experimental.mosaic import gpu as mgpu
  from jax._src.lib.mlir import ir
  from jax._src.lib.mlir.dialects import arith, llvm

  c = lambda v: arith.constant(i32, v)
  base = llvm.ptrtoint(i32, mgpu.utils.memref_ptr(ref))
  lane = arith.andi(mgpu.utils.thread_idx(), c(31))
  row = arith.addi(base, arith.muli(window, c(2 * HEAD_DIM)))
  row = arith.addi(row, arith.muli(arith.shrui(lane, c(3)), c(16)))  # lanes 8m..8m+7 give matrix m's rows
  quad = ir.Type.parse("!llvm.struct<(i32, i32, i32, i32)>")
  pairs = []
  for k in range(HEAD_DIM // 32):  # chunks 4k..4k+3
    loaded = llvm.inline_asm(quad, [arith.addi(row, c(64 * k))],
                             "ldmatrix.sync.aligned.m8n8.x4.shared.b16 {$0, $1, $2, $3}, [$4];",
                             "=r,=r,=r,=r,r", has_side_effects=True)  # not moved above the TMA's barrier wait
    pairs += [llvm.extractvalue(i32, loaded, [i]) for i in range(4)]
  return pairs


def thread_order(x, axis: int = -1):
  """Window metadata (scales or minimums, [..., H] with H = 128) in the order `metadata_in_thread_order` reads:
  within each part's 32 channels 32p + 8g + 2l + e (g: the 8-channel group, l = lane % 4, e: the pair's half),
  the f16 at 32p + 8l + 2g + e. The pairs of a 4 x 4 block swap places, so the order is its own inverse: a
  thread's 4 pairs of a part become 16 contiguous bytes, one `ld.shared.v4` where pair loads took four."""
  return key_order(x, 2, axis)  # the same swap of pairs as INT2's permuted key columns


def key_order(x, bits: int = 2, axis: int = -1):
  """q's channels in the order of `permuted_keys`' key columns: column 8g + 2l + e of part p (W = H bits / 8
  channels a part; g < W / 8 the column group, l = lane % 4, e the pair's half) holds channel W p + (W / 4) l +
  2g + e, so that a thread's W / 4 channels of a part are contiguous in a token's code bytes (byte j of a row
  holds channels j + W p) and in a window's scales and minimums. For INT2 this is `thread_order` (the 4 x 4
  blocks of pairs make it its own inverse); INT4's 4 x 8 blocks do not."""
  # A swap of two axes of a reshape, not a gather (as a gather on q^T, the permutation was a kernel of its own a
  # layer in the 7B step: 72 µs a step at 32 x 100, session 28)
  axis = axis % x.ndim
  shape, width = x.shape, HEAD_DIM * bits // 8
  blocks = x.reshape(*shape[:axis], HEAD_DIM // width, 4, width // 8, 2, *shape[axis + 1:])
  return blocks.swapaxes(axis + 1, axis + 2).reshape(shape)


def _metadata_in_thread_order(ref, window, part, lane_pair, i32, bits: int = 2):
  """The W / 2 f16 at W part + (W / 4) (lane % 4) of row `window` of a [2, H] f16 ref (W = H bits / 8 channels a
  part), as W / 8 pairs (i32 registers), by 16-byte loads where pair loads took one a pair: INT2's 16 bytes (4
  pairs) one load, INT4's 32 bytes two. For INT2, in `thread_order` these are the 4 pairs of `part` the thread
  needs (its column groups g = 0..3, channels 32 part + 8g + 2 (lane % 4)); in channel order, channels W part +
  (W / 4) (lane % 4) .. of `_keys_by_thread` (both widths). A 16-byte load takes as many shared-memory wavefronts
  a warp as its 4 pair loads (ncu s26), but one instruction."""
  from jax.experimental.mosaic import gpu as mgpu
  from jax._src.lib.mlir import ir
  from jax._src.lib.mlir.dialects import arith, llvm

  c = lambda v: arith.constant(i32, v)
  width = HEAD_DIM * bits // 8
  base = llvm.ptrtoint(i32, mgpu.utils.memref_ptr(ref))
  address = arith.addi(arith.addi(base, arith.muli(window, c(2 * HEAD_DIM))), c(2 * width * part))
  address = arith.addi(address, arith.muli(lane_pair, c(width // 2)))
  quad = ir.Type.parse("!llvm.struct<(i32, i32, i32, i32)>")
  pairs = []
  for chunk in range(width // 32):
    loaded = llvm.inline_asm(quad, [arith.addi(address, c(16 * chunk)) if chunk else address],
                             "ld.shared.v4.b32 {$0, $1, $2, $3}, [$4];", "=r,=r,=r,=r,r",
                             has_side_effects=True)  # not moved above the TMA's barrier wait
    pairs += [llvm.extractvalue(i32, loaded, [i]) for i in range(4)]
  return pairs


def _static_column_groups(codes) -> list[int]:
  """For each register of `codes` (WGMMA layout), the 8-column group of its first code: the register's column
  is 2 (lane % 4) + 8 x this (the lane's part is dynamic, the rest static; see TiledLayout.thread_idxs)."""
  from jax.experimental.mosaic import gpu as mgpu
  shape = tuple(codes.shape)
  strides = codes.layout.tiling.tile_strides(tuple(mgpu.utils.get_contiguous_strides(shape)))
  columns = [sum(i * s for i, s in zip(idx, strides)) % shape[1] for idx in np.ndindex(codes.registers.shape)]
  assert all(col % 8 == 0 for col in columns), columns
  return [col // 8 for col in columns]


def _kept_bits(spread, mask, exponent, i32, half2):
  """The bits `mask` of each half of `spread` (i32) under the exponent bits `exponent`, as f16x2: one AND, or
  with an exponent one LOP3 (as an AND and an OR, ptxas kept two, s25's SASS)."""
  from jax.experimental.mosaic import gpu as mgpu
  from jax._src.lib.mlir.dialects import arith, llvm

  const = lambda v: arith.constant(i32, v)
  if exponent:
    kept = llvm.inline_asm(i32, [spread, const(0x10001 * mask), const(0x10001 * exponent)],
                           "lop3.b32 $0, $1, $2, $3, 0xEA;", "=r,r,r,r")  # 0xEA: (a & b) | c
  else:
    kept = arith.andi(spread, const(0x10001 * mask))
  return mgpu.utils.bitcast(kept, half2)


def _part_of(spread, constants, magic, i32, half2):
  """One part of the two codes under `prmt`'s spread (i32) as f16x2: the part's bits kept (`_kept_bits`), less
  the magic number (`magic`, f16x2). `constants`: the part's (mask, exponent, _) from `part_constants`."""
  from jax._src.lib.mlir.dialects import arith

  mask, exponent, _ = constants
  return arith.subf(_kept_bits(spread, mask, exponent, i32, half2), magic)


class _FoldedParts:
  """`folded_minimums`: a register path's parts as magic + code (`folded_part_constants`), to be dequantized by
  one f16x2 fma with the scale and the folded minimum m - magic x scale (`minimum`): no subtraction a pair of
  codes. `spread` (the two codes' bytes, each in the low byte of its half) is shifted once for the parts that
  need it (`parts_of`)."""

  def __init__(self, bits: int, i32, half2):
    from jax.experimental.mosaic import gpu as mgpu
    from jax._src.lib.mlir.dialects import arith
    self.i32, self.half2 = i32, half2
    self.constants = [folded_part_constants(p, bits) for p in range(8 // bits)]
    self.shift = max(c[0] for c in self.constants)
    self.negated_magic = [mgpu.utils.bitcast(arith.constant(i32, 0x10001 * _f16_bits(-c[3])), half2)
                          for c in self.constants]

  def minimum(self, scale, minimum, part):
    """The folded minimum (f16x2) of a scale and minimum pair: minimum - magic x scale, one fma."""
    return _fma_f16x2(scale, self.negated_magic[part], minimum, self.half2)

  def parts_of(self, spread, parts=None):
    """spread (i32) -> each part's magic + code (f16x2), one LOP3 each, and one shift for them all (`parts`:
    those parts only)."""
    from jax._src.lib.mlir.dialects import arith
    constants = self.constants if parts is None else [self.constants[p] for p in parts]
    if any(c[0] for c in constants):
      shifted = arith.shli(spread, arith.constant(self.i32, self.shift))
    return [_kept_bits(shifted if shift else spread, mask, exponent, self.i32, self.half2)
            for shift, mask, exponent, _ in constants]


def _fma_f16x2(x, scale, minimum, half2):
  """x * scale + minimum, f16x2, as one PTX fma (LLVM widens a <2 x half> fma to two f32 ones with four
  conversions)."""
  from jax._src.lib.mlir.dialects import llvm
  return llvm.inline_asm(half2, [x, scale, minimum], "fma.rn.f16x2 $0, $1, $2, $3;", "=r,r,r,r")


def _unpacked_parts(codes, scale_ref=None, minimum_ref=None, ptx_fma=True, magic_exponents=False,
                    parts=None, bits=2, ldmatrix_metadata=False, metadata_in_thread_order=False,
                    values_per_token=False):
  """codes [64, 32] uint8 in the WGMMA layout (two codes of a row a register) -> 4 f16 [64, 32] in the WGMMA
  layout: part p is 4^p times the codes (keys; the codes themselves with `magic_exponents`), or, given a
  [2, H] scale and minimum (values), the dequantized values of channels 32p + column, with token t's window
  t // 32. With `bits=4`: codes [64, 64] -> 2 parts [64, 64], 16^p c, channels 64p + column.

  Per register (two bytes of a row): one byte permute puts each byte under the exponent of 1024 (0x64), then
  per part one AND keeps the part's bits in place (1024 + 4^p c exactly, as f16) and one f16x2 subtract
  removes the 1024; values take one f16x2 fma with the window's scale (times 4^-p) and minimum, loaded a pair
  at a time, or with `ldmatrix_metadata` all 16 pairs of each by four `ldmatrix` (`_metadata_by_ldmatrix`).
  With `magic_exponents` the permute leaves the high bytes zero and part p's bits go under the exponent of
  2^(10 - bits p), whose mantissa bit bits x p is worth 1 (one AND-OR, the Triton kernel's trick): the subtract
  then leaves c itself, and neither q nor the values' scales carry (2^bits)^-p. `parts`: which of them to return.
  `metadata_in_thread_order`: the scales and minimums are in `thread_order`, and a part's 4 pairs of each come
  by one 16-byte load (`_metadata_in_thread_order`; INT2 only). `values_per_token` (KIVI's values): the scale and
  minimum are per token and group of 32 channels, [32, 8] f16 refs (token pairs x 4 groups: token t's group g
  at element 4t + g), one f16 a (row, group) loaded and doubled.
  """
  from jax.experimental.mosaic import gpu as mgpu
  from jax.experimental.pallas import mosaic_gpu as plgpu
  from jax._src.lib.mlir import ir
  from jax._src.lib.mlir.dialects import arith, llvm, memref, vector
  from jax._src.lib.mlir.dialects import math as mlir_math

  wgmma = plgpu.Layout.WGMMA
  values = scale_ref is not None
  width = HEAD_DIM * bits // 8  # channels a part
  parts = tuple(range(8 // bits)) if parts is None else parts
  out = tuple(plgpu.ShapeDtypeStruct((STEP, width), jnp.float16, layout=wgmma) for _ in parts)
  arg_types = (wgmma, plgpu.RefType(), plgpu.RefType()) if values else (wgmma,)

  @plgpu.inline_mgpu(arg_types=arg_types, return_type=out)
  def unpack(ctx, codes, *refs):
    del ctx
    i16, i32 = ir.IntegerType.get_signless(16), ir.IntegerType.get_signless(32)
    f16 = ir.F16Type.get()
    half2 = ir.VectorType.get((2,), f16)
    const = lambda v: arith.constant(i32, v)
    constants = [part_constants(p, magic_exponents, bits) for p in range(8 // bits)]
    magic = [mgpu.utils.bitcast(const(0x10001 * c[2]), half2) for c in constants]
    registers = {part: np.empty_like(codes.registers) for part in parts}
    indices = list(codes.layout.thread_idxs(codes.shape))
    if values and values_per_token:  # (row offset, group) -> the f16 scale and minimum in both halves
      offsets, token_metadata = list(_register_offsets(tuple(codes.shape))), {}
      groups = _static_column_groups(codes)
      first_row = _first_row(mgpu.utils.thread_idx(), const)

      def token_scale(n, part, which):
        row_offset, group = offsets[n][1], (width * part + 8 * groups[n]) // 32
        if (row_offset, group, which) not in token_metadata:
          row = arith.addi(first_row, const(row_offset))
          index = lambda v: arith.index_cast(ir.IndexType.get(), v)
          value = memref.load(refs[which], [index(arith.shrui(row, const(1))),
                                            index(arith.addi(arith.muli(arith.andi(row, const(1)), const(4)),
                                                             const(group)))])
          token_metadata[row_offset, group, which] = vector.broadcast(half2, value)
        return token_metadata[row_offset, group, which]
    if values and (ldmatrix_metadata or metadata_in_thread_order):  # a thread's rows lie in one window
      window = arith.index_cast(i32, arith.divui(indices[0][0], arith.constant(ir.IndexType.get(), WINDOW)))
      groups = _static_column_groups(codes)
      chunks = width // 8  # 8-channel chunks a part
    if values and ldmatrix_metadata:  # (a warp's 16 of 64 tokens)
      loaded = [[mgpu.utils.bitcast(x, half2) for x in _metadata_by_ldmatrix(ref, window, i32)] for ref in refs]
    if values and metadata_in_thread_order:
      assert bits == 2 and chunks == 4, "thread order: INT2's 4 column groups a part"
      lane_pair = arith.andi(mgpu.utils.thread_idx(), const(3))
      loaded = [[mgpu.utils.bitcast(x, half2) if part in parts else None for part in range(8 // bits)
                 for x in (_metadata_in_thread_order(ref, window, part, lane_pair, i32) if part in parts
                           else [None] * 4)] for ref in refs]
    for n, ((idx, reg), (row, col)) in enumerate(zip(np.ndenumerate(codes.registers), indices)):
      pair = arith.extui(i32, mgpu.utils.bitcast(reg, i16))
      high = "0" if magic_exponents else "0x64646464"  # the high byte of each half: zero, or 1024's
      spread = llvm.inline_asm(i32, [pair], f"prmt.b32 $0, $1, {high}, 0x4140;", "=r,r")
      if values and not (ldmatrix_metadata or metadata_in_thread_order or values_per_token):
        window = arith.divui(row, arith.constant(ir.IndexType.get(), WINDOW))
      for part in parts:
        x = _part_of(spread, constants[part], magic[part], i32, half2)
        if values:
          if values_per_token:
            scale, minimum = token_scale(n, part, 0), token_scale(n, part, 1)
          elif ldmatrix_metadata or metadata_in_thread_order:
            scale, minimum = (pairs[chunks * part + groups[n]] for pairs in loaded)
          else:
            channel = arith.addi(col, arith.constant(ir.IndexType.get(), width * part))
            scale = vector.load(half2, refs[0], [window, channel])
            minimum = vector.load(half2, refs[1], [window, channel])
          if not magic_exponents:
            scale = arith.mulf(scale, mgpu.utils.bitcast(const(0x10001 * _f16_bits((2.0 ** bits) ** -part)),
                                                         half2))
          if ptx_fma:
            x = _fma_f16x2(x, scale, minimum, half2)
          else:
            x = mlir_math.fma(x, scale, minimum)
        registers[part][idx] = x
    return tuple(mgpu.FragmentedArray(_registers=registers[p], _layout=mgpu.WGMMA_LAYOUT, _is_signed=None)
                 for p in parts)

  return unpack(codes, scale_ref, minimum_ref) if values else unpack(codes)


def value_row_channels(by_ldmatrix: bool = False, bits: int = 2) -> np.ndarray:
  """`values_in_registers`: the channel of each row of O^T (and of the V^T operand). Row 16w + j + 8h + 64m
  (w: the warp, j = lane // 4, h and m: the register's half and M tile, as the WGMMA layout places them) holds
  channel b + 32 (2m + h) with b = 8w + j: the four rows of a thread are the four parts of one byte column b
  of the codes, so that each of its tokens is one byte. `by_ldmatrix` (`values_by_ldmatrix`): channel
  `ldmatrix_value_channel(w, j, h, m, bits)`, two parts of two adjacent bytes."""
  row = np.arange(HEAD_DIM)
  warp, j, h, m = (row % STEP) // 16, row % 8, (row % 16) // 8, row // STEP
  if by_ldmatrix:
    return ldmatrix_value_channel(warp, j, h, m, bits)
  return 8 * warp + j + 32 * (2 * m + h)


def ldmatrix_value_chunk(warp, bits: int = 2):
  """`values_by_ldmatrix`: the 16-byte chunk of a token's codes a warp's `ldmatrix` reads: INT2's 32 bytes are
  two (warps 0, 2 and 1, 3 read the same bytes, for different parts), INT4's 64 four."""
  return warp % 2 if bits == 2 else warp


def ldmatrix_value_channel(warp, j, h, m, bits: int = 2):
  """`values_by_ldmatrix`: the channel of a thread's row 16w + j + 8h + 64m of V^T (w: its warp in the
  warpgroup, j = lane // 4): byte 16 c + 2j + h of a token's codes (c: the warp's chunk, `ldmatrix_value_chunk`;
  `ldmatrix`'s b16 column j is bytes 2j and 2j + 1 of it), and of that byte INT2's part 2 (w // 2) + m (channel
  byte + 32 part), INT4's part m (byte + 64 m). A thread's channels are two adjacent pairs, so a window's scales
  (and minimums) of a part are one 32-bit load. Works on ints and numpy arrays alike."""
  byte = 16 * ldmatrix_value_chunk(warp, bits) + 2 * j + h
  return byte + (32 * (2 * (warp // 2) + m) if bits == 2 else 64 * m)


def ldmatrix_value_rotation(warp, h, m: int = 0, bits: int = 2):
  """`values_by_ldmatrix`: the right rotation of a register of `ldmatrix.trans` (bytes 2j and 2j + 1 of two
  tokens: [b0, b1] of the first in the low half, of the second in the high) that brings part m of byte b_h to
  the mantissa bits of `folded_part_constants(m, bits)` in each half. INT2 (m does not matter: both parts come
  from one rotation): the warp's parts 2 (w // 2) and + 1 to bits 6-7 and 8-9 (parts 0-1 of b0 are bits 0-3,
  left by 6; parts 2-3 bits 4-7, left by 2; b1's 8 bits further). INT4: the nibble to bits 4-7 (b0's low nibble
  left by 4, its high one in place; b1's 8 bits further)."""
  if bits == 2:
    return (26 + 4 * (warp // 2) + 8 * h) % 32
  return (28 + 8 * h + 4 * m) % 32


def value_row_byte(group: int, bits: int) -> tuple[int, int]:
  """`values_in_registers`: where the channel b + 32 group of `value_row_channels` lies in a token's codes, as
  (offset from byte column b, part): INT2's four groups are the four parts of byte b; INT4's are the two parts
  of bytes b and b + 32 (byte j holds channels j and j + 64)."""
  return (0, group) if bits == 2 else (32 * (group % 2), group // 2)


def _register_types():
  """(i32, f16x2, c) for the register paths' inline MLIR: c(v) makes an i32 constant."""
  from jax._src.lib.mlir import ir
  from jax._src.lib.mlir.dialects import arith
  i32 = ir.IntegerType.get_signless(32)
  return i32, ir.VectorType.get((2,), ir.F16Type.get()), lambda v: arith.constant(i32, v)


def _swizzled_codes(row_bytes: int):
  """The ref type of a step's codes as TMA stores them: rows of `row_bytes`, tiled by 8 rows, swizzled."""
  from jax.experimental.pallas import mosaic_gpu as plgpu
  return plgpu.RefType((plgpu.TilingTransform((8, row_bytes)), plgpu.SwizzleTransform(row_bytes)))


def _ldmatrix_first_channel(c, bits: int):
  """`values_by_ldmatrix`: `ldmatrix_value_channel(w, j, 0, 0, bits)` of this thread (i32; `c` makes i32
  constants): its rows' h and m add the static `ldmatrix_value_channel(0, 0, h, m, bits)`."""
  from jax.experimental.mosaic import gpu as mgpu
  from jax._src.lib.mlir.dialects import arith
  thread = mgpu.utils.thread_idx()
  warp, j = arith.andi(arith.shrui(thread, c(5)), c(3)), arith.shrui(arith.andi(thread, c(31)), c(2))
  chunk = arith.andi(warp, c(1)) if bits == 2 else warp  # ldmatrix_value_chunk
  channel = arith.addi(arith.muli(chunk, c(16)), arith.muli(j, c(2)))
  return arith.addi(channel, arith.muli(arith.shrui(warp, c(1)), c(64))) if bits == 2 else channel


def _first_row(thread, c):
  """A thread's first row in the WGMMA layout of a [64, N] operand (i32): 16w + lane // 4, w its warp in the
  warpgroup; its other row is 8 further. `c` makes i32 constants."""
  from jax._src.lib.mlir.dialects import arith
  return arith.addi(arith.muli(arith.andi(arith.shrui(thread, c(5)), c(3)), c(16)),
                    arith.shrui(arith.andi(thread, c(31)), c(2)))


def _thread_position(i32):
  """(b, f) of this thread in the WGMMA layout (i32 values): its first row 16w + j (w: the warp of its
  warpgroup, j = lane // 4) as the byte column b = 8w + j of `value_row_channels`, and its first column
  f = 2 (lane % 4)."""
  from jax.experimental.mosaic import gpu as mgpu
  from jax._src.lib.mlir.dialects import arith

  c = lambda v: arith.constant(i32, v)
  thread = mgpu.utils.thread_idx()
  lane = arith.andi(thread, c(31))
  column = arith.addi(arith.muli(arith.andi(arith.shrui(thread, c(5)), c(3)), c(8)), arith.shrui(lane, c(2)))
  return column, arith.muli(arith.andi(lane, c(3)), c(2))


def _register_offsets(shape):
  """(register index, row, column) of each register of a WGMMA-layout array of `shape`: its static offset
  from the thread's first row and column."""
  from jax.experimental.mosaic import gpu as mgpu
  strides = mgpu.WGMMA_LAYOUT.tiling.tile_strides(tuple(mgpu.utils.get_contiguous_strides(shape)))
  for idx in np.ndindex(mgpu.WGMMA_LAYOUT.registers_shape(shape)):
    yield (idx, *divmod(sum(i * s for i, s in zip(idx, strides)), shape[1]))


def _token_byte_pairs(codes, column, first_token, row_bytes, i32):
  """The register paths' V^T codes: returns pair(token, byte_offset), the i32 holding byte `column` + byte_offset
  of tokens first_token + token and the next (of a step's swizzled codes ref), each in the low byte of its half:
  a `ld.shared.u8` a token, one `prmt` for the two."""
  from jax.experimental.mosaic import gpu as mgpu
  from jax._src.lib.mlir.dialects import arith, llvm

  c = lambda v: arith.constant(i32, v)
  base = llvm.ptrtoint(i32, mgpu.utils.memref_ptr(codes))

  def code_byte(token_offset, byte_offset):
    byte = arith.addi(column, c(byte_offset)) if byte_offset else column
    offset = arith.addi(arith.muli(arith.addi(first_token, c(token_offset)), c(row_bytes)), byte)
    # The swizzle XORs the 16-byte chunk's index (bits 4 and up) with the offset's bits 7 and up.
    offset = arith.xori(offset, arith.andi(arith.shrui(offset, c(3)), c(row_bytes - 16)))
    return llvm.inline_asm(i32, [arith.addi(base, offset)], "ld.shared.u8 $0, [$1];", "=r,r",
                           has_side_effects=True)  # not moved above the TMA's barrier wait

  def pair(token, byte_offset):
    return llvm.inline_asm(i32, [code_byte(token, byte_offset), code_byte(token + 1, byte_offset)],
                           "prmt.b32 $0, $1, $2, 0x5410;", "=r,r,r")
  return pair


def _values_transposed(codes_ref, scale_ref, minimum_ref, metadata_in_thread_order=False, bits=2, folded=False,
                       prefolded=False, one_metadata_load=False):
  """A step's values as the V wgmma's register operand: V^T f16 [128, 64] (WGMMA layout), row r channel
  `value_row_channels()[r]`, column t token t, from the codes [64, 32] (uint8, 32-byte swizzle) and the [2, H]
  scales and minimums. A thread holds byte column b = 8w + lane // 4 of 16 tokens (2 (lane % 4) + 8i and the
  next): a byte a token (`ld.shared.u8`), two tokens' bytes under one `prmt`, then per part the magic exponents'
  LOP3, the subtraction and one f16x2 fma with the window's scale and minimum (both halves one channel and
  window: 16 loads of one f16 a thread a step, where the WGMMA layout of the codes takes 32 of a pair). No
  stores of V to shared memory and no V reads by the wgmma: they were 40 % of the kernel's shared-memory
  wavefronts (ncu, s26). Magic exponents. `metadata_in_thread_order`: the scales and minimums are in
  `thread_order` (channel 8g + 2l + e of a part at 8l + 2g + e; INT2).

  `bits=4`: codes [64, 64] (64-byte swizzle), byte j holding channels j and j + 64. The thread's rows are the
  same channels, b + 32 (2m + h): those of row half h are the two parts (m) of byte column b + 32h, so a token
  takes two bytes, one a half.

  `folded` (`folded_minimums`): the parts as magic + code (`_FoldedParts`), each (window, channel)'s minimum
  folded once (8 fmas a thread a step), no subtraction a register (32); `prefolded`: they come folded
  (`fold_minimums`), none of the 8. `one_metadata_load` (a knockout, wrong by design): window 0's first group
  stands for every (window, group), one f16 load of each."""
  from jax.experimental.mosaic import gpu as mgpu
  from jax.experimental.pallas import mosaic_gpu as plgpu
  from jax._src.lib.mlir import ir
  from jax._src.lib.mlir.dialects import arith, memref, vector

  wgmma = plgpu.Layout.WGMMA
  shape = (HEAD_DIM, STEP)

  row_bytes = HEAD_DIM * bits // 8
  codes_type = _swizzled_codes(row_bytes)

  @plgpu.inline_mgpu(arg_types=(codes_type, plgpu.RefType(), plgpu.RefType()),
                     return_type=plgpu.ShapeDtypeStruct(shape, jnp.float16, layout=wgmma))
  def unpack(ctx, codes, scales, minimums):
    del ctx
    i32, index = ir.IntegerType.get_signless(32), ir.IndexType.get()
    half2 = ir.VectorType.get((2,), ir.F16Type.get())
    c = lambda v: arith.constant(i32, v)
    column, first_token = _thread_position(i32)
    two_tokens = _token_byte_pairs(codes, column, first_token, row_bytes, i32)
    constants = [part_constants(p, True, bits) for p in range(8 // bits)]
    magic = [mgpu.utils.bitcast(c(0x10001 * k[2]), half2) for k in constants]
    stored = column  # where channel `column` of a part sits in its 32
    if metadata_in_thread_order:  # b = 8g + 2l + e sits at 8l + 2g + e
      pair = arith.andi(column, c(7))
      stored = arith.addi(arith.addi(arith.muli(arith.shrui(pair, c(1)), c(8)),
                                     arith.muli(arith.shrui(column, c(3)), c(2))), arith.andi(column, c(1)))
    channel = lambda part: arith.index_cast(index, arith.addi(stored, c(32 * part)))
    refs, metadata = (scales, minimums), {}  # (ref, window, part) -> the f16 in both halves

    def broadcast(which, window, part):
      if one_metadata_load:
        window, part = 0, 0
      if (which, window, part) not in metadata:
        value = memref.load(refs[which], [arith.constant(index, window), channel(part)])
        metadata[which, window, part] = vector.broadcast(half2, value)
      return metadata[which, window, part]

    folding = _FoldedParts(bits, i32, half2) if folded else None
    folded_minimums = {}  # (window, group) -> its folded minimum, f16x2

    def minimum(window, group, part):
      if one_metadata_load:
        window, group = 0, 0
      if not folded or prefolded:
        return broadcast(1, window, group)
      if (window, group) not in folded_minimums:
        folded_minimums[window, group] = folding.minimum(broadcast(0, window, group), broadcast(1, window, group),
                                                         part)
      return folded_minimums[window, group]
    spread = {}  # (token offset, byte offset) -> the two tokens' bytes, each in the low byte of its half
    registers = np.empty(mgpu.WGMMA_LAYOUT.registers_shape(shape), dtype=object)
    for idx, row, token in _register_offsets(shape):
      group, window = 2 * (row // STEP) + (row % STEP) // 8, token // WINDOW  # channel column + 32 group
      byte_offset, part = value_row_byte(group, bits)
      if (token, byte_offset) not in spread:
        pair = two_tokens(token, byte_offset)
        spread[token, byte_offset] = folding.parts_of(pair) if folded else pair
      if folded:
        x = spread[token, byte_offset][part]
      else:
        x = _part_of(spread[token, byte_offset], constants[part], magic[part], i32, half2)
      registers[idx] = _fma_f16x2(x, broadcast(0, window, group), minimum(window, group, part), half2)
    return mgpu.FragmentedArray(_registers=registers, _layout=mgpu.WGMMA_LAYOUT, _is_signed=None)

  return unpack(codes_ref, scale_ref, minimum_ref)


def _value_codes_transposed(codes_ref, bits=2):
  """`token_scaled_p` (KIVI's values): a step's value codes as the V wgmma's register operand, exact (no scale or
  minimum), as two V^T tiles f16 [64, 64] (WGMMA layout): tile m's row r is channel `value_row_channels()[64 m +
  r]`, column t token t. The codes come as in `_values_transposed` (a byte a token, two tokens under one `prmt`),
  then per part the magic exponents' LOP3 and one subtraction: c itself, so that the V wgmma's products carry no
  magic number against a probability scaled by the token's scale (`_token_scaled_p`)."""
  from jax.experimental.mosaic import gpu as mgpu
  from jax.experimental.pallas import mosaic_gpu as plgpu

  wgmma = plgpu.Layout.WGMMA
  tile = (STEP, STEP)
  row_bytes = HEAD_DIM * bits // 8

  @plgpu.inline_mgpu(arg_types=(_swizzled_codes(row_bytes),),
                     return_type=tuple(plgpu.ShapeDtypeStruct(tile, jnp.float16, layout=wgmma) for _ in range(2)))
  def unpack(ctx, codes):
    del ctx
    i32, half2, c = _register_types()
    two_tokens = _token_byte_pairs(codes, *_thread_position(i32), row_bytes, i32)
    constants = [part_constants(p, True, bits) for p in range(8 // bits)]
    magic = [mgpu.utils.bitcast(c(0x10001 * k[2]), half2) for k in constants]
    spread, tiles = {}, []
    for m in range(2):
      registers = np.empty(mgpu.WGMMA_LAYOUT.registers_shape(tile), dtype=object)
      for idx, row, token in _register_offsets(tile):
        byte_offset, part = value_row_byte(2 * m + row // 8, bits)
        if (token, byte_offset) not in spread:
          spread[token, byte_offset] = two_tokens(token, byte_offset)
        registers[idx] = _part_of(spread[token, byte_offset], constants[part], magic[part], i32, half2)
      tiles.append(mgpu.FragmentedArray(_registers=registers, _layout=mgpu.WGMMA_LAYOUT, _is_signed=None))
    return tuple(tiles)

  return unpack(codes_ref)


def _token_metadata_words(ref, row_offset, i32, c):
  """`token_scaled_p`: the 4 f16 (one a group of 32 channels) of this thread's row `row_offset` of a step's
  [32, 8] token-pair buffer (token t at element 4t + g), as two i32 words: one 8-byte load."""
  from jax.experimental.mosaic import gpu as mgpu
  from jax._src.lib.mlir import ir
  from jax._src.lib.mlir.dialects import arith, llvm

  base = llvm.ptrtoint(i32, mgpu.utils.memref_ptr(ref))
  token = arith.addi(_first_row(mgpu.utils.thread_idx(), c), c(row_offset))
  pair = ir.Type.parse("!llvm.struct<(i32, i32)>")
  loaded = llvm.inline_asm(pair, [arith.addi(base, arith.muli(token, c(8)))], "ld.shared.v2.b32 {$0, $1}, [$2];",
                           "=r,=r,r", has_side_effects=True)  # not moved above the TMA's barrier wait
  return [llvm.extractvalue(i32, loaded, [k]) for k in range(2)]


def _token_scaled_p(p, scale_ref):
  """`token_scaled_p`: P [64, 8] f32 (WGMMA layout) -> the V wgmmas' B operands, f16 [64, 16] a V^T tile m:
  column h of tile m's is s[t, 2m] P[t, h], column 8 + h s[t, 2m + 1] P[t, h], s the token's scale of a group
  of 32 channels (tile m's rows are groups 2m and 2m + 1: `value_row_channels`). A thread's two rows' scales by
  one 8-byte load each; a register pair one f16x2 multiply by a scale in both halves."""
  from jax.experimental.mosaic import gpu as mgpu
  from jax.experimental.pallas import mosaic_gpu as plgpu
  from jax._src.lib.mlir import ir
  from jax._src.lib.mlir.dialects import arith, llvm, vector

  wgmma = plgpu.Layout.WGMMA
  wide = (STEP, COLUMNS)

  @plgpu.inline_mgpu(arg_types=(wgmma, plgpu.RefType()),
                     return_type=tuple(plgpu.ShapeDtypeStruct(wide, jnp.float16, layout=wgmma) for _ in range(2)))
  def scaled(ctx, p, scales):
    del ctx
    i32, half2, c = _register_types()
    rows = {row: p.registers[idx] for idx, row, _ in _register_offsets((STEP, COLUMNS // 2))}
    halves, words = {}, {}
    for row, reg in rows.items():
      x, y = (vector.extract(reg, dynamic_position=[], static_position=ir.DenseI64ArrayAttr.get([k]))
              for k in range(2))
      halves[row] = llvm.inline_asm(half2, [y, x], "cvt.rn.f16x2.f32 $0, $1, $2;", "=r,f,f")  # x low, y high
      words[row] = _token_metadata_words(scales, row, i32, c)
    tiles = []
    for m in range(2):
      registers = np.empty(mgpu.WGMMA_LAYOUT.registers_shape(wide), dtype=object)
      for idx, row, col in _register_offsets(wide):  # group 2m + col // 8: the low or high half of word m
        scale = llvm.inline_asm(half2, [words[row][m]], f"prmt.b32 $0, $1, $1, {'0x3232' if col else '0x1010'};",
                                "=r,r")
        registers[idx] = arith.mulf(halves[row], scale)
      tiles.append(mgpu.FragmentedArray(_registers=registers, _layout=mgpu.WGMMA_LAYOUT, _is_signed=None))
    return tuple(tiles)

  return scaled(p, scale_ref)


def _token_minimum_terms(p, minimum_ref, e):
  """`token_scaled_p`: e [64, 16] f32 (WGMMA layout) plus this step's sum over a thread's two rows of m[t, g]
  P[t, h], m the token's minimum of group g: the values' minimums' share of O^T, kept a thread apart as l is and
  reduced once at the end. Group g's pair of columns sits in e's register of row 8 (g // 2) and column
  8 (g % 2) (`token_scaled_output`)."""
  from jax.experimental.mosaic import gpu as mgpu
  from jax.experimental.pallas import mosaic_gpu as plgpu
  from jax._src.lib.mlir import ir
  from jax._src.lib.mlir.dialects import arith, vector
  from jax._src.lib.mlir.dialects import math as mlir_math

  wgmma = plgpu.Layout.WGMMA

  @plgpu.inline_mgpu(arg_types=(wgmma, plgpu.RefType(), wgmma),
                     return_type=plgpu.ShapeDtypeStruct((STEP, COLUMNS), jnp.float32, layout=wgmma))
  def terms(ctx, p, minimums, e):
    del ctx
    i32, half2, c = _register_types()
    f32 = ir.F32Type.get()
    pair = ir.VectorType.get((2,), f32)
    rows = {row: p.registers[idx] for idx, row, _ in _register_offsets((STEP, COLUMNS // 2))}
    minimum = {}
    for row in rows:
      words = _token_metadata_words(minimums, row, i32, c)
      for g in range(4):
        half = vector.extract(mgpu.utils.bitcast(words[g // 2], half2), dynamic_position=[],
                              static_position=ir.DenseI64ArrayAttr.get([g % 2]))
        minimum[row, g] = vector.broadcast(pair, arith.extf(f32, half))
    registers = np.empty_like(e.registers)
    for idx, row, col in _register_offsets((STEP, COLUMNS)):
      group, reg = 2 * (row // 8) + col // 8, e.registers[idx]
      for source, p_row in rows.items():
        reg = mlir_math.fma(minimum[source, group], p_row, reg)
      registers[idx] = reg
    return mgpu.FragmentedArray(_registers=registers, _layout=mgpu.WGMMA_LAYOUT, _is_signed=None)

  return terms(p, minimum_ref, e)


def _store_token_scaled(tiles, minimum_terms, o_ref, width: int = COLUMNS):
  """`token_scaled_p`: O^T's two tiles f32 [64, 16] (WGMMA layout; tile m's row r channel `value_row_channels()
  [64 m + r]`, of group g = 2m + h, h = (r % 16) // 8, whose heads are columns 8h ... 8h + 7) plus the minimums'
  shares (`minimum_terms[m]`: [64, 16], every row the column sums of `_token_minimum_terms` of groups 2m, 2m + 1)
  -> o_ref (a plain [128, width] f32 buffer in shared memory) in channel order, heads in columns 0-7 (and with
  width 16, 8-15 zero)."""
  from jax.experimental.mosaic import gpu as mgpu
  from jax.experimental.pallas import mosaic_gpu as plgpu
  from jax._src.lib.mlir import ir
  from jax._src.lib.mlir.dialects import arith, llvm, vector

  wgmma = plgpu.Layout.WGMMA

  @plgpu.inline_mgpu(arg_types=(wgmma, wgmma, wgmma, wgmma, plgpu.RefType()))
  def store(ctx, tile0, tile1, terms0, terms1, o_ref):
    del ctx
    i32, _, c = _register_types()
    f32 = ir.F32Type.get()
    column, first_column = _thread_position(i32)
    base = llvm.ptrtoint(i32, mgpu.utils.memref_ptr(o_ref))
    zero = arith.constant(f32, 0.0)
    for m, (tile, terms) in enumerate(((tile0, terms0), (tile1, terms1))):
      for idx, row, col in _register_offsets((STEP, COLUMNS)):
        h, reg, term = row // 8, tile.registers[idx], terms.registers[idx]
        channel = arith.addi(column, c(32 * (2 * m + h)))
        if col == 8 * h:  # this row's heads
          x, y = (vector.extract(arith.addf(reg, term), dynamic_position=[],
                                 static_position=ir.DenseI64ArrayAttr.get([k])) for k in range(2))
          target = first_column
        elif width == COLUMNS:  # the other group's columns: the output's empty 8-15
          x = y = zero
          target = arith.addi(first_column, c(COLUMNS // 2))
        else:  # an 8-wide output has no empty columns
          continue
        element = arith.addi(arith.muli(channel, c(width)), target)
        llvm.inline_asm(ir.Type.parse("!llvm.void"), [arith.addi(base, arith.muli(element, c(4))), x, y],
                        "st.shared.v2.f32 [$0], {$1, $2};", "r,f,f", has_side_effects=True)

  store(*tiles, *minimum_terms, o_ref)


def _values_by_ldmatrix(codes_ref, scale_ref, minimum_ref, bits=2, codes_only=False):
  """`values_by_ldmatrix`: `_values_transposed` (folded minimums) with a thread's rows (`ldmatrix_value_channel`)
  two parts of two adjacent code bytes. Two `ldmatrix.x4.trans` a thread and step bring them: each of the 8
  matrices is 8 tokens x 16 bytes (the warp's chunk of a row, `ldmatrix_value_chunk`), and `.trans` gives
  lane (j, f = lane % 4) b16 column j of tokens 2f and 2f + 1, the WGMMA operand's column pair, in the low and
  high half of one register: 2 loads where `ld.shared.u8` took 16 (INT2) or 32 (INT4), and no `prmt` to pair
  them. A right rotation (`ldmatrix_value_rotation`: INT2 one a byte, its amount the warp's, for both parts;
  INT4 one a part, none for b0's high nibble) puts a part's bits under its magic exponent, one LOP3 a part keeps
  them, and one f16x2 fma with the scale and folded minimum dequantizes them. The scales and minimums of a
  window and part are a pair of channels, one 32-bit load, and one fold a pair: 8 metadata loads and 4 folds a
  step where the byte-column rows took 16 and 8. `codes_only` (a knockout, wrong by design): the parts as magic +
  code, with no scale, minimum or their loads."""
  from jax.experimental.mosaic import gpu as mgpu
  from jax.experimental.pallas import mosaic_gpu as plgpu
  from jax._src.lib.mlir import ir
  from jax._src.lib.mlir.dialects import arith, llvm, vector

  shape, row_bytes = (HEAD_DIM, STEP), HEAD_DIM * bits // 8
  codes_type = _swizzled_codes(row_bytes)

  @plgpu.inline_mgpu(arg_types=(codes_type, plgpu.RefType(), plgpu.RefType()),
                     return_type=plgpu.ShapeDtypeStruct(shape, jnp.float16, layout=plgpu.Layout.WGMMA))
  def unpack(ctx, codes, scales, minimums):
    del ctx
    i32, half2, c = _register_types()
    thread = mgpu.utils.thread_idx()
    lane, warp = arith.andi(thread, c(31)), arith.andi(arith.shrui(thread, c(5)), c(3))
    chunk = arith.andi(warp, c(1)) if bits == 2 else warp  # ldmatrix_value_chunk
    part_pair = arith.shrui(warp, c(1))  # INT2's: parts 2 (w // 2) and + 1
    base = llvm.ptrtoint(i32, mgpu.utils.memref_ptr(codes))
    quad = ir.Type.parse("!llvm.struct<(i32, i32, i32, i32)>")
    raw = []  # raw[i]: tokens 8i + 2f (low half) and + 1 (high), bytes 2j, 2j + 1 of the warp's chunk
    for load in range(2):  # lane l gives row l % 8 of matrix l // 8: token 32 load + l
      offset = arith.addi(arith.muli(arith.addi(lane, c(32 * load)), c(row_bytes)), arith.muli(chunk, c(16)))
      offset = arith.xori(offset, arith.andi(arith.shrui(offset, c(3)), c(row_bytes - 16)))  # the row's swizzle
      loaded = llvm.inline_asm(quad, [arith.addi(base, offset)],
                               "ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {$0, $1, $2, $3}, [$4];",
                               "=r,=r,=r,=r,r", has_side_effects=True)  # not moved above the TMA's barrier wait
      raw += [llvm.extractvalue(i32, loaded, [k]) for k in range(4)]
    if bits == 2:  # ldmatrix_value_rotation(w, h), the warp's part pair as data: one a byte, for both its parts
      amounts = [arith.andi(arith.addi(c(26 + 8 * h), arith.muli(part_pair, c(4))), c(31)) for h in range(2)]
    # INT2: parts at bits 6-7 and 8-9, magic 16 and 4; INT4: nibbles at bits 4-7, magic 64
    constants = [folded_part_constants(m, bits) for m in range(2)]
    negated_magic = [mgpu.utils.bitcast(c(0x10001 * _f16_bits(-k[3])), half2) for k in constants]

    first_channel = _ldmatrix_first_channel(c, bits)
    metadata = {}  # (window, m) -> (scale pair, folded minimum pair), f16x2: channels ch, ch + 1 of the part

    def pairs(window, m):
      if (window, m) not in metadata:
        channel = arith.addi(first_channel, c(ldmatrix_value_channel(0, 0, 0, m, bits)))
        loaded = []
        for ref in (scales, minimums):
          address = arith.addi(llvm.ptrtoint(i32, mgpu.utils.memref_ptr(ref)),
                               arith.muli(arith.addi(channel, c(window * HEAD_DIM)), c(2)))
          loaded.append(mgpu.utils.bitcast(llvm.inline_asm(i32, [address], "ld.shared.b32 $0, [$1];", "=r,r",
                                                           has_side_effects=True), half2))
        scale, minimum = loaded
        metadata[window, m] = scale, _fma_f16x2(scale, negated_magic[m], minimum, half2)
      return metadata[window, m]

    def broadcast(pair, h):  # channel h of a pair in both halves (ptxas takes it as the fma's .H0_H0 / .H1_H1)
      x = vector.extract(pair, dynamic_position=[], static_position=ir.DenseI64ArrayAttr.get([h]))
      return vector.broadcast(half2, x)

    def rotated(i, h, m):  # raw[i] with part m of byte b_h under its exponent: INT2 a rotation a byte, INT4 a part
      key = (i, h) if bits == 2 else (i, h, m)
      if key not in rotations:
        if bits == 4 and ldmatrix_value_rotation(0, h, m, bits) == 0:  # b0's high nibble: in place
          rotations[key] = raw[i]
        else:
          amount = amounts[h] if bits == 2 else c(ldmatrix_value_rotation(0, h, m, bits))
          rotations[key] = llvm.inline_asm(i32, [raw[i], amount], "shf.r.wrap.b32 $0, $1, $1, $2;", "=r,r,r")
      return rotations[key]

    rotations = {}
    registers = np.empty(mgpu.WGMMA_LAYOUT.registers_shape(shape), dtype=object)
    for idx, row, token in _register_offsets(shape):
      i, h, m = token // 8, (row % STEP) // 8, row // STEP
      _, mask, exponent, _ = constants[m]
      if codes_only:
        registers[idx] = _kept_bits(rotated(i, h, m), mask, exponent, i32, half2)
        continue
      scale, minimum = pairs(token // WINDOW, m)
      registers[idx] = _fma_f16x2(_kept_bits(rotated(i, h, m), mask, exponent, i32, half2), broadcast(scale, h),
                                  broadcast(minimum, h), half2)
    return mgpu.FragmentedArray(_registers=registers, _layout=mgpu.WGMMA_LAYOUT, _is_signed=None)

  return unpack(codes_ref, scale_ref, minimum_ref)


def _keys_by_thread(codes_ref, scale_ref, minimum_ref, folded=False, bits=2, prefolded=False,
                    one_metadata_load=False, only_parts=None, codes_only=False):
  """`permuted_keys`: a step's keys as the score wgmma's register operands (f16 [64, W] a part, W = H bits / 8:
  INT2's 4 parts of 32 channels, INT4's 2 of 64; WGMMA layout), column 8g + 2l + e of part p being channel W p +
  (W / 4) l + 2g + e (`key_order`; q^T's rows are permuted alike, so the scores are the same sums). A thread
  (l = lane % 4) then needs code bytes (W / 4) l .. + W / 4 - 1 of each of its two token rows, one 8-byte (INT2)
  or 16-byte (INT4) load a row where the WGMMA layout's loads of a pair took 4 (8), and of each part the scale
  and minimum pairs of those channels, 16-byte loads (`_metadata_in_thread_order`) where pair loads took 4 (8):
  INT2 30 loads a thread and step fewer, INT4 38 (offline SASS, s30). Each register: a `prmt` of two bytes, then
  per part the magic exponents' LOP3, the subtraction and one f16x2 fma. `folded` (`folded_minimums`): the parts
  as magic + code (`_FoldedParts`), the minimum pairs folded (16 fmas a thread a step), no subtraction a register
  (32); `prefolded`: the minimums come folded (`fold_minimums`), none of the 16. `one_metadata_load` (a
  knockout, wrong by design): part 0's pairs stand for every part's, one load of scales and one of minimums.
  `only_parts`: those parts alone (their metadata's loads, conversions and fmas; the code bytes are loaded all the
  same), so that a part's wgmma can be issued before the next part is unpacked (`interleaved_key_parts`).
  `codes_only` (a knockout, wrong by design; with `folded`): each part as magic + code, with no scale, minimum or
  their loads, what a factored form with the scales in q's operand would leave of the keys' conversions."""
  from jax.experimental.mosaic import gpu as mgpu
  from jax.experimental.pallas import mosaic_gpu as plgpu
  from jax._src.lib.mlir import ir
  from jax._src.lib.mlir.dialects import arith, llvm

  width, parts = HEAD_DIM * bits // 8, 8 // bits  # a part's channels = a row's code bytes
  words = width // 16  # a thread's words of a row (its column groups: pairs of bytes, width // 8)
  shape, layout = (STEP, width), plgpu.Layout.WGMMA
  codes_type = _swizzled_codes(width)
  part_type = plgpu.ShapeDtypeStruct(shape, jnp.float16, layout=layout)

  wanted = tuple(range(parts)) if only_parts is None else tuple(only_parts)

  @plgpu.inline_mgpu(arg_types=(codes_type, plgpu.RefType(), plgpu.RefType()),
                     return_type=(part_type,) * len(wanted))
  def unpack(ctx, codes, scales, minimums):
    del ctx
    i32, half2, c = _register_types()
    thread = mgpu.utils.thread_idx()
    row = _first_row(thread, c)  # the thread's first token
    lane_pair = arith.andi(thread, c(3))
    window = arith.shrui(row, c(5))  # both of its rows (row, row + 8) lie in one window
    base = llvm.ptrtoint(i32, mgpu.utils.memref_ptr(codes))
    row_words = ir.Type.parse(f"!llvm.struct<({', '.join(['i32'] * words)})>")
    vector = f"v{words}"
    targets = ", ".join(f"${k}" for k in range(words))

    def code_bytes(token):  # bytes (W / 4) l .. of a token's row (W-byte swizzle: whole 16-byte chunks move)
      offset = arith.addi(arith.muli(token, c(width)), arith.muli(lane_pair, c(width // 4)))
      offset = arith.xori(offset, arith.andi(arith.shrui(offset, c(3)), c(width - 16)))
      loaded = llvm.inline_asm(row_words, [arith.addi(base, offset)],
                               f"ld.shared.{vector}.b32 {{{targets}}}, [${words}];", ",".join(["=r"] * words + ["r"]),
                               has_side_effects=True)  # not moved above the TMA's barrier wait
      return [llvm.extractvalue(i32, loaded, [k]) for k in range(words)]
    rows = {0: code_bytes(row), 8: code_bytes(arith.addi(row, c(8)))}
    loads = {}  # (ref, part) -> its pairs (one_metadata_load: part 0's for all)

    def pairs(which, part):
      part = 0 if one_metadata_load else part
      if (which, part) not in loads:
        ref = (scales, minimums)[which]
        loads[which, part] = [mgpu.utils.bitcast(x, half2)
                              for x in _metadata_in_thread_order(ref, window, part, lane_pair, i32, bits)]
      return loads[which, part]
    metadata = {} if codes_only else {part: [pairs(0, part), pairs(1, part)] for part in wanted}  # (scales, minimums)
    constants = [part_constants(p, True, bits) for p in range(parts)]
    magic = [mgpu.utils.bitcast(c(0x10001 * k[2]), half2) for k in constants]
    if folded:
      folding = _FoldedParts(bits, i32, half2)
      if not prefolded:
        metadata = {part: [s_, [folding.minimum(s, m, part) for s, m in zip(s_, m_)]]
                    for part, (s_, m_) in metadata.items()}
    registers = [np.empty(mgpu.WGMMA_LAYOUT.registers_shape(shape), dtype=object) for _ in wanted]
    for idx, row_offset, column in _register_offsets(shape):
      g = column // 8  # bytes 2g, 2g + 1 of the thread's: word g // 2, its bytes (2g % 4, + 1)
      first = 2 * g % 4
      spread = llvm.inline_asm(i32, [rows[row_offset][g // 2]],
                               f"prmt.b32 $0, $1, 0, 0x{0x4040 | (first + 1) << 8 | first:x};", "=r,r")
      unpacked = folding.parts_of(spread, wanted) if folded else [
          _part_of(spread, constants[part], magic[part], i32, half2) for part in wanted]
      for i, part in enumerate(wanted):
        registers[i][idx] = unpacked[i] if codes_only else _fma_f16x2(
            unpacked[i], metadata[part][0][g], metadata[part][1][g], half2)
    return tuple(mgpu.FragmentedArray(_registers=r, _layout=mgpu.WGMMA_LAYOUT, _is_signed=None) for r in registers)

  return unpack(codes_ref, scale_ref, minimum_ref)


def _store_in_channel_order(o_t, o_ref, by_ldmatrix: bool = False, bits: int = 2, width: int = COLUMNS):
  """O^T f32 [128, 16] or (`narrow_values`) [128, 8] (WGMMA layout) whose rows are channels in
  `value_row_channels(by_ldmatrix, bits)` order -> o_ref (a plain [128, width] f32 buffer in shared memory) in
  channel order: each register pair to its channel's row (8 stores of 8 bytes a thread), so that no pass after
  the kernel puts them back. `width` 8 (`eight_column_softmax`): O^T's columns 8-15, empty, are not stored."""
  from jax.experimental.mosaic import gpu as mgpu
  from jax.experimental.pallas import mosaic_gpu as plgpu
  from jax._src.lib.mlir import ir
  from jax._src.lib.mlir.dialects import arith, llvm, vector

  shape = o_t.shape  # [128, 16], or [128, 8] (`narrow_values`: columns 8-15 written as zeros where width is 16)

  @plgpu.inline_mgpu(arg_types=(plgpu.Layout.WGMMA, plgpu.RefType()))
  def store(ctx, o_t, o_ref):
    del ctx
    i32 = ir.IntegerType.get_signless(32)
    c = lambda v: arith.constant(i32, v)
    column, first_column = _thread_position(i32)
    if by_ldmatrix:  # the thread's first row's channel: h and m add static offsets
      column = _ldmatrix_first_channel(c, bits)
    base = llvm.ptrtoint(i32, mgpu.utils.memref_ptr(o_ref))
    for idx, row, col in _register_offsets(shape):
      if col >= width:  # the empty columns of an 8-wide output
        continue
      pair = o_t.registers[idx]
      h, m = (row % STEP) // 8, row // STEP
      channel = arith.addi(column, c(ldmatrix_value_channel(0, 0, h, m, bits) if by_ldmatrix else 32 * (2 * m + h)))
      element = arith.addi(arith.muli(channel, c(width)), arith.addi(first_column, c(col)))
      x, y = (vector.extract(pair, dynamic_position=[], static_position=ir.DenseI64ArrayAttr.get([k]))
              for k in range(2))
      llvm.inline_asm(ir.Type.parse("!llvm.void"), [arith.addi(base, arith.muli(element, c(4))), x, y],
                      "st.shared.v2.f32 [$0], {$1, $2};", "r,f,f", has_side_effects=True)
      if shape[1] < width:  # the narrow accumulator's columns 8-15 of a 16-wide output: zeros
        zero = arith.constant(ir.F32Type.get(), 0.0)
        llvm.inline_asm(ir.Type.parse("!llvm.void"),
                        [arith.addi(base, arith.muli(arith.addi(element, c(COLUMNS // 2)), c(4))), zero, zero],
                        "st.shared.v2.f32 [$0], {$1, $2};", "r,f,f", has_side_effects=True)

  store(o_t, o_ref)


LAG_MARGIN = 8.0  # `lagged_max`: scores may exceed the agreed maximum by this much (base 2): P <= 256


def _vote_by_warp(x, limit, votes_ref):
  """Writes to votes_ref[w] (int32 [4], shared memory) whether any thread of warp w holds an element of x
  above limit (f32 [64, 16], WGMMA layout): a warp vote, no exchange between warps until a barrier."""
  from jax.experimental.mosaic import gpu as mgpu
  from jax.experimental.pallas import mosaic_gpu as plgpu
  from jax._src.lib.mlir import ir
  from jax._src.lib.mlir.dialects import arith, llvm, memref, vector

  wgmma = plgpu.Layout.WGMMA

  @plgpu.inline_mgpu(arg_types=(wgmma, wgmma, plgpu.RefType()))
  def vote(ctx, x, limit, votes):
    del ctx
    i32 = ir.IntegerType.get_signless(32)
    over = None
    for a, b in zip(x.registers.flat, limit.registers.flat):
      above = arith.cmpf(arith.CmpFPredicate.OGT, a, b)
      for k in range(ir.VectorType(above.type).shape[0]):
        bit = vector.extract(above, dynamic_position=[], static_position=ir.DenseI64ArrayAttr.get([k]))
        over = bit if over is None else arith.ori(over, bit)
    word = arith.extui(i32, over)
    voted = llvm.inline_asm(
        i32, [word], "{ .reg .pred p; setp.ne.u32 p, $1, 0; vote.sync.any.pred p, p, 0xffffffff; "
        "selp.u32 $0, 1, 0, p; }", "=r,r", has_side_effects=True)
    warp = arith.remui(mgpu.utils.warp_idx(sync=False), arith.constant(i32, 4))
    memref.store(voted, votes, [arith.index_cast(ir.IndexType.get(), warp)])  # every lane, the same word

  vote(x, limit, votes_ref)


REDUCTION_SCRATCH = 512  # f32 elements of a warpgroup's own scratch for `_column_reduce`
REDUCTION_SCRATCH_BLOCK2 = 256  # the least one reduction takes: four warpgroups of two-step blocks fit 227 KB then


def _column_reduce(x, op: str, scratch_ref):
  """x [64, 16] f32 (WGMMA layout) reduced over its rows, which lie across the warpgroup's 4 warps, by `op`
  ("max" or "add"): Mosaic's reduction, but through the caller's scratch (f32 [REDUCTION_SCRATCH], shared
  memory). Pallas gives every reduction the kernel's one scratch buffer, which the warpgroups of a CTA
  would share: with `warpgroups` > 1 their maxima mixed (wrong results on the H200, session 22)."""
  from jax.experimental.pallas import mosaic_gpu as plgpu

  @plgpu.inline_mgpu(arg_types=(plgpu.Layout.WGMMA, plgpu.RefType()),
                     return_type=plgpu.ShapeDtypeStruct((x.shape[1],), jnp.float32,
                                                        layout=plgpu.Layout.WGMMA.reduce(0)))
  def reduce(ctx, x, scratch):
    del ctx
    return x.reduce(op, 0, scratch=scratch)

  return reduce(x, scratch_ref)


def _scaled_query(q, scale_ref):
  """q^T [128, 16] f16 (WGMMA layout) times the step's key scales ([2, H] ref): column c takes window
  c // 8's. A register holds two columns of one window (pairs never straddle the 8-column blocks), so one
  f16x2 multiply by the channel's scale, loaded once and doubled."""
  from jax.experimental.mosaic import gpu as mgpu
  from jax.experimental.pallas import mosaic_gpu as plgpu
  from jax._src.lib.mlir import ir
  from jax._src.lib.mlir.dialects import arith, memref, vector

  wgmma = plgpu.Layout.WGMMA

  @plgpu.inline_mgpu(arg_types=(wgmma, plgpu.RefType()),
                     return_type=plgpu.ShapeDtypeStruct((HEAD_DIM, COLUMNS), jnp.float16, layout=wgmma))
  def scaled(ctx, q, scale_ref):
    del ctx
    half2 = ir.VectorType.get((2,), ir.F16Type.get())
    registers = np.empty_like(q.registers)
    for (idx, reg), (row, col) in zip(np.ndenumerate(q.registers), q.layout.thread_idxs(q.shape)):
      window = arith.divui(col, arith.constant(ir.IndexType.get(), COLUMNS // 2))
      registers[idx] = arith.mulf(reg, vector.broadcast(half2, memref.load(scale_ref, [window, row])))
    return mgpu.FragmentedArray(_registers=registers, _layout=mgpu.WGMMA_LAYOUT, _is_signed=None)

  return scaled(q, scale_ref)


def _scaled_permuted_query(q, scale_ref):
  """`_scaled_query` for INT2's permuted q^T rows (`key_order`: row 32p + 8g + 2l + e is channel 32p + 8l + 2g + e),
  its scales by 8-byte loads: a thread's rows r and r + 8 of a 64-row tile are channels c and c + 2 of one aligned
  group of 4 (r = 16w + j, j < 8: row bit 3 is 0, and it becomes channel bit 1), so one `ld.shared.b64` a tile and
  window brings both, and a `prmt` broadcasts each (half e = c % 2 of a word): 4 loads a step, not 8 scalar ones
  (offline, s49: 406 SASS a step against 413 with one scalar load a register, 119 registers against 127)."""
  from jax.experimental.mosaic import gpu as mgpu
  from jax.experimental.pallas import mosaic_gpu as plgpu
  from jax._src.lib.mlir import ir
  from jax._src.lib.mlir.dialects import arith, llvm

  wgmma = plgpu.Layout.WGMMA
  shape = (HEAD_DIM, COLUMNS)

  @plgpu.inline_mgpu(arg_types=(wgmma, plgpu.RefType()),
                     return_type=plgpu.ShapeDtypeStruct(shape, jnp.float16, layout=wgmma))
  def scaled(ctx, q, scale_ref):
    del ctx
    i32, half2, c = _register_types()
    thread = mgpu.utils.thread_idx()
    row = _first_row(thread, c)  # 16w + j: bit 0 is e, bits 1-2 the field l, bit 4 the field g's high bit
    base = arith.addi(arith.shli(arith.andi(arith.shrui(row, c(1)), c(3)), c(3)),  # 8 l
                      arith.shli(arith.andi(arith.shrui(row, c(3)), c(3)), c(1)))  # + 2 g (g even: a group of 4)
    selector = arith.select(arith.cmpi(arith.CmpIPredicate.ne, arith.andi(row, c(1)), c(0)), c(0x3232), c(0x1010))
    pointer = llvm.ptrtoint(i32, mgpu.utils.memref_ptr(scale_ref))
    pair_type = ir.Type.parse("!llvm.struct<(i32, i32)>")
    loaded = {}

    def scale(tile, window, half):  # of row 64 tile + 8 half + r: channel 64 tile + 32 r5 + base + 2 half + e
      if (tile, window) not in loaded:  # (r5: bit 5 of r, the part's high bit with the tile's)
        channel = arith.addi(arith.addi(base, c(64 * tile)), arith.andi(row, c(32)))
        address = arith.addi(pointer, arith.muli(arith.addi(channel, c(window * HEAD_DIM)), c(2)))
        words = llvm.inline_asm(pair_type, [address], "ld.shared.v2.b32 {$0, $1}, [$2];", "=r,=r,r",
                                has_side_effects=True)
        loaded[tile, window] = [llvm.extractvalue(i32, words, [k]) for k in range(2)]
      word = loaded[tile, window][half]
      return mgpu.utils.bitcast(llvm.inline_asm(i32, [word, selector], "prmt.b32 $0, $1, $1, $2;", "=r,r,r"), half2)

    registers = np.empty_like(q.registers)
    for idx, row_offset, column in _register_offsets(shape):
      registers[idx] = arith.mulf(q.registers[idx], scale(row_offset // 64, column // (COLUMNS // 2),
                                                          (row_offset % 64) // 8))
    return mgpu.FragmentedArray(_registers=registers, _layout=mgpu.WGMMA_LAYOUT, _is_signed=None)

  return scaled(q, scale_ref)


def part_constants(part: int, magic_exponents: bool, bits: int = 2) -> tuple[int, int, int]:
  """Per 16-bit half holding a code byte under `prmt`'s high byte (0x64, or 0 with `magic_exponents`):
  the AND mask, the bits OR-ed in after it, and the f16 bits of the magic number then subtracted. The
  result is (2^bits)^part * code, or the code itself with `magic_exponents` (part p's bits under the exponent
  of 2^(10 - bits p), whose mantissa bit bits x p is worth 1)."""
  if magic_exponents:
    return (1 << bits) - 1 << bits * part, (25 - bits * part) << 10, (25 - bits * part) << 10
  return 0xFF00 | ((1 << bits) - 1) << bits * part, 0, 0x6400


def folded_part_constants(part: int, bits: int = 2) -> tuple[int, int, int, float]:
  """`folded_minimums`: (shift, mask, exponent bits, magic) of part p of a byte in the low byte of an f16 half.
  Shifted left by `shift`, the part's bits sit at mantissa bits q >= 4 under the exponent of 2^(10 - q), so the
  half is magic + code exactly, magic = 2^(10 - q). Then x = code x s + m = half x s + (m - magic x s): the
  folded minimum, rounded to f16 once a window, is off by at most (|m| + magic s) 2^-11, at most s / 32 beyond
  the minimum's own rounding where magic <= 64 (bits below 4 would make it s / 2). INT2 shifts parts 0 and 1 by
  6 (q = 6, 8), INT4 part 0 by 4 (q = 4), one shift a register."""
  shift = (6 if part < 2 else 0) if bits == 2 else (4 if part == 0 else 0)
  q = bits * part + shift
  assert 4 <= q <= 10 - bits, (part, bits, q)
  return shift, (1 << bits) - 1 << q, (25 - q) << 10, 2.0 ** (10 - q)


def _part_magic(bits: int) -> np.ndarray:
  """[H] float32: the magic number `folded_part_constants` gives channel c's part (c // (H bits / 8))."""
  width = HEAD_DIM * bits // 8
  return np.array([folded_part_constants(c // width, bits)[3] for c in range(HEAD_DIM)], np.float32)


def fold_minimums(scale: jax.Array, minimum: jax.Array, bits: int = 2) -> jax.Array:
  """Scales and minimums [..., H] (channel order) -> the folded minimums m - magic x s that `folded_minimums`
  computes in the kernel every step, in f32 and rounded once: what `prefolded_minimums` reads."""
  folded = minimum.astype(jnp.float32) - jnp.asarray(_part_magic(bits)) * scale.astype(jnp.float32)
  return folded.astype(minimum.dtype)


def unfold_minimums(scale: jax.Array, folded: jax.Array, bits: int = 2) -> jax.Array:
  """`fold_minimums`' inverse (up to its rounding): the plain minimums."""
  minimum = folded.astype(jnp.float32) + jnp.asarray(_part_magic(bits)) * scale.astype(jnp.float32)
  return minimum.astype(folded.dtype)


def _f16_bits(x: float) -> int:
  return int(np.array(x, np.float16).view(np.uint16))


@dataclasses.dataclass(frozen=True)
class KernelPlan:
  """One launch's kernel as `kernel_plan` builds it: `body(pair, split, *inputs, *outputs, *scratch)`, the
  operands it is called on, its outputs (o_t, m, l), its grid of CTAs (pairs, splits), the shared memory and
  barriers it allocates (`scratch`), its warpgroups a CTA, compiler parameters and interpret mode (the body was
  built for it)."""
  body: Callable
  operands: tuple
  out_type: tuple
  grid: tuple[int, int]
  scratch: tuple
  warpgroups: int
  compiler_params: Any
  interpret: Any

  @property
  def ctas(self) -> int:
    return self.grid[0] * self.grid[1]


def int2_decode(*args, **options):
  """Partial softmax of each (pair, split): `kernel_plan`'s kernel (its arguments and options) in a launch of its
  own. Returns o_t [N, J, H, C] (unnormalized, f32), m and l [N, J, C]."""
  return launch(kernel_plan(*args, **options))


def launch(plan: KernelPlan):
  """A `KernelPlan`'s kernel in a launch of its own, its grid (pair, split): o_t, m, l."""
  from jax.experimental.pallas import mosaic_gpu as plgpu

  def kernel(*refs):
    plan.body(lax.axis_index("pair"), lax.axis_index("split"), *refs)
  call = plgpu.kernel(kernel, out_type=plan.out_type, grid=plan.grid, grid_names=("pair", "split"),
                      scratch_types=plan.scratch, **_threads(plan.warpgroups), compiler_params=plan.compiler_params,
                      interpret=plan.interpret)
  return call(*plan.operands)


def can_launch_together(plans) -> bool:
  """Whether `launch_together` takes these plans: the same warpgroups a CTA, compiler parameters and mode."""
  return len({(plan.warpgroups, plan.compiler_params, repr(plan.interpret)) for plan in plans}) == 1


def _threads(warpgroups: int) -> dict:
  return dict(num_threads=warpgroups, thread_name="wg") if warpgroups > 1 else {}


def launch_together(plans) -> list[tuple[jax.Array, jax.Array, jax.Array]]:
  """Several kernels (`KernelPlan`s: pools of other widths and options) in one launch, each (o_t, m, l) as its
  own launch would give them. The grid is the plans' CTAs one after another; a CTA runs its plan's body alone,
  with that plan's shared memory and barriers allocated inside its branch, so the launch takes the most any
  plan needs, not their sum. One launch where there were several: no wait for one grid to drain before the
  next begins, and one launch's fixed cost (batch 8 x 32k: the INT2 and INT4 pools, s50-s51). The plans must
  agree on warpgroups a CTA and compiler parameters."""
  from jax.experimental import pallas as pl
  from jax.experimental.pallas import mosaic_gpu as plgpu

  plans = list(plans)
  first = plans[0]
  if not can_launch_together(plans):
    raise ValueError("launch_together: the plans differ in warpgroups a CTA, compiler parameters or interpret mode: "
                     f"{[(plan.warpgroups, plan.compiler_params) for plan in plans]}")
  starts = np.cumsum([0] + [plan.ctas for plan in plans]).tolist()
  inputs = np.cumsum([0] + [len(plan.operands) for plan in plans]).tolist()
  collective = ("wg",) if first.warpgroups > 1 else ()

  def kernel(*refs):
    outputs = refs[inputs[-1]:]
    cta = lax.axis_index("cta")
    for i, plan in enumerate(plans):
      own_inputs = refs[inputs[i]:inputs[i + 1]]
      own_outputs = outputs[3 * i:3 * i + 3]

      @pl.when((cta >= starts[i]) & (cta < starts[i + 1]))
      def _(plan=plan, own_inputs=own_inputs, own_outputs=own_outputs, start=starts[i]):
        pair, split = (cta - start) // plan.grid[1], (cta - start) % plan.grid[1]
        pl.run_scoped(functools.partial(plan.body, pair, split, *own_inputs, *own_outputs), *plan.scratch,
                      collective_axes=collective)
  call = plgpu.kernel(kernel, out_type=tuple(t for plan in plans for t in plan.out_type), grid=(starts[-1],),
                      grid_names=("cta",), **_threads(first.warpgroups), compiler_params=first.compiler_params,
                      interpret=first.interpret)
  flat = call(*(x for plan in plans for x in plan.operands))
  return [tuple(flat[3 * i:3 * i + 3]) for i in range(len(plans))]


def kernel_plan(q, k_codes, k_scale, k_bias, v_codes, v_scale, v_min, *, splits: int, interpret=None,
                fast_unpack: bool = True, stages: int = 2, approx_math: bool = False, ptx_fma: bool = True,
                auto_barriers: bool = False, magic_exponents: bool = False, overlap_values: bool = True,
                defer_values_wgmma: bool = False, values_by_part: bool = False, keys_in_smem: bool = False,
                bias_in_kernel: bool = False, dequantize_keys: bool = False, lagged_max: bool = False,
                steps_per_block: int = 1, warpgroups: int = 1, grid_dependency_wait: bool = False,
                values_scaled_after: bool = False, in_place_values: bool = False, ldmatrix_metadata: bool = False,
                metadata_in_thread_order: bool = False, values_in_registers: bool = False,
                fetch_by_one_warp: bool = False, permuted_keys: bool = False, values_per_token: bool = False,
                folded_minimums: bool = False, eight_column_softmax: bool = False, values_by_ldmatrix: bool = False,
                token_scaled_p: bool = False, paired_steps: bool = False, narrow_scores: bool = False,
                narrow_values: bool = False, max_windows: int | None = None, range_params=None,
                paged: bool = False, knockout: str = "", sixteen_columns_out: bool = False,
                fetch_warp_by_group: bool = False, prefolded_minimums: bool = False,
                interleaved_key_parts: bool = False, factored_keys: bool = False):
  """The kernel of one launch (`KernelPlan`: `int2_decode` launches it, `launch_together` beside others): partial
  softmax of each (pair, split), o_t [N, J, H, C] (unnormalized, f32), m and l [N, J, C].

  q [N, G, H] (scaled, base 2), k_bias from `key_bias`. Column c of the results is head c % 8 over the windows
  of parity c // 8: C = 16, or with `eight_column_softmax` 8 (head c over both parities). `fast_unpack`: codes to
  halves with inline PTX (else Mosaic's own conversions, which the interpret mode runs); `stages`: the input
  pipeline's depth; `approx_math`: Mosaic's approximate exp2 (`ex2.approx.ftz.f32`: 1.5 % faster in the
  large-batch kernel, s25);
  `ptx_fma`: the values' f16x2 fma as inline PTX; `auto_barriers`: Pallas' barrier before and after every
  store to shared memory (without them, each buffer is written only after the wgmma that read it was
  waited for, and read only after `commit_smem`, whose barrier orders the writes); `magic_exponents`: see
  `_unpacked_parts` (untimed); `overlap_values`: dequantize the values while the score wgmma runs (else
  before it: the key parts, which wgmma reads from registers, then live for less time; untimed);
  `defer_values_wgmma`: O^T accumulates in place in a wgmma accumulator and a step's V wgmma is waited for
  in the next step, after its key wgmma is issued and its values dequantized (double-buffered V and P;
  untimed; not in the interpret mode, which cannot store to an accumulator); `values_by_part`: each part of
  the values stored before the next is unpacked (8 registers live, not 32; untimed); `keys_in_smem`: the
  unpacked keys go through shared memory, a part at a time, to one wgmma with A read from there, instead of
  a register operand whose 32 registers stay live until the wgmma is waited for (untimed); `bias_in_kernel`:
  k_bias is the key minimums [N, W, H] themselves, and each program computes its windows' biases before
  its loop (wgmmas of 64 windows' minimums against q^T, into shared memory): no XLA pass over the
  minimums, and none over windows past a range's count (untimed; at most `MAX_BIAS_ROWS` windows a
  split, a range's bound given as `max_windows`); `dequantize_keys`: k_bias is the key minimums [N, W, H],
  read a step beside the scales, and the keys are dequantized in registers as the values are (code x scale
  + minimum, one f16x2 fma): q^T goes to shared memory once, not scaled a step, and there is no bias at all
  (no XLA pass, no per-step store and barrier for q; windows past a range's count masked by index);
  `lagged_max`: a step's P is taken against the maximum agreed so far, not this step's (which lies across
  the 4 warps: Mosaic's reduction costs a store, two barriers and loads a step). Each warp votes whether any
  score exceeds that maximum by more than `LAG_MARGIN` (P <= 2^8 stays exact enough in f16) and writes its
  vote beside P before P's barrier; only where a vote is cast (uniform, read after the barrier) is the true
  maximum reduced and P recomputed (the first step with a score always; 8-10 % faster, session 23);
  `steps_per_block`: 64-token steps a pipeline iteration (one TMA issue, barrier wait and slot computation for
  them all; with 2 and `defer_values_wgmma`, the V and P buffers' slots are static; with four warpgroups
  slower, s25: ptxas spills); `warpgroups`: programs (warpgroups) a CTA, each with its own
  buffers and a pipeline written out by hand: splits of one pair, or where `splits` divides `warpgroups`,
  every split of warpgroups / splits pairs (N a multiple of that). Four make a CTA of 512 threads, for which
  ptxas must fit 128 registers a thread (session 20's PTX: 145 registers, 128 with 36 bytes of spills), so that
  an SM holds 4 programs, not 3; not with `defer_values_wgmma` (its second V buffer would not fit 4 times),
  `bias_in_kernel` or `keys_in_smem`. Wrong on the H200 in session 22: Pallas' cross-warp reductions all
  use one scratch buffer, which the CTA's warpgroups shared; its reductions now go through a scratch a
  warpgroup (`_column_reduce`; right on the H200 since, session 23). `grid_dependency_wait`: the kernel
  waits for the grids before it (`griddepcontrol.wait`) before its first read of memory, which makes Mosaic
  launch it with programmatic stream serialization (PDL): its CTAs may start, and set up their barriers and
  buffers, while the kernel before it drains (no faster, s24). `values_scaled_after`: the values' codes go to the V
  wgmma as they are (no scale, minimum or their loads a code), and the step's product is scaled after it:
  within a step, column c of P weighs only window c // 8's tokens, so O^T[h, c] += s[w, h] (C^T P)[h, c] +
  m[w, h] sum_t P[t, c], with w = c // 8; the column sums come from a second wgmma of P against ones in
  shared memory (16 KB a CTA), already in O^T's layout. 16 x 2 f32 FMAs and a few loads a thread a step
  replace 32 f16x2 FMAs and their 32 loads of scales and minimums (slower: 347 µs against 277 at batch 32 x
  32k, session 24; not with `defer_values_wgmma`, which accumulates O^T in place). `in_place_values`: O^T
  accumulates in place in a wgmma accumulator, with one V and one P buffer: a step's V wgmma is waited for at
  the start of the next step, before they are rewritten, and with `lagged_max` the accumulator is rescaled only
  where the maximum moves (the vote's branch): no fresh accumulator, no add of it and no wait on the V wgmma in
  a step (3.5 % faster, s25; like `defer_values_wgmma`, not in the interpret mode, which cannot store to an
  accumulator). With `dequantize_keys`, `magic_exponents` puts each part's bits under its own exponent for keys
  and values alike: the scales need no 4^-p (12 f16x2 multiplies a tensor and step fewer; 3.5 % faster with the
  AND-OR as one LOP3, s25). `ldmatrix_metadata`: a step's scales and minimums, where dequantized in registers,
  reach each thread by 4 `ldmatrix` a row instead of 16 loads of a pair (`_metadata_by_ldmatrix`; 48 loads a
  step fewer with `dequantize_keys`; 2 % slower, s25). `metadata_in_thread_order`: k_scale, k_bias (the key
  minimums: with `dequantize_keys` only), v_scale and v_min come in `thread_order`, and a part's 4 pairs of each
  reach a thread by one 16-byte load where pair loads took 4 (9 % fewer instructions, no faster: a 16-byte load
  takes as many shared-memory wavefronts as 4 pair loads, and the wavefronts bounded the kernel, s26). The
  interpret mode puts them back in order and takes the plain path. `values_in_registers`: the V wgmma takes V^T
  from registers (`_values_transposed`), not from a buffer the values were stored to: its rows (O^T's) are
  channels in `value_row_channels` order, put back as O^T is stored (`_store_in_channel_order`); dequantized
  while the score wgmma runs with `overlap_values`, else after it is waited for (16 % faster than through shared
  memory, s26; magic exponents; INT4 since s27, untimed; the interpret mode takes the shared-memory path).
  `fetch_by_one_warp` (four warpgroups): a block's TMA copies are issued inside a branch only the warpgroup's
  first warp takes (`plgpu.warp_map`), where every warp computed the six copies' descriptors and coordinates
  under a predicate that held for one thread: 92 of the 525 instructions a warp executed a step (ncu, s26; untimed).
  `permuted_keys` (with `dequantize_keys` and magic exponents): the contraction's channels permuted for the keys
  and q^T alike (`_keys_by_thread`, `key_order`), so that a thread's code bytes and scales come by 8- and 16-byte
  loads: 30 loads a thread and step fewer, the metadata in channel order (INT2 timed in s28; INT4 since s30,
  untimed). `values_per_token` (KIVI's values):
  v_scale and v_min are [N, T, 4] f16, a scale and minimum per token and group of 32 channels, copied a step as
  [32, 8] (token pairs: TMA moves rows of 16 bytes or more); each thread loads one f16 of each a (row, group),
  16 loads a step where the window's pairs took 32; the values go through shared memory (not with
  `values_in_registers`; untimed, s27). `folded_minimums` (with `permuted_keys` or `values_in_registers`):
  in those register paths each part's bits are shifted to mantissa bits >= 4 (`folded_part_constants`) and the
  magic number is folded into the minimum once a window and channel pair (m - magic x s, one f16x2 fma), so a
  pair of codes takes a LOP3 and an fma, no subtraction: 64 subtractions a thread and step for 24 fmas and 16
  shifts (untimed; the folded minimum's f16 rounding adds at most s / 32 a window and channel).
  `prefolded_minimums` (with `folded_minimums`): k_bias and v_min hold the folded minimums already
  (`fold_minimums`, once a cache, not a step), so the register paths take them as loaded: 24 fewer f16x2 fmas a
  thread and step (16 keys', 8 values'). The interpret mode unfolds them first (its plain path reads minimums).
  `eight_column_softmax` (with `dequantize_keys` and `lagged_max`): with the keys dequantized a score is q . k in
  either window, so the softmax runs on the score accumulator's first 8 columns for all 64 rows (a value slice)
  where it ran on 16 with half of them masked: 4 of a thread's 8 subtractions, exp2, vote compares and row-sum
  terms a step, and no mask (a range's windows past its count are masked by row). P is stored 16 wide, its
  columns 8-15 zero, so O^T's columns 8-15 and their m and l come out empty (-1e30, 0: splits the merge
  weighs by zero). 5 % faster on all-INT2 pools, the large-batch default since s32 (`MOSAIC_LEAN_EIGHT`).
  `values_by_ldmatrix` (with `values_in_registers` and `folded_minimums`): a thread's rows of V^T are two parts
  of two adjacent code bytes (`ldmatrix_value_channel`), not INT2's four parts of one byte or INT4's two parts of
  two bytes 32 apart, so that two `ldmatrix.trans` a step bring its codes where 16 (INT2) or 32 (INT4) byte loads
  and their `prmt` did, and a window's scales and minimums of a part come as a pair of channels
  (`_values_by_ldmatrix`; 8 loads and 4 folds a step where 16 and 8; correct and < 1 % faster on an H100, s35).
  `token_scaled_p` (KIVI's values, with `values_per_token` and `eight_column_softmax`): V = s c + m with s and m a
  token's and group's (32 channels), so O^T = C^T (s P) + sum_t m P. The V wgmma takes the exact codes from
  registers (`_value_codes_transposed`: no scale, minimum or their loads a code) as two tiles of 64 channels, each
  against its own B: column h of tile m's is s[t, 2m] P[t, h], column 8 + h s[t, 2m + 1] P[t, h] (a tile's rows
  are two groups, and P's columns 8-15 were empty), into two accumulators whose rows keep the columns of their
  group (`_token_scaled_p`); the minimums' share is summed beside l (`_token_minimum_terms`) and added as O^T is
  stored (`_store_token_scaled`). Where the values went through shared memory, per token, the data pipe and the
  per-code loads bounded KIVI's kernel (~20 % behind INT2's, s28); H100, s37: 112.9 µs against 129.7 at batch
  32 x 19,968, 220.9 against 254.6 at 60 (`mosaic_kivi_s37_h100.md`).

  `paired_steps` (with `steps_per_block=2`, `eight_column_softmax`, `in_place_values`, `values_in_registers`):
  a block's two steps under one softmax, 128 keys a vote, barrier and branch: both score wgmmas (each waited
  for before the next step's keys are unpacked: both in flight spilled), P of each into its own buffer, and the
  two V wgmmas (the first waited for before the second's V^T: both in flight spilled). Offline (s38) 793 SASS
  in the INT2 main loop a block against 2 x 459, 128 registers, no spills; but the executed hot loop is 691 against
  2 x 333 (the cut was the vote's rare branch), and it is no faster on an H100 (s39).
  `narrow_scores` (with `eight_column_softmax`): the score wgmma 8 columns wide, not 16 (with the keys dequantized
  columns 8-15 copied 0-7): its B is q [8, H] K-major (`query_rows`: G heads padded to 8, f16), read transposed
  by wgmma, a part's channels a slice of its rows; S^T's accumulator [64, 8] (4 registers a thread, not 8).
  `narrow_values` (with `eight_column_softmax`, O^T in place from V^T in registers): the V wgmma 8 columns wide,
  not 16 (P's columns 8-15 were zero): P stored transposed, [8, 64] K-major, read transposed by wgmma; O^T's
  accumulator [128, 8] (8 registers a thread, not 16), its columns 8-15 written as zeros on the way out.
  Both narrow (variant `..._narrow_both`): HGMMA.64x8x16 only, 124 registers; on an H100 the kernel 1.0-1.3 % faster
  than the wide one and the 7B step at 32 x 100 3.3 % (s39, one run each): the default for INT2 windows' pools
  since s39 (`quantized_decode.MOSAIC_DEFAULT`; "pallas:mosaic_wide" runs s38's).

  `fetch_warp_by_group` (with `fetch_by_one_warp`): warpgroup g's copies are issued by its warp g % 4, not its warp 0.
  Warp w of a CTA runs on the multiprocessor's scheduler w % 4, so every warpgroup's warp 0 sat on scheduler 0,
  which issued the four groups' copy set-up (57 SASS a step, mostly uniform ops, beside the 350 of a step's common
  path; `paged`: 12 copies, 180 beside 352) on top of its own share, while the warpgroups' barriers a step wait for
  their slowest warp: spread, each scheduler carries one group's (s46; the default's INT2 launches since s47, H100:
  3.5-3.9 % faster at batch 32 and 60).

  `sixteen_columns_out`: the outputs 16 columns wide even with `eight_column_softmax` (8-15 empty), as before s46,
  for a comparison in one run.

  `interleaved_key_parts` (with `permuted_keys`; s48): each part of the keys unpacked just before its own score
  wgmma (`_keys_by_thread`'s `only_parts`), so that the tensor cores start on part 0 while parts 1-3 are unpacked;
  the code bytes are loaded once a part (8 loads a step, not 2).

  `knockout` ("keys", "values" or "both"; a diagnostic, wrong by design): the register operand of the score wgmma
  (keys), of the V wgmma (values) or both is a constant, so that a step skips those codes' shared-memory loads and
  conversions while TMA still moves every byte and the wgmmas, softmax and pipeline run as they do. Its time against
  the kernel's is what the conversions cost on a card (`kernel_experiments.sh knockout`); compiled only (not the
  interpret mode), with `permuted_keys` and `values_in_registers`. "key_metadata", "value_metadata" and "metadata"
  (s48) keep the conversions and cut the scales' and minimums' loads instead: every pair of the keys' (values')
  metadata is the step's first one (one 16-byte load of scales and one of minimums for the keys, one f16 of each
  for the values), so their time against the kernel's is what those loads cost. "key_scaling", "value_scaling"
  and "scaling" (s49) keep the code loads and conversions and drop the scales, minimums, their loads and the
  fmas (the operands are magic + code): what a factored form, the scales moved to the other operand and the
  minimums and magic numbers to biases, would leave a step before the work it adds.

  `factored_keys` (s49, INT2, with `dequantize_keys`, `eight_column_softmax`, `permuted_keys` and `folded_minimums`;
  not `narrow_scores` or `paged`): the factored form. k_bias is the key minimums [N, W, H] over a whole pool (over a
  range, `range_partials` gives the range's bias, `factored_bias` through `range_bias`), as with
  `dequantize_keys`, but the keys go to the score wgmma as magic + code (`_keys_by_thread`'s `codes_only`: one
  LOP3 a pair of codes, no scale, minimum, their loads or fma), and each step writes q^T times its two windows'
  scales (`_scaled_permuted_query`: columns 0-7 the first window's, 8-15 the second's) to the wgmma's B; a row takes its
  window's 8 columns, plus the bias q . m - sum_c magic_c B_c (f32, `factored_bias`, one XLA pass, which rounds B
  as the kernel does, so the magic numbers' share cancels to f32's rounding of the sums: B's own f16 rounding then
  weighs the code alone, 2^-11 |q s| c a channel, as the dequantized key's rounding weighed the key). The interpret
  mode runs the same factored sum with the codes' exact parts (the plain path) and the plain minimums' bias.
  (s49 also compiled the magic numbers' share taken off by 8 more wgmmas a step, A the constant -magic: 483 SASS a
  step with spills, and no more precise than this bias; removed.) Timed on an H100 in s50: no faster than the
  default where the SMs bound the kernel (87.2 µs against 86.5 at batch 16, half the SMs), and the bias pass adds
  12-47 µs a call; not the default.

  A range of the pool (a layer's windows in a cache shared by layers; `range_partials`): `range_params`, an
  int32 [32] array (data) holding the range's first window, its count of windows and the row of the first
  window in k_bias (`range_bias`). The ceil(count / 2) steps, in blocks of `steps_per_block`, are shared
  by the splits, each reading ceil(blocks / splits) blocks or what is left (a dynamic trip count: no block
  past the count is read); windows past the count in a block carry a bias of -1e30, and those past the pool
  are read as zeros (TMA fills them).

  `paged` (a range, four warpgroups, `dequantize_keys`): the windows lie anywhere, as records of ablation C's
  unreordered heap (`wq_jax.interleaved`), and range_params is [rows, 32]: row 0 as above, rows 1 on the layer's
  page table (`format_starts`: each record's start in 16-bit units, the range's entries from entry first on;
  rows of 32, as a copy moves at most 256 elements along a dimension). The codes are then views of the
  heaps as rows of H/4 (INT2) or H/2 (INT4) bytes, the scales and minimums (and the key minimums in k_bias) views
  as rows of H f16: a record is a window's codes then a row of scales and a row of minimums. Each window of a
  block is fetched where its record lies, six copies a window (`paged_partials`).
  """
  from jax.experimental import pallas as pl
  from jax.experimental.pallas import mosaic_gpu as plgpu

  n, tokens, packed = k_codes.shape
  ranged = range_params is not None
  spb = steps_per_block
  bits = code_bits(k_codes)
  parts, width, levels = 8 // bits, packed, 1 << bits  # a part: `width` channels, (2^bits)^p c
  if v_codes.shape != k_codes.shape:
    raise ValueError(f"keys' codes {k_codes.shape} and values' {v_codes.shape} differ")
  if not ranged and tokens % (STEP * spb * splits):
    raise ValueError(f"codes {k_codes.shape}: need T a multiple of {STEP} x steps_per_block x splits")
  if values_scaled_after and defer_values_wgmma:
    raise ValueError("values_scaled_after scales each step's product: not with defer_values_wgmma")
  if dequantize_keys and (bias_in_kernel or keys_in_smem):
    raise ValueError("dequantize_keys adds no bias: not with bias_in_kernel or keys_in_smem")
  if metadata_in_thread_order and not (dequantize_keys and bits == 2 and not values_scaled_after):
    raise ValueError("metadata_in_thread_order: INT2 with dequantize_keys (the scales read where dequantized)")
  if values_in_registers and not (magic_exponents and not (values_scaled_after or defer_values_wgmma)):
    raise ValueError("values_in_registers: with magic_exponents, not with values_scaled_after or "
                     "defer_values_wgmma")
  if permuted_keys and not (dequantize_keys and magic_exponents and not metadata_in_thread_order
                            and not ldmatrix_metadata):
    raise ValueError("permuted_keys: with dequantize_keys and magic_exponents, the metadata in channel order")
  if folded_minimums and not (permuted_keys or values_in_registers):
    raise ValueError("folded_minimums: the register paths', with permuted_keys or values_in_registers")
  if interleaved_key_parts and not (permuted_keys and interpret is None and not knockout):
    raise ValueError("interleaved_key_parts: the register path's keys (permuted_keys), compiled, no knockout")
  if prefolded_minimums and not (folded_minimums and not (values_by_ldmatrix or values_per_token)):
    raise ValueError("prefolded_minimums: minimums folded before the kernel, with folded_minimums (not "
                     "values_by_ldmatrix or values_per_token)")
  if values_by_ldmatrix and not (values_in_registers and folded_minimums and not metadata_in_thread_order):
    raise ValueError("values_by_ldmatrix: with values_in_registers and folded_minimums, the metadata in channel "
                     "order")
  if token_scaled_p and not (values_per_token and eight_column_softmax and in_place_values
                             and not (defer_values_wgmma or values_scaled_after or bias_in_kernel)):
    raise ValueError("token_scaled_p: KIVI's values (values_per_token) with eight_column_softmax and "
                     "in_place_values, not with defer_values_wgmma, values_scaled_after or bias_in_kernel")
  if paired_steps and not (steps_per_block == 2 and eight_column_softmax and in_place_values and values_in_registers
                           and not (token_scaled_p or values_per_token or defer_values_wgmma)):
    raise ValueError("paired_steps: a block's two steps under one softmax, with steps_per_block=2, "
                     "eight_column_softmax, in_place_values and values_in_registers (not KIVI's values)")
  if narrow_scores and not (eight_column_softmax and not (keys_in_smem or bias_in_kernel)):
    raise ValueError("narrow_scores: with eight_column_softmax (the keys dequantized), not keys_in_smem or "
                     "bias_in_kernel")
  if narrow_values and not (eight_column_softmax and values_in_registers and in_place_values
                            and not token_scaled_p):
    raise ValueError("narrow_values: with eight_column_softmax, values_in_registers and in_place_values, not "
                     "token_scaled_p")
  if paged and not (ranged and warpgroups > 1 and dequantize_keys and not (bias_in_kernel or values_per_token)):
    raise ValueError("paged: a range of windows through a page table, with warpgroups > 1 and dequantize_keys, not "
                     "bias_in_kernel or values_per_token")
  if knockout not in KNOCKOUTS:
    raise ValueError(f"knockout: one of {KNOCKOUTS[1:]}, got {knockout!r}")
  if knockout and (interpret is not None or not (permuted_keys and values_in_registers)):
    raise ValueError("knockout: a compiled diagnostic (not the interpret mode), with permuted_keys and "
                     "values_in_registers")
  if knockout in ("key_scaling", "scaling") and not folded_minimums:
    raise ValueError(f"knockout {knockout!r}: the keys as magic + code need folded_minimums")
  if knockout in ("value_scaling", "scaling") and not values_by_ldmatrix:
    raise ValueError(f"knockout {knockout!r}: the values as magic + code need values_by_ldmatrix")
  if factored_keys and not (code_bits(k_codes) == 2 and dequantize_keys and eight_column_softmax and permuted_keys
                            and folded_minimums and not (narrow_scores or paged or paired_steps or interleaved_key_parts
                                                         or prefolded_minimums or bias_in_kernel)):
    raise ValueError("factored_keys: INT2 codes, with dequantize_keys, eight_column_softmax, permuted_keys and "
                     "folded_minimums; not paged, narrow_scores, paired_steps, interleaved_key_parts, "
                     "prefolded_minimums or bias_in_kernel")
  if eight_column_softmax and not (dequantize_keys and lagged_max):
    raise ValueError("eight_column_softmax: one score a head for both windows, with dequantize_keys and "
                     "lagged_max")
  if values_per_token:
    if v_scale.shape != (n, tokens, HEAD_DIM // 32) or v_min.shape != v_scale.shape:
      raise ValueError(f"values_per_token: v_scale and v_min [N, T, {HEAD_DIM // 32}] (a token's groups of 32 "
                       f"channels), got {v_scale.shape}, {v_min.shape}")
    if values_in_registers or values_scaled_after or ldmatrix_metadata or metadata_in_thread_order or not (
        fast_unpack or interpret is not None):
      raise ValueError("values_per_token: the values through shared memory, dequantized by the fast path: not with "
                       "values_in_registers, values_scaled_after, ldmatrix_metadata or metadata_in_thread_order")
    v_scale, v_min = (x.reshape(n, tokens // 2, 2 * HEAD_DIM // 32) for x in (v_scale, v_min))  # token pairs
  if prefolded_minimums and interpret is not None:  # the plain path reads plain minimums
    k_bias, v_min = unfold_minimums(k_scale, k_bias, bits), unfold_minimums(v_scale, v_min, bits)
  if metadata_in_thread_order and interpret is not None:  # the plain path reads them in channel order
    k_scale, k_bias, v_scale, v_min = (thread_order(x) for x in (k_scale, k_bias, v_scale, v_min))
  if in_place_values and (defer_values_wgmma or values_scaled_after):
    raise ValueError("in_place_values: one V buffer, not with defer_values_wgmma or values_scaled_after")
  if bias_in_kernel:
    if k_bias.shape[2] != HEAD_DIM or (ranged and max_windows is None):
      raise ValueError(f"bias_in_kernel takes the key minimums [N, windows, {HEAD_DIM}] (and a range's "
                       f"max_windows), got {k_bias.shape}, max_windows={max_windows}")
  elif factored_keys and not ranged:
    if k_bias.shape != k_scale.shape:
      raise ValueError(f"factored_keys takes the key minimums [N, windows, {HEAD_DIM}] (a range: `factored_bias` "
                       f"over it), got {k_bias.shape}")
    k_bias = factored_bias(q, k_scale, k_bias, magic=factored_magic(interpret, fast_unpack))
  elif factored_keys:
    if k_bias.shape[2] != COLUMNS:
      raise ValueError(f"factored_keys over a range takes its bias [N, windows, {COLUMNS}] (`range_partials`), "
                       f"got {k_bias.shape}")
  elif (k_bias.shape[2] != (HEAD_DIM if dequantize_keys else COLUMNS)
        or (not ranged and k_bias.shape[1] != tokens // WINDOW)):
    raise ValueError(f"k_bias: a bias [N, windows, {COLUMNS}] from key_bias (range_bias for a range), or with "
                     f"dequantize_keys the key minimums [N, windows, {HEAD_DIM}]; got {k_bias.shape}")
  # A step's rows of the values' scales and minimums: its 2 windows, or (`values_per_token`) its 32 token pairs
  value_rows, value_columns = (STEP // 2, 2 * HEAD_DIM // 32) if values_per_token else (2, HEAD_DIM)
  if not ranged:
    range_params = jnp.zeros((32,), jnp.int32)  # unused: the whole pool's start and count are static
  blocks = tokens // (STEP * spb) // splits  # static, where not ranged
  bias_rows = (in_kernel_bias_rows(max_windows if ranged else tokens // WINDOW, splits, spb)
               if bias_in_kernel else 0)
  if bias_rows > MAX_BIAS_ROWS:
    raise ValueError(f"bias_in_kernel holds at most {MAX_BIAS_ROWS} windows a split, got {bias_rows}")
  groups = warpgroups
  if fetch_warp_by_group and not fetch_by_one_warp:
    raise ValueError("fetch_warp_by_group: which warp issues a group's copies, with fetch_by_one_warp")
  if fetch_by_one_warp and groups == 1:
    raise ValueError("fetch_by_one_warp: the four-warpgroup pipeline's (warpgroups > 1); emit_pipeline issues its own")
  if groups > 1 and (defer_values_wgmma or bias_in_kernel or keys_in_smem or cta_splits(splits, groups, n) != splits):
    raise ValueError(f"warpgroups={groups} needs splits divisible by it (or dividing it, with pairs a multiple of "
                     f"warpgroups / splits; got splits={splits} for {n} pairs), and neither defer_values_wgmma, "
                     f"bias_in_kernel nor keys_in_smem")
  # A CTA's warpgroups are splits of one pair, or (fewer splits than warpgroups) the splits of several pairs:
  # short pools at large batches then fill fewer waves of CTAs, each program reading more steps
  pairs_per_cta = groups // splits if splits < groups else 1
  # The outputs' columns: with `eight_column_softmax` both window parities' heads are in 0-7 (8-15 would be empty:
  # s46 dropped them, half of the partials' bytes written and merged), else a parity's 8 each
  out_columns = COLUMNS // 2 if eight_column_softmax and not sixteen_columns_out else COLUMNS
  layout = plgpu.Layout
  fast = fast_unpack and interpret is None  # inline PTX: the interpret mode runs the plain path
  magic = fast and magic_exponents
  transposed_values = fast and values_in_registers  # V^T in registers (the interpret mode: through v_s)
  scaled_codes = fast and token_scaled_p  # KIVI's value codes in registers, exact (the interpret mode: v_s)
  register_values = transposed_values or scaled_codes
  keys_by_thread = fast and permuted_keys  # the keys' channels permuted, q^T's rows alike
  defer = defer_values_wgmma and interpret is None
  slots = 2 if defer else 1
  in_place = defer or (in_place_values and interpret is None)  # O^T in a wgmma accumulator across steps
  rescale_on_vote = in_place and in_place_values and lagged_max  # alpha is 1 wherever no warp votes
  # With the keys permuted, row 8g + 2l + e of a part is channel (W / 4) l + 2g + e, as the keys' columns
  # (`key_order`): q's channels permuted before its sum over the heads, where XLA fuses the permutation into it
  qk = key_order(q, bits, axis=2) if keys_by_thread else q  # q's channels in the keys' order
  qt = query_rows(qk) if narrow_scores else query_operands(
      qk, part_scaled=not (magic or (dequantize_keys and not factored_keys)), bits=bits)
  q_raw = query_operands(q, part_scaled=False) if bias_in_kernel else qt  # q^T for the minimums' products

  def swizzled(row_bytes, dtype):  # the interpret mode takes plain buffers
    if interpret is not None:
      return ()
    return (plgpu.TilingTransform((8, row_bytes // jnp.dtype(dtype).itemsize)), plgpu.SwizzleTransform(row_bytes))

  def smem(shape, dtype, row_bytes=None):
    return plgpu.SMEM(shape, dtype, transforms=swizzled(row_bytes, dtype) if row_bytes else ())

  def kernel(pair, split, range_g, qt_g, qr_g, kc_g, ks_g, kb_g, vc_g, vs_g, vm_g, o_g, m_g, l_g, bq_s, v_slots,
             p_slots, bias_s, vote_slots, bar, *group_scratch):
    if grid_dependency_wait and interpret is None:  # nothing read before: the wait is all the ordering needed
      plgpu.griddepcontrol_wait()
    if groups > 1:  # this warpgroup's pair, split and buffers
      wg = lax.axis_index("wg")
      if pairs_per_cta > 1:
        pair, split = pair * pairs_per_cta + wg // splits, wg % splits
      else:
        split = split * groups + wg
      bq_s, v_slots, p_slots, my_bar = bq_s.at[wg], v_slots.at[wg], p_slots.at[wg], bar.at[wg]
      vote_slots = vote_slots.at[wg]
    else:
      my_bar = bar.at[0]

    def column_max(x):  # over the rows (keys): a warpgroup's own scratch where a CTA has several
      if groups > 1 and interpret is None:
        return _column_reduce(x, "max", group_scratch[10].at[wg])
      return x.max(axis=0)

    def column_sum(x):
      if groups > 1 and interpret is None:
        return _column_reduce(x, "add", group_scratch[10].at[wg])
      return x.sum(axis=0)

    def read_before_reuse():
      # A scoped buffer's memory is the next allocation's, which one thread fills by TMA at once: every
      # warp must have read it first (without this barrier, a slow warp read the pipeline's first codes as
      # its query: non-finite partials in ~1 call of 3 at 2-5 waves, session 22).
      plgpu.commit_smem()

    def load_range(range_s):  # first window, count, bias row: through shared memory (a TMA moves >= 128 B)
      plgpu.copy_gmem_to_smem(range_g, range_s, my_bar)
      plgpu.barrier_wait(my_bar)
      values = tuple(range_s[0, i] if paged else range_s[i] for i in range(3))  # paged: [rows, 32]
      read_before_reuse()
      return values
    if ranged:  # in blocks of `spb` steps of two windows
      if groups > 1:
        start, count, bias_row = load_range(group_scratch[0].at[wg])
      else:
        start, count, bias_row = pl.run_scoped(load_range, smem(range_params.shape, jnp.int32))
      total = ((count + 1) // 2 + spb - 1) // spb
      per_split = (total + splits - 1) // splits
      begin = split * per_split
      my_blocks = jnp.clip(total - begin, 0, per_split)
    else:
      start, count, bias_row, begin, my_blocks = 0, tokens // WINDOW, 0, split * blocks, blocks
    first_window = 2 * spb * begin  # of the split, from the range's start

    def load_query(qt_s):  # scoped: its shared memory goes back to the pipeline's buffers
      plgpu.copy_gmem_to_smem(qt_g.at[pair], qt_s, my_bar)
      plgpu.barrier_wait(my_bar)
      q = plgpu.load(qt_s, layout=layout.WGMMA)
      read_before_reuse()
      return q
    if narrow_scores:  # q's rows straight into the score wgmma's B: no copy in registers
      plgpu.copy_gmem_to_smem(qt_g.at[pair], bq_s, my_bar)
      plgpu.barrier_wait(my_bar)
      q = None
    else:  # several warpgroups: through bq_s, which the first step overwrites (allocations are the CTA's there)
      q = load_query(bq_s) if groups > 1 else pl.run_scoped(load_query, smem((HEAD_DIM, COLUMNS), jnp.float16))
      if dequantize_keys and groups == 1 and not factored_keys:  # q^T once: the keys carry their own scales
        bq_s[...] = q
        plgpu.commit_smem()
    ones_s = group_scratch[-1] if values_scaled_after else None
    if values_scaled_after:  # every warpgroup writes the same ones: each reads them after its own barrier
      for part in range(parts):
        ones_s[:, pl.ds(width * part, width)] = plgpu.layout_cast(jnp.ones((STEP, width), jnp.float16),
                                                                  layout.WGMMA)
      plgpu.commit_smem()

    col = plgpu.broadcasted_iota(jnp.int32, (HEAD_DIM, COLUMNS), 1, layout=layout.WGMMA)
    row = plgpu.broadcasted_iota(jnp.int32, (STEP, COLUMNS), 0, layout=layout.WGMMA)
    first_half = plgpu.broadcasted_iota(jnp.int32, (STEP, COLUMNS), 1, layout=layout.WGMMA) < COLUMNS // 2
    own_window = (row < WINDOW) == first_half
    column_window = plgpu.broadcasted_iota(jnp.int32, (STEP, COLUMNS), 1, layout=layout.WGMMA) // (COLUMNS // 2)
    # `eight_column_softmax`: the softmax's columns (8 heads, both windows) and what widens them back to 16
    soft = COLUMNS // 2 if eight_column_softmax else COLUMNS
    score_columns = soft if narrow_scores else COLUMNS  # S^T's accumulator

    def query_part(part):  # the score wgmma's B for a part's channels: q^T's rows, or q's columns read transposed
      if narrow_scores:
        return bq_s.at[:, pl.ds(width * part, width)].transpose((1, 0))
      return bq_s.at[pl.ds(width * part, width)]
    row_window = plgpu.broadcasted_iota(jnp.int32, (STEP, soft), 0, layout=layout.WGMMA) // WINDOW

    o_columns = soft if narrow_values else COLUMNS  # O^T's accumulator

    def values_b(p_s):  # the V wgmma's B: P [64, 16], or (`narrow_values`) P^T [8, 64] read transposed
      return p_s.transpose((1, 0)) if narrow_values else p_s

    def wide_p(p):  # P [64, soft] -> [64, 16] f16, columns 8-15 zero (the V wgmma's B is 16 wide)
      if soft == COLUMNS:
        return p.astype(jnp.float16)
      zeros = plgpu.layout_cast(jnp.zeros((STEP, COLUMNS - soft), jnp.float32), layout.WGMMA)
      return jnp.concatenate([p, zeros], axis=1).astype(jnp.float16)

    def wide_alpha(alpha, rows=HEAD_DIM):  # alpha [soft] -> over O^T [rows, 16]: columns 8-15 zero (times 1), or
      if soft == COLUMNS or narrow_values:  # with `token_scaled_p` the other group's heads (alpha again)
        return lax.broadcast_in_dim(alpha, (rows, alpha.shape[0]), [1])
      if token_scaled_p:
        return lax.broadcast_in_dim(jnp.concatenate([alpha, alpha]), (rows, COLUMNS), [1])
      ones = plgpu.layout_cast(jnp.ones((rows, COLUMNS - soft), jnp.float32), layout.WGMMA)
      return jnp.concatenate([lax.broadcast_in_dim(alpha, (rows, soft), [1]), ones], axis=1)

    def token_rows(ref):  # `token_scaled_p`, interpret mode: a step's [32, 8] token pairs -> [64 tokens, 4 groups]
      return ref[...].reshape(STEP, HEAD_DIM // 32).astype(jnp.float32)

    def store_p(p_s, p, vs_s):  # P [64, soft] into the V wgmma's B (with `token_scaled_p`: a tile's, times s)
      if narrow_values:
        p_s.transpose((1, 0))[...] = p.astype(jnp.float16)
        return
      if not token_scaled_p:
        p_s[...] = wide_p(p)
        return
      if interpret is None:
        tiles = _token_scaled_p(p, vs_s)
      else:
        scale = token_rows(vs_s)
        tiles = [jnp.concatenate([p * scale[:, 2 * m:2 * m + 1], p * scale[:, 2 * m + 1:2 * m + 2]], axis=1)
                 .astype(jnp.float16) for m in range(2)]
      for m in range(2):
        p_s[m] = tiles[m]

    def rescaled_terms(e, alpha):  # `token_scaled_p`: the minimums' share times alpha (where a vote moved the max)
      return e * alpha[None, :] if interpret is not None else e * wide_alpha(alpha, STEP)

    def minimum_terms(e, p, vm_s):  # `token_scaled_p`: plus this step's share
      if interpret is not None:  # [4 groups, 8 heads]
        return e + jnp.sum(token_rows(vm_s)[:, :, None] * p[:, None, :], axis=0)
      return _token_minimum_terms(p, vm_s, e)

    def wide_columns(x, fill):  # m or l [soft] -> [out_columns] (`sixteen_columns_out`: 8-15 empty)
      if soft == out_columns:
        return x
      rest = plgpu.layout_cast(jnp.full((COLUMNS - soft,), fill, jnp.float32), layout.WGMMA.reduce(0))
      return jnp.concatenate([x, rest])
    token = plgpu.broadcasted_iota(jnp.int32, (STEP, width), 0, layout=layout.WGMMA)

    def window_biases(kmin_s, qr_s):  # `bias_in_kernel`: bias_s row j = window start + first_window + j
      plgpu.copy_gmem_to_smem(qr_g.at[pair], qr_s, my_bar)
      plgpu.barrier_wait(my_bar)

      def chunk(c, carry):  # 64 windows' minimums (zeros past the pool) against q^T
        plgpu.copy_gmem_to_smem(kb_g.at[pair, pl.ds(start + first_window + STEP * c, STEP)], kmin_s, my_bar)
        plgpu.barrier_wait(my_bar)

        def product(acc):
          plgpu.wgmma(acc, kmin_s, qr_s)
          plgpu.wgmma_wait(0)
          return acc[...]
        bias = pl.run_scoped(product, plgpu.ACC((STEP, COLUMNS), jnp.float32))
        bias_s[pl.ds(STEP * c, STEP)] = jnp.where(first_window + STEP * c + row < count, bias, _NEG)
        plgpu.commit_smem()  # the rows are written, and kmin_s free for the next chunk's copy
        return carry
      lax.fori_loop(0, (2 * spb * my_blocks + STEP - 1) // STEP, chunk, 0)
    if bias_in_kernel:
      pl.run_scoped(window_biases, smem((STEP, HEAD_DIM), jnp.float16, 32), smem((HEAD_DIM, COLUMNS), jnp.float16, 32))

    def per_column(ref, factor=None):  # [2, H] -> [H, 16]: column c takes window c // 8's row (times factor [H])
      loaded = [plgpu.load(ref.at[w], layout=layout.WGMMA.reduce(1)).astype(jnp.float32) for w in range(2)]
      rows = [lax.broadcast_in_dim(x if factor is None else x * factor, (HEAD_DIM, COLUMNS), [0]) for x in loaded]
      return jnp.where(col < 8, rows[0], rows[1])

    if values_scaled_after:  # channel h's codes come unpacked as levels^p c (part p = h // width), or c (`magic`)
      channel = plgpu.broadcasted_iota(jnp.int32, (HEAD_DIM,), 0, layout=layout.WGMMA.reduce(1))
      code_factor = jnp.exp2((-bits * (channel // width)).astype(jnp.float32)) if not magic else None

    def per_token(ref, part):  # [2, H] -> [64, width]: token t takes window t // 32's channels of the part
      rows = [lax.broadcast_in_dim(plgpu.load(ref.at[w, pl.ds(width * part, width)],
                                              layout=layout.WGMMA.reduce(0)), (STEP, width), [1]) for w in range(2)]
      return jnp.where(token < WINDOW, rows[0], rows[1])

    def unpacked_keys(kc_s, which=None):  # parts of the keys' codes, f16 [64, width] (levels^p c; c with `magic`)
      which = tuple(range(parts)) if which is None else which
      if fast:
        return _unpacked_parts(plgpu.load(kc_s, layout=layout.WGMMA), magic_exponents=magic, parts=which,
                               bits=bits)
      codes = plgpu.load(kc_s, layout=layout.WGMMA_UPCAST_2X)
      return [plgpu.layout_cast((codes & jnp.uint8((levels - 1) << bits * part)).astype(jnp.float16), layout.WGMMA)
              for part in which]

    def per_token_group(ref, part):  # `values_per_token`, interpret mode: [32, 8] -> [64, width], a token's groups
      groups = ref[...].reshape(STEP, HEAD_DIM // 32)[:, width * part // 32:width * (part + 1) // 32]
      return jnp.repeat(groups, 32, axis=1)

    def plain_dequantized(codes, scale_ref, minimum_ref, part, by_token=False):  # Mosaic's own conversions
      values = plgpu.layout_cast((codes & jnp.uint8((levels - 1) << bits * part)).astype(jnp.float16), layout.WGMMA)
      metadata = per_token_group if by_token else per_token
      return values * (metadata(scale_ref, part) * jnp.float16(levels ** -part)) + metadata(minimum_ref, part)

    def dequantized_keys(kc_s, ks_s, km_s):  # `dequantize_keys`: code x scale + minimum, f16 [64, 32] a part
      if factored_keys:  # magic + code (the plain path: the exact parts), the scales in q^T
        return _keys_by_thread(kc_s, ks_s, ks_s, True, bits, codes_only=True) if keys_by_thread else unpacked_keys(kc_s)
      if knockout in ("keys", "both"):
        return [plgpu.layout_cast(jnp.full((STEP, width), 1.0, jnp.float16), layout.WGMMA) for _ in range(parts)]
      if keys_by_thread:
        return _keys_by_thread(kc_s, ks_s, km_s, folded_minimums, bits, prefolded_minimums,
                               one_metadata_load=knockout in ("key_metadata", "metadata"),
                               codes_only=knockout in ("key_scaling", "scaling"))
      if fast:
        return _unpacked_parts(plgpu.load(kc_s, layout=layout.WGMMA), ks_s, km_s, ptx_fma=ptx_fma,
                               magic_exponents=magic, bits=bits, ldmatrix_metadata=ldmatrix_metadata,
                               metadata_in_thread_order=metadata_in_thread_order)
      codes = plgpu.load(kc_s, layout=layout.WGMMA_UPCAST_2X)
      return [plain_dequantized(codes, ks_s, km_s, part) for part in range(parts)]

    def transposed_values_of(vc_s, vs_s, vm_s):  # V^T in registers, rows as `value_row_channels` orders them
      if knockout in ("values", "both"):
        return plgpu.layout_cast(jnp.full((HEAD_DIM, STEP), 1.0, jnp.float16), layout.WGMMA)
      if scaled_codes:
        return _value_codes_transposed(vc_s, bits)
      if values_by_ldmatrix:
        return _values_by_ldmatrix(vc_s, vs_s, vm_s, bits, codes_only=knockout in ("value_scaling", "scaling"))
      return _values_transposed(vc_s, vs_s, vm_s, metadata_in_thread_order, bits, folded_minimums,
                                prefolded_minimums, one_metadata_load=knockout in ("value_metadata", "metadata"))

    def dequantize_values(vc_s, vs_s, vm_s, v_s):  # into v_s [64 tokens, 128 channels] f16
      if token_scaled_p:  # the interpret mode's exact codes (levels^p c, times levels^-p)
        for part, value in enumerate(unpacked_keys(vc_s)):
          v_s[:, pl.ds(width * part, width)] = value * jnp.float16(levels ** -part)
        return
      if values_scaled_after:  # the codes alone: scaled after the V wgmma
        for part, value in enumerate(unpacked_keys(vc_s)):
          v_s[:, pl.ds(width * part, width)] = value
        return
      if fast:
        codes = plgpu.load(vc_s, layout=layout.WGMMA)
        unpack = functools.partial(_unpacked_parts, codes, vs_s, vm_s, ptx_fma=ptx_fma, magic_exponents=magic,
                                   bits=bits, ldmatrix_metadata=ldmatrix_metadata,
                                   metadata_in_thread_order=metadata_in_thread_order,
                                   values_per_token=values_per_token)
        unpacked = [] if values_by_part else unpack()
        for part in range(parts):
          value = unpack(parts=(part,))[0] if values_by_part else unpacked[part]
          v_s[:, pl.ds(width * part, width)] = value
        return
      codes = plgpu.load(vc_s, layout=layout.WGMMA_UPCAST_2X)
      for part in range(parts):
        v_s[:, pl.ds(width * part, width)] = plain_dequantized(codes, vs_s, vm_s, part, values_per_token)

    def block(indices, *refs):  # `spb` steps
      if bias_in_kernel:
        (kc_s, ks_s, vc_s, vs_s, vm_s, carry), kb_s = refs, None
      else:
        kc_s, ks_s, kb_s, vc_s, vs_s, vm_s, carry = refs
      if paired_steps:  # both steps' refs, one softmax
        sizes = ((kc_s, STEP), (ks_s, 2), (kb_s, 2), (vc_s, STEP), (vs_s, value_rows), (vm_s, value_rows))
        return paired_step(indices[0], [tuple(ref.at[pl.ds(n * i, n)] for ref, n in sizes) for i in range(2)], carry)
      for i in range(spb):
        rows = lambda ref, n: ref.at[pl.ds(n * i, n)]
        index = indices[0] * spb + i  # the step's, in the split
        step_bias = bias_s.at[pl.ds(2 * index, 2)] if bias_in_kernel else rows(kb_s, 2)
        carry = step(index, i, rows(kc_s, STEP), rows(ks_s, 2), step_bias, rows(vc_s, STEP),
                     rows(vs_s, value_rows), rows(vm_s, value_rows), carry)
      return carry

    def step(index, i, kc_s, ks_s, kb_s, vc_s, vs_s, vm_s, carry):  # index: traced; i: within the block
      acc, m_run, l_rows, e = carry  # acc: None where O^T accumulates in place (`defer`, `in_place_values`)
      slot = (i % slots if spb % slots == 0 else lax.rem(index, slots)) if defer else 0
      v_s = v_slots.at[slot]
      p_s = p_slots if token_scaled_p else p_slots.at[slot]  # `token_scaled_p`: a B a V^T tile
      if in_place and not defer:  # the previous step's V wgmma has read v_s and p_s before they are rewritten
        plgpu.wgmma_wait(0)
      if factored_keys or not dequantize_keys:  # q^T times the step's key scales
        if fast:
          bq_s[...] = _scaled_permuted_query(q, ks_s) if factored_keys else _scaled_query(q, ks_s)
        else:
          bq_s[...] = (q.astype(jnp.float32) * per_column(ks_s)).astype(jnp.float16)
        plgpu.commit_smem()

      def scores(s_acc, k_s=None):
        values_t = None  # `values_in_registers`: V^T [128, 64] (`token_scaled_p`: its codes, two tiles)
        if not overlap_values and not register_values:
          dequantize_values(vc_s, vs_s, vm_s, v_s)
        if k_s is not None:  # `keys_in_smem`
          for part in range(parts):  # stored a part at a time: a part's registers live
            k_s[:, pl.ds(width * part, width)] = unpacked_keys(kc_s, (part,))[0]
          plgpu.commit_smem()
          plgpu.wgmma(s_acc, k_s, bq_s)
        elif interleaved_key_parts:  # a part unpacked, its wgmma issued, then the next part
          for part in range(parts):
            key_part, = _keys_by_thread(kc_s, ks_s, kb_s, folded_minimums, bits, prefolded_minimums,
                                        only_parts=(part,))
            plgpu.wgmma(s_acc, key_part, query_part(part))
        else:
          keys = dequantized_keys(kc_s, ks_s, kb_s) if dequantize_keys else unpacked_keys(kc_s)
          for part in range(parts):
            plgpu.wgmma(s_acc, keys[part], query_part(part))
        if overlap_values and register_values:
          values_t = transposed_values_of(vc_s, vs_s, vm_s)
        elif overlap_values:
          dequantize_values(vc_s, vs_s, vm_s, v_s)  # while the tensor cores work on the scores
        plgpu.wgmma_wait(0)  # with `defer`, also the previous step's V wgmma
        return s_acc[...], values_t

      accumulator = plgpu.ACC((STEP, score_columns), jnp.float32)
      if keys_in_smem:  # a scope of its own: registers and shared memory cannot share one
        s, values_t = pl.run_scoped(lambda k_s: pl.run_scoped(lambda acc: scores(acc, k_s), accumulator),
                                    smem((STEP, HEAD_DIM), jnp.float16, 32))
      else:
        s, values_t = pl.run_scoped(scores, accumulator)
      if register_values and values_t is None:  # after the score wgmma: the keys' registers are free
        values_t = transposed_values_of(vc_s, vs_s, vm_s)
      if register_values:
        v_operand = values_t
      elif token_scaled_p:  # the interpret mode's two tiles of 64 channels
        v_operand = [v_s.at[:, pl.ds(STEP * m, STEP)].transpose((1, 0)) for m in range(2)]
      else:
        v_operand = v_s.transpose((1, 0))
      if factored_keys:  # each row its window's 8 columns, plus that window's bias
        bias = [lax.broadcast_in_dim(plgpu.load(kb_s.at[w], layout=layout.WGMMA.reduce(0)), s.shape, [1])
                for w in range(2)]
        s = s + jnp.where(first_half, bias[0], bias[1])
        s = jnp.where(row_window == 0, s[:, :soft], s[:, soft:])
      elif dequantize_keys:  # kb_s holds the minimums, already in the keys; a range masks past its count
        past = first_window + 2 * index  # the step's first window, from the range's start
        if eight_column_softmax:  # both windows' rows in columns 0-7: nothing to mask but a range's end
          s = s[:, :soft]
          s = jnp.where(row_window < count - past, s, _NEG) if ranged else s
        else:
          s = jnp.where(own_window & (column_window < count - past) if ranged else own_window, s, _NEG)
      else:
        bias = [lax.broadcast_in_dim(plgpu.load(kb_s.at[w], layout=layout.WGMMA.reduce(0)), s.shape, [1])
                for w in range(2)]  # columns 0-7 from the first window's row, 8-15 from the second's
        s = jnp.where(own_window, s + jnp.where(first_half, bias[0], bias[1]), _NEG)
      if lagged_max:  # P against the agreed maximum, stored with the warps' votes before P's barrier
        m_new, (p,), alpha, e = lagged_softmax((s,), m_run, (p_s,), vote_slots.at[lax.rem(index, 2)], vs_s, e)
      else:
        m_new = jnp.maximum(m_run, column_max(s))
        p = jnp.exp2(s - lax.broadcast_in_dim(m_new, s.shape, [1]))
        alpha = jnp.exp2(m_run - m_new)
      # Row sums are kept a thread's rows apart and reduced once at the end: no exchange between warps.
      l_rows = l_rows * lax.broadcast_in_dim(alpha, s.shape, [1]) + p
      if token_scaled_p:  # rescaled in the vote's branch (alpha is 1 elsewhere)
        e = minimum_terms(e, p, vm_s)
      if in_place and not rescale_on_vote:
        rescale_accumulator(alpha)
      elif not in_place:
        acc = acc * wide_alpha(alpha)
      if not lagged_max:
        p_s[...] = p.astype(jnp.float16)
        plgpu.commit_smem()
      if in_place:  # waited for in the next step (or after the loop)
        values_wgmma(o_acc, v_operand, p_s)
        return acc, m_new, l_rows, e

      def attend(o_acc):  # a fresh accumulator, added to the rescaled one (interpret mode cannot store to one)
        plgpu.wgmma(o_acc, v_operand, values_b(p_s))
        plgpu.wgmma_wait(0)
        return o_acc[...]

      def attend_tiles(tile0, tile1):  # `token_scaled_p`: a tile of 64 channels against its own B
        values_wgmma((tile0, tile1), v_operand, p_s)
        plgpu.wgmma_wait(0)
        return jnp.concatenate([tile0[...], tile1[...]], axis=0)

      def attend_codes(o_acc, sum_acc):  # `values_scaled_after`: (C^T P, every row the column sums of P)
        plgpu.wgmma(o_acc, v_s.transpose((1, 0)), p_s)
        plgpu.wgmma(sum_acc, ones_s.transpose((1, 0)), p_s)
        plgpu.wgmma_wait(0)
        return o_acc[...], sum_acc[...]
      if values_scaled_after:
        product, sums = pl.run_scoped(attend_codes, plgpu.ACC((HEAD_DIM, COLUMNS), jnp.float32),
                                      plgpu.ACC((HEAD_DIM, COLUMNS), jnp.float32))
        acc = acc + product * per_column(vs_s, code_factor) + sums * per_column(vm_s)
      elif token_scaled_p:
        acc = acc + pl.run_scoped(attend_tiles, *(plgpu.ACC((STEP, COLUMNS), jnp.float32) for _ in range(2)))
      else:
        acc = acc + pl.run_scoped(attend, plgpu.ACC((HEAD_DIM, o_columns), jnp.float32))
      return acc, m_new, l_rows, e

    def paired_step(block, steps, carry):  # `paired_steps`: 128 keys (two steps' refs) under one softmax
      acc, m_run, l_rows, e = carry
      if in_place:  # the previous block's V wgmmas have read both P buffers
        plgpu.wgmma_wait(0)

      def scores(*accumulators):
        for (kc_s, ks_s, kb_s, *_), s_acc in zip(steps, accumulators):
          keys = dequantized_keys(kc_s, ks_s, kb_s)
          for part in range(parts):
            plgpu.wgmma(s_acc, keys[part], query_part(part))
          plgpu.wgmma_wait(0)  # the keys' registers free before the next step's (both in flight spill)
        return tuple(s_acc[...][:, :soft] for s_acc in accumulators)
      tiles = pl.run_scoped(scores, *(plgpu.ACC((STEP, score_columns), jnp.float32) for _ in range(2)))
      if ranged:  # a range masks past its count
        tiles = [jnp.where(row_window < count - (first_window + 2 * (2 * block + i)), x, _NEG)
                 for i, x in enumerate(tiles)]
      m_new, (p0, p1), alpha, e = lagged_softmax(tiles, m_run, (p_slots.at[0], p_slots.at[1]),
                                                 vote_slots.at[lax.rem(block, 2)], None, e)  # one vote, one barrier
      l_rows = l_rows * lax.broadcast_in_dim(alpha, p0.shape, [1]) + p0 + p1
      if not in_place:  # the interpret mode: O^T rescaled, then each step's product added
        acc = acc * wide_alpha(alpha)

      def attend(o_acc, p_s):
        plgpu.wgmma(o_acc, v_slots.at[0].transpose((1, 0)), values_b(p_s))
        plgpu.wgmma_wait(0)
        return o_acc[...]
      for i, (*_, vc_s, vs_s, vm_s) in enumerate(steps):
        if in_place:  # the second waited for at the next block's start
          if i:  # the first step's V^T registers free first
            plgpu.wgmma_wait(0)
          values_wgmma(o_acc, transposed_values_of(vc_s, vs_s, vm_s), p_slots.at[i])
        else:
          dequantize_values(vc_s, vs_s, vm_s, v_slots.at[0])
          acc = acc + pl.run_scoped(lambda o: attend(o, p_slots.at[i]), plgpu.ACC((HEAD_DIM, o_columns), jnp.float32))
      return acc, m_new, l_rows, e

    def values_wgmma(accumulator, v_operand, p_s):  # O^T += V^T P (`token_scaled_p`: a tile against its own B)
      if token_scaled_p:
        for m in range(2):
          plgpu.wgmma(accumulator[m], v_operand[m], p_s.at[m])
      else:
        plgpu.wgmma(accumulator, v_operand, values_b(p_s))

    def rescale_accumulator(alpha):  # O^T in place, times alpha
      for tile in (o_acc if token_scaled_p else (o_acc,)):
        tile[...] = tile[...] * wide_alpha(alpha, tile.shape[0])

    def lagged_softmax(tiles, m_run, p_refs, votes, vs_s, e):
      """(maximum, P of each tile, the factor alpha on what came before) of a step's scores (`paired_steps`: a
      block's two steps' tiles under one vote): P = 2^(s - m_run) and alpha 1 where no score exceeds m_run by more
      than LAG_MARGIN, else (a uniform branch) the true running maximum, P against it and 2^(m_run - maximum).
      P is in p_refs, fenced."""
      highest = tiles[0] if len(tiles) == 1 else jnp.maximum(*tiles)
      limit = lax.broadcast_in_dim(m_run + LAG_MARGIN, highest.shape, [1])

      def probabilities(m):  # each tile's P against m, stored
        p = tuple(jnp.exp2(s - lax.broadcast_in_dim(m, s.shape, [1])) for s in tiles)
        for p_s, x in zip(p_refs, p):
          store_p(p_s, x, vs_s)
        return p
      p = probabilities(m_run)
      if interpret is None:  # each warp's vote in shared memory; P's barrier publishes both
        _vote_by_warp(highest, limit, votes)
        plgpu.commit_smem()
        over = (votes[0] | votes[1] | votes[2] | votes[3]) != 0
      else:  # the interpret mode runs the warpgroup as one: its own reduction
        over = jnp.any(highest > limit)
        plgpu.commit_smem()

      def reduce_and_redo():
        m_new = jnp.maximum(m_run, column_max(highest))
        alpha = jnp.exp2(m_run - m_new)
        if rescale_on_vote:  # the accumulator's last wgmma was waited for at the step's (block's) start
          rescale_accumulator(alpha)
        p_new = probabilities(m_new)
        plgpu.commit_smem()
        return m_new, p_new, alpha, rescaled_terms(e, alpha) if token_scaled_p else e
      # No vote: alpha is 1, not 2^(m_run - m_run) (s25 SASS: 20 instructions a step went to that)
      unchanged = plgpu.layout_cast(jnp.ones((soft,), jnp.float32), layout.WGMMA.reduce(0))
      return lax.cond(over, reduce_and_redo, lambda: (m_run, p, unchanged, e))

    def run_loop(accumulator=None):  # accumulator: O^T's wgmma accumulator where it accumulates in place
      nonlocal o_acc
      o_acc = accumulator
      e = None  # `token_scaled_p`: the minimums' share ([4 groups, 8 heads] in the interpret mode)
      if token_scaled_p:
        e = (jnp.zeros((4, soft), jnp.float32) if interpret is not None
             else plgpu.layout_cast(jnp.zeros((STEP, COLUMNS), jnp.float32), layout.WGMMA))
      init = (None if in_place else plgpu.layout_cast(jnp.zeros((HEAD_DIM, o_columns), jnp.float32),
                                                      layout.WGMMA),
              plgpu.layout_cast(jnp.full((soft,), _NEG, jnp.float32), layout.WGMMA.reduce(0)),
              plgpu.layout_cast(jnp.zeros((STEP, soft), jnp.float32), layout.WGMMA), e)
      if ranged:  # element offsets: the range may start at an odd window; a dynamic trip count
        codes = lambda: plgpu.BlockSpec((pl.Element(STEP * spb), packed),
                                        lambda s: (WINDOW * start + STEP * spb * (begin + s), 0),
                                        transforms=swizzled(packed, jnp.uint8))
        metadata = lambda: plgpu.BlockSpec((pl.Element(2 * spb), HEAD_DIM),
                                           lambda s: (start + 2 * spb * (begin + s), 0))
        token_metadata = lambda: plgpu.BlockSpec((pl.Element(value_rows * spb), value_columns),
                                                 lambda s: (WINDOW // 2 * start + value_rows * spb * (begin + s), 0))
        bias = plgpu.BlockSpec((pl.Element(2 * spb), COLUMNS), lambda s: (bias_row + 2 * spb * (begin + s), 0))
      else:
        codes = lambda: plgpu.BlockSpec((STEP * spb, packed), lambda s: (begin + s, 0),
                                        transforms=swizzled(packed, jnp.uint8))
        metadata = lambda: plgpu.BlockSpec((2 * spb, HEAD_DIM), lambda s: (begin + s, 0))
        token_metadata = lambda: plgpu.BlockSpec((value_rows * spb, value_columns), lambda s: (begin + s, 0))
        bias = plgpu.BlockSpec((2 * spb, COLUMNS), lambda s: (begin + s, 0))
      specs, inputs = [codes(), metadata(), bias, codes(), metadata(), metadata()], [kc_g, ks_g, kb_g, vc_g, vs_g, vm_g]
      if dequantize_keys and not factored_keys:  # the key minimums, beside the scales
        specs[2] = metadata()
      if values_per_token:
        specs[4:] = [token_metadata(), token_metadata()]
      if bias_in_kernel:  # computed before the loop, into bias_s
        del specs[2], inputs[2]
      if groups > 1:
        acc, m_run, l_rows, e = group_pipeline(init)
      else:
        pipeline = plgpu.emit_pipeline(block, grid=(my_blocks,), max_concurrent_steps=stages, init_carry=init,
                                       in_specs=specs)
        acc, m_run, l_rows, e = pipeline(*(x.at[pair] for x in inputs))
      if in_place:
        plgpu.wgmma_wait(0)
        acc = tuple(tile[...] for tile in o_acc) if token_scaled_p else o_acc[...]
      return acc, m_run, l_rows, e

    def group_pipeline(init):  # `emit_pipeline` by hand: its allocations would be the CTA's, not the group's
      buffers = [b.at[wg] for b in group_scratch[3:9]]
      barriers = group_scratch[9]
      sources = [kc_g, ks_g, kb_g, vc_g, vs_g, vm_g]
      rows = [STEP * spb, 2 * spb, 2 * spb, STEP * spb, value_rows * spb, value_rows * spb]
      value_first = WINDOW // 2 * start if values_per_token else start
      first = [WINDOW * start, start, start if dequantize_keys and not factored_keys else bias_row, WINDOW * start,
               value_first, value_first]

      def fetch(index):  # block `index` of the split into its slot
        slot = lax.rem(index, stages)
        if paged:
          return fetch_pages(index, slot)
        for source, buffer, n, f in zip(sources, buffers, rows, first):
          plgpu.copy_gmem_to_smem(source.at[pair, pl.ds(f + n * (begin + index), n)], buffer.at[slot],
                                  barriers.at[wg * stages + slot])

      def fetch_pages(index, slot):  # each window of the block from its record (`paged`)
        table = group_scratch[0].at[wg]
        for j in range(2 * spb):
          entry = start + jnp.minimum(first_window + 2 * spb * index + j, count - 1)  # past the count: masked
          unit = table[1 + entry // PAGE_TABLE, entry % PAGE_TABLE]  # the record's start, 16-bit units
          code_row = unit // (packed // 2)
          meta_row = unit // HEAD_DIM + WINDOW * packed // (2 * HEAD_DIM)  # after the codes: scales, minimums
          for source, buffer, row, n in zip(sources, buffers, (code_row, meta_row, meta_row + 1) * 2,
                                            (WINDOW, 1, 1) * 2):
            plgpu.copy_gmem_to_smem(source.at[pair, pl.ds(row, n)], buffer.at[slot, pl.ds(n * j, n)],
                                    barriers.at[wg * stages + slot])

      for index in range(stages):
        pl.when(index < my_blocks)(functools.partial(fetch, index))

      def body(index, carry):
        slot = lax.rem(index, stages)
        plgpu.barrier_wait(barriers.at[wg * stages + slot])
        carry = block((index,), *(b.at[slot] for b in buffers), carry)
        # The block's reads of the slot precede its last commit_smem (a barrier of the warpgroup).
        if fetch_by_one_warp and interpret is None:  # the other warps branch around the copies' set-up
          issuer = lax.rem(wg, 4) if fetch_warp_by_group else 0  # `fetch_warp_by_group`: a scheduler a group's
          plgpu.warp_map(lambda warp: pl.when((warp == issuer) & (index + stages < my_blocks))(
              lambda: fetch(index + stages)))
        else:
          pl.when(index + stages < my_blocks)(lambda: fetch(index + stages))
        return carry
      return lax.fori_loop(0, my_blocks, body, init)

    o_acc = None
    if in_place and token_scaled_p:  # two tiles of 64 channels
      acc, m_run, l_rows, e = pl.run_scoped(lambda *tiles: run_loop(tiles),
                                            *(plgpu.ACC((STEP, COLUMNS), jnp.float32) for _ in range(2)))
    elif in_place:
      acc, m_run, l_rows, e = pl.run_scoped(run_loop, plgpu.ACC((HEAD_DIM, o_columns), jnp.float32))
    else:
      acc, m_run, l_rows, e = run_loop()

    def token_scaled_output(o_s):  # `token_scaled_p`: a row's group's columns, plus the minimums' share
      if interpret is None:  # e's rows 0-7 of a 16 hold groups 0, 1 (columns 0-7, 8-15), rows 8-15 groups 2, 3
        upper = plgpu.broadcasted_iota(jnp.int32, (STEP, COLUMNS), 0, layout=layout.WGMMA) % 16 >= 8
        terms = [lax.broadcast_in_dim(column_sum(jnp.where(upper == bool(m), e, 0.0)), (STEP, COLUMNS), [1])
                 for m in range(2)]
        _store_token_scaled(acc, terms, o_s, out_columns)
        return
      # The interpret mode's rows are channels in order: row c's group c // 32, its heads in columns 8 (c // 32 % 2)
      group = lax.broadcasted_iota(jnp.int32, (HEAD_DIM, soft), 0) // 32
      heads = jnp.where(group % 2 == 1, acc[:, soft:], acc[:, :soft]) + jnp.repeat(e, 32, axis=0)
      o_s[...] = out_width(heads)

    def out_width(x):  # O^T [128, 8 or 16] -> the output's columns: 8-15 dropped, or (`sixteen_columns_out`) empty
      if x.shape[1] > out_columns:
        return x[:, :out_columns]
      if x.shape[1] < out_columns:
        return jnp.concatenate([x, jnp.zeros((HEAD_DIM, out_columns - x.shape[1]), jnp.float32)], axis=1)
      return x

    def store(o_s, ml_s):
      if token_scaled_p:
        token_scaled_output(o_s)
      elif transposed_values:  # rows back in channel order on the way out
        _store_in_channel_order(acc, o_s, values_by_ldmatrix, bits, out_columns)
      else:  # O^T's columns as the output has them (`eight_column_softmax`: 8; columns 8-15 of a wide one empty)
        o_s[...] = out_width(acc)
      ml_s[0] = wide_columns(m_run, _NEG)
      ml_s[1] = wide_columns(column_sum(l_rows), 0.0)
      plgpu.commit_smem()
      plgpu.copy_smem_to_gmem(o_s, o_g.at[pair, split])
      plgpu.copy_smem_to_gmem(ml_s.at[0], m_g.at[pair, split])
      plgpu.copy_smem_to_gmem(ml_s.at[1], l_g.at[pair, split])
      plgpu.wait_smem_to_gmem(0)
    if groups > 1:
      store(group_scratch[1].at[wg], group_scratch[2].at[wg])
    else:
      pl.run_scoped(store, smem((HEAD_DIM, out_columns), jnp.float32), smem((2, out_columns), jnp.float32))

  per_group = (groups,) if groups > 1 else ()  # leading dimension of a warpgroup's own buffers
  # V [64, 128] f16 a slot, where the values go through shared memory; V^T in registers leaves it unread, so a
  # stand-in of 1 KB: a CTA of four warpgroups 123 KB, not 184 (s36; the kernel's time the same on an H100)
  values_shape = (8, 64) if register_values else (STEP, HEAD_DIM)
  query_shape, query_row_bytes = ((COLUMNS // 2, HEAD_DIM), 2 * width) if narrow_scores else ((HEAD_DIM, COLUMNS), 32)
  p_shape, p_row_bytes = ((COLUMNS // 2, STEP), 2 * STEP) if narrow_values else ((STEP, COLUMNS), 32)
  scratch = [smem((*per_group, *query_shape), jnp.float16, query_row_bytes),
             smem((*per_group, slots, *values_shape), jnp.float16, None if register_values else 32),
             smem((*per_group, 2 if token_scaled_p or paired_steps else slots, *p_shape), jnp.float16, p_row_bytes),
             smem((max(bias_rows, 8), COLUMNS), jnp.float32),
             smem((*per_group, 2, 4), jnp.int32),  # `lagged_max`: the 4 warps' votes, two steps' slots
             plgpu.Barrier(num_arrivals=1, num_barriers=groups)]
  if groups > 1:  # range, O^T and (m, l) staging, the pipeline's buffers and barriers, a set a warpgroup
    blocks_of = lambda shape, dtype, row_bytes=None: smem((groups, stages, *shape), dtype, row_bytes)
    codes_of = lambda: blocks_of((STEP * spb, packed), jnp.uint8, packed)
    scratch += [smem((groups, *range_params.shape), jnp.int32), smem((groups, HEAD_DIM, out_columns), jnp.float32),
                smem((groups, 2, out_columns), jnp.float32),
                codes_of(), blocks_of((2 * spb, HEAD_DIM), jnp.float16),
                blocks_of((2 * spb, HEAD_DIM), jnp.float16) if dequantize_keys and not factored_keys
                else blocks_of((2 * spb, COLUMNS), jnp.float32),
                codes_of(), blocks_of((value_rows * spb, value_columns), jnp.float16),
                blocks_of((value_rows * spb, value_columns), jnp.float16),
                plgpu.Barrier(num_arrivals=6 * (2 * spb if paged else 1), num_barriers=groups * stages),
                smem((groups, REDUCTION_SCRATCH if spb == 1 else REDUCTION_SCRATCH_BLOCK2), jnp.float32)]
  if values_scaled_after:  # ones for the column sums of P, one buffer a CTA (the last scratch)
    scratch.append(smem((STEP, HEAD_DIM), jnp.float16, 32))
  return KernelPlan(
      body=kernel, operands=(range_params, qt, q_raw, k_codes, k_scale, k_bias, v_codes, v_scale, v_min),
      out_type=(jax.ShapeDtypeStruct((n, splits, HEAD_DIM, out_columns), jnp.float32),
                jax.ShapeDtypeStruct((n, splits, out_columns), jnp.float32),
                jax.ShapeDtypeStruct((n, splits, out_columns), jnp.float32)),
      grid=(n // pairs_per_cta, max(1, splits // groups)), scratch=tuple(scratch), warpgroups=groups,
      compiler_params=plgpu.CompilerParams(lowering_semantics=plgpu.LoweringSemantics.Lane,
                                           approx_math=approx_math, unsafe_no_auto_barriers=not auto_barriers),
      interpret=interpret)


MAX_BIAS_ROWS = 256  # 16 KB of shared memory a program, three programs an SM
PAGE_TABLE = 32  # `paged`: range_params' rows (its page table from row 1 on)
MAX_PAGES = 2048  # `paged`: a warpgroup holds the layer's page table, 8 KB


def in_kernel_bias_rows(windows: int, splits: int, steps_per_block: int = 1) -> int:
  """Rows of a program's bias buffer with `bias_in_kernel`: its windows (of at most `windows`), in chunks of
  64."""
  ceil = lambda a, b: -(-a // b)
  per_split = ceil(ceil(ceil(windows, 2), steps_per_block), splits)  # blocks
  return ceil(2 * steps_per_block * per_split, STEP) * STEP


def merge(o_t, m, l, groups: int) -> jax.Array:
  """Partials of `int2_decode` -> attention output [N, G, H] (f32): splits and window parities merged."""
  n, splits, h, columns = o_t.shape
  parts = splits * columns // (COLUMNS // 2)  # a split's window parities (one where the heads are 8 columns)
  o = jnp.swapaxes(o_t, 2, 3).reshape(n, parts, COLUMNS // 2, h)
  m = m.reshape(n, parts, COLUMNS // 2)
  l = l.reshape(n, parts, COLUMNS // 2)
  top = m.max(axis=1, keepdims=True)
  w = jnp.exp2(m - top)
  out = (o * w[..., None]).sum(axis=1) / (l * w).sum(axis=1)[..., None]
  return out[:, :groups]


def reference(q, k_codes, k_scale, k_min, v_codes, v_scale, v_min) -> np.ndarray:
  """Dequantize, then attend (numpy, float64): q [N, G, H] base-2 scores -> [N, G, H]."""
  def values(codes, scale, minimum):
    codes = np.asarray(codes)
    bits = codes.shape[-1] * 8 // HEAD_DIM
    unpacked = np.concatenate([(codes >> (bits * p)) & ((1 << bits) - 1) for p in range(8 // bits)],
                              axis=-1).astype(np.float64)
    if np.shape(scale)[1] == codes.shape[1]:  # `values_per_token`: a token's groups of 32 channels
      per_token = lambda x: np.repeat(np.asarray(x, np.float64), HEAD_DIM // np.shape(x)[2], axis=2)
    else:  # a window's channels
      per_token = lambda x: np.repeat(np.asarray(x, np.float64), WINDOW, axis=1)
    return unpacked * per_token(scale) + per_token(minimum)
  k = values(k_codes, k_scale, k_min)
  v = values(v_codes, v_scale, v_min)
  s = np.einsum("ngh,nth->ngt", np.asarray(q, np.float64), k)
  p = np.exp2(s - s.max(axis=-1, keepdims=True))
  return np.einsum("ngt,nth->ngh", p / p.sum(axis=-1, keepdims=True), v)


def range_partials(q, k_codes, k_scale, k_min, v_codes, v_scale, v_min, first, count, *, windows: int,
                   splits: int, interpret=None, **options):
  """Partials (`int2_decode`'s o_t, m, l) over windows first ... first + count - 1 of a pool (a layer's range
  in a cache shared by layers; first and count data, `windows` >= count static, the bias's size): the
  splits share ceil(count / 2) steps, whatever the bound."""
  args, options = _range_arguments(q, k_codes, k_scale, k_min, v_codes, v_scale, v_min, first, count,
                                   windows=windows, splits=splits, interpret=interpret, **options)
  return int2_decode(*args, **options)


def range_plan(q, k_codes, k_scale, k_min, v_codes, v_scale, v_min, first, count, *, windows: int, splits: int,
               interpret=None, **options) -> KernelPlan:
  """`range_partials`' kernel as a `KernelPlan`, for `launch_together`."""
  args, options = _range_arguments(q, k_codes, k_scale, k_min, v_codes, v_scale, v_min, first, count,
                                   windows=windows, splits=splits, interpret=interpret, **options)
  return kernel_plan(*args, **options)


def _range_arguments(q, k_codes, k_scale, k_min, v_codes, v_scale, v_min, first, count, *, windows: int,
                     splits: int, interpret=None, **options) -> tuple[tuple, dict]:
  """`kernel_plan`'s arguments and options for a range of a pool (`range_partials`)."""
  first = jnp.asarray(first, jnp.int32)
  spb = options.get("steps_per_block", 1)
  if options.get("bias_in_kernel") and in_kernel_bias_rows(windows, splits, spb) > MAX_BIAS_ROWS:
    options = dict(options, bias_in_kernel=False)  # too many windows a split to hold their biases
  if options.get("factored_keys"):  # the minimums (and the keys' magic numbers) as a bias a window
    magic = factored_magic(interpret, options.get("fast_unpack", True))
    bias, bias_row = range_bias(q, k_min, first, count, windows, spb, k_scale=k_scale, magic=magic)
  elif options.get("dequantize_keys"):  # the kernel reads the minimums at the range's windows
    bias, bias_row = k_min, jnp.int32(0)
  elif options.get("bias_in_kernel"):
    bias, bias_row, options = k_min, jnp.int32(0), dict(options, max_windows=windows)
  else:
    bias, bias_row = range_bias(q, k_min, first, count, windows, spb)
  params = jnp.zeros((32,), jnp.int32).at[:3].set(jnp.stack([first, jnp.asarray(count, jnp.int32), bias_row]))
  return ((q, k_codes, k_scale, bias, v_codes, v_scale, v_min),
          dict(options, splits=splits, interpret=interpret, range_params=params))


def heap_views(heap, bits: int):
  """Ablation C's heap of a layer's records, uint16 [B, K, U] (`wq_jax.interleaved`), as `paged` reads it (no
  copy): codes as rows of a token's code bytes [B*K, 2U / (H b / 8), H b / 8] uint8, and scales and minimums as
  rows of H f16 [B*K, U / H, H]."""
  b, k, units = heap.shape
  packed = HEAD_DIM * bits // 8
  as_bytes = lax.bitcast_convert_type(heap, jnp.uint8).reshape(b * k, 2 * units // packed, packed)
  return as_bytes, lax.bitcast_convert_type(heap, jnp.float16).reshape(b * k, units // HEAD_DIM, HEAD_DIM)


def paged_partials(q, k_heap, v_heap, page_table, first, count, *, bits: int, splits: int, interpret=None,
                   **options):
  """Partials (`int2_decode`'s o_t, m, l) over entries first ... first + count - 1 of a layer's page table
  (`format_starts` [W], int32: records of `bits` bits in ablation C's heaps, uint16 [B, K, U]), each window read
  where its record lies (`paged`); first and count data (the splits' trip counts follow count, as a range's)."""
  return launch(paged_plan(q, k_heap, v_heap, page_table, first, count, bits=bits, splits=splits,
                           interpret=interpret, **options))


def paged_plan(q, k_heap, v_heap, page_table, first, count, *, bits: int, splits: int, interpret=None,
               **options) -> KernelPlan:
  """`paged_partials`' kernel as a `KernelPlan`, for `launch_together`."""
  options = unfactored(options)  # (the paged kernel's keys carry their scales)
  pages = page_table.shape[0]
  if pages > MAX_PAGES:
    raise ValueError(f"paged: a page table of at most {MAX_PAGES} windows a layer, got {pages}")
  params = jnp.zeros((PAGE_TABLE,), jnp.int32).at[:2].set(jnp.stack([jnp.asarray(first, jnp.int32),
                                                                    jnp.asarray(count, jnp.int32)]))
  pad = -pages % PAGE_TABLE  # whole rows
  params = jnp.concatenate([params, page_table.astype(jnp.int32), jnp.zeros((pad,), jnp.int32)])
  params = params.reshape(-1, PAGE_TABLE)
  kc, km = heap_views(k_heap, bits)
  vc, vm = heap_views(v_heap, bits)
  return kernel_plan(q, kc, km, km, vc, vm, vm, splits=splits, interpret=interpret, range_params=params, paged=True,
                     **options)


def unfactored(options: dict) -> dict:
  """Options without `factored_keys`, the score wgmma back to 8 columns (`narrow_scores`) where they set it 16:
  what launches the factored form does not serve take."""
  if not options.get("factored_keys"):
    return options
  options = {k: v for k, v in options.items() if k != "factored_keys"}
  return dict(options, narrow_scores=True) if options.get("eight_column_softmax") else options


def pool_partials(q, k_codes, k_scale, k_min, v_codes, v_scale, v_min, *, splits: int, interpret=None,
                  **options):
  """`int2_decode`'s partials over one whole pool, given its key minimums: the bias computed where the
  options need one. Splits that do not divide the pool's steps read it as a range (the last split's
  surplus windows masked)."""
  windows = k_codes.shape[1] // WINDOW
  if k_codes.shape[1] % (STEP * options.get("steps_per_block", 1) * splits):
    return range_partials(q, k_codes, k_scale, k_min, v_codes, v_scale, v_min, 0, windows, windows=windows,
                          splits=splits, interpret=interpret, **options)
  own_minimums = options.get("bias_in_kernel") or options.get("dequantize_keys")
  bias = k_min if own_minimums else key_bias(q, k_min)
  return int2_decode(q, k_codes, k_scale, bias, v_codes, v_scale, v_min, splits=splits, interpret=interpret,
                     **options)


@functools.partial(jax.jit, static_argnames=("splits", "interpret", "options"))
def attend(q, k_codes, k_scale, k_min, v_codes, v_scale, v_min, *, splits: int, interpret=None, options=()):
  """q [N, G, H] -> [N, G, H] f32 over one pool: `pool_partials`, then the merge. `options`: (name, value)
  pairs of `int2_decode`'s keywords."""
  o_t, m, l = pool_partials(q, k_codes, k_scale, k_min, v_codes, v_scale, v_min, splits=splits,
                            interpret=interpret, **dict(options))
  return merge(o_t, m, l, q.shape[1])


# s25's large-batch kernel: four warpgroups a CTA, the keys dequantized in registers, the lagged maximum, O^T in
# place, magic exponents and ex2.approx.ftz; the variants from session 25 on add to it.
_LARGE_BATCH = dict(overlap_values=False, warpgroups=4, dequantize_keys=True, lagged_max=True, in_place_values=True,
                    magic_exponents=True, approx_math=True)

# Named variants of `int2_decode`'s options, as the benchmarks time them (results/decode_attention_notes.md).
# s47's default INT2 kernel (both wgmmas narrow, each group's copies by its warp g % 4), and s48's (V's codes by
# ldmatrix too): the bases of the s48 variants
_SPREAD = dict(_LARGE_BATCH, values_in_registers=True, permuted_keys=True, fetch_by_one_warp=True, folded_minimums=True,
               eight_column_softmax=True, narrow_scores=True, narrow_values=True, fetch_warp_by_group=True)
_SPREAD_VLDSM = dict(_SPREAD, values_by_ldmatrix=True)

VARIANTS = {  # name: keyword arguments of int2_decode
    "plain": dict(fast_unpack=False, ptx_fma=False, auto_barriers=True),  # Mosaic's own conversions
    "run3": dict(ptx_fma=False, auto_barriers=True),  # run 3's kernel
    "ptx_fma": dict(auto_barriers=True),
    "fast": dict(),  # the default: inline PTX for the unpacking and the values' fma, no automatic barriers
    "fast_s3": dict(stages=3),
    "magic": dict(magic_exponents=True),  # per-part magic exponents: no 4^-p anywhere (untimed, s20)
    "values_first": dict(overlap_values=False),  # fewer live registers, no overlap (untimed, s20)
    "magic_values_first": dict(magic_exponents=True, overlap_values=False),
    "deferred": dict(defer_values_wgmma=True),  # the V wgmma waited for in the next step (fastest, s21)
    "deferred_values_first": dict(defer_values_wgmma=True, overlap_values=False),  # the two best of s21
    # that, with the minimums' biases computed in the kernel before its loop (untimed)
    "deferred_values_first_bias": dict(defer_values_wgmma=True, overlap_values=False, bias_in_kernel=True),
    # two steps a pipeline iteration (static V/P slots; one TMA issue and barrier wait for both; untimed)
    "deferred_values_first_block2": dict(defer_values_wgmma=True, overlap_values=False, steps_per_block=2),
    "deferred_values_first_block2_bias": dict(defer_values_wgmma=True, overlap_values=False, steps_per_block=2,
                                              bias_in_kernel=True),
    # the keys dequantized in registers as the values are: no bias, q^T stored once (untimed)
    "dequantized_keys": dict(overlap_values=False, dequantize_keys=True),
    "deferred_dequantized_keys": dict(defer_values_wgmma=True, overlap_values=False, dequantize_keys=True),
    # P against the maximum agreed so far: one barrier a step (8-10 % faster, session 23)
    "deferred_values_first_lagged": dict(defer_values_wgmma=True, overlap_values=False, lagged_max=True),
    "deferred_dequantized_keys_lagged": dict(defer_values_wgmma=True, overlap_values=False, dequantize_keys=True,
                                             lagged_max=True),
    # four programs a CTA of 512 threads: ptxas must fit 128 registers, 4 programs an SM (splits must be a
    # multiple of 4; wrong on the H200 in session 22, `mosaic_int2_races_wg4_s22.json`, until `_column_reduce`)
    "values_first_wg4": dict(overlap_values=False, warpgroups=4),
    "values_first_wg4_block2": dict(overlap_values=False, warpgroups=4, steps_per_block=2),
    # with the keys dequantized and the lagged maximum: the fastest at batch 32, and the default's at large
    # batches (`quantized_decode.LARGE_BATCH_MOSAIC`; session 23)
    "values_first_wg4_keys_lagged": dict(overlap_values=False, warpgroups=4, dequantize_keys=True, lagged_max=True),
    # that, launched under PDL (`grid_dependency_wait`; untimed)
    "values_first_wg4_keys_lagged_pdl": dict(overlap_values=False, warpgroups=4, dequantize_keys=True,
                                             lagged_max=True, grid_dependency_wait=True),
    # the values' codes through the V wgmma as they are, the step's product scaled after it (slower, s24)
    "values_first_wg4_keys_lagged_after": dict(overlap_values=False, warpgroups=4, dequantize_keys=True,
                                               lagged_max=True, values_scaled_after=True),
    "values_first_wg4_lagged_after": dict(overlap_values=False, warpgroups=4, lagged_max=True,
                                          values_scaled_after=True),
    "dequantized_keys_lagged_after": dict(overlap_values=False, dequantize_keys=True, lagged_max=True,
                                          values_scaled_after=True),
    # O^T accumulated in place, rescaled only on a vote, the V wgmma waited for in the next step; and/or magic
    # exponents (no 4^-p on the scales): 3 / 3.5 / 5 % faster at batch 32-60 (s25, `mosaic_int2_s25_lop3_h200.md`)
    "values_first_wg4_keys_lagged_in_place": dict(overlap_values=False, warpgroups=4, dequantize_keys=True,
                                                  lagged_max=True, in_place_values=True),
    "values_first_wg4_keys_lagged_magic": dict(overlap_values=False, warpgroups=4, dequantize_keys=True,
                                               lagged_max=True, magic_exponents=True),
    "values_first_wg4_keys_lagged_in_place_magic": dict(overlap_values=False, warpgroups=4, dequantize_keys=True,
                                                        lagged_max=True, in_place_values=True, magic_exponents=True),
    "deferred_dequantized_keys_lagged_magic": dict(defer_values_wgmma=True, overlap_values=False,
                                                   dequantize_keys=True, lagged_max=True, magic_exponents=True),
    # scales and minimums by ldmatrix: no faster (s25)
    "values_first_wg4_keys_lagged_ldsm": dict(overlap_values=False, warpgroups=4, dequantize_keys=True,
                                              lagged_max=True, ldmatrix_metadata=True),
    "values_first_wg4_keys_lagged_all": dict(overlap_values=False, warpgroups=4, dequantize_keys=True, lagged_max=True,
                                             in_place_values=True, magic_exponents=True, ldmatrix_metadata=True),
    "deferred_dequantized_keys_lagged_magic_ldsm": dict(defer_values_wgmma=True, overlap_values=False,
                                                        dequantize_keys=True, lagged_max=True, magic_exponents=True,
                                                        ldmatrix_metadata=True),
    # The large-batch default's kernel (in place, magic exponents), with ex2.approx.ftz for every exp2 (Mosaic's
    # approx_math; the plain exp2 takes a compare and two predicated multiplies around each MUFU.EX2), and
    # that with two 64-token steps a pipeline iteration (one TMA issue of 6 copies, ~100 SASS a warp, for both)
    "wg4_large_batch_ftz": _LARGE_BATCH,
    "wg4_large_batch_ftz_block2": dict(_LARGE_BATCH, steps_per_block=2),
    # that, with V^T as the V wgmma's register operand (no V in shared memory), dequantized after the score
    # wgmma is waited for (16 % faster, s26: the large-batch default), or while it runs (13 %)
    "wg4_large_batch_ftz_vregs": dict(_LARGE_BATCH, values_in_registers=True),
    "wg4_large_batch_ftz_vregs_overlap": dict(_LARGE_BATCH, values_in_registers=True, overlap_values=True),
    # that, with a block's copies issued by one warp of the four (untimed)
    "wg4_large_batch_ftz_vregs_one_warp_fetch": dict(_LARGE_BATCH, values_in_registers=True, fetch_by_one_warp=True),
    # that, with the keys' channels permuted (and q^T's): a thread's code bytes and scales by 8- and 16-byte loads
    # (untimed); and both untimed changes together
    "wg4_large_batch_ftz_vregs_permuted_keys": dict(_LARGE_BATCH, values_in_registers=True, permuted_keys=True),
    "wg4_large_batch_ftz_vregs_permuted_keys_one_warp_fetch": dict(
        _LARGE_BATCH, values_in_registers=True, permuted_keys=True, fetch_by_one_warp=True),
    # that, with the scales and minimums in `thread_order`: the keys' 4 pairs of a part by one 16-byte load
    # (untimed; the caller's metadata must be in that order)
    "wg4_large_batch_ftz_vregs_thread_order": dict(_LARGE_BATCH, values_in_registers=True,
                                                   metadata_in_thread_order=True),
    # the lean kernel (s28's INT2 winner), its minimums folded: no subtraction a pair of codes (untimed)
    "wg4_large_batch_ftz_lean_folded": dict(_LARGE_BATCH, values_in_registers=True, permuted_keys=True,
                                            fetch_by_one_warp=True, folded_minimums=True),
    # that, its softmax on 8 columns for both windows (`eight_column_softmax`; the large-batch default since s32)
    "wg4_large_batch_ftz_lean_folded_eight": dict(_LARGE_BATCH, values_in_registers=True, permuted_keys=True,
                                                  fetch_by_one_warp=True, folded_minimums=True,
                                                  eight_column_softmax=True),
    # that, V's codes by two `ldmatrix.trans` a thread and step, a thread's rows two parts of two bytes
    # (`values_by_ldmatrix`; < 1 % faster on an H100, s35; untimed on an H200)
    "wg4_large_batch_ftz_lean_folded_eight_vldsm": dict(_LARGE_BATCH, values_in_registers=True, permuted_keys=True,
                                                        fetch_by_one_warp=True, folded_minimums=True,
                                                        eight_column_softmax=True, values_by_ldmatrix=True),
    # lean_folded_eight, a block of two steps under one softmax (`paired_steps`: one vote, one barrier and one
    # branch a 128 keys; offline 793 SASS in the main loop a 128 keys against 2 x 459, no spills, s38; executed on an
    # H100 its hot loop is 691 a 128 keys against 2 x 333, and it is no faster, s39)
    "wg4_large_batch_ftz_lean_folded_eight_paired": dict(_LARGE_BATCH, values_in_registers=True, permuted_keys=True,
                                                         fetch_by_one_warp=True, folded_minimums=True,
                                                         eight_column_softmax=True, steps_per_block=2,
                                                         paired_steps=True),
    # lean_folded_eight with the score wgmma 8 columns wide (`narrow_scores`, s39; H100: 110.3 / 213.1 µs at batch
    # 32 / 60 x 19,968 against 109.4 / 213.5)
    "wg4_large_batch_ftz_lean_folded_eight_narrow": dict(_LARGE_BATCH, values_in_registers=True, permuted_keys=True,
                                                         fetch_by_one_warp=True, folded_minimums=True,
                                                         eight_column_softmax=True, narrow_scores=True),
    # that, the V wgmma 8 wide too (`narrow_values`: P^T K-major, O^T's accumulator [128, 8]; s39; H100: 107.5 /
    # 206.7 µs against 108.6 / 209.5, `mosaic_int2_s39_overlapped_h100.md`)
    "wg4_large_batch_ftz_lean_folded_eight_narrow_both": dict(_LARGE_BATCH, values_in_registers=True,
                                                              permuted_keys=True, fetch_by_one_warp=True,
                                                              folded_minimums=True, eight_column_softmax=True,
                                                              narrow_scores=True, narrow_values=True),
    # (s45) the default's kernel (narrow_both) with 3 and 4 pipeline stages: more code bytes in flight a warpgroup
    # (two stages keep ~24 KB in flight an SM, ~3 MB over 132 SMs: Little's law at ~1 us of loaded latency gives the
    # ~2.4 TB/s this kernel streams on both cards). Slower on an H100 in s36 (the lean_eight kernel, 4 % at 3-4
    # stages; s45, this kernel: 0.7-3.8 %), where the kernel already streams 80 % of the copy; untimed on an H200,
    # where it streams 57 %.
    "wg4_large_batch_ftz_lean_folded_eight_narrow_both_s3": dict(
        _LARGE_BATCH, values_in_registers=True, permuted_keys=True, fetch_by_one_warp=True, folded_minimums=True,
        eight_column_softmax=True, narrow_scores=True, narrow_values=True, stages=3),
    "wg4_large_batch_ftz_lean_folded_eight_narrow_both_s4": dict(
        _LARGE_BATCH, values_in_registers=True, permuted_keys=True, fetch_by_one_warp=True, folded_minimums=True,
        eight_column_softmax=True, narrow_scores=True, narrow_values=True, stages=4),
    # (s46) s46's default with each warpgroup's copies issued by its warp g % 4 (`fetch_warp_by_group`): one
    # group's copy set-up a scheduler, where scheduler 0 issued all four groups'; the default's INT2 kernel in s47
    "wg4_large_batch_ftz_lean_folded_eight_narrow_both_spread": _SPREAD,
    # (s48) that with the minimums folded before the kernel (`prefolded_minimums`, `fold_minimums`): 24 fewer f16x2
    # fmas a thread and step, what a cache storing folded minimums would run (correct; no faster on half an H100's
    # SMs, where the SMs bound the kernel as on an H200)
    "wg4_large_batch_ftz_lean_folded_eight_narrow_both_spread_prefolded": dict(_SPREAD, prefolded_minimums=True),
    # (s48) that with each part of the keys unpacked just before its score wgmma (`interleaved_key_parts`; slower)
    "wg4_large_batch_ftz_lean_folded_eight_narrow_both_spread_interleaved": dict(_SPREAD, interleaved_key_parts=True),
    "wg4_large_batch_ftz_lean_folded_eight_narrow_both_spread_interleaved_prefolded": dict(
        _SPREAD, interleaved_key_parts=True, prefolded_minimums=True),
    # (s48) that with V's codes by ldmatrix.trans (`values_by_ldmatrix`, s35's, now with both wgmmas narrow): the
    # default's INT2 kernel since s48 (6 % faster on half an H100's SMs, 5 % on the full machine)
    "wg4_large_batch_ftz_lean_folded_eight_narrow_both_spread_vldsm": _SPREAD_VLDSM,
    # (s48) that with five warpgroups a CTA (96 registers a thread offline, 16 bytes of spills; no faster on half an
    # H100's SMs; s39's five were slower on a full H100)
    "wg5_large_batch_ftz_lean_folded_eight_narrow_both_spread_vldsm": dict(_SPREAD_VLDSM, warpgroups=5),
    # (s48) that, a block's two steps under one softmax (`paired_steps`, s38's; 2 % faster on half an H100's SMs,
    # not on the full machine)
    "wg4_large_batch_ftz_lean_folded_eight_narrow_both_spread_vldsm_paired": dict(
        _SPREAD_VLDSM, steps_per_block=2, paired_steps=True),
    # (s46) diagnostics, wrong by design (`knockout`): the default's kernel with the keys', the values' or both
    # register operands constant, every byte still moved by TMA: what the conversions cost on a card
    **{f"wg4_large_batch_ftz_lean_folded_eight_narrow_both_ko_{what}": dict(
        _LARGE_BATCH, values_in_registers=True, permuted_keys=True, fetch_by_one_warp=True, folded_minimums=True,
        eight_column_softmax=True, narrow_scores=True, narrow_values=True, knockout=what)
       for what in ("keys", "values", "both")},
    # (s48) the same diagnostics on the default (spread copies), and the scales' and minimums' loads cut instead
    **{f"wg4_large_batch_ftz_lean_folded_eight_narrow_both_spread_ko_{what}": dict(_SPREAD, knockout=what)
       for what in KNOCKOUTS[1:7]},
    # (s49) the factored form (`factored_keys`): keys as magic + code, q^T times a step's scales, the wide score wgmma
    "wg4_large_batch_ftz_lean_folded_eight_narrow_both_spread_vldsm_factored": dict(
        _SPREAD_VLDSM, narrow_scores=False, factored_keys=True),
    # (s49) the default's (V by ldmatrix) with each of those, and with the keys', the values' or both operands as
    # magic + code alone (no scale, minimum or their loads): what a factored form would leave of the conversions
    **{f"wg4_large_batch_ftz_lean_folded_eight_narrow_both_spread_vldsm_ko_{what}": dict(_SPREAD_VLDSM, knockout=what)
       for what in KNOCKOUTS[1:]},
    # lean_folded_eight with five and six warpgroups a CTA (s39): more warps a scheduler to hide the step's chain
    # (the wgmma waits, s36's ncu), at 96 and 80 registers a thread (offline: 48 and 128 bytes of spills, main
    # loop 497 and 539 SASS against 459). Slower on an H100, batch 32 x 19,200: 124.7 and 160.2 µs against 105.7
    # (`mosaic_int2_s39_wg_h100.md`)
    "wg5_large_batch_ftz_lean_folded_eight": dict(_LARGE_BATCH, values_in_registers=True, permuted_keys=True,
                                                  fetch_by_one_warp=True, folded_minimums=True,
                                                  eight_column_softmax=True, warpgroups=5),
    "wg6_large_batch_ftz_lean_folded_eight": dict(_LARGE_BATCH, values_in_registers=True, permuted_keys=True,
                                                  fetch_by_one_warp=True, folded_minimums=True,
                                                  eight_column_softmax=True, warpgroups=6),
    # INT4 pools as the large-batch configurations take them (`quantized_decode.pool_options`: no permuted keys),
    # and that with V's codes by `ldmatrix.trans` (s35)
    "wg4_large_batch_ftz_int4_eight": dict(_LARGE_BATCH, values_in_registers=True, fetch_by_one_warp=True,
                                           folded_minimums=True, eight_column_softmax=True),
    "wg4_large_batch_ftz_int4_eight_vldsm": dict(_LARGE_BATCH, values_in_registers=True, fetch_by_one_warp=True,
                                                 folded_minimums=True, eight_column_softmax=True,
                                                 values_by_ldmatrix=True),
    # INT4's kernel (V^T, copies by one warp; no permuted keys), its values folded alike
    "wg4_large_batch_ftz_vregs_one_warp_fetch_folded": dict(_LARGE_BATCH, values_in_registers=True,
                                                            fetch_by_one_warp=True, folded_minimums=True),
    # and INT4's keys permuted as INT2's (`key_order`: a thread's 16 code bytes a row by one 16-byte load; untimed)
    "wg4_large_batch_ftz_int4_lean": dict(_LARGE_BATCH, values_in_registers=True, permuted_keys=True,
                                          fetch_by_one_warp=True),
    "wg4_large_batch_ftz_int4_lean_folded": dict(_LARGE_BATCH, values_in_registers=True, permuted_keys=True,
                                                 fetch_by_one_warp=True, folded_minimums=True),
    # s25's kernel with KIVI's values (a scale and minimum a token and group of 32 channels; through shared memory:
    # `values_per_token`; untimed, s27): what serves kivi2 and kivi4 at large batches
    "wg4_large_batch_ftz_kivi": dict(_LARGE_BATCH, values_per_token=True),
    # that, with a block's copies issued by one warp, and with the keys' channels permuted too (s28)
    "wg4_large_batch_ftz_kivi_one_warp_fetch": dict(_LARGE_BATCH, values_per_token=True, fetch_by_one_warp=True),
    "wg4_large_batch_ftz_kivi_lean": dict(_LARGE_BATCH, values_per_token=True, permuted_keys=True,
                                          fetch_by_one_warp=True),
    # that, its permuted keys folded: ptxas spills 4 bytes and the main loop stays at 593 SASS offline (s30), so
    # KIVI's pools take no folded minimums (`quantized_decode.pool_options`)
    "wg4_large_batch_ftz_kivi_lean_folded": dict(_LARGE_BATCH, values_per_token=True, permuted_keys=True,
                                                 fetch_by_one_warp=True, folded_minimums=True),
    # the large-batch default's kernel as KIVI's pools take it (`quantized_decode.pool_options`: values per token
    # through shared memory, no folded minimums), and that with the V wgmma on the exact codes against P times each
    # token's scale (`token_scaled_p`: KIVI's values from registers; 13 % faster on an H100, s37)
    "wg4_large_batch_ftz_kivi_eight": dict(_LARGE_BATCH, values_per_token=True, permuted_keys=True,
                                           fetch_by_one_warp=True, eight_column_softmax=True),
    "wg4_large_batch_ftz_kivi_eight_scaled_p": dict(_LARGE_BATCH, values_per_token=True, permuted_keys=True,
                                                    fetch_by_one_warp=True, eight_column_softmax=True,
                                                    token_scaled_p=True),
    # that, its score wgmma 8 columns wide (`narrow_scores`, as KIVI's INT2 pools take it with
    # `quantized_decode.DecodeConfig.kivi_narrow_scores`; s45, untimed)
    "wg4_large_batch_ftz_kivi_eight_scaled_p_narrow": dict(_LARGE_BATCH, values_per_token=True, permuted_keys=True,
                                                           fetch_by_one_warp=True, eight_column_softmax=True,
                                                           token_scaled_p=True, narrow_scores=True),
    # s25's kernel with three pipeline slots where two were (another 24 KB a CTA: 208 KB; no faster, s26)
    "wg4_large_batch_ftz_s3": dict(_LARGE_BATCH, stages=3),
    # s25's kernel with the scales and minimums in `thread_order`: a part's 4 pairs by one 16-byte load (no
    # faster, s26; the caller's metadata must be in that order: `thread_order`)
    "wg4_large_batch_ftz_thread_order": dict(_LARGE_BATCH, metadata_in_thread_order=True),
    "by_part": dict(values_by_part=True),  # the values stored a part at a time (untimed, s20)
    "keys_smem": dict(keys_in_smem=True, values_by_part=True),  # keys through shared memory too (untimed)
}
