"""Decode attention over a layer of the three-segment cache, by registered implementation.

Axes: B batch, N query heads, K KV heads, G query heads per KV head, H head dim,
W windows, S window size, T tokens, C channel groups.

The XLA implementation is written in the kernels' factored form (SPEC §3):
for a quantized key window (k_hat = s k + m, m = -s z the stored minimum),
q . k_hat = sum_c (q_c s_c) k_c + sum_c q_c m_c, so the scales fold into q and
the codes need only an int -> float conversion; for values,
sum_t p_t (s_c v_tc + m_c) = s_c sum_t p_t v_tc + m_c sum_t p_t.
One softmax runs over the logits of every segment at once (SPEC Eqs. 12-13).
"""
from __future__ import annotations

import dataclasses
import functools
import math
import warnings
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import PartitionSpec as P
from jaxtyping import Array, Float

from wq_jax import quant
from wq_jax.cache import LayerCache, Pool
from wq_jax.interleaved import InterleavedLayer, interleaved_attention

AttentionFn = Callable[..., jax.Array]
_IMPLEMENTATIONS: dict[str, AttentionFn] = {}


_SCALES_Q: set[str] = set()


def register(name: str, *, scales_q: bool = False):
  """Registers a decode-attention implementation: fn(q [B,K,G,H] pre-scaled float32, layer) -> [B,K,G,H];
  with `scales_q`, fn(q [B,K,G,H] as given, layer, scale=...) scales q itself (a kernel does it as it
  loads q, saving a launch of its own at small sizes)."""
  def wrap(fn):
    _IMPLEMENTATIONS[name] = fn
    if scales_q:
      _SCALES_Q.add(name)
    return fn
  return wrap


def implementations() -> tuple[str, ...]:
  return tuple(sorted(_IMPLEMENTATIONS))


@dataclasses.dataclass(frozen=True)
class PerShard:
  """A registered implementation run on each device's shard of `mesh` under `shard_map`.

  XLA partitions the "xla" path by itself, but not a kernel: this runs one
  kernel a device on its requests ('data') and KV heads ('model').
  """
  name: str
  mesh: jax.sharding.Mesh


def _per_shard(fn, mesh, layer: LayerCache):
  axes = mesh.axis_names
  batch, heads = ("data" if "data" in axes else None), ("model" if "model" in axes else None)
  split = P(batch, heads)
  specs = jax.tree_util.tree_map(lambda _: split, layer).replace(offsets=P(), counts=P(), rest_len=P(batch))
  if getattr(layer, "layer", None) is not None:  # the stacked rest segment: [L, B, K, R, H]
    specs = specs.replace(rest_k=P(None, batch, heads), rest_v=P(None, batch, heads), layer=P())
  return jax.shard_map(fn, mesh=mesh, in_specs=(split, specs), out_specs=split, check_vma=False)


def decode_attention(
    q: Float[Array, "B N H"],
    layer: LayerCache,
    *,
    scale: float | None = None,
    implementation: str | PerShard = "xla",
) -> Float[Array, "B N H"]:
  """softmax(q K^T * scale) V over every segment of one layer, for one new token a request."""
  mesh = None
  if isinstance(implementation, PerShard):
    implementation, mesh = implementation.name, implementation.mesh
  if implementation not in _IMPLEMENTATIONS:
    if implementation == "pallas":
      import pallas_kernels.registration  # noqa: F401  (registers "pallas" on import)
    if implementation not in _IMPLEMENTATIONS:
      raise ValueError(f"unknown attention implementation {implementation!r}; known: {implementations()}")
  b, n, h = q.shape
  k = layer.rest_k.shape[-3]
  if n % k:
    raise ValueError(f"{n} query heads are not a multiple of {k} KV heads")
  scale = 1.0 / math.sqrt(h) if scale is None else scale
  fn = _IMPLEMENTATIONS[implementation]
  if implementation in _SCALES_Q and not isinstance(layer, InterleavedLayer):
    qg, fn = q.reshape(b, k, n // k, h), functools.partial(fn, scale=scale)
  else:
    qg = (q.astype(jnp.float32) * scale).reshape(b, k, n // k, h)
  if isinstance(layer, InterleavedLayer):
    out = _interleaved(qg, layer, implementation, mesh)
  elif mesh is not None:
    out = _per_shard(fn, mesh, layer)(qg, layer)
  else:
    out = fn(qg, layer)
  return out.reshape(b, n, h).astype(q.dtype)


def _interleaved(qg, layer: InterleavedLayer, implementation: str, mesh) -> jax.Array:
  """Ablation C's unreordered layout: its paged Pallas kernel under any "pallas" name, XLA's reader (every
  window in every format, selected per window) otherwise, under a mesh (XLA partitions it itself), and for
  caches the kernel cannot read (float32 models: said once, as a warning)."""
  if implementation.startswith("pallas") and mesh is None:
    from pallas_kernels import interleaved_decode as paged
    reason = paged.unreadable(layer, qg.shape[-1], interpret=jax.default_backend() == "cpu")
    if reason is None:  # "pallas:triton": the Triton paged kernel for every format, as for the pools
      from pallas_kernels.registration import CONFIGS  # a variant's Mosaic launches, as its pools take them
      return paged.interleaved_decode(qg, layer, mosaic=() if implementation == "pallas:triton" else None,
                                      mosaic_config=CONFIGS.get(implementation))
    warnings.warn(f"ablation C under {implementation!r}: the paged kernel cannot read this cache ({reason}); "
                  "XLA's reader instead", stacklevel=3)
  return interleaved_attention(qg, layer)


def _pool_slice(layer: LayerCache, p: int):
  """The windows of pool p that the XLA path reads for this layer, and which are the layer's.

  A fixed number of windows (`slice_windows[p]`) is sliced, starting where the
  layer's range starts (moved back if it would run off the end); windows
  outside [offset, offset + count) are masked.
  """
  n = layer.slice_windows[p]
  s = layer.window_size
  pool_windows = layer.k_pools[p].data.shape[2] // s
  start = jnp.clip(layer.offsets[p], 0, pool_windows - n)
  idx = start + jnp.arange(n)
  valid = (idx >= layer.offsets[p]) & (idx < layer.offsets[p] + layer.counts[p])
  return start, n, valid


def _slice_tokens(x, start_window, n, s):
  return jax.lax.dynamic_slice_in_dim(x, start_window * s, n * s, axis=2)


def _slice_windows(x, start_window, n):
  return jax.lax.dynamic_slice_in_dim(x, start_window, n, axis=2)


def _dense_logits(qg, keys):
  """q . k in float32 from operands in the cache's dtype: no float32 copy of the cache is made."""
  return jnp.einsum("BKGH,BKTH->BKGT", qg.astype(keys.dtype), keys, preferred_element_type=jnp.float32)


def _dense_output(p, values):
  return jnp.einsum("BKGT,BKTH->BKGH", p.astype(values.dtype), values, preferred_element_type=jnp.float32)


def _key_logits(qg, pool: Pool, start, n, s):
  """[B, K, G, n*S] logits of one pool slice, factored for quantized windows."""
  b, k, g, h = qg.shape
  data = _slice_tokens(pool.data, start, n, s)
  if pool.bits == 16:
    return _dense_logits(qg, data)
  codes = quant.unpack(data, pool.bits, h).astype(jnp.float32).reshape(b, k, n, s, h)
  sc = _slice_windows(pool.scale, start, n).astype(jnp.float32)  # [B, K, n, H]
  mn = _slice_windows(pool.minimum, start, n).astype(jnp.float32)
  qs = qg[:, :, :, None, :] * sc[:, :, None]  # [B, K, G, n, H]: scales folded into q
  logits = jnp.einsum("BKGWH,BKWSH->BKGWS", qs, codes)
  bias = jnp.einsum("BKGH,BKWH->BKGW", qg, mn)  # one bias per window
  return (logits + bias[..., None]).reshape(b, k, g, n * s)


def _value_output(p, pool: Pool, start, n, s, h):
  """sum_t p_t v_hat_t for one pool slice: p [B, K, G, n*S] -> [B, K, G, H]."""
  b, k, g, _ = p.shape
  data = _slice_tokens(pool.data, start, n, s)
  if pool.bits == 16:
    return _dense_output(p, data)
  codes = quant.unpack(data, pool.bits, h).astype(jnp.float32)  # [B, K, n*S, H]
  if pool.channel_group:  # per-token scales over channel groups: fold them into p
    c = pool.channel_group
    sc = _slice_tokens(pool.scale, start, n, s).astype(jnp.float32)  # [B, K, T, H/C]
    mn = _slice_tokens(pool.minimum, start, n, s).astype(jnp.float32)
    ps = p[..., None] * sc[:, :, None]  # [B, K, G, T, H/C]
    pv = jnp.einsum("BKGTH,BKTH->BKGH", jnp.repeat(ps, c, axis=-1), codes)
    bias = jnp.einsum("BKGT,BKTC->BKGC", p, mn)
    return pv + jnp.repeat(bias, c, axis=-1)
  sc = _slice_windows(pool.scale, start, n).astype(jnp.float32)  # [B, K, n, H]
  mn = _slice_windows(pool.minimum, start, n).astype(jnp.float32)
  pw = p.reshape(b, k, g, n, s)
  pv = jnp.einsum("BKGWS,BKWSH->BKGWH", pw, codes.reshape(b, k, n, s, h))
  return jnp.einsum("BKWH,BKGWH->BKGH", sc, pv) + jnp.einsum("BKWH,BKGW->BKGH", mn, pw.sum(-1))


@register("xla")
def _xla_attention(qg: Float[Array, "B K G H"], layer: LayerCache) -> Float[Array, "B K G H"]:
  b, k, g, h = qg.shape
  s = layer.window_size
  logits, masks, slices = [], [], []
  for p in range(3):
    if layer.slice_windows[p] == 0:
      continue
    start, n, valid = _pool_slice(layer, p)
    logits.append(_key_logits(qg, layer.k_pools[p], start, n, s))
    masks.append(jnp.broadcast_to(jnp.repeat(valid, s)[None], (b, n * s)))
    slices.append((p, start, n))
  rest_k, rest_v = layer.own_rest()
  logits.append(_dense_logits(qg, rest_k))
  masks.append(jnp.arange(rest_k.shape[2])[None, :] < layer.rest_len[:, None])
  sizes = [x.shape[-1] for x in logits]
  all_logits = jnp.concatenate(logits, axis=-1)
  mask = jnp.concatenate(masks, axis=-1)[:, None, None, :]
  probs = jax.nn.softmax(jnp.where(mask, all_logits, -jnp.inf), axis=-1)
  parts = jnp.split(probs, np.cumsum(sizes)[:-1].tolist(), axis=-1)
  out = _dense_output(parts[-1], rest_v)
  for part, (p, start, n) in zip(parts[:-1], slices):
    out = out + _value_output(part, layer.v_pools[p], start, n, s, h)
  return out


def reference_attention(q: Float[Array, "B N H"], k: Float[Array, "B K T H"], v: Float[Array, "B K T H"],
                        valid=None, scale: float | None = None) -> Float[Array, "B N H"]:
  """Plain softmax attention of one query token over [B, K, T, H] keys and values."""
  b, n, h = q.shape
  kh = k.shape[1]
  scale = 1.0 / math.sqrt(h) if scale is None else scale
  qg = q.astype(jnp.float32).reshape(b, kh, n // kh, h) * scale
  logits = jnp.einsum("BKGH,BKTH->BKGT", qg, k.astype(jnp.float32))
  if valid is not None:
    logits = jnp.where(valid[:, None, None, :], logits, -jnp.inf)
  probs = jax.nn.softmax(logits, axis=-1)
  return jnp.einsum("BKGT,BKTH->BKGH", probs, v.astype(jnp.float32)).reshape(b, n, h)
