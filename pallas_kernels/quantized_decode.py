"""Split-K flash decoding over one layer of the three-pool KV cache (Pallas, Triton lowering).

Axes: B batch, K KV heads, G query heads per KV head (padded to Gp >= 16, the
smallest tensor-core tile), H head dim, S window size, W windows in a pool,
T tokens, R rest tokens, J splits of the key axis, C channels per value group,
P codes a byte, E chunk width (channels), n = H/E chunks.

The layout, as arrays (wq_jax.cache builds it):
    pool data     [B, K, W*S, H] high precision, or uint8 codes [B, K, W*S, H/P]
                  packed "split" style: byte j holds channels j, j + H/P, ...
    scale, zero   [B, K, W, H]: one pair per window and channel, or, for values
                  grouped per token (KIVI), [B, K, W*S, H/C]
    ranges        the layer owns windows [offset[p], offset[p] + count[p]) of pool p
    rest          [B, K, R, H]; request b has rest_len[b] valid tokens

One program serves one (request, KV head, split) and all G query heads of that
KV head. It streams its share of every segment once, in two online softmaxes:
the high-precision segments, then the quantized ones (two small states keep
few registers alive; the combine step merges them like two more splits).

Quantized codes are unpacked in registers, chunk by chunk (a chunk is E
channels: one shift and mask of a block of bytes, loaded through a ref), and
the n chunks are interleaved with two-way stacks (Triton's join: no data moves
between threads) into one [tokens, H] tile whose column j*n + c is channel
c*E + j. q, scales and zeros are brought into that order with a reshape and a
transpose; the output goes back the same way. In bf16 a code becomes a float
with one OR: code | 0x4300 is the bf16 number 128 + code, and the 128 joins the
zero-point. Two ways to use the tile (DecodeConfig.factored):
  factored   one window a step, in the factored form of SPEC §3:
                 q . k_hat = sum_c (q_c s_c) x_c - sum_c (q_c s_c) z_c   (scales folded into q)
                 sum_t p_t v_hat_tc = s_c (sum_t p_t x_tc - z_c sum_t p_t)   (scales after P.V)
             so codes meet the tensor cores with no arithmetic but the OR;
  tiled      `tile_windows` windows a step, dequantized in registers (one FMA
             per value with the window's scale), then the same two dots and one
             softmax update as a high-precision step: fewer, larger steps.
Every array is passed whole, as rows, and all sizes (tokens a pool holds, rest
capacity, split count) are data, so the compiled kernel depends on head shapes
only and one compilation serves every batch and video length.

Three layers: `_kernel` over refs, `quantized_decode` (the pallas_call with its
grid and BlockSpecs, and the combine), and `reference` (pure jnp, the factored
form, no tiling). A Mosaic GPU version would be one more module with the same
signature, registered under another name.
"""
from __future__ import annotations

import dataclasses
import functools
import itertools
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu
from jaxtyping import Array, Float, Int

_NEG = -1e30  # the running max starts finite, so exp(m_old - m_new) is never inf - inf
_BF16_MAGIC = 0x4300  # bf16 bits of 128.0: OR-ing a code c < 128 into them gives 128 + c exactly
_SPLITS, _TOKENS, _REST_CAPACITY = 0, 1, 4  # entries of the int32 `sizes` operand (pool p at _TOKENS + p)


@functools.partial(jax.tree_util.register_dataclass, data_fields=["data", "scale", "zero"],
                   meta_fields=["bits", "channel_group"])
@dataclasses.dataclass(frozen=True)
class PoolArrays:
  """One pool of the cache, for keys or values (the fields of wq_jax.cache.Pool)."""
  data: jax.Array  # [B, K, W*S, H] values, or [B, K, W*S, H/P] uint8 codes
  scale: jax.Array | None  # [B, K, W, H], or [B, K, W*S, H/C] with channel_group C
  zero: jax.Array | None
  bits: int
  channel_group: int = 0


@dataclasses.dataclass(frozen=True)
class DecodeConfig:
  """Tiling knobs; the defaults were chosen on an H200 (benchmarks/decode_attention.py)."""
  factored: bool = False  # quantized windows one at a time in the factored form, else tiled
  tile_windows: int = 4  # tiled: quantized windows a loop step reads
  dense_tokens: int = 64  # high-precision and rest tokens a loop step reads
  target_programs: int = 528  # grid size to aim for (4 per multiprocessor on an H200)
  min_tokens_per_split: int = 128
  num_warps: int = 8
  num_stages: int = 3
  magic_convert: bool = True  # bf16 codes by OR-ing into 128.0, else a plain conversion


@dataclasses.dataclass(frozen=True)
class _Segment:
  """What the kernel knows statically about one pool."""
  index: int  # pool position in `offsets` / `counts`
  bits: int
  value_group: int  # C, or 0: value scales per window and channel
  block: int  # a step: tokens of a high-precision pool, windows of a quantized one


# ----------------------------------------------------------------------------- kernel


def _online_softmax(m, l, s):
  """Folds scores [Gp, n] into the running max and sum; returns them, the rescale and p."""
  m_new = jnp.maximum(m, jnp.max(s, axis=1))
  corr = jnp.exp(m - m_new)
  p = jnp.exp(s - m_new[:, None])
  return m_new, l * corr + jnp.sum(p, axis=1), corr, p


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


def _dense_segment(state, q, k_ref, v_ref, base, size, t_lo, t_hi, *, block, split, num_splits):
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
    m, l, corr, p = _online_softmax(m, l, s)
    return m, l, acc * corr[:, None] + _dot(p.astype(dtype), v_ref[rows, :])

  return lax.fori_loop(lo, hi, step, state)


# -- quantized tiles


def _chunks(bits: int, num_chunks: int):
  """(byte block, shift, chunk) for each chunk of a packed row: chunk c is channels [cE, (c+1)E)."""
  per_byte = 8 // bits
  blocks = num_chunks // per_byte  # byte blocks of E columns in a row of H/P bytes
  return [(blk, part * bits, part * blocks + blk) for blk in range(blocks) for part in range(per_byte)]


def _interleave(parts):
  """n (a power of two) tiles [M, E] -> [M, n*E] whose column j*n + c is column j of parts[c]."""
  while len(parts) > 1:
    half = len(parts) // 2
    parts = [jnp.stack([parts[i], parts[i + half]], axis=-1) for i in range(half)]
  x = parts[0]
  return x.reshape(x.shape[0], -1)


def _to_interleaved(x, chunk: int):
  """[M, H] in channel order -> interleaved order (column j*n + c holds channel c*E + j)."""
  m, h = x.shape
  return x.reshape(m, h // chunk, chunk).transpose(0, 2, 1).reshape(m, h)


def _from_interleaved(x, chunk: int):
  """The inverse of `_to_interleaved`."""
  m, h = x.shape
  return x.reshape(m, chunk, h // chunk).transpose(0, 2, 1).reshape(m, h)


def _codes_as_float(codes, shift: int, bits: int, dtype, magic: bool):
  """One chunk of codes (bits at `shift` of each byte) as `dtype`, and the offset they carry."""
  mask = (1 << bits) - 1
  if magic and dtype == jnp.bfloat16:
    wide = codes.astype(jnp.uint16)
    bits16 = ((wide >> jnp.uint16(shift)) & jnp.uint16(mask)) | jnp.uint16(_BF16_MAGIC)
    return lax.bitcast_convert_type(bits16, jnp.bfloat16), 128.0
  return ((codes >> jnp.uint8(shift)) & jnp.uint8(mask)).astype(dtype), 0.0


def _unpacked(ref, rows, *, bits, head_dim, chunk, dtype, magic):
  """Codes of `rows` as an interleaved float tile [M, H] (offset + code), and the offset."""
  parts = [None] * (head_dim // chunk)
  for blk, shift, c in _chunks(bits, len(parts)):
    if shift == 0:  # a block of bytes holds P chunks: load it once
      codes = ref[rows, pl.ds(blk * chunk, chunk)]
    parts[c], offset = _codes_as_float(codes, shift, bits, dtype, magic)
  return _interleave(parts), offset


def _window_rows(ref, first, count, chunk):
  """Per-window scales (or zeros) of `count` windows from row `first`, interleaved, float32 [count, H]."""
  return _to_interleaved(ref[pl.ds(first, count), :].astype(jnp.float32), chunk)


def _token_groups(ref, rows, tokens, head_dim, chunk, group):
  """Per-token scales of C-channel groups [T, H/C] -> float32 [T, H] in interleaved order."""
  x = ref[rows, :].astype(jnp.float32)  # [T, H/C]
  n, groups = head_dim // chunk, head_dim // group
  if n != groups:  # a group spans n / groups chunks
    x = jnp.broadcast_to(x[:, :, None], (tokens, groups, n // groups)).reshape(tokens, n)
  return jnp.broadcast_to(x[:, None, :], (tokens, chunk, n)).reshape(tokens, head_dim)


def _tile_segment(state, qp, refs, bk, tokens, offset, count, *, seg, window, chunk, dtype, split, num_splits,
                  magic):
  """Windows [offset, offset + count) of a quantized pool, `seg.block` windows a step, dequantized."""
  k_ref, ks_ref, kz_ref, v_ref, vs_ref, vz_ref = refs
  head_dim = qp.shape[1]
  tile = seg.block
  size = tile * window
  pool_windows = tokens // window
  qd = qp.astype(dtype)
  lo, hi = _split_range(pl.cdiv(count, tile), split, num_splits)
  kw = dict(bits=seg.bits, head_dim=head_dim, chunk=chunk, dtype=dtype, magic=magic)

  def per_window(x):  # [tile, H] -> [tile * S, H]
    return jnp.broadcast_to(x[:, None, :], (tile, window, head_dim)).reshape(size, head_dim)

  def step(i, carry):
    m, l, acc = carry
    start = offset + i * tile
    first = jnp.minimum(start, pool_windows - tile)  # stay inside the pool; mask what is not ours
    win = first + lax.broadcasted_iota(jnp.int32, (1, size), 1) // window
    rows = pl.ds(bk * tokens + first * window, size)
    meta = bk * pool_windows + first
    x, off = _unpacked(k_ref, rows, **kw)
    sc = _window_rows(ks_ref, meta, tile, chunk)
    bias = -(_window_rows(kz_ref, meta, tile, chunk) + off) * sc
    k = (x.astype(jnp.float32) * per_window(sc) + per_window(bias)).astype(dtype)
    s = jnp.where((win >= start) & (win < offset + count), _dot_t(qd, k), -jnp.inf)
    m, l, corr, p = _online_softmax(m, l, s)
    x, off = _unpacked(v_ref, rows, **kw)
    if seg.value_group:
      sc = _token_groups(vs_ref, rows, size, head_dim, chunk, seg.value_group)
      bias = -(_token_groups(vz_ref, rows, size, head_dim, chunk, seg.value_group) + off) * sc
    else:
      sc = _window_rows(vs_ref, meta, tile, chunk)
      sc, bias = per_window(sc), per_window(-(_window_rows(vz_ref, meta, tile, chunk) + off) * sc)
    v = (x.astype(jnp.float32) * sc + bias).astype(dtype)
    return m, l, acc * corr[:, None] + _dot(p.astype(dtype), v)

  return lax.fori_loop(lo, hi, step, state)


def _factored_segment(state, qp, refs, bk, tokens, offset, count, *, seg, window, chunk, dtype, split,
                      num_splits, magic):
  """Windows [offset, offset + count) of a quantized pool, one a step, in the factored form."""
  k_ref, ks_ref, kz_ref, v_ref, vs_ref, vz_ref = refs
  head_dim = qp.shape[1]
  pool_windows = tokens // window
  lo, hi = _split_range(count, split, num_splits)
  kw = dict(bits=seg.bits, head_dim=head_dim, chunk=chunk, dtype=dtype, magic=magic)

  def step(i, carry):
    m, l, acc = carry
    w = offset + i
    rows = pl.ds(bk * tokens + w * window, window)
    meta = bk * pool_windows + w
    x, off = _unpacked(k_ref, rows, **kw)
    qs = (qp * _window_rows(ks_ref, meta, 1, chunk)).astype(dtype)  # [Gp, H]: scales folded into q
    bias = jnp.sum(qs.astype(jnp.float32) * (_window_rows(kz_ref, meta, 1, chunk) + off), axis=1, keepdims=True)
    m, l, corr, p = _online_softmax(m, l, _dot_t(qs, x) - bias)
    x, off = _unpacked(v_ref, rows, **kw)
    if seg.value_group:  # per-token scales fold into p; values of a group share them
      sc = _token_groups(vs_ref, rows, window, head_dim, chunk, seg.value_group)
      zs = (_token_groups(vz_ref, rows, window, head_dim, chunk, seg.value_group) + off) * sc
      # sum_t p_t s_tc (x_tc - z_tc): the scales vary along t, so they meet the codes before the dot.
      pv = _dot(p.astype(dtype), (x.astype(jnp.float32) * sc - zs).astype(dtype))
    else:
      pb = p.astype(dtype)
      p_sum = jnp.sum(pb.astype(jnp.float32), axis=1, keepdims=True)  # [Gp, 1]
      zr = _window_rows(vz_ref, meta, 1, chunk) + off
      pv = (_dot(pb, x) - p_sum * zr) * _window_rows(vs_ref, meta, 1, chunk)
    return m, l, acc * corr[:, None] + pv

  return lax.fori_loop(lo, hi, step, state)


def _kernel(offsets_ref, counts_ref, rest_len_ref, sizes_ref, q_ref, *refs, segments: tuple[_Segment, ...],
            kv_heads, group, window, chunk, rest_block, cfg: DecodeConfig):
  """One (request, KV head, split): its share of every segment, as two partial softmaxes (o, m, l)."""
  *in_refs, o_ref, m_ref, l_ref = refs
  it = iter(in_refs)
  seg_refs = [tuple(next(it) for _ in range(2 if seg.bits == 16 else 6)) for seg in segments]
  rest_k, rest_v = next(it), next(it)

  program = pl.program_id(0)
  num_splits = sizes_ref[_SPLITS]
  split, bk = program % num_splits, program // num_splits
  b = bk // kv_heads
  head_dim = q_ref.shape[1]
  q = q_ref[pl.ds(bk * group, group), :]  # f32 [Gp, H]

  def fresh():
    return (jnp.full((group,), _NEG, jnp.float32), jnp.zeros((group,), jnp.float32),
            jnp.zeros((group, head_dim), jnp.float32))

  state = fresh()
  for seg, refs_ in zip(segments, seg_refs):
    if seg.bits == 16:
      offset, count, tokens = offsets_ref[seg.index], counts_ref[seg.index], sizes_ref[_TOKENS + seg.index]
      state = _dense_segment(state, q, *refs_, bk * tokens, tokens, offset * window, (offset + count) * window,
                             block=seg.block, split=split, num_splits=num_splits)
  capacity = sizes_ref[_REST_CAPACITY]
  m, l, o = _dense_segment(state, q, rest_k, rest_v, bk * capacity, capacity, 0, rest_len_ref[b],
                           block=rest_block, split=split, num_splits=num_splits)
  m_ref[0], l_ref[0], o_ref[0] = m, l, o
  if len(segments) == sum(seg.bits == 16 for seg in segments):
    return
  qp = _to_interleaved(q, chunk)
  state = fresh()
  quantized = _factored_segment if cfg.factored else _tile_segment
  for seg, refs_ in zip(segments, seg_refs):
    if seg.bits != 16:
      offset, count, tokens = offsets_ref[seg.index], counts_ref[seg.index], sizes_ref[_TOKENS + seg.index]
      state = quantized(state, qp, refs_, bk, tokens, offset, count, seg=seg, window=window, chunk=chunk,
                        dtype=rest_k.dtype, split=split, num_splits=num_splits, magic=cfg.magic_convert)
  m, l, o = state
  m_ref[1], l_ref[1], o_ref[1] = m, l, _from_interleaved(o, chunk)


# ----------------------------------------------------------------------------- pallas_call


def _pow2_floor(n: int) -> int:
  return 1 << (max(n, 1).bit_length() - 1)


def _chunk_width(head_dim: int, v_pools) -> int:
  """E: a quarter of the head dim (one INT2 byte block), no wider than a value channel group."""
  width = head_dim // 4
  for pool in v_pools:
    if pool is not None and pool.channel_group:
      width = min(width, pool.channel_group)
  return width


def num_splits(batch: int, kv_heads: int, tokens: int, cfg: DecodeConfig) -> int:
  """J: enough programs to fill the device, none with fewer than `min_tokens_per_split` tokens."""
  fill = -(-cfg.target_programs // (batch * kv_heads))
  return max(1, min(fill, tokens // cfg.min_tokens_per_split))


def quantized_decode(
    qg: Float[Array, "B K G H"],
    k_pools: Sequence[PoolArrays | None],
    v_pools: Sequence[PoolArrays | None],
    offsets: Int[Array, "3"],
    counts: Int[Array, "3"],
    rest_k: Float[Array, "B K R H"],
    rest_v: Float[Array, "B K R H"],
    rest_len: Int[Array, "B"],
    *,
    window_size: int,
    tokens_hint: int | None = None,
    config: DecodeConfig = DecodeConfig(),
    interpret: bool = False,
) -> Float[Array, "B K G H"]:
  """softmax(qg . K^T) V over a layer's pools and rest segment; qg is pre-scaled float32.

  A pool given as None is skipped (the layer has no window there).
  `tokens_hint` (static) bounds the layer's tokens; it sets the split count.
  """
  b, kh, g, h = qg.shape
  gp = max(16, 1 << (g - 1).bit_length())
  chunk = _chunk_width(h, v_pools)
  if h % chunk or (h // chunk) & (h // chunk - 1):
    raise ValueError(f"head dim {h} does not split into a power of two of chunks of {chunk}")
  if tokens_hint is None:
    tokens_hint = rest_k.shape[2] + sum(p.data.shape[2] for p in k_pools if p is not None)
  splits = num_splits(b, kh, tokens_hint, config)
  q = jnp.pad(qg.astype(jnp.float32), ((0, 0), (0, 0), (0, gp - g), (0, 0))).reshape(b * kh * gp, h)

  def rows(x):  # [B, K, n, ...] -> [B*K*n, ...]: a (request, head) is a run of rows
    return x.reshape(-1, x.shape[-1])

  segments, operands, tokens = [], [], [0, 0, 0]
  for index, (kp, vp) in enumerate(zip(k_pools, v_pools)):
    if kp is None or kp.data.shape[2] == 0:
      continue
    tokens[index] = kp.data.shape[2]
    if kp.bits == 16:
      block = min(config.dense_tokens, _pow2_floor(tokens[index]))
    else:
      block = min(config.tile_windows, _pow2_floor(tokens[index] // window_size))
    segments.append(_Segment(index, kp.bits, vp.channel_group, block))
    arrays = [kp.data, vp.data] if kp.bits == 16 else [kp.data, kp.scale, kp.zero, vp.data, vp.scale, vp.zero]
    operands += [rows(x) for x in arrays]
  operands += [rows(rest_k), rows(rest_v)]
  sizes = np.array([splits, *tokens, rest_k.shape[2], 0, 0, 0], np.int32)
  phases = 1 + any(seg.bits != 16 for seg in segments)

  n = b * kh * splits
  kernel = functools.partial(
      _kernel, segments=tuple(segments), kv_heads=kh, group=gp, window=window_size, chunk=chunk,
      rest_block=min(config.dense_tokens, _pow2_floor(rest_k.shape[2])), cfg=config)
  # Whole arrays, indexed by element (not by block) so that no size becomes a constant of the code.
  whole = lambda x: pl.BlockSpec(tuple(pl.Element(d) for d in x.shape), lambda i: (0,) * x.ndim)
  inputs = [offsets.astype(jnp.int32), counts.astype(jnp.int32), rest_len.astype(jnp.int32), sizes, q, *operands]
  o, m, l = pl.pallas_call(
      kernel,
      grid=(n,),
      in_specs=[whole(x) for x in inputs],
      out_specs=[pl.BlockSpec((None, phases, gp, h), lambda i: (i, 0, 0, 0)),
                 pl.BlockSpec((None, phases, gp), lambda i: (i, 0, 0)),
                 pl.BlockSpec((None, phases, gp), lambda i: (i, 0, 0))],
      out_shape=[jax.ShapeDtypeStruct((n, phases, gp, h), jnp.float32),
                 jax.ShapeDtypeStruct((n, phases, gp), jnp.float32),
                 jax.ShapeDtypeStruct((n, phases, gp), jnp.float32)],
      compiler_params=plgpu.CompilerParams(num_warps=config.num_warps, num_stages=config.num_stages),
      interpret=interpret,
      name="wq_quantized_decode",
  )(*inputs)
  shape = (b, kh, splits * phases, gp)  # each phase of each split is one partial softmax
  return combine_splits(o.reshape(*shape, h), m.reshape(shape), l.reshape(shape))[:, :, :g]


def combine_splits(o: Float[Array, "B K J G H"], m: Float[Array, "B K J G"], l: Float[Array, "B K J G"]):
  """Merges the splits' unnormalized outputs by their running maxima."""
  m_max = jnp.max(m, axis=2, keepdims=True)
  w = jnp.exp(m - m_max)
  total = jnp.sum(w * l, axis=2)
  out = jnp.einsum("BKJG,BKJGH->BKGH", w, o)
  return out / jnp.where(total > 0, total, 1.0)[..., None]


# ----------------------------------------------------------------------------- reference


def _reference_logits(qg, pool: PoolArrays, window: int):
  """[B, K, G, W*S] scores over a whole pool, factored for quantized windows."""
  b, kh, g, h = qg.shape
  if pool.bits == 16:
    return jnp.einsum("BKGH,BKTH->BKGT", qg, pool.data.astype(jnp.float32))
  codes = _unpack(pool.data, pool.bits, h).reshape(b, kh, -1, window, h)
  qs = qg[:, :, :, None] * pool.scale.astype(jnp.float32)[:, :, None]  # [B, K, G, W, H]
  bias = jnp.einsum("BKGWH,BKWH->BKGW", qs, pool.zero.astype(jnp.float32))
  logits = jnp.einsum("BKGWH,BKWSH->BKGWS", qs, codes) - bias[..., None]
  return logits.reshape(b, kh, g, -1)


def _reference_values(p, pool: PoolArrays, window: int, h: int):
  """sum_t p_t v_hat_t over a whole pool: p [B, K, G, W*S] -> [B, K, G, H]."""
  b, kh, g, t = p.shape
  if pool.bits == 16:
    return jnp.einsum("BKGT,BKTH->BKGH", p, pool.data.astype(jnp.float32))
  codes = _unpack(pool.data, pool.bits, h)  # [B, K, T, H]
  sc, zr = pool.scale.astype(jnp.float32), pool.zero.astype(jnp.float32)
  if pool.channel_group:  # per token over groups of C channels: scales fold into p
    ps = p[..., None] * sc[:, :, None]  # [B, K, G, T, H/C]
    pv = jnp.einsum("BKGTH,BKTH->BKGH", jnp.repeat(ps, pool.channel_group, axis=-1), codes)
    return pv - jnp.repeat(jnp.einsum("BKGTC,BKTC->BKGC", ps, zr), pool.channel_group, axis=-1)
  pw = p.reshape(b, kh, g, -1, window)
  pv = jnp.einsum("BKGWS,BKWSH->BKGWH", pw, codes.reshape(b, kh, -1, window, h))
  return jnp.einsum("BKWH,BKGWH->BKGH", sc, pv - zr[:, :, None] * pw.sum(-1)[..., None])


def _unpack(codes, bits, h):
  per_byte = 8 // bits
  parts = [(codes >> (bits * i)) & ((1 << bits) - 1) for i in range(per_byte)]
  return jnp.concatenate(parts, axis=-1)[..., :h].astype(jnp.float32)


def reference(qg, k_pools, v_pools, offsets, counts, rest_k, rest_v, rest_len, *, window_size: int):
  """`quantized_decode` in pure jnp: one softmax over every pool (masked to the layer's windows) and the rest."""
  b, kh, g, h = qg.shape
  qg = qg.astype(jnp.float32)
  logits, masks, used = [], [], []
  for index, (kp, vp) in enumerate(zip(k_pools, v_pools)):
    if kp is None or kp.data.shape[2] == 0:
      continue
    window = jnp.arange(kp.data.shape[2]) // window_size
    masks.append(jnp.broadcast_to((window >= offsets[index]) & (window < offsets[index] + counts[index]),
                                  (b, window.size)))
    logits.append(_reference_logits(qg, kp, window_size))
    used.append(vp)
  logits.append(jnp.einsum("BKGH,BKTH->BKGT", qg, rest_k.astype(jnp.float32)))
  masks.append(jnp.arange(rest_k.shape[2])[None] < rest_len[:, None])
  mask = jnp.concatenate(masks, axis=1)[:, None, None]
  probs = jax.nn.softmax(jnp.where(mask, jnp.concatenate(logits, axis=-1), -jnp.inf), axis=-1)
  parts = jnp.split(probs, list(itertools.accumulate(x.shape[-1] for x in logits))[:-1], axis=-1)
  out = jnp.einsum("BKGT,BKTH->BKGH", parts[-1], rest_v.astype(jnp.float32))
  for part, vp in zip(parts[:-1], used):
    out = out + _reference_values(part, vp, window_size, h)
  return out
