"""Ablation C: windows at mixed precision kept in their original order (no reorder).

Axes: L layers, B batch, K KV heads, H head dim, S window size, W windows a layer.

An honest unreordered layout: each layer's windows are stored one after the
other, in original order, as variable-size byte records in one heap shared by
all layers (keys and values in two heaps of equal layout):

    16-bit window   S*H values in the model dtype
    b-bit window    S*H*b/8 code bytes, then H scales and H minimums (meta dtype)

`record_start[l, w]` is the byte offset of window w of layer l. Memory is
exactly the planned records (rounded up to a bucket), like the reordered
cache, but no precision lies contiguous. The heap is stored in 16-bit units
(uint16) so that a kernel reads a 16-bit window as rows of its dtype, and codes
and scales as rows of 16-bit words, without a copy (every record is a whole
number of 2H-byte rows when S is a multiple of 8).

Two readers. The XLA one (`interleaved_attention`) fetches every window in
every format and selects per window, the cost the paper's Module III removes.
The Pallas one (`pallas_kernels/interleaved_decode.py`) reads each format's
windows where they lie through a page table built with the cache
(`format_starts`, `format_counts`: the records of each format in window order),
as paged attention reads a block table: the layout stays unreordered, only the
reading order groups the formats.
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from wq_jax import quant
from wq_jax.buckets import bucket, round_up
from wq_jax.cache import POOL_BITS, append_to_rest, make_pool, plan_layout, rest_segment

HEAP_ALIGN = 256


def record_bytes(bits: int, window_size: int, head_dim: int, dtype, meta_dtype) -> int:
  if bits == 16:
    return window_size * head_dim * jnp.dtype(dtype).itemsize
  return window_size * quant.packed_length(head_dim, bits) + 2 * head_dim * jnp.dtype(meta_dtype).itemsize


@struct.dataclass
class InterleavedLayer:
  k_heap: jax.Array  # uint16 [B, K, bytes / 2]
  v_heap: jax.Array
  record_start: jax.Array  # int32 [W]: bytes
  plan: jax.Array  # int32 [W]
  format_starts: jax.Array  # int32 [W]: 16-bit units, the 16-bit records, then INT4's, then INT2's
  format_counts: jax.Array  # int32 [3]: records of each format (POOL_BITS order)
  rest_k: jax.Array  # [B, K, R, H], or with `layer` every layer's [L, B, K, R, H] (as `cache.LayerCache`)
  rest_v: jax.Array
  rest_len: jax.Array
  window_size: int = struct.field(pytree_node=False)
  dtype: str = struct.field(pytree_node=False)
  meta_dtype: str = struct.field(pytree_node=False)
  layer: jax.Array | None = None

  @property
  def capacity(self) -> int:
    return self.rest_k.shape[-2]

  def own_rest(self):
    """This layer's rest keys and values, [B, K, R, H] each."""
    if self.layer is None:
      return self.rest_k, self.rest_v
    return self.rest_k[self.layer], self.rest_v[self.layer]

  def append(self, k_new, v_new) -> "InterleavedLayer":
    return append_to_rest(self, k_new, v_new)


@struct.dataclass
class InterleavedCache:
  k_heap: jax.Array  # uint16 [B, K, bytes / 2]
  v_heap: jax.Array
  record_start: jax.Array  # int32 [L, W]
  plan: jax.Array  # int32 [L, W]
  format_starts: jax.Array  # int32 [L, W]
  format_counts: jax.Array  # int32 [L, 3]
  rest_k: jax.Array  # [L, B, K, R, H]
  rest_v: jax.Array
  rest_len: jax.Array  # int32 [B]
  window_size: int = struct.field(pytree_node=False)
  dtype: str = struct.field(pytree_node=False)
  meta_dtype: str = struct.field(pytree_node=False)

  @property
  def num_layers(self) -> int:
    return self.rest_k.shape[0]

  @property
  def capacity(self) -> int:
    return self.rest_k.shape[3]

  @property
  def nbytes(self) -> int:
    return sum(int(x.size) * x.dtype.itemsize for x in jax.tree_util.tree_leaves(self))

  def layer(self, l, *, stacked: bool = False) -> InterleavedLayer:
    """Layer l's view; `stacked`: over every layer's rest segment, appended to and read in place (a layer's own
    slice is a copy a layer and step), as `KVCache.layer`."""
    rest_k, rest_v = (self.rest_k, self.rest_v) if stacked else (self.rest_k[l], self.rest_v[l])
    return InterleavedLayer(self.k_heap, self.v_heap, self.record_start[l], self.plan[l], self.format_starts[l],
                            self.format_counts[l], rest_k, rest_v, self.rest_len, self.window_size, self.dtype,
                            self.meta_dtype, jnp.asarray(l, jnp.int32) if stacked else None)

  def replace_layer(self, l, layer: InterleavedLayer) -> "InterleavedCache":
    if layer.layer is not None:
      return self.replace(rest_k=layer.rest_k, rest_v=layer.rest_v)
    return self.replace(rest_k=self.rest_k.at[l].set(layer.rest_k), rest_v=self.rest_v.at[l].set(layer.rest_v))

  def advance(self) -> "InterleavedCache":
    return self.replace(rest_len=self.rest_len + 1)


def build_interleaved_cache(keys, values, plan, *, visual_start, num_visual, seq_lens, max_new_tokens,
                            window_size=32, meta_dtype=jnp.float16) -> InterleavedCache:
  """Quantizes by `plan` and writes each layer's windows as records in original order."""
  plan = np.asarray(plan, np.int32)
  layout = plan_layout(plan, visual_start=visual_start, num_visual=num_visual, seq_lens=seq_lens,
                       window_size=window_size)
  head_dim, dtype, meta = keys.shape[-1], jnp.dtype(keys.dtype), jnp.dtype(meta_dtype)
  sizes = {b: record_bytes(b, window_size, head_dim, dtype, meta) for b in POOL_BITS}
  record_size = np.vectorize(sizes.get)(plan).astype(np.int64)
  record_start = (np.cumsum(record_size.reshape(-1)) - record_size.reshape(-1)).reshape(plan.shape)
  total = int(record_size.sum())
  # Room past the end so that reading any window in the largest format stays in bounds; whole rows of H
  # 16-bit units, so that a kernel can view the heap as such rows.
  align = max(HEAP_ALIGN, 2 * head_dim)
  heap_bytes = bucket(round_up(total, align) // align) * align + round_up(max(sizes.values()), align)
  format_starts, format_counts = page_table(plan, record_start)
  starts_by_pool = tuple(jnp.asarray(_pool_starts(plan, record_start, b, len(src)), jnp.int32)
                         for b, src in zip(POOL_BITS, layout.pool_sources))
  return _build(keys, values, tuple(jnp.asarray(s) for s in layout.pool_sources), starts_by_pool,
                jnp.asarray(layout.rest_sources), jnp.asarray(layout.rest_len),
                jnp.asarray(record_start, jnp.int32), jnp.asarray(plan), jnp.asarray(format_starts),
                jnp.asarray(format_counts), visual_start=visual_start,
                num_windows=plan.shape[1], window_size=window_size,
                capacity=layout.rest_sources.shape[1] + max_new_tokens, meta_dtype=meta.name,
                heap_bytes=heap_bytes)


def page_table(plan, record_start):
  """Per layer, the records' starts in 16-bit units grouped by format (POOL_BITS order, window order within
  one), and the count of each format: what a kernel needs to stream one format at a time."""
  starts = np.zeros(plan.shape, np.int32)
  counts = np.zeros((plan.shape[0], len(POOL_BITS)), np.int32)
  for l in range(plan.shape[0]):
    order = np.concatenate([np.nonzero(plan[l] == b)[0] for b in POOL_BITS])
    starts[l] = record_start[l, order] // 2
    counts[l] = [np.sum(plan[l] == b) for b in POOL_BITS]
  return starts, counts


def _pool_starts(plan, record_start, bits, padded_len):
  """Heap offsets of a pool's windows in pool order; padding slots point past the records."""
  starts = record_start.reshape(-1)[np.nonzero((plan == bits).reshape(-1))[0]]
  out = np.full(padded_len, -1, np.int64)  # -1: dropped by the scatter (out of bounds)
  out[: len(starts)] = starts
  return out


@functools.partial(jax.jit, static_argnames=("visual_start", "num_windows", "window_size", "capacity",
                                             "meta_dtype", "heap_bytes"))
def _build(keys, values, pool_sources, pool_starts, rest_sources, rest_len, record_start, plan, format_starts,
           format_counts, *, visual_start, num_windows, window_size, capacity, meta_dtype, heap_bytes):
  def heap_of(x):
    l, b, k, _, h = x.shape
    vis = jax.lax.slice_in_dim(x, visual_start, visual_start + num_windows * window_size, axis=3)
    win = vis.reshape(l, b, k, num_windows, window_size, h).transpose(0, 3, 1, 2, 4, 5)
    win = win.reshape(l * num_windows, b, k, window_size, h)
    heap = jnp.zeros((b, k, heap_bytes), jnp.uint8)
    for bits, src, starts in zip(POOL_BITS, pool_sources, pool_starts):
      if src.shape[0] == 0:
        continue
      g = jnp.take(win, src, axis=0).transpose(1, 2, 0, 3, 4)  # [B, K, P, S, H]
      pool = make_pool(g, bits, 0, x.dtype, jnp.dtype(meta_dtype))
      heap = _scatter_records(heap, _records(pool, g.shape[2]), starts)
    return _as_halves(heap)

  return InterleavedCache(
      k_heap=heap_of(keys), v_heap=heap_of(values), record_start=record_start, plan=plan,
      format_starts=format_starts, format_counts=format_counts,
      rest_k=rest_segment(keys, rest_sources, rest_len, capacity),
      rest_v=rest_segment(values, rest_sources, rest_len, capacity), rest_len=rest_len,
      window_size=window_size, dtype=jnp.dtype(keys.dtype).name, meta_dtype=meta_dtype)


def _as_bytes(x):
  """[..., n] of any dtype -> uint8 [..., n * itemsize]."""
  if x.dtype == jnp.uint8:
    return x
  b = jax.lax.bitcast_convert_type(x, jnp.uint8)
  return b.reshape(*x.shape[:-1], -1)


def _as_halves(b):
  """uint8 [..., 2n] -> uint16 [..., n] (little-endian, as both backends store them)."""
  return jax.lax.bitcast_convert_type(b.reshape(*b.shape[:-1], -1, 2), jnp.uint16)


def _from_bytes(b, dtype):
  dtype = jnp.dtype(dtype)
  if dtype == jnp.uint8:
    return b
  return jax.lax.bitcast_convert_type(b.reshape(*b.shape[:-1], -1, dtype.itemsize), dtype)


def _records(pool, num_windows):
  """A pool's windows as byte records [B, K, P, record_bytes]."""
  b, k, _, c = pool.data.shape
  data = _as_bytes(pool.data.reshape(b, k, num_windows, -1))
  if pool.bits == 16:
    return data
  return jnp.concatenate([data, _as_bytes(pool.scale), _as_bytes(pool.minimum)], axis=-1)


def _scatter_records(heap, records, starts):
  dnums = jax.lax.ScatterDimensionNumbers(update_window_dims=(0, 1, 3), inserted_window_dims=(),
                                          scatter_dims_to_operand_dims=(2,))
  return jax.lax.scatter(heap, starts[:, None], records, dnums, mode="drop")


def _gather_records(heap, starts, size):
  """[B, K, n] at `starts` [W] -> [B, K, W, size] (starts and size in the heap's units)."""
  dnums = jax.lax.GatherDimensionNumbers(offset_dims=(0, 1, 3), collapsed_slice_dims=(), start_index_map=(2,))
  b, k, _ = heap.shape
  return jax.lax.gather(heap, starts[:, None], dnums, slice_sizes=(b, k, size), mode="clip")


def layer_windows(heap, layer: InterleavedLayer, head_dim: int):
  """Every window of a layer dequantized, in original order: [B, K, W*S, H] float32."""
  s = layer.window_size
  per_format = []
  for bits in POOL_BITS:
    size = record_bytes(bits, s, head_dim, layer.dtype, layer.meta_dtype)
    rec = _as_bytes(_gather_records(heap, layer.record_start // 2, size // 2))  # [B, K, W, size]
    b, k, w, _ = rec.shape
    if bits == 16:
      x = _from_bytes(rec, layer.dtype).reshape(b, k, w, s, head_dim).astype(jnp.float32)
    else:
      code_bytes = s * quant.packed_length(head_dim, bits)
      meta_bytes = head_dim * jnp.dtype(layer.meta_dtype).itemsize
      codes = rec[..., :code_bytes].reshape(b, k, w, s, -1)
      scale = _from_bytes(rec[..., code_bytes:code_bytes + meta_bytes], layer.meta_dtype)
      minimum = _from_bytes(rec[..., code_bytes + meta_bytes:], layer.meta_dtype)
      q = quant.unpack(codes, bits, head_dim).astype(jnp.float32)
      x = scale.astype(jnp.float32)[:, :, :, None] * q + minimum.astype(jnp.float32)[:, :, :, None]
    per_format.append(x)
  bits = layer.plan[None, None, :, None, None]
  x = jnp.where(bits == 16, per_format[0], jnp.where(bits == 4, per_format[1], per_format[2]))
  b, k, w = x.shape[:3]
  return x.reshape(b, k, w * s, head_dim)


def interleaved_attention(qg, layer: InterleavedLayer):
  """Dequantize every window in original order, then one softmax over windows and rest."""
  h = qg.shape[-1]
  rest_k, rest_v = layer.own_rest()
  k = jnp.concatenate([layer_windows(layer.k_heap, layer, h), rest_k.astype(jnp.float32)], axis=2)
  v = jnp.concatenate([layer_windows(layer.v_heap, layer, h), rest_v.astype(jnp.float32)], axis=2)
  num_window_tokens = k.shape[2] - rest_k.shape[2]
  valid = jnp.concatenate([jnp.ones((qg.shape[0], num_window_tokens), bool),
                           jnp.arange(rest_k.shape[2])[None, :] < layer.rest_len[:, None]], axis=1)
  logits = jnp.einsum("BKGH,BKTH->BKGT", qg, k)
  probs = jax.nn.softmax(jnp.where(valid[:, None, None, :], logits, -jnp.inf), axis=-1)
  return jnp.einsum("BKGT,BKTH->BKGH", probs, v)
