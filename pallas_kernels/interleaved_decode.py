"""Decode attention over ablation C's unreordered cache (Pallas, Triton lowering): a paged reader.

Axes: B batch, K KV heads, G query heads per KV head (padded to Gp >= 16), H head dim, S window size,
W windows a layer, R rest tokens, J splits, b bits, n = H b / 16 (16-bit words of a token's codes).

`wq_jax.interleaved` keeps a layer's windows in their original order as variable-size records in one heap
of 16-bit units, and a page table: the records' starts grouped by format (`format_starts`, `format_counts`).
This kernel streams each format's windows through that table, as paged attention streams blocks, so each
loop is homogeneous (one format; one window a step, or two under one softmax update with
`DecodeConfig.tile_windows=2`, slower on an H100) though no two windows need be adjacent. The heap is
read in place through three reshapes of it (no copy): rows of H words (16-bit windows, scales and
minimums), and rows of n words (a token's codes).

Codes are packed "split" style (`quant.pack`: byte j holds channels j + p H/P at bits b p), so word i of a
token holds bytes 2i and 2i + 1: part p of byte parity e, (word >> (8 e + b p)) & (2^b - 1), is channel
2i + e + 2 n p. The two parities' tiles [S, n] of a part, interleaved (Triton's join), are its 2n channels in
order: a contiguous block of q, of the scales and minimums, and of the output, as the reordered kernel's parts
(`quantized_decode._quantized_segment`). On the GPU a tile is a mask and a subtraction a pair of codes
(`_code_asm`, the magic-number trick of `quantized_decode._dequant_asm`); each part is then scaled (one f16
fma) and meets the tensor cores in its own dot.

One program serves one (request, KV head, split) and runs three phases, each its own online softmax and
partial (o, m, l): the 16-bit windows with the rest segment, the INT4 windows, the INT2 windows; the
combine merges phases like splits. On the GPU a part's dot needs 2n >= 16 channels: H >= 64 for INT2; the
interpret mode (CPU) takes any H.

Where the reordered cache's INT4 and INT2 pools go through the Mosaic GPU kernel (`mosaic_formats`: large
launches, JAX >= 0.11), so do C's windows of those formats (session 41): `mosaic_int2.paged_partials` fetches each
window of a 64-key step from its record by the same page table (a window's codes, scales and minimums: six copies,
where a reordered pool's step takes six for two windows) and runs that kernel's loop unchanged. This kernel then
reads the 16-bit windows and the rest only, and the merged combine takes the launches' sets as the reordered
path's.
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu
from jaxtyping import Array, Float

from pallas_kernels import mosaic_int2 as mi
from pallas_kernels import quantized_decode as qd

FORMATS = (16, 4, 2)  # the page table's order, `wq_jax.cache.POOL_BITS` (not imported: no flax here)
_QUANTIZED = FORMATS[1:]  # phases 1 and 2

# Its tiling. A window step is a chain of dependent work (a page-table entry, its loads, the dots, the softmax's
# maximum across warps), so more programs a multiprocessor than the registers keep resident still help: the
# split count plans for 8. H100, one layer (`interleaved_bench.py`, `results/interleaved_s40_*_h100.md`), µs
# against 4 warps / 3 stages / 3 programs: batch 32 x 19,968 all-INT2 384 against 415, mixed plan 403 against
# 430; batch 60 x 1k mixed 80 against 95. One warp a program executes the fewest instructions a window but was
# 2-3 x slower; 2 warps lost on the mixed plan. Then the running sum as a tile (no reduction across warps a
# step): 359 / 377 / 67. Two windows a step (`tile_windows=2`): 384 / 405 / 75.
PAGED = qd.DecodeConfig(num_warps=4, num_stages=2, programs_per_multiprocessor=8, tile_windows=1)


def _code_asm(bits: int, part: int, parity: int) -> str:
  """PTX: two 16-bit words of codes -> part `part` of byte parity e of each, as two halves c (f16x2).

  The codes sit at bit 8 e + b p of each word; for e = 1 a shift by 8 brings both (and garbage the mask drops)
  to bit b p of their halves. Masked in place and OR-ed into the bits of 2^(10 - b p), whose mantissa bit b p is
  worth 1, each half is 2^(10 - b p) + c exactly (as `quantized_decode._dequant_asm`); one subtraction leaves c.
  Operands: $0 out, $1 codes.
  """
  shift = bits * part
  mask = ((1 << bits) - 1) << shift
  magic = (15 + 10 - shift) << 10
  lines = ["{", ".reg .b32 t, magic;", f"mov.b32 magic, {magic | magic << 16:#010x};"]
  source = "$1"
  if parity:
    lines.append("shr.b32 t, $1, 8;")
    source = "t"
  lines += [f"lop3.b32 t, {source}, {mask | mask << 16:#010x}, {magic | magic << 16:#010x}, 0xea;",  # (a & b) | c
            "sub.f16x2 $0, t, magic;", "}"]
  return "\n".join(lines)


def _codes_of(words, *, bits: int, part: int, parity: int, inline_asm: bool):
  """uint16 [S, n] -> the codes of one part and byte parity as f16 [S, n]."""
  if inline_asm:
    return plgpu.elementwise_inline_asm(
        _code_asm(bits, part, parity), args=[words], constraints="=r,r", pack=2,
        result_shape_dtypes=[jax.ShapeDtypeStruct(words.shape, jnp.float16)])[0]
  return ((words >> jnp.uint16(8 * parity + bits * part)) & jnp.uint16((1 << bits) - 1)).astype(jnp.float16)


def _part_codes(words, *, bits: int, part: int, inline_asm: bool):
  """uint16 [S, n] -> part p's codes f16 [S, 2n], channels 2 n p ... in order: word i's byte parities are
  channels 2i and 2i + 1 of the part, so the two parities' tiles interleave (a stack on a last axis of 2,
  then a reshape: Triton's join, no data movement)."""
  tiles = [_codes_of(words, bits=bits, part=part, parity=e, inline_asm=inline_asm) for e in (0, 1)]
  return jnp.stack(tiles, axis=-1).reshape(words.shape[0], 2 * words.shape[1])


def _kernel(counts_ref, starts_ref, rest_len_ref, layer_ref, q_ref, k_rows, v_rows, k_codes4, v_codes4, k_codes2,
            v_codes2, rest_k_ref, rest_v_ref, o_ref, m_ref, l_ref, *, heap_words, kv_heads, layers, window, splits,
            dtype, meta_dtype, exp2, inline_asm, windows_per_step, quantized):
  """One (request, KV head, split): its share of each format's windows and of the rest, as partial softmaxes
  o [P, Gp, H], m and l [P, Gp] (phases: 16-bit windows and rest, then the formats of `quantized`, of INT4 and
  INT2, that this launch reads)."""
  program = pl.program_id(0)
  split, bk = program % splits, program // splits
  head_dim = q_ref.shape[-1]
  pair = bk * heap_words  # where this (request, KV head)'s heap starts, in 16-bit words
  q = q_ref[...]  # f32 [Gp, H], base-2 scores

  def entries(fmt):  # this split's entries of the page table for format `fmt` (POOL_BITS order)
    first = sum((counts_ref[i] for i in range(fmt)), jnp.int32(0))
    lo, hi = qd._split_range(counts_ref[fmt], split, splits)
    return first + lo, first + hi

  def dense_window(i, carry):  # a 16-bit record: S rows of H words, keys' and values' alike
    m, l, acc = carry
    rows = pl.ds((pair + starts_ref[i]) // head_dim, window)
    k = lax.bitcast_convert_type(k_rows[rows, :], dtype)
    m, l, corr, p = qd._online_softmax(m, l, qd._dot_t(q.astype(dtype), k), exp2)
    v = lax.bitcast_convert_type(v_rows[rows, :], dtype)
    return m, l, acc * corr[:, None] + qd._dot(p.astype(dtype), v)

  m, l, (acc,) = qd._fresh(q.shape[0], head_dim, 1)
  lo, hi = entries(0)
  m, l, acc = lax.fori_loop(lo, hi, dense_window, (m, l, acc))
  pairs = rest_len_ref.shape[0] * kv_heads
  capacity = rest_k_ref.shape[0] // (pairs * layers)
  rows = (layer_ref[0] * pairs + bk) * capacity  # this layer's rest rows (of the stacked segment, or its own)
  m, l, acc = qd._dense_segment((m, l, acc), q, rest_k_ref, rest_v_ref, rows, capacity, 0,
                                rest_len_ref[bk // kv_heads], block=min(64, qd._pow2_floor(capacity)), split=split,
                                num_splits=splits, deferred_sum=False, exp2=exp2)
  m_ref[0, :], l_ref[0, :] = m, l
  o_ref[0, :, :] = acc

  formats = [f for f in ((4, k_codes4, v_codes4), (2, k_codes2, v_codes2)) if f[0] in quantized]
  for phase, (bits, k_codes, v_codes) in enumerate(formats, start=1):
    n = head_dim * bits // 16  # words of a token's codes; a part is 2n channels
    parts = [pl.ds(2 * n * p, 2 * n) for p in range(8 // bits)]
    q_parts = [q_ref[:, cols].astype(jnp.float16) for cols in parts]

    def dequantized(codes_ref, rows_ref, start, bits=bits, parts=parts, n=n):
      words = codes_ref[pl.ds((pair + start) // n, window), :]  # uint16 [S, n]
      meta = (pair + start + window * n) // head_dim  # the scales' row; the minimums' the next
      out = []
      for p, cols in enumerate(parts):
        scale, minimum = (lax.bitcast_convert_type(rows_ref[row, cols], meta_dtype).astype(jnp.float16)[None, :]
                          for row in (meta, meta + 1))
        out.append(_part_codes(words, bits=bits, part=p, inline_asm=inline_asm) * scale + minimum)
      return out

    def scores(start, q_parts=q_parts, dequantized=dequantized, k_codes=k_codes):
      keys = dequantized(k_codes, k_rows, start)
      return functools.reduce(jnp.add, [qd._dot_t(qp, kp) for qp, kp in zip(q_parts, keys)])

    def quantized_step(j, carry, lo, hi, scores=scores, dequantized=dequantized, v_codes=v_codes):
      """Entries lo + w j ... (w = `windows_per_step`, those below hi) under one softmax update. The running
      sum is a tile [Gp, S] whose rows sum to l (`quantized_decode._sum_tile`): no reduction across warps for it
      a step, one at the loop's end."""
      m, l, accs = carry
      first = lo + windows_per_step * j
      entries_ = [jnp.minimum(first + w, hi - 1) for w in range(windows_per_step)]
      starts = [starts_ref[e] for e in entries_]
      s = [scores(starts[0])]
      s += [jnp.where(first + w < hi, scores(starts[w]), -jnp.inf) for w in range(1, windows_per_step)]
      m_new = functools.reduce(jnp.maximum, [jnp.max(x, axis=1) for x in s], m)
      corr = exp2(m - m_new)
      probs = [exp2(x - m_new[:, None]) for x in s]
      l = l * corr[:, None] + functools.reduce(jnp.add, probs)
      accs = [a * corr[:, None] for a in accs]
      for start, p in zip(starts, probs):
        values = dequantized(v_codes, v_rows, start)
        accs = [a + qd._dot(p.astype(jnp.float16), v) for a, v in zip(accs, values)]
      return m_new, l, tuple(accs)

    m, l, accs = qd._fresh(q.shape[0], 2 * n, len(parts))
    lo, hi = entries(FORMATS.index(bits))
    m, l, accs = lax.fori_loop(0, pl.cdiv(hi - lo, windows_per_step),
                               functools.partial(quantized_step, lo=lo, hi=hi),
                               (m, qd._sum_tile(l, window, True), accs))
    m_ref[phase, :], l_ref[phase, :] = m, qd._sum_rows(l)
    for cols, a in zip(parts, accs):
      o_ref[phase, :, cols] = a


def unreadable(layer, head_dim: int, interpret: bool) -> str | None:
  """Why this kernel cannot read `layer` (None where it can): 16-bit caches only (a float32 model's 16-bit
  windows hold 4-byte values), windows of a multiple of 8 tokens, and on the GPU dots 16 channels wide."""
  dtype = jnp.dtype(layer.dtype)
  if dtype.itemsize != 2 or jnp.dtype(layer.meta_dtype).itemsize != 2:
    return f"it reads 16-bit caches, not {dtype.name} values with {layer.meta_dtype} scales"
  if layer.window_size % 8 or layer.k_heap.dtype != jnp.uint16:
    return (f"it needs a uint16 heap and windows of a multiple of 8 tokens (heap {layer.k_heap.dtype}, "
            f"window {layer.window_size})")
  if not interpret and head_dim * min(_QUANTIZED) // 8 < 16:
    return f"head dim {head_dim}: its INT2 parts need H >= 64 on the GPU (a dot is 16 wide at least)"
  return None


def mosaic_formats(layer, pairs: int, groups: int, head_dim: int, interpret: bool) -> tuple[int, ...]:
  """The quantized formats whose windows go through the Mosaic GPU kernel (`mosaic_int2.paged_partials`), as the
  reordered cache's pools of those widths do (`quantized_decode.for_launch`): launches of
  `DecodeConfig.mosaic_min_pairs` (request, KV head) pairs or more and layers of `mosaic_min_pool_tokens` window
  tokens or more, or (since s43) `mosaic_min_pairs_long` pairs and `mosaic_long_pool_tokens` (counted over the
  layer's windows of every format: C's plan is data; untimed below 128 pairs), windows of 32, head dim 128, at
  most 8 query heads a KV head, f16 scales, a page table a warpgroup can hold; not in interpret mode, where the
  Triton kernel reads every format."""
  default = qd.DecodeConfig()
  windows = layer.plan.shape[0]
  if qd.for_launch(default, pairs, windows * layer.window_size, interpret=interpret) is default:  # not large
    return ()
  if (not mi.available() or layer.window_size != mi.WINDOW or head_dim != mi.HEAD_DIM or groups > 8
          or windows > mi.MAX_PAGES or jnp.dtype(layer.meta_dtype) != jnp.float16):
    return ()
  return qd.LARGE_BATCH_BITS


def _mosaic_plan(q, layer, bits: int, large: qd.DecodeConfig, interpret: bool) -> mi.KernelPlan:
  """The Mosaic kernel over the layer's windows of `bits` bits, read where their records lie (its partials a set
  for the combine, o heads last: `quantized_decode.mosaic_set`). q [B, K, G, H] f32, base-2 scores."""
  b, kh, g, h = q.shape
  fmt = FORMATS.index(bits)
  counts = layer.format_counts.astype(jnp.int32)
  splits, options = qd.mosaic_plan(b * kh, layer.plan.shape[0], bits, large)  # the layer's windows bound the count
  return mi.paged_plan(q.reshape(b * kh, g, h), layer.k_heap, layer.v_heap, layer.format_starts,
                       jnp.sum(counts[:fmt]), counts[fmt], bits=bits, splits=splits,
                       interpret=mi.interpret_params() if interpret else None, **options)


def interleaved_decode(qg: Float[Array, "B K G H"], layer, *, config: qd.DecodeConfig = PAGED,
                       interpret: bool | None = None, mosaic: tuple[int, ...] | None = None,
                       mosaic_config: qd.DecodeConfig | None = None) -> Float[Array, "B K G H"]:
  """softmax(qg . K^T) V over one layer of ablation C's cache (`wq_jax.interleaved.InterleavedLayer`), qg
  pre-scaled (float32), in float32. `mosaic`: the quantized formats read by the Mosaic GPU kernel (JAX >= 0.11)
  through the page table, the others by this kernel; None: `mosaic_formats`'s choice. `mosaic_config`: the
  configuration whose large launches those take (as `quantized_decode.for_launch` gives them: the pools'
  default's, or a registered variant's, so that a variant times C as it times the pools)."""
  interpret = jax.default_backend() == "cpu" if interpret is None else interpret
  b, kh, g, h = qg.shape
  reason = unreadable(layer, h, interpret)
  if reason:
    raise ValueError(f"the interleaved kernel cannot read this cache: {reason}; implementation='xla' can")
  if mosaic is None:
    mosaic = mosaic_formats(layer, b * kh, g, h, interpret)
  quantized = tuple(bits for bits in _QUANTIZED if bits not in mosaic)
  gp = max(16, 1 << (g - 1).bit_length())
  heap_words = layer.k_heap.shape[-1]
  splits = qd.num_splits(b, kh, layer.plan.shape[0] * layer.window_size + layer.capacity, config)
  scaled = qg.astype(jnp.float32) * qd._LOG2E  # base-2 scores, for every launch
  q = jnp.pad(scaled, ((0, 0), (0, 0), (0, gp - g), (0, 0))).reshape(b * kh, gp, h)
  views = []
  for heap in (layer.k_heap, layer.v_heap):  # reshapes of the heap, no copies
    views.append([heap.reshape(-1, h), heap.reshape(-1, h // 4), heap.reshape(-1, h // 8)])
  (k_rows, k4, k2), (v_rows, v4, v2) = views
  stacked = layer.layer is not None  # rest_k [L, B, K, R, H]: read layer `layer`'s rows in place
  rest_layer = (layer.layer if stacked else jnp.zeros((), jnp.int32)).astype(jnp.int32).reshape(1)
  scalars = [layer.format_counts.astype(jnp.int32), layer.format_starts.astype(jnp.int32),
             layer.rest_len.astype(jnp.int32), rest_layer]
  arrays = [k_rows, v_rows, k4, v4, k2, v2, layer.rest_k.reshape(-1, h), layer.rest_v.reshape(-1, h)]
  n = b * kh * splits
  inline_asm = config.inline_asm and not interpret
  exp2 = qd._exp2_ftz if inline_asm and config.fast_exp2 else jnp.exp2
  kernel = functools.partial(_kernel, heap_words=heap_words, kv_heads=kh, window=layer.window_size, splits=splits,
                             layers=layer.rest_k.shape[0] if stacked else 1,
                             dtype=jnp.dtype(layer.dtype), meta_dtype=jnp.dtype(layer.meta_dtype), exp2=exp2,
                             inline_asm=inline_asm, windows_per_step=config.tile_windows, quantized=quantized)
  whole = lambda x: pl.BlockSpec(tuple(pl.Element(d) for d in x.shape), lambda i: (0,) * x.ndim)
  inputs = [*scalars, q, *arrays]  # q: a (request, KV head)'s block a program; the rest whole
  in_specs = [*map(whole, scalars), pl.BlockSpec((None, gp, h), lambda i: (i // splits, 0, 0)), *map(whole, arrays)]
  phases = 1 + len(quantized)
  o, m, l = pl.pallas_call(
      kernel,
      grid=(n,),
      in_specs=in_specs,
      out_specs=[pl.BlockSpec((None, phases, gp, h), lambda i: (i, 0, 0, 0)),
                 pl.BlockSpec((None, phases, gp), lambda i: (i, 0, 0)),
                 pl.BlockSpec((None, phases, gp), lambda i: (i, 0, 0))],
      out_shape=qd.partial_softmax_shapes(n, phases, gp, h),
      compiler_params=plgpu.CompilerParams(num_warps=config.num_warps, num_stages=config.num_stages),
      interpret=interpret,
      name="wq_interleaved_decode",
  )(*inputs)
  shape = (b, kh, splits * phases, gp)
  triton = (o.reshape(*shape, h), m.reshape(shape), l.reshape(shape))
  if not mosaic:
    return qd.combine_splits(*triton)[:, :, :g]
  # the Mosaic launches and the merged combine, as the pools take them
  base = qd.DecodeConfig() if mosaic_config is None else mosaic_config
  large = base if base.int2_mosaic else qd.large_batch(base)
  partials = qd.mosaic_launches(lambda c: [_mosaic_plan(scaled, layer, bits, c, interpret) for bits in mosaic], large,
                                b * kh, len(mosaic))
  sets = [triton, *(qd.mosaic_set(*p, b, kh) for p in partials)]
  if large.fused_combine:
    return qd.combine_kernel(sets, g, config=large, interpret=interpret)
  return qd.combine_sets(sets, g)
