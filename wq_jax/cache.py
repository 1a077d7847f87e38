"""The WindowQuant KV cache: one pool per precision shared by all layers, plus a dense rest.

Axes: L layers, B batch, K KV heads, H head dim, S window size, W windows a
layer, P windows in a pool (all layers), R rest tokens, C channel groups.

For keys and for values alike:

    pools[0]  high precision   data [B, K, P16*S, H]             model dtype
    pools[1]  INT4             data [B, K, P4*S, H/2] uint8      scale, minimum [B, K, P4, H]
    pools[2]  INT2             data [B, K, P2*S, H/4] uint8      scale, minimum [B, K, P2, H]
    rest      [L, B, K, R, H]  model dtype: text tokens, the visual tail (M mod S
              tokens), then room for the generated tokens; `rest_len[b]` are valid.

Layer l owns windows [offsets[p, l], offsets[p, l] + counts[p, l]) of pool p:
the paper's reorder (windows of one bit width contiguous), with the layer's
range carried as values, not shapes, so the layer loop can be a `lax.scan` and
plans of one video length share a compiled decode step. Pool sizes are rounded
up to a shape bucket (`buckets.bucket`, at most 6.25 % padding), so the cache's
bytes follow the plan. Windows keep their original order inside a pool; every
token is stored head-major so a kernel reads each segment once.

Quantized keys have one (scale, minimum) per window, KV head and channel (the
window's S tokens form the group); values the same, or, for KIVI, per token
over groups of `value_channel_group` channels (scale [B, K, P*S, H/C]).
A value is scale * code + minimum: the minimum (-scale * zero-point, the value
of code 0) is stored instead of the integer zero-point, so that dequantizing is
one fused multiply-add per value, in a kernel's registers as in XLA.
"""
from __future__ import annotations

import functools
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct
from jaxtyping import Array, Float, Int

from wq_jax import quant
from wq_jax.buckets import bucket, round_up

POOL_BITS = (16, 4, 2)  # pool order: high precision, INT4, INT2
REST_ALIGN = 16


@struct.dataclass
class Pool:
  """All layers' windows of one precision, for keys or for values."""
  data: jax.Array  # [B, K, P*S, H] values, or [B, K, P*S, H*bits/8] packed codes
  scale: jax.Array | None  # None for the high-precision pool
  minimum: jax.Array | None  # -scale * zero-point: a value is scale * code + minimum
  bits: int = struct.field(pytree_node=False)
  # 0: one (scale, minimum) per window and channel; C > 0: per token over C channels.
  channel_group: int = struct.field(pytree_node=False, default=0)


@struct.dataclass
class LayerCache:
  """One layer's view of the cache: the shared pools, its ranges, its rest segment.

  With `layer` set, rest_k and rest_v are every layer's [L, B, K, R, H] and
  this layer's is rest_k[layer] (`own_rest`): decode appends into the stacked
  segment in place and the Pallas kernel reads it there, where a layer's own
  array is a copy a layer and step (XLA arrays have no views).
  """
  k_pools: tuple[Pool, Pool, Pool]
  v_pools: tuple[Pool, Pool, Pool]
  offsets: Int[Array, "3"]
  counts: Int[Array, "3"]
  rest_k: Float[Array, "B K R H"] | Float[Array, "L B K R H"]
  rest_v: Float[Array, "B K R H"] | Float[Array, "L B K R H"]
  rest_len: Int[Array, "B"]
  window_size: int = struct.field(pytree_node=False)
  slice_windows: tuple[int, int, int] = struct.field(pytree_node=False)
  layer: Int[Array, ""] | None = None

  @property
  def capacity(self) -> int:
    return self.rest_k.shape[-2]

  def own_rest(self) -> tuple[Float[Array, "B K R H"], Float[Array, "B K R H"]]:
    """This layer's rest keys and values."""
    if self.layer is None:
      return self.rest_k, self.rest_v
    return self.rest_k[self.layer], self.rest_v[self.layer]

  def append(self, k_new: Float[Array, "B K H"], v_new: Float[Array, "B K H"]) -> "LayerCache":
    """Writes one token per request at `rest_len` and counts it."""
    return append_to_rest(self, k_new, v_new)


def append_to_rest(layer, k_new: Float[Array, "B K H"], v_new: Float[Array, "B K H"]):
  """A layer view (anything with rest_k, rest_v, rest_len, and perhaps a stacked `layer`) with one more
  token per request."""
  if getattr(layer, "layer", None) is not None:  # [L, B, K, R, H]: one scatter into the stacked segment
    rows = jnp.arange(layer.rest_len.shape[0])

    def write(buf, x):
      return buf.at[layer.layer, rows, :, layer.rest_len, :].set(x.astype(buf.dtype), mode="drop")
  else:
    def write(buf, x):
      update = jax.vmap(lambda b, y, p: jax.lax.dynamic_update_slice_in_dim(b, y[:, None], p, axis=1))
      return update(buf, x.astype(buf.dtype), layer.rest_len)
  return layer.replace(rest_k=write(layer.rest_k, k_new), rest_v=write(layer.rest_v, v_new),
                       rest_len=layer.rest_len + 1)


@struct.dataclass
class KVCache:
  k_pools: tuple[Pool, Pool, Pool]
  v_pools: tuple[Pool, Pool, Pool]
  offsets: Int[Array, "3 L"]
  counts: Int[Array, "3 L"]
  rest_k: Float[Array, "L B K R H"]
  rest_v: Float[Array, "L B K R H"]
  rest_len: Int[Array, "B"]
  window_size: int = struct.field(pytree_node=False)
  # Per pool, the windows the XLA path slices for a layer (a bucket of the largest count).
  slice_windows: tuple[int, int, int] = struct.field(pytree_node=False)

  @property
  def num_layers(self) -> int:
    return self.rest_k.shape[0]

  @property
  def capacity(self) -> int:
    """Rest tokens a request can hold, generated ones included."""
    return self.rest_k.shape[3]

  @property
  def nbytes(self) -> int:
    """Exact device bytes of every array the cache holds."""
    return sum(int(x.size) * x.dtype.itemsize for x in jax.tree_util.tree_leaves(self))

  def layer(self, l, *, stacked: bool = False) -> LayerCache:
    """Layer l's view; `stacked`: over every layer's rest segment (see LayerCache), as decode takes it."""
    rest_k, rest_v = (self.rest_k, self.rest_v) if stacked else (self.rest_k[l], self.rest_v[l])
    return LayerCache(
        k_pools=self.k_pools, v_pools=self.v_pools,
        offsets=self.offsets[:, l], counts=self.counts[:, l],
        rest_k=rest_k, rest_v=rest_v, rest_len=self.rest_len,
        window_size=self.window_size, slice_windows=self.slice_windows,
        layer=jnp.asarray(l, jnp.int32) if stacked else None,
    )

  def replace_layer(self, l, layer: LayerCache) -> "KVCache":
    """Takes back a layer's rest segment (the pools are read-only during decode)."""
    if layer.layer is not None:
      return self.replace(rest_k=layer.rest_k, rest_v=layer.rest_v)
    return self.replace(rest_k=self.rest_k.at[l].set(layer.rest_k), rest_v=self.rest_v.at[l].set(layer.rest_v))

  def advance(self) -> "KVCache":
    """Counts the token that every layer has just appended."""
    return self.replace(rest_len=self.rest_len + 1)


# ----------------------------------------------------------------------------- layout (host side)


@struct.dataclass
class Layout:
  """Where every window and rest token of a prefill goes; computed on the host from the plan."""
  pool_sources: tuple[np.ndarray, np.ndarray, np.ndarray]  # per pool, flat (layer * W + window), padded
  offsets: np.ndarray  # int32 [3, L]
  counts: np.ndarray  # int32 [3, L]
  rest_sources: np.ndarray  # int32 [B, R0]: the prefill position of each rest token
  rest_len: np.ndarray  # int32 [B]


def plan_layout(plan, *, visual_start: int, num_visual: int, seq_lens: Sequence[int], window_size: int) -> Layout:
  """Reorders windows by bit width (stable) and lists the rest tokens of each request."""
  plan = np.asarray(plan, np.int32)
  num_layers, num_windows = plan.shape
  if num_windows != num_visual // window_size:
    raise ValueError(f"plan has {num_windows} windows, but {num_visual} visual tokens make "
                     f"{num_visual // window_size} windows of {window_size}")
  bad = ~np.isin(plan, POOL_BITS)
  if bad.any():
    raise ValueError(f"plan values must be in {POOL_BITS}; found {sorted(set(plan[bad].tolist()))}")
  sources, offsets, counts = [], [], []
  for bits in POOL_BITS:
    chosen = (plan == bits).reshape(-1)
    flat = np.nonzero(chosen)[0].astype(np.int32)  # layer-major, original order within a layer
    padded = np.zeros(bucket(flat.size), np.int32)
    padded[: flat.size] = flat
    sources.append(padded)
    count = (plan == bits).sum(axis=1).astype(np.int32)
    counts.append(count)
    offsets.append((np.cumsum(count) - count).astype(np.int32))
  windows_end = visual_start + num_windows * window_size
  visual_end = visual_start + num_visual
  rest_rows = []
  for n in seq_lens:
    if n < visual_end:
      raise ValueError(f"a sequence of {n} tokens cannot hold visual tokens up to {visual_end}")
    rest_rows.append(np.r_[np.arange(visual_start), np.arange(windows_end, n)])
  rest_len = np.array([len(r) for r in rest_rows], np.int32)
  width = round_up(max(int(rest_len.max()), 1), REST_ALIGN)
  rest_sources = np.zeros((len(rest_rows), width), np.int32)
  for b, row in enumerate(rest_rows):
    rest_sources[b, : len(row)] = row
  return Layout(tuple(sources), np.stack(offsets), np.stack(counts), rest_sources, rest_len)


# ----------------------------------------------------------------------------- building


def build_cache(
    keys: Float[Array, "L B K T H"],
    values: Float[Array, "L B K T H"],
    plan,
    *,
    visual_start: int,
    num_visual: int,
    seq_lens: Sequence[int],
    max_new_tokens: int,
    window_size: int = 32,
    value_channel_group: int = 0,
    meta_dtype=jnp.float16,
) -> KVCache:
  """Reorders and quantizes the prefill K/V by `plan` (int32[L, W], original order) in one jit.

  keys/values are post-RoPE and head-major; visual tokens are prefill positions
  [visual_start, visual_start + num_visual); request b has seq_lens[b] valid tokens.
  """
  plan = np.asarray(plan, np.int32)
  layout = plan_layout(plan, visual_start=visual_start, num_visual=num_visual,
                       seq_lens=seq_lens, window_size=window_size)
  capacity = layout.rest_sources.shape[1] + max_new_tokens
  # Powers of two: the XLA path may read up to twice the windows, but recompiles rarely.
  slice_windows = tuple(min(bucket(int(c.max(initial=0)), mantissa_bits=0), len(s)) for c, s in
                        zip(layout.counts, layout.pool_sources))
  return _build(
      keys, values, tuple(jnp.asarray(s) for s in layout.pool_sources), jnp.asarray(layout.rest_sources),
      jnp.asarray(layout.rest_len), jnp.asarray(layout.offsets), jnp.asarray(layout.counts),
      visual_start=visual_start, num_windows=plan.shape[1],
      window_size=window_size, capacity=capacity, value_channel_group=value_channel_group,
      meta_dtype=jnp.dtype(meta_dtype), slice_windows=slice_windows)


@functools.partial(jax.jit, static_argnames=(
    "visual_start", "num_windows", "window_size", "capacity", "value_channel_group", "meta_dtype",
    "slice_windows"))
def _build(keys, values, pool_sources, rest_sources, rest_len, offsets, counts, *, visual_start, num_windows,
           window_size, capacity, value_channel_group, meta_dtype, slice_windows) -> KVCache:
  def windows_of(x):  # [L, B, K, T, H] -> [L*W, B, K, S, H]
    l, b, k, _, h = x.shape
    vis = jax.lax.slice_in_dim(x, visual_start, visual_start + num_windows * window_size, axis=3)
    vis = vis.reshape(l, b, k, num_windows, window_size, h)
    return vis.transpose(0, 3, 1, 2, 4, 5).reshape(l * num_windows, b, k, window_size, h)

  def pools_of(x, channel_group):
    win = windows_of(x)
    pools = []
    for bits, src in zip(POOL_BITS, pool_sources):
      g = jnp.take(win, src, axis=0).transpose(1, 2, 0, 3, 4)  # [B, K, P, S, H]
      pools.append(make_pool(g, bits, channel_group, x.dtype, meta_dtype))
    return tuple(pools)

  return KVCache(
      k_pools=pools_of(keys, 0), v_pools=pools_of(values, value_channel_group),
      offsets=offsets, counts=counts, rest_k=rest_segment(keys, rest_sources, rest_len, capacity),
      rest_v=rest_segment(values, rest_sources, rest_len, capacity), rest_len=rest_len,
      window_size=window_size, slice_windows=slice_windows)


def rest_segment(x: Float[Array, "L B K T H"], rest_sources, rest_len, capacity: int) -> Float[Array, "L B K R H"]:
  """Each request's non-window tokens, compacted to the front, zero past `rest_len`, `capacity` long."""
  r = jnp.take_along_axis(x, rest_sources[None, :, None, :, None], axis=3)
  valid = jnp.arange(rest_sources.shape[1])[None, :] < rest_len[:, None]
  r = jnp.where(valid[None, :, None, :, None], r, 0)
  return jnp.pad(r, [(0, 0)] * 3 + [(0, capacity - r.shape[3]), (0, 0)])


def make_pool(windows: Float[Array, "B K P S H"], bits: int, channel_group: int, dtype, meta_dtype) -> Pool:
  """Stores [B, K, P, S, H] windows at `bits` (16: as `dtype`) in the pool layout."""
  b, k, p, s, h = windows.shape
  if bits == 16:
    return Pool(windows.reshape(b, k, p * s, h).astype(dtype), None, None, bits=16)
  if channel_group:  # per token, over groups of `channel_group` channels (KIVI values)
    channel_group = min(channel_group, h)  # a head narrower than a group is one group
    if h % channel_group:
      raise ValueError(f"head dim {h} is not a multiple of the channel group {channel_group}")
    grouped = windows.reshape(b, k, p * s, h // channel_group, channel_group)
    q, scale, zero = quant.quantize_codes(grouped, bits, axis=-1, scale_dtype=meta_dtype)
    codes = quant.pack(q.reshape(b, k, p * s, h), bits)
    return Pool(codes, scale[..., 0], _minimum(scale, zero)[..., 0], bits=bits, channel_group=channel_group)
  q, scale, zero = quant.quantize_codes(windows, bits, axis=3, scale_dtype=meta_dtype)
  codes = quant.pack(q.reshape(b, k, p * s, h), bits)
  return Pool(codes, scale[:, :, :, 0], _minimum(scale, zero)[:, :, :, 0], bits=bits)


def _minimum(scale, zero):
  """-scale * zero-point in float32, stored in the metadata dtype: the value of code 0."""
  return (-scale.astype(jnp.float32) * zero.astype(jnp.float32)).astype(scale.dtype)


# ----------------------------------------------------------------------------- reading back


def pool_window_values(pool: Pool, head_dim: int, window_size: int) -> Float[Array, "B K P*S H"]:
  """Dequantizes a whole pool (tests and the dequantize-then-attend baseline)."""
  if pool.bits == 16:
    return pool.data.astype(jnp.float32)
  codes = quant.unpack(pool.data, pool.bits, head_dim).astype(jnp.float32)
  b, k, t, h = codes.shape
  if pool.channel_group:
    g = pool.channel_group
    x = codes.reshape(b, k, t, h // g, g)
    x = pool.scale.astype(jnp.float32)[..., None] * x + pool.minimum.astype(jnp.float32)[..., None]
    return x.reshape(b, k, t, h)
  x = codes.reshape(b, k, t // window_size, window_size, h)
  x = pool.scale.astype(jnp.float32)[:, :, :, None] * x + pool.minimum.astype(jnp.float32)[:, :, :, None]
  return x.reshape(b, k, t, h)


def dequantized_layer(cache: KVCache, l: int):
  """Layer l's keys, values and validity as plain arrays, in cache order (pools, then rest).

  Returns (k [B, K, T, H], v [B, K, T, H], valid [B, T]) in float32.
  """
  h = cache.rest_k.shape[-1]
  s = cache.window_size
  ks, vs, valid = [], [], []
  b = cache.rest_k.shape[1]
  for p in range(3):
    off, cnt = int(cache.offsets[p, l]), int(cache.counts[p, l])
    k = pool_window_values(cache.k_pools[p], h, s)[:, :, off * s: (off + cnt) * s]
    v = pool_window_values(cache.v_pools[p], h, s)[:, :, off * s: (off + cnt) * s]
    ks.append(k), vs.append(v), valid.append(jnp.ones((b, cnt * s), bool))
  ks.append(cache.rest_k[l].astype(jnp.float32))
  vs.append(cache.rest_v[l].astype(jnp.float32))
  valid.append(jnp.arange(cache.capacity)[None, :] < cache.rest_len[:, None])
  return jnp.concatenate(ks, axis=2), jnp.concatenate(vs, axis=2), jnp.concatenate(valid, axis=1)


def planned_bytes(plan, *, batch: int, kv_heads: int, head_dim: int, window_size: int, rest_tokens: int,
                  dtype=jnp.bfloat16, meta_dtype=jnp.float16, value_channel_group: int = 0) -> int:
  """Bytes of codes + metadata for exactly the planned windows, plus the rest segment, K and V."""
  plan = np.asarray(plan)
  item, meta = jnp.dtype(dtype).itemsize, jnp.dtype(meta_dtype).itemsize
  per_head = 0
  for bits in POOL_BITS:
    n = int((plan == bits).sum())
    tokens = n * window_size
    if bits == 16:
      per_head += 2 * tokens * head_dim * item
      continue
    codes = tokens * quant.packed_length(head_dim, bits)
    k_meta = 2 * n * head_dim * meta
    v_meta = 2 * tokens * (head_dim // value_channel_group) * meta if value_channel_group else k_meta
    per_head += 2 * codes + k_meta + v_meta
  per_head += 2 * plan.shape[0] * rest_tokens * head_dim * item
  return batch * kv_heads * per_head
