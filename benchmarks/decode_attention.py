"""Decode attention over one layer of the three-pool cache: Pallas kernel vs cudnn, XLA and a copy.

Qwen2-7B attention shapes (28 query heads, 4 KV heads, head dim 128, bf16),
batch x tokens per sequence x plan. For each: the median time, the cache's
compressed bytes (`KVCache.nbytes` of a single-layer cache: codes, scales,
zeros, high-precision windows and the rest segment), the achieved bandwidth,
and the ratio to a device-to-device copy, to `jax.nn.dot_product_attention`
(cudnn) on an all-FP16 cache of the same tokens, and to the "xla"
dequantize-then-attend path, all measured in the same run.

    PYTHONPATH=. python benchmarks/decode_attention.py            # everything
    PYTHONPATH=. python benchmarks/decode_attention.py --check    # correctness only

Timing: each measurement runs `inner` independent calls inside one jit (one
dispatch, distinct queries, distinct data so that repeated calls do not read a
warm L2: the kernel's calls the layers of one cache of `inner` layers, read as
a decode step reads them; cudnn's a cache of their own), after a warm-up; the
median over repeats, divided by `inner`.
Writes JSON, a markdown table and a roofline PNG to --out.
"""
from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import math
import os
import platform
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

from benchmarks.harness import best_copy_TBps, copy_bandwidth
from pallas_kernels import mosaic_int2 as mi
from pallas_kernels import quantized_decode as qd
from pallas_kernels import registration
from wq_jax import attention, cache
from wq_jax.cache import KVCache, Pool

HEADS, KV_HEADS, HEAD_DIM, WINDOW = 28, 4, 128, 32
TEXT, NEW = 64, 16  # rest segment: text tokens, then room for generated ones
PLANS = {"fp16": (1.0, 0.0, 0.0), "mix": (0.15, 0.35, 0.5), "int4": (0.0, 1.0, 0.0), "int2": (0.0, 0.0, 1.0),
         "kivi2": (0.0, 0.0, 1.0), "kivi4": (0.0, 1.0, 0.0)}
L2_BYTES = 60e6


# ----------------------------------------------------------------------------- caches


def window_counts(tokens: int, plan: str) -> tuple[int, int, int]:
  windows = (tokens - TEXT) // WINDOW
  f16, f4, _ = PLANS[plan]
  n16 = round(f16 * windows)
  n4 = round(f4 * windows)
  return n16, n4, windows - n16 - n4


def synthetic_cache(key, batch: int, tokens: int, plan: str, layers: int = 1) -> KVCache:
  """A cache of `layers` layers (one by default) with random codes, scales and values, each layer's windows
  as many as the plan gives it, every layer's windows of a precision in one pool (as a model's cache holds
  them)."""
  counts = window_counts(tokens, plan)
  group = 32 if plan.startswith("kivi") else 0  # KIVI's values: a scale a token and group of 32 channels
  keys = iter(jax.random.split(key, 16))
  bk = (batch, KV_HEADS)

  def pool(bits, n, channel_group=0):
    n *= layers
    t = n * WINDOW
    if bits == 16:
      return Pool(jax.random.normal(next(keys), (*bk, t, HEAD_DIM), jnp.bfloat16), None, None, bits=16)
    meta = (*bk, t, HEAD_DIM // channel_group) if channel_group else (*bk, n, HEAD_DIM)
    codes = jax.random.bits(next(keys), (*bk, t, HEAD_DIM * bits // 8), jnp.uint8)
    scale = jax.random.uniform(next(keys), meta, jnp.float32, 0.02, 0.1).astype(jnp.float16)
    minimum = -scale * jax.random.randint(next(keys), meta, 0, 1 << bits).astype(jnp.float16)
    return Pool(codes, scale, minimum, bits=bits, channel_group=channel_group)

  k_pools = tuple(pool(bits, n) for bits, n in zip(cache.POOL_BITS, counts))
  v_pools = tuple(pool(bits, n, group if bits != 16 else 0) for bits, n in zip(cache.POOL_BITS, counts))
  rest_len = tokens - sum(counts) * WINDOW
  rest = lambda: jax.random.normal(next(keys), (layers, *bk, rest_len + NEW, HEAD_DIM), jnp.bfloat16)
  return KVCache(
      k_pools=k_pools, v_pools=v_pools,
      offsets=jnp.array(counts, jnp.int32)[:, None] * jnp.arange(layers, dtype=jnp.int32),
      counts=jnp.tile(jnp.array(counts, jnp.int32)[:, None], (1, layers)),
      rest_k=rest(), rest_v=rest(), rest_len=jnp.full((batch,), rest_len, jnp.int32),
      window_size=WINDOW, slice_windows=counts)


def copies(make, nbytes: int, inner: int):
  """Enough distinct inputs that `inner` calls in a row stream from HBM, not from L2."""
  n = max(1, min(inner, math.ceil(3 * L2_BYTES / max(nbytes, 1))))
  return [make(i) for i in range(n)]


# ----------------------------------------------------------------------------- timing


# XLA options every timed call is compiled with (`--compiler-options`): e.g. no command buffers, so that the host
# launches each kernel where XLA would update a CUDA graph's commands for each dispatch's new output buffers.
COMPILER_OPTIONS: dict = {}


def compile_calls(fn, inputs, queries, layered: bool = False):
  """fn(q, *inputs[i]) for each of the queries, in one compiled jit; and the seconds it took to compile.
  `layered`: inputs is [(cache,)] of as many layers as queries, and call i is fn(q, cache, layer=i)."""
  inner = len(queries)
  if layered:
    many = jax.jit(lambda ins, qs: [fn(qs[i], *ins[0], layer=i) for i in range(inner)])
  else:
    many = jax.jit(lambda ins, qs: [fn(qs[i], *ins[i % len(ins)]) for i in range(inner)])
  t0 = time.perf_counter()
  compiled = many.lower(inputs, queries).compile(COMPILER_OPTIONS or None)
  return compiled, time.perf_counter() - t0


def bench(fn, inputs, queries, repeats=7, compiled=None, layered=False):
  """Median seconds a call of fn(q, *inputs[i]) takes, from `len(queries)` calls in one jit."""
  inner = len(queries)
  compile_s = 0.0
  if compiled is None:
    compiled, compile_s = compile_calls(fn, inputs, queries, layered)
  outs = jax.block_until_ready(compiled(inputs, queries))
  finite = all(bool(jnp.isfinite(x).all()) for o in outs[:2] for x in jax.tree.leaves(o))
  times = []
  for _ in range(repeats):
    t0 = time.perf_counter()
    if BACK_TO_BACK:  # the host dispatches ahead, as a decode loop does; one wait at the end
      jax.block_until_ready([compiled(inputs, queries) for _ in range(BACK_TO_BACK)])
      times.append((time.perf_counter() - t0) / BACK_TO_BACK)
    else:
      jax.block_until_ready(compiled(inputs, queries))
      times.append(time.perf_counter() - t0)
  return float(np.median(times)) / inner, compile_s, finite, outs


def device_time(compiled, inputs, queries):
  """GPU time a call, from a profile of one dispatch of `len(queries)` calls: the kernels' summed
  durations, and the span from the first kernel's start to the last one's end (gaps included), each
  divided by the calls, with the kernels' names and shares. None where the profile has no GPU plane.

  At small sizes `bench` measures the host's dispatch of the jit (tens of µs a call), not the GPU.
  `compiled` comes from `compile_calls`, and has run before (no compilation inside the trace).
  """
  import glob
  import tempfile
  inner = len(queries)
  with tempfile.TemporaryDirectory() as tmp:
    with jax.profiler.trace(tmp):
      jax.block_until_ready(compiled(inputs, queries))
    files = glob.glob(os.path.join(tmp, "**", "*.xplane.pb"), recursive=True)
    if not files:
      return None
    data = jax.profiler.ProfileData.from_file(files[0])
  events = [e for plane in data.planes if plane.name.startswith("/device:GPU")
            for line in plane.lines if "stream" in line.name.lower() for e in line.events]
  if not events:
    return None
  kernels = {}
  for e in events:
    kernels[e.name] = kernels.get(e.name, 0.0) + e.duration_ns
  span = max(e.end_ns for e in events) - min(e.start_ns for e in events)
  top = sorted(kernels.items(), key=lambda kv: -kv[1])[:6]
  return dict(kernel_s=sum(kernels.values()) * 1e-9 / inner, span_s=span * 1e-9 / inner,
              kernels_a_call=len(events) / inner, top={name[:80]: ns * 1e-9 / inner for name, ns in top})


# Calls per timed dispatch where `--inner` fixes it: the clock then shows what a dispatch costs beyond its
# kernels (per call, it falls as 1 / inner where the cost is the dispatch's, not the calls').
INNER_CALLS: int | None = None
# Small calls (the default since s34; `--cache-a-call` for the old way): one cache of as many layers as the calls
# a dispatch, each call reading its layer as a decode step does, rather than a cache a call: a dispatch then passes
# ~20 arrays, not ~20 a call, whose handling on the host outlasted the GPU's work at batch 1 x 1k (H100, s34:
# 41.3 µs a call on the clock against 8.6 of GPU span, cudnn 21.0; layered 18.8 against cudnn's 17.0).
# cudnn keeps its FP16 [B, T, K, H] arrays a call (two plain arrays a call).
LAYERED = True
# Dispatches sent before one wait (`--back-to-back`), so the host's work a dispatch overlaps the GPU's: a
# clock time that excludes the wait's round trip (default 0: wait after each dispatch).
BACK_TO_BACK = 0


def inner_calls(nbytes: int) -> int:
  """Calls per timed dispatch: about 2 ms of work, at least 1, at most 32 (or `INNER_CALLS`)."""
  if INNER_CALLS:
    return INNER_CALLS
  est = nbytes / 3e12 + 5e-6
  return int(min(32, max(1, round(2e-3 / est))))


# ----------------------------------------------------------------------------- runs


def pallas_fn(config: qd.DecodeConfig | None, implementation: str = "pallas"):
  """The attention call to time: a registered implementation, or the kernel with tiling `config`."""
  if config is None:
    return lambda q, c, layer=0: attention.decode_attention(q, c.layer(layer, stacked=True),
                                                           implementation=implementation)

  def run(q, c, layer=0):
    b, n, h = q.shape
    qg = q.reshape(b, KV_HEADS, n // KV_HEADS, h)  # the kernel scales q, as the registered path has it do
    # As a registered name runs it: launches planned on a layer's tokens, not on a layered cache's whole pools
    # (until s35 this path passed no pool_tokens, so small calls on one cache of 32 layers planned their
    # launches as for 32 times the tokens: an INT4 launch apart at 1 x 8k, 8 x 1k and 8 x 8k)
    out = registration.layer_attention(qg, c.layer(layer, stacked=True), scale=h ** -0.5, config=config)
    return out.reshape(b, n, h).astype(q.dtype)
  return run


def xla_fn(q, c, layer=0):
  return attention.decode_attention(q, c.layer(layer), implementation="xla")


def cudnn_fn(q, k, v):
  return jax.nn.dot_product_attention(q[:, None], k, v, implementation="cudnn")[:, 0]


def queries(key, batch, inner):
  return [jax.random.normal(k, (batch, HEADS, HEAD_DIM), jnp.bfloat16) for k in jax.random.split(key, inner)]


def rel_err(a, b):
  a, b = a.astype(jnp.float32), b.astype(jnp.float32)
  return float(jnp.linalg.norm(a - b) / jnp.linalg.norm(b))


def _xla_error(row: dict) -> str:
  """The kernel's relative error against the "xla" path, or "-" where the row was not compared (a variant's
  plans after its first, which `--variants` runs without the XLA path)."""
  err = row.get("pallas_vs_xla_rel_err")
  return "-" if err is None else f"{err:.1e}"


def measure(batch, tokens, plan, *, key, config=None, with_xla=True, gpu_time=False):
  c0 = synthetic_cache(key, batch, tokens, plan)
  nbytes = c0.nbytes
  inner = inner_calls(nbytes)
  layered = LAYERED and inner > 1
  if layered:  # one cache, a layer a call (`LAYERED`)
    caches = [synthetic_cache(key, batch, tokens, plan, layers=inner)]
  else:
    caches = [c0] + copies(lambda i: jax.tree.map(
        lambda x: x + 0 if x.dtype != jnp.uint8 else x ^ jnp.uint8(i + 1), c0), nbytes, inner)[1:]
  qs = queries(jax.random.fold_in(key, 1), batch, inner)
  row = dict(batch=batch, tokens=tokens, plan=plan, bytes=nbytes, inner=inner, layered=layered,
             copies=inner if layered else len(caches),
             windows=list(window_counts(tokens, plan)), config=dataclasses.asdict(config or qd.DecodeConfig()),
             splits=qd.num_splits(batch, KV_HEADS, tokens, config or qd.DecodeConfig()))
  inputs = [(c,) for c in caches]
  compiled, comp = compile_calls(pallas_fn(config), inputs, qs, layered)
  t, _, finite, out = bench(pallas_fn(config), inputs, qs, compiled=compiled)
  row.update(pallas_s=t, pallas_compile_s=comp, pallas_finite=finite, pallas_TBps=nbytes / t / 1e12)
  if gpu_time:  # the kernels a call, from a profile: where a plan's launches spend it
    gpu = device_time(compiled, inputs, qs)
    row.update(pallas_gpu_s=gpu and gpu["kernel_s"], pallas_gpu_span_s=gpu and gpu["span_s"],
               pallas_gpu_top=gpu and gpu["top"])
  # Dequantized f32 copies of every pool: skip where they would not fit comfortably.
  if with_xla and 4 * batch * KV_HEADS * tokens * HEAD_DIM * 4 < 40e9:
    try:
      # One distinct cache a call: the dequantization does not depend on q, so shared caches would be CSE'd.
      k = min(inner, 4)
      t, comp, finite, ref = bench(xla_fn, inputs[:k], qs[:k], repeats=5, layered=layered)
      # the last call both ran: a layer other than the first where `layered` (its pools at an offset)
      row.update(xla_s=t, xla_compile_s=comp, xla_finite=finite, pallas_vs_xla_rel_err=rel_err(out[k - 1],
                                                                                               ref[k - 1]))
    except Exception as e:
      row["xla_error"] = repr(e)[:300]
  del caches
  return row


def cudnn_inputs(batch, tokens, *, key):
  """Distinct FP16 [B, T, K, H] caches and queries for `inner_calls` cudnn calls; and their bytes."""
  k1, k2 = jax.random.split(key)
  shape = (batch, tokens, KV_HEADS, HEAD_DIM)
  nbytes = 2 * math.prod(shape) * 2
  inner = inner_calls(nbytes)
  kv = copies(lambda i: (jax.random.normal(jax.random.fold_in(k1, i), shape, jnp.bfloat16),
                         jax.random.normal(jax.random.fold_in(k2, i), shape, jnp.bfloat16)), nbytes, inner)
  return kv, queries(jax.random.fold_in(key, 2), batch, inner), nbytes


def measure_cudnn(batch, tokens, *, key, gpu_time=False):
  """cudnn on the FP16 cache, timed as `measure` times the kernel: the clock, and with `gpu_time` its kernels'
  GPU time from a profile (so that small calls, whose clock is the host's dispatch, compare on the GPU too)."""
  kv, qs, nbytes = cudnn_inputs(batch, tokens, key=key)
  try:
    compiled, comp = compile_calls(cudnn_fn, kv, qs)
    t, _, finite, _ = bench(cudnn_fn, kv, qs, compiled=compiled)
    row = dict(cudnn_s=t, cudnn_bytes=nbytes, cudnn_compile_s=comp, cudnn_finite=finite,
               cudnn_TBps=nbytes / t / 1e12)
  except Exception as e:
    return dict(cudnn_error=repr(e)[:300], cudnn_bytes=nbytes)
  if gpu_time:
    gpu = device_time(compiled, kv, qs)
    row.update(cudnn_gpu_s=gpu and gpu["kernel_s"], cudnn_gpu_span_s=gpu and gpu["span_s"])
  return row


def small_call_inputs(batch, tokens, plan, *, key):
  """A synthetic cache, the calls a timed dispatch, distinct copies of the cache as (cache,) argument
  tuples, and that many queries."""
  c0 = synthetic_cache(key, batch, tokens, plan)
  inner = inner_calls(c0.nbytes)
  caches = [(c,) for c in [c0] + copies(lambda i: jax.tree.map(lambda x: x + 0 if x.dtype != jnp.uint8 else x, c0),
                                        c0.nbytes, inner)[1:]]
  return c0, inner, caches, queries(jax.random.fold_in(key, 1), batch, inner)


def time_parts(parts, qs):
  """Wall seconds a call (`bench`) and the GPU profile (`device_time`) of each (fn, inputs) in `parts`,
  each compiled once for both."""
  wall, profiles = {}, {}
  for name, (fn, inputs) in parts.items():
    compiled, _ = compile_calls(fn, inputs, qs)
    wall[name] = bench(fn, inputs, qs, compiled=compiled)[0]
    try:
      profiles[name] = device_time(compiled, inputs, qs)
    except Exception as e:  # the profile is extra information; the timing above stands without it
      profiles[name] = dict(error=repr(e)[:200])
  return wall, profiles


def breakdown(batch, tokens, plan, *, key):
  """Where a small call's time goes: the whole path, its pallas_calls alone, the combine alone, a
  one-kernel call (the per-call floor of this timing), and cudnn, each timed as in `measure`."""
  c0, inner, caches, qs = small_call_inputs(batch, tokens, plan, key=key)
  default = qd.DecodeConfig()
  apart = dataclasses.replace(default, int4_launch_min_tokens=0)
  one = dataclasses.replace(default, int4_launch=None)

  def kernels_only(config):  # the launches without the combine
    def run(q, c):
      layer = c.layer(0)
      b, n, h = q.shape
      qg = q.reshape(b, KV_HEADS, n // KV_HEADS, h)
      k_pools, v_pools = [tuple(registration._arrays(p, w) for p, w in zip(ps, layer.slice_windows))
                          for ps in (layer.k_pools, layer.v_pools)]
      return qd.partial_softmaxes(qg, k_pools, v_pools, layer.offsets, layer.counts, layer.rest_k, layer.rest_v,
                                  layer.rest_len, window_size=WINDOW, config=config, q_scale=h ** -0.5,
                                  interpret=jax.default_backend() == "cpu")
    return run

  o, m, l = kernels_only(default)(qs[0], c0)
  parts = {
      "whole path, INT4 pools in a launch of their own": (pallas_fn(apart), caches),
      "whole path, one launch": (pallas_fn(one), caches),
      "launches without the combine, INT4 apart": (kernels_only(apart), caches),
      "launch without the combine, one launch": (kernels_only(one), caches),
      "combine only": (lambda q, o, m, l: qd.combine_splits(o + q[0, 0, 0].astype(jnp.float32), m, l),
                       [(o, m, l)]),
      "one tiny kernel (per-call floor)": (lambda q, c: q * 2, caches),
      "cudnn (FP16 [B, T, K, H] cache)": (cudnn_fn, cudnn_inputs(batch, tokens, key=key)[0]),
  }
  rows, profiles = time_parts(parts, qs)
  for name, t in rows.items():
    print(f"breakdown B={batch} T={tokens} {plan}: {name}: {t * 1e6:.1f} us; device {profiles[name]}", flush=True)
  return dict(batch=batch, tokens=tokens, plan=plan, inner=inner, seconds=rows, device=profiles)


def phases_ab(batch, tokens, plan, *, key):
  """The whole path with a program a phase against a program running its phases in turn, and cudnn:
  wall time as in `measure` and GPU time from a profile (`device_time`)."""
  c0, inner, caches, qs = small_call_inputs(batch, tokens, plan, key=key)
  default = qd.DecodeConfig()
  parts = {"phases in parallel": (pallas_fn(dataclasses.replace(default, parallel_phases=True)), caches),
           "phases in turn": (pallas_fn(dataclasses.replace(default, parallel_phases=False)), caches),
           "cudnn": (cudnn_fn, cudnn_inputs(batch, tokens, key=key)[0])}
  # The main launch of the registered path, as quantized_decode.partial_softmaxes forms it: its tokens
  # (they set the split count) and its phases (FP16 + rest, then each quantized pool it holds).
  layer = c0.layer(0)
  hint = sum(layer.slice_windows) * WINDOW + layer.rest_k.shape[2]
  phases = 1 + sum(n > 0 for n in layer.slice_windows[1:])
  int4_tokens = layer.slice_windows[1] * WINDOW
  if int4_tokens and qd.int4_launch_pays(default, batch * KV_HEADS * int4_tokens):
    hint, phases = hint - int4_tokens, phases - 1
  wall, profiles = time_parts(parts, qs)
  row = dict(batch=batch, tokens=tokens, plan=plan, inner=inner, wall_s=wall,
             default_parallel=qd.phases_in_parallel(default, batch * KV_HEADS * qd.num_splits(
                 batch, KV_HEADS, hint, default), phases),
             gpu_s={name: (p or {}).get("span_s") for name, p in profiles.items()})
  print(f"phases B={batch} T={tokens} {plan}: wall " + ", ".join(f"{k} {v * 1e6:.1f}" for k, v in row["wall_s"].items())
        + " | gpu span " + ", ".join(f"{k} {v * 1e6:.1f}" for k, v in row["gpu_s"].items() if v), flush=True)
  return row


def correctness_checks():
  """Real quantized caches (build_cache on random K/V with outlier channels): pallas vs dequantize-then-attend."""
  rows = []
  cases = [dict(batch=3, kv=4, group=7, h=128, windows=40, group_c=0),
           dict(batch=1, kv=2, group=8, h=64, windows=33, group_c=0),
           dict(batch=2, kv=4, group=7, h=128, windows=24, group_c=32),
           dict(batch=3, kv=2, group=1, h=64, windows=20, group_c=16),
           dict(batch=1, kv=4, group=2, h=128, windows=9, group_c=0)]
  for i, case in enumerate(cases):
    key = jax.random.PRNGKey(100 + i)
    k1, k2, k3, k4 = jax.random.split(key, 4)
    tokens = 7 + case["windows"] * WINDOW + 45
    shape = (2, case["batch"], case["kv"], tokens, case["h"])
    offset = 3 * jax.random.normal(k3, (1, 1, case["kv"], 1, case["h"]))  # outlier channels
    k = (jax.random.normal(k1, shape) + offset).astype(jnp.bfloat16)
    v = jax.random.normal(k2, shape, jnp.bfloat16)
    rng = np.random.default_rng(i)
    plan = rng.choice([16, 4, 2], size=(2, case["windows"]), p=[0.15, 0.35, 0.5]).astype(np.int32)
    plan[1, :] = 2
    seq = [tokens - int(rng.integers(0, 30)) for _ in range(case["batch"])]
    c = cache.build_cache(k, v, plan, visual_start=7, num_visual=case["windows"] * WINDOW + 5, seq_lens=seq,
                          max_new_tokens=8, window_size=WINDOW, value_channel_group=case["group_c"])
    q = jax.random.normal(k4, (case["batch"], case["kv"] * case["group"], case["h"]), jnp.bfloat16)
    for l in range(2):
      got = jax.jit(lambda q, layer: attention.decode_attention(q, layer, implementation="pallas"))(q, c.layer(l))
      xla = jax.jit(lambda q, layer: attention.decode_attention(q, layer))(q, c.layer(l))
      want = attention.reference_attention(q.astype(jnp.float32), *cache.dequantized_layer(c, l))
      rows.append(dict(case=case, layer=l, finite=bool(jnp.isfinite(got).all()),
                       rel_err_vs_dequantized=rel_err(got, want), xla_rel_err_vs_dequantized=rel_err(xla, want)))
      print(f"check {case} layer {l}: pallas {rows[-1]['rel_err_vs_dequantized']:.2e} "
            f"xla {rows[-1]['xla_rel_err_vs_dequantized']:.2e} finite {rows[-1]['finite']}", flush=True)
  return rows


# Tilings as measured: t quantized windows a step, w warps a program, p resident programs an SM (for the
# split count), s pipeline stages, f factored form; INT4 pools take their own step (1) only in t2w4i1
# (the default then); each is pinned to the INT4 launch it was measured with.
_AS_MEASURED = dict(int4_tile_windows=None, int4_launch=None)
VARIANTS = {
    "v3_run3": qd.DecodeConfig(num_warps=8, programs_per_multiprocessor=4, round_to_waves=False, **_AS_MEASURED),
    "t2w8": qd.DecodeConfig(tile_windows=2, num_warps=8, programs_per_multiprocessor=1, **_AS_MEASURED),
    "t2w8f": qd.DecodeConfig(tile_windows=2, num_warps=8, programs_per_multiprocessor=1, factored=True,
                             **_AS_MEASURED),
    "t1w8": qd.DecodeConfig(tile_windows=1, num_warps=8, programs_per_multiprocessor=1, **_AS_MEASURED),
    "t4w8": qd.DecodeConfig(tile_windows=4, num_warps=8, programs_per_multiprocessor=1, **_AS_MEASURED),
    "t2w4": qd.DecodeConfig(tile_windows=2, num_warps=4, programs_per_multiprocessor=3, **_AS_MEASURED),
    "t2w4f": qd.DecodeConfig(tile_windows=2, num_warps=4, programs_per_multiprocessor=3, factored=True,
                             **_AS_MEASURED),
    "t4w4": qd.DecodeConfig(tile_windows=4, num_warps=4, programs_per_multiprocessor=2, **_AS_MEASURED),
    "t2w4_jnp": qd.DecodeConfig(tile_windows=2, num_warps=4, programs_per_multiprocessor=3, inline_asm=False,
                                **_AS_MEASURED),
    "t2w4s2": qd.DecodeConfig(tile_windows=2, num_warps=4, programs_per_multiprocessor=3, num_stages=2,
                              **_AS_MEASURED),
    "t1w4": qd.DecodeConfig(tile_windows=1, num_warps=4, programs_per_multiprocessor=4, **_AS_MEASURED),
    "t2w2": qd.DecodeConfig(tile_windows=2, num_warps=2, programs_per_multiprocessor=6, **_AS_MEASURED),
    "t1w2": qd.DecodeConfig(tile_windows=1, num_warps=2, programs_per_multiprocessor=8, **_AS_MEASURED),
    "t2w4i1": qd.DecodeConfig(tile_windows=2, int4_tile_windows=1, num_warps=4, programs_per_multiprocessor=3,
                              int4_launch=None),
    # INT4 pools in a launch of their own at 2 warps (t2w2's tiling, which ran INT4 alone fastest)
    "t2w4_i4w2": qd.DecodeConfig(int4_launch_min_tokens=0, int4_launch=qd.DecodeConfig(
        num_warps=2, tile_windows=2, int4_tile_windows=None, programs_per_multiprocessor=6)),
    # the same with the grid sized for the 4 programs that fit (224 registers at 2 warps, SASS of 2026-12-03)
    "t2w4_i4w2p4": qd.DecodeConfig(int4_launch_min_tokens=0, int4_launch=qd.DecodeConfig(
        num_warps=2, tile_windows=2, int4_tile_windows=None, programs_per_multiprocessor=4)),
    # the main launch's grid sized for 4 programs an SM: with q in bf16 it compiles to 128 registers (kernel_sass.py,
    # 2026-12-03), so four 4-warp programs fit (untimed)
    "p4_i4w2": qd.DecodeConfig(programs_per_multiprocessor=4, int4_launch_min_tokens=0),
    # the registered default, and the same with the grid sized for 4 programs an SM (the pip Triton's 128 registers
    # of 12:45; run 9, 2026-12-03: 171 against 155 µs, so XLA's Triton likely allocates more)
    "default": qd.DecodeConfig(),
    "p4": qd.DecodeConfig(programs_per_multiprocessor=4),
    # the softmax's running sum reduced across warps every step (the default defers it to the loop's end)
    "sum_a_step": qd.DecodeConfig(deferred_sum=False),
    # one warp a program: no exchange across warps a step (the row max and P stay in the warp's registers);
    # offline SASS (2026-12-03): INT2 1,029 instructions a 32-token step (32 a token against 40 at 4 warps),
    # INT4 1,106, 255 registers (8 programs an SM); at two windows a step the INT2 loop spills. Run 12
    # (15:34, batch 8 x 32k, µs, mix / int2 / int4): w1t1 279 / 335 / 184, w1t1s4 350 / 436 / 231,
    # w1t2 213 / 173 / 201, against the default's 167 / 132 / 125: far slower
    "w1t1": qd.DecodeConfig(num_warps=1, tile_windows=1, int4_tile_windows=None, programs_per_multiprocessor=8,
                            int4_launch=None),
    "w1t1s4": qd.DecodeConfig(num_warps=1, tile_windows=1, int4_tile_windows=None, programs_per_multiprocessor=8,
                              int4_launch=None, num_stages=4),
    "w1t2": qd.DecodeConfig(num_warps=1, tile_windows=2, int4_tile_windows=None, programs_per_multiprocessor=8,
                            int4_launch=None),
    # the partial softmaxes merged by one Pallas launch instead of XLA's four small kernels (end to end, 7B,
    # 2026-12-03 17:29: slower at 1 x 100 frames, a tie at 32 x 100; see DecodeConfig.fused_combine; its grid
    # has channel blocks since s33)
    "fused_combine": qd.DecodeConfig(fused_combine=True),
    # the INT2 pool through the Mosaic GPU kernel (JAX >= 0.11; pallas_kernels/mosaic_int2.py), the rest as the
    # default (2026-12-04 05:18, batch 8 x 32k: 150 µs on the mix against the default's 158)
    "mosaic_int2": qd.DecodeConfig(int2_mosaic=True),
    "mosaic_int2_bias": qd.MOSAIC_BIAS_IN_KERNEL,  # and the key minimums' biases in the kernel
    "mosaic_int2_keys": qd.MOSAIC_DEQUANTIZED_KEYS,  # and the keys dequantized in registers: no bias
    "mosaic_int2_lagged": qd.MOSAIC_LAGGED_MAX,  # and P against the maximum agreed so far (s23)
    "mosaic_int2_int4": qd.MOSAIC_INT2_INT4,  # that, and the INT4 pool in a Mosaic launch too (s23)
    "mosaic_int2_wg4": qd.MOSAIC_FOUR_WARPGROUPS,  # four programs a CTA, keys dequantized, lagged max (s23)
    "mosaic_int2_int4_wg4": dataclasses.replace(qd.MOSAIC_FOUR_WARPGROUPS, int4_mosaic=True),  # INT4 too (s23)
    "mosaic_int2_wg4_merged": qd.MOSAIC_FOUR_WARPGROUPS_MERGED,  # the two sets merged in one launch (s24)
    "mosaic_int2_wg4_pdl": qd.MOSAIC_FOUR_WARPGROUPS_PDL,  # launched under PDL (no faster, s24)
    "mosaic_int2_wg4_vregs": qd.MOSAIC_FOUR_WARPGROUPS_VREGS,  # V^T in registers: the large-batch default (s26)
    "mosaic_int2_wg4_vregs_int4": qd.MOSAIC_FOUR_WARPGROUPS_VREGS_INT4,  # that, and INT4 pools through it (s27)
    "mosaic_int2_wg4_lean": qd.MOSAIC_FOUR_WARPGROUPS_LEAN,  # permuted keys, copies by one warp (s27)
    "mosaic_int2_wg4_kivi": qd.MOSAIC_KIVI,  # that INT4 one, and KIVI's pools through the Mosaic kernel (s27)
    "mosaic_wg4_lean_all": qd.MOSAIC_LEAN_ALL,  # s28's kernel winners for INT2, INT4 and KIVI's pools
    "mosaic_wg4_lean_folded": qd.MOSAIC_LEAN_FOLDED,  # that, the magic number folded into the minimums (s30)
    "mosaic_wg4_lean_int4_keys": qd.MOSAIC_LEAN_INT4_KEYS,  # that, and INT4 pools' keys permuted (s30)
    "mosaic_wg4_lean_eight": qd.MOSAIC_LEAN_EIGHT,  # the folded one, its softmax on 8 columns (s31)
    "mosaic_wg4_lean_eight_vldsm": qd.MOSAIC_LEAN_EIGHT_VLDSM,  # that, V's INT2 codes by ldmatrix.trans (s35)
    "mosaic_wg4_kivi_scaled_p": qd.MOSAIC_KIVI_SCALED_P,  # that, KIVI's values from registers, P scaled (s37)
    "mosaic_four_splits": qd.MOSAIC_FOUR_SPLITS,  # s37's default: 4 splits at least (2 since s38, batch >= 45)
    "mosaic_paired": qd.MOSAIC_PAIRED,  # the default, two steps under one softmax (INT2 pools; s38; no faster, s39)
    "mosaic_wide": qd.MOSAIC_WIDE,  # s38's default: both wgmmas 16 columns wide (8 since s39)
    # s43, batch 8 x 32k: the large-batch default's Mosaic launches at 32 pairs (four warpgroups a CTA fill an SM's
    # registers, so the Triton launch's 16-bit programs cannot share it), and with CTAs of two warpgroups sized for
    # one a multiprocessor (116 registers offline), leaving half of each SM to the 16-bit launch beside it (and
    # that launch's grid sized for two programs an SM, not three). H100: two warpgroups no faster than four
    # (`results/decode_attention_s43_b8_wg2_h100.md`)
    "mosaic_default": qd.MOSAIC_DEFAULT,
    "triton_only": qd.TRITON_ONLY,  # "pallas:triton": the Triton kernel for every pool (the default at 32 pairs
                                    # until s43)
    "mosaic_wg2": qd.MOSAIC_TWO_WARPGROUPS,
    "mosaic_wg2_p2": dataclasses.replace(qd.MOSAIC_TWO_WARPGROUPS, programs_per_multiprocessor=2),
    "mosaic_wg2_int2": dataclasses.replace(qd.MOSAIC_TWO_WARPGROUPS, int4_mosaic=False),  # INT4 stays with Triton
    # s44: the default with its Triton launch ordered before the Mosaic ones (a data dependency), where batch 8's
    # all-INT2 profile on an H200 suggested the rest segment's small launch on the critical path (s45, H100: slower
    # but for batch 8's mixed plan)
    "triton_first": qd.DecodeConfig(triton_first=True),
    # s45: INT2 windows' pools with 3 and 4 pipeline stages (more bytes in flight; H100-slower in s36)
    "mosaic_s3": qd.MOSAIC_STAGES3,
    "mosaic_s4": qd.MOSAIC_STAGES4,
    "mosaic_spread": qd.MOSAIC_SPREAD,  # (s46) a group's copies issued by its warp g % 4 (the default since s47)
    "mosaic_warp0_copies": qd.MOSAIC_WARP0_COPIES,  # (s47) by its warp 0, as until s47
    "mosaic_no_vldsm": qd.MOSAIC_NO_VLDSM,  # (s48) V's INT2 codes by byte loads, as until s48 (ldmatrix.trans since)
    "mosaic_factored": qd.MOSAIC_FACTORED,  # (s49) INT2 windows' keys factored: scales in q's operand, minimums a bias
    "mosaic_wide_output": qd.MOSAIC_WIDE_OUTPUT,  # (s46) the partials 16 columns wide, 8 empty, as until s46
    "mosaic_kivi_wide": qd.MOSAIC_KIVI_WIDE,  # KIVI's INT2 pools' score wgmma 16 wide (until s46; since, 8)
    # s33: the large-batch configuration's merge as one program a (request, KV head) (the combine's grid before
    # its channel blocks), and as XLA's kernels
    "eight_combine_one_block": dataclasses.replace(qd.MOSAIC_LEAN_EIGHT, combine_channel_blocks=1),
    "eight_xla_merge": dataclasses.replace(qd.MOSAIC_LEAN_EIGHT, fused_combine=False),
    # s51: the merge's grid (channel blocks) and warps a program. s51's first runs named 4 warps (the default then)
    # "combine_b16", "combine_b16_w2" and "combine_b8_w2" for 16 blocks at 4 and 2 warps and 8 at 2; s33-s50's default
    # is combine_b8_w4 at batch 8 (32 pairs), combine_b4_w4 at 32 x 100 (128), combine_b2_w4 at batch 60 (240)
    **{f"combine_b{b}_w{w}": dataclasses.replace(qd.MOSAIC_DEFAULT, combine_channel_blocks=b, combine_warps=w)
       for b in (1, 2, 4, 8, 16, 32, 64) for w in (1, 2, 4)},
    # s51, batch 8 x 32k: the Triton launch (the 16-bit windows and the rest, ~80 MB at ~82 % of the copy where batch
    # 60's streams ~96 %) on other grids (12 splits by default there): 6 splits (800 keys a split at least), the grid
    # sized for 2, 4 or 6 programs an SM (8, 16, 24 splits), 4 pipeline stages; the Mosaic launches as the default's.
    # H100: the launch 33.7-35.3 µs against the default's 34.3, no grid faster (`results/s51_b8_triton_h100.md`)
    **{f"triton_{name}": dataclasses.replace(qd.MOSAIC_DEFAULT, **fields) for name, fields in (
        ("j6", dict(min_tokens_per_split=800)), ("p2", dict(programs_per_multiprocessor=2)),
        ("p4", dict(programs_per_multiprocessor=4)), ("p6", dict(programs_per_multiprocessor=6)),
        ("s4", dict(num_stages=4)))},
    # s51, batch 8 x 32k: the Mosaic launches' grids for two or three programs an SM (8 or 12 splits: 64 or 96
    # CTAs a pool, not 128), so that under the concurrent graph the INT2 and INT4 launches (and the Triton one)
    # can share the machine rather than each taking a wave of whole SMs in turn. H100, slower: GPU span 121.8 and
    # 106.2 µs against 99.6 serially, 111.5 and 112.7 against 106.8 concurrent (`results/s51_b8_variants*_h100.md`)
    "mosaic_p2": dataclasses.replace(qd.MOSAIC_DEFAULT, mosaic_programs_per_multiprocessor=2),
    "mosaic_p3": dataclasses.replace(qd.MOSAIC_DEFAULT, mosaic_programs_per_multiprocessor=3),
    # s52: a layer's Mosaic pools (batch 8 x 32k: INT2's 128 CTAs and INT4's 128) in one launch, each CTA its own
    # pool's kernel (`mosaic_int2.launch_together`), each pool's grid as alone (256 CTAs)
    "mosaic_one_launch": qd.MOSAIC_ONE_LAUNCH,
    # that with each pool's grid sized for 2 programs an SM (8 splits: 64 CTAs a pool, 128 in all, one wave): s51's
    # mosaic_p2 left half the SMs idle through each of its two launches; in one launch both pools share them. What
    # the default runs below 64 pairs since s52 (`mosaic_one_launch_shares_wave`); H100, batch 8 x 32k, serial span
    # 86.8-87.6 µs against 93.6-94.7 with a launch a pool (`results/s52_*_h100.md`, where "mosaic_default" was that)
    "mosaic_one_launch_p2": dataclasses.replace(qd.MOSAIC_ONE_LAUNCH, mosaic_programs_per_multiprocessor=2),
    "mosaic_separate": qd.MOSAIC_SEPARATE_LAUNCHES,  # a launch a Mosaic pool, as until s52
    # s53: the 16-bit windows and the rest in the Mosaic launch too (`mosaic_dense`), no Triton launch: their CTAs
    # (a quarter of the SMs; 3/8, a half) stream beside the quantized ones; two programs of two K/V slots a CTA, or
    # four of one (`w4`), or two of three (`s3`). H100, batch 8, serial span (s53's first form, `plain`): 32k 87.1 µs
    # against the default's 86.7 (s3 85.3), 16k 51.6 against 55.8 (`results/s53_dense_b8_*_h100.md`)
    "mosaic_dense": qd.MOSAIC_DENSE,
    **{f"mosaic_dense_{name}": dataclasses.replace(qd.MOSAIC_DENSE, **fields) for name, fields in (
        ("q3", dict(mosaic_dense_share=0.375)), ("half", dict(mosaic_dense_share=0.5)),
        ("w4", dict(mosaic_dense_working=4, mosaic_dense_stages=1)), ("s3", dict(mosaic_dense_stages=3)),
        # s53's second form: three programs of two slots a CTA; and its first (a reduction and a V wgmma waited for
        # a step, no lagged maximum)
        ("w3", dict(mosaic_dense_working=3)), ("w3_half", dict(mosaic_dense_working=3, mosaic_dense_share=0.5)),
        ("plain", dict(mosaic_dense_lagged_max=False, mosaic_dense_in_place=False)))},
    # s33: a program a phase at any grid size (by default only where that fits two waves), so that the 16-bit
    # phase's memory-bound programs and the INT2 phase's instruction-bound ones share the SMs at batch 8 x 32k
    "parallel_phases": qd.DecodeConfig(parallel_phases=True),
    "eight_parallel_phases": dataclasses.replace(qd.MOSAIC_LEAN_EIGHT, parallel_phases=True),
    # s34, batch 1 x 1k (a few programs a phase, each a step or two long: the launch, q's load, the pipeline's
    # fill and the merge are the time): fewer splits (256 or 512 keys at least, J = 4 or 2), two pipeline
    # stages, and one program a (request, KV head) running its phases in turn (one partial: the merge is a
    # division)
    "split256": qd.DecodeConfig(min_tokens_per_split=256),  # the default since s35
    "split128": qd.DecodeConfig(min_tokens_per_split=128),  # the default until s35 (J = 8 at 1k)
    "split512": qd.DecodeConfig(min_tokens_per_split=512),
    "stages2": qd.DecodeConfig(num_stages=2),
    "one_program": qd.DecodeConfig(min_tokens_per_split=1 << 30, parallel_phases=False),
    "mosaic_int2_block2": qd.DecodeConfig(  # two steps a pipeline iteration (untimed)
        int2_mosaic=True, mosaic_options=tuple(mi.VARIANTS["deferred_values_first_block2"].items())),
    # four INT2 windows a step (two programs an SM; run 10: 239 µs on the mix against the default's 147)
    "t4p2": qd.DecodeConfig(tile_windows=4, programs_per_multiprocessor=2),
    # exp2 as ex2.approx.f32, as XLA's Triton lowers jnp.exp2 (a compare and two predicated multiplies around
    # each MUFU.EX2: ncu, 2026-12-03); the default issues ex2.approx.ftz.f32 alone
    "exact_exp2": qd.DecodeConfig(fast_exp2=False),
    # Shared memory caps the main launch at 3 programs an SM (ncu, all-INT2 at batch 8 x 32k: 71.7 KB a program,
    # 128 registers, which would allow 4). The high-precision loop's 64-token tiles set it: at 32 tokens a step
    # it needs 37.9 KB (offline, pip Triton 3.9; 137 registers on the mix plan against 166), and with 2
    # pipeline stages 38.9 KB. Each with the grid sized for 4 programs an SM. Run 13 (17:40, batch 8 x 32k,
    # µs, mix / int2 / fp16): d32p4 152.6 / 128.9 / 166.3, s2p4 163.7 / 173.8 / 178.8, against the default's
    # 159.6 / 123.2 / 178.0; d32p4 then took 859 µs on the mix at batch 60 against the default's 745 (run 12)
    "d32p4": qd.DecodeConfig(dense_tokens=32, programs_per_multiprocessor=4),
    "s2p4": qd.DecodeConfig(num_stages=2, programs_per_multiprocessor=4),
    # 2 warps, one window a step for every pool (186 registers on the mix plan: 5 programs an SM)
    "t1w2p5": qd.DecodeConfig(tile_windows=1, int4_tile_windows=None, num_warps=2, programs_per_multiprocessor=5,
                              int4_launch=None),
}
# (batch, tokens) in the order a time-limited run measures them: the bars' configurations first.
PRIORITY = [(8, 32768), (1, 1024), (60, 32768), (1, 32768), (8, 131072), (8, 1024), (60, 1024), (8, 8192),
            (1, 8192), (60, 8192), (1, 131072), (60, 131072)]


# ----------------------------------------------------------------------------- report


def markdown(report) -> str:
  copy = best_copy_TBps(report["copy"])
  lines = [f"# Decode attention, one layer, {HEADS} q heads / {KV_HEADS} KV heads / head dim {HEAD_DIM}, bf16",
           "", f"- command: `{report['command']}`", f"- date: {report['date']}", f"- device: {report['device']}",
           f"- jax {report['jax']}; kernel: `implementation=\"pallas\"` (the default: Pallas Triton launches, and "
           "on JAX >= 0.11 the Mosaic GPU kernels of `pallas_kernels/mosaic_int2.py` for large quantized pools); "
           "variants are `VARIANTS`' tilings",
           "- timing: median of 7 timed repeats, each "
           + (f"{report['back_to_back']} dispatches sent back to back, then one wait" if report.get("back_to_back")
              else "one dispatch and a wait for it")
           + "; a dispatch is "
           + (f"{report['inner']} calls" if report.get("inner") else "`inner` calls (~2 ms of work)")
           + ("; the kernel's calls of a dispatch read the layers of one cache (the default since s34), cudnn's"
              " a cache each" if report.get("layered") else ""),
           "- copy bandwidth (bytes read + written): " + ", ".join(
               f"{k} {v:.2f} TB/s" for k, v in report["copy"].items() if k.endswith("TBps")),
           *([f"- XLA options of every timed call: `{json.dumps(report['compiler_options'])}`"]
             if report.get("compiler_options") else []),
           "- bytes: `KVCache.nbytes` of a single-layer cache (codes + f16 scales/minimums + bf16 windows + rest)",
           "- vs cudnn: cudnn time on an all-FP16 [B,T,K,H] cache of the same tokens / pallas time; "
           "byte ratio: those FP16 bytes / the plan's bytes", "",
           "| batch | tokens | plan | MB | pallas µs | TB/s | % copy | cudnn µs | vs cudnn | byte ratio "
           "| vs cudnn / byte ratio | xla µs | vs xla |",
           "| ---: | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
  for r in report["results"]:
    cud = r.get("cudnn_s")
    speed = cud / r["pallas_s"] if cud else float("nan")
    ratio = r["cudnn_bytes"] / r["bytes"]
    xla = r.get("xla_s")
    lines.append(
        f"| {r['batch']} | {r['tokens']} | {r['plan']} | {r['bytes'] / 1e6:.1f} | {r['pallas_s'] * 1e6:.1f} "
        f"| {r['pallas_TBps']:.2f} | {100 * r['pallas_TBps'] / copy:.0f} | "
        + (f"{cud * 1e6:.1f}" if cud else "-") + f" | {speed:.2f} | {ratio:.2f} | {speed / ratio:.2f} | "
        + (f"{xla * 1e6:.1f} | {xla / r['pallas_s']:.1f}" if xla else "- | -") + " |")
  timed = [r for r in report["results"] if r.get("pallas_gpu_span_s")]
  if timed:  # the same rows by GPU time (`--gpu-time`): span, first kernel's start to last one's end, a call
    lines += ["", "GPU time a call (span), from a profile of one dispatch:", "",
              "| batch | tokens | plan | pallas µs | TB/s | % copy | cudnn µs | vs cudnn | vs cudnn / byte ratio |",
              "| ---: | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for r in timed:
      t, cud = r["pallas_gpu_span_s"], r.get("cudnn_gpu_span_s")
      tbps = r["bytes"] / t / 1e12
      speed = cud / t if cud else float("nan")
      lines.append(f"| {r['batch']} | {r['tokens']} | {r['plan']} | {t * 1e6:.1f} | {tbps:.2f} | "
                   f"{100 * tbps / copy:.0f} | " + (f"{cud * 1e6:.1f}" if cud else "-")
                   + f" | {speed:.2f} | {speed / (r['cudnn_bytes'] / r['bytes']):.2f} |")
  if report.get("variants"):
    name = report.get("sweep_config", {}).get("name")
    first = next(iter(report["variants"].values()))
    shape = f"batch {first.get('batch', 8)}, {first.get('tokens', 32768) // 1024}k tokens"
    used = "the sweep above used the fastest" if report["results"] else "the fastest"
    lines += ["", f"## Tuning variants ({shape}; {used}: {name})", "",
              "| variant | plan | splits | pallas µs | TB/s | GPU µs (kernels) | GPU µs (span) | err vs xla "
              "| compile s |",
              "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for name, r in report["variants"].items():
      # Kernels summed, and first start to last end: they differ where kernels overlap (concurrent graphs)
      # or the GPU idles between them.
      gpu = " | ".join(f"{r[k] * 1e6:.1f}" if r.get(k) else "-" for k in ("pallas_gpu_s", "pallas_gpu_span_s"))
      lines.append(f"| {name} | {r['plan']} | {r.get('splits', '-')} | {r['pallas_s'] * 1e6:.1f} | "
                   f"{r['pallas_TBps']:.2f} | {gpu} | {_xla_error(r)} | "
                   f"{r['pallas_compile_s']:.1f} |")
  for b in report.get("breakdown", []):
    lines += ["", f"## Parts of a call: batch {b['batch']}, {b['tokens']} tokens, plan {b['plan']} "
              f"({b['inner']} calls a timed dispatch)", "",
              "| part | µs a call (wall) | GPU kernels µs a call | GPU span µs a call | kernels a call |",
              "| --- | ---: | ---: | ---: | ---: |"]
    for name, t in b["seconds"].items():
      d = (b.get("device") or {}).get(name) or {}
      gpu = (f"{d['kernel_s'] * 1e6:.1f} | {d['span_s'] * 1e6:.1f} | {d['kernels_a_call']:.1f}" if "kernel_s" in d
             else "- | - | -")
      lines.append(f"| {name} | {t * 1e6:.1f} | {gpu} |")
  if report.get("phases"):
    lines += ["", "## A program a phase, or one running its phases in turn (plan mix; µs a call)", "",
              "| batch | tokens | default | wall: parallel | wall: in turn | wall: cudnn | GPU: parallel "
              "| GPU: in turn | GPU: cudnn | GPU: default / cudnn |", "| ---: | ---: | --- |" + " ---: |" * 7]
    for r in report["phases"]:
      w, g = r["wall_s"], r["gpu_s"]
      names = ("phases in parallel", "phases in turn", "cudnn")
      gpu = [g.get(n) for n in names]
      ours = gpu[0] if r["default_parallel"] else gpu[1]
      best = ours / gpu[2] if ours and gpu[2] else float("nan")
      lines.append(f"| {r['batch']} | {r['tokens']} | {'parallel' if r['default_parallel'] else 'in turn'} | "
                   + " | ".join(f"{w[n] * 1e6:.1f}" for n in names) + " | "
                   + " | ".join(f"{x * 1e6:.1f}" if x else "-" for x in gpu) + f" | {best:.2f} |")
  return "\n".join(lines) + "\n"


def roofline(report, path):
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  fig, ax = plt.subplots(figsize=(7, 4.5))
  markers = {"fp16": "o", "mix": "s", "int2": "^", "kivi2": "v", "kivi4": "D"}
  for plan, mk in markers.items():
    rows = [r for r in report["results"] if r["plan"] == plan]
    if rows:
      ax.scatter([r["bytes"] for r in rows], [r["pallas_TBps"] for r in rows], marker=mk, label=f"pallas {plan}")
  rows = [r for r in report["results"] if r["plan"] == "fp16" and r.get("cudnn_s")]
  ax.scatter([r["cudnn_bytes"] for r in rows], [r["cudnn_bytes"] / r["cudnn_s"] / 1e12 for r in rows], marker="x",
             c="k", label="cudnn (fp16 cache)")
  for name, bw in report["copy"].items():
    if name.endswith("TBps"):
      ax.axhline(bw, ls="--", lw=1, c="gray")
      ax.annotate(name.replace("_TBps", ""), (0.01, bw), xycoords=("axes fraction", "data"), fontsize=7,
                  color="gray", va="bottom")
  ax.set_xscale("log")
  ax.set_xlabel("bytes read (compressed cache of one layer)")
  ax.set_ylabel("achieved bandwidth (TB/s)")
  ax.set_title("Decode attention on " + report["device"])
  ax.legend(fontsize=7)
  fig.tight_layout()
  fig.savefig(path, dpi=120)


def main(argv=None):
  ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  ap.add_argument("--batches", default="1,8,60")
  ap.add_argument("--tokens", default="1024,8192,32768,131072")
  ap.add_argument("--plans", default="fp16,mix,int2")
  ap.add_argument("--variants", default="", help="comma list of VARIANTS to time at --variant-shape")
  ap.add_argument("--variant-shape", default="8,32768", help="'batch,tokens' the variants are timed at")
  ap.add_argument("--variant-plans", default="mix", help="plans each variant is timed on (the first picks the best)")
  ap.add_argument("--check", action="store_true", help="run the correctness checks")
  ap.add_argument("--gpu-time", action="store_true", help="profile each sweep row's call: its kernels' GPU time")
  ap.add_argument("--no-sweep", action="store_true")
  ap.add_argument("--breakdown", action="store_true", help="time the parts of a batch-1 call at 1k tokens")
  ap.add_argument("--phases", default="", help="'batch,tokens;...': a program a phase against phases in turn")
  ap.add_argument("--budget-s", type=float, default=1e9, help="stop the sweep after this many seconds")
  ap.add_argument("--compiler-options", type=json.loads, default={},
                  help='XLA options of every timed call, as JSON: \'{"xla_gpu_enable_command_buffer": ""}\'')
  ap.add_argument("--inner", type=int, default=None, help="calls a timed dispatch (default: ~2 ms of work)")
  ap.add_argument("--back-to-back", type=int, default=0, help="dispatches a timed repeat sends before its wait")
  ap.add_argument("--cache-a-call", action="store_true",
                  help="small calls each read a cache of their own (before s34), not a layer of one (see LAYERED)")
  ap.add_argument("--layered", action="store_true", help="(the default since s34; kept for old commands)")
  ap.add_argument("--out", default="benchmarks/results")
  ap.add_argument("--tag", default="decode_attention")
  args = ap.parse_args(argv)
  COMPILER_OPTIONS.update(args.compiler_options)
  global INNER_CALLS, BACK_TO_BACK, LAYERED
  INNER_CALLS, BACK_TO_BACK, LAYERED = args.inner, args.back_to_back, not args.cache_a_call
  start = time.time()
  device = jax.devices()[0]
  report = dict(command="PYTHONPATH=. python " + " ".join(sys.argv),
                date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                device=f"{device.device_kind} ({device.platform})", jax=jax.__version__, host=platform.node(),
                compiler_options=args.compiler_options, back_to_back=args.back_to_back, inner=args.inner,
                layered=not args.cache_a_call,
                results=[], variants={}, checks=[], skipped=[], breakdown=[], phases=[])
  report["copy"] = copy_bandwidth() if device.platform == "gpu" else {"jnp_elementwise_TBps": float("nan")}
  print("copy", report["copy"], flush=True)
  os.makedirs(args.out, exist_ok=True)

  def save():
    with open(os.path.join(args.out, args.tag + ".json"), "w") as f:
      json.dump(report, f, indent=1)
    with open(os.path.join(args.out, args.tag + ".md"), "w") as f:
      f.write(markdown(report))

  if args.check:
    report["checks"] = correctness_checks()
    save()
  key = jax.random.PRNGKey(0)
  if args.breakdown:
    report["breakdown"] = [breakdown(1, 1024, plan, key=key) for plan in ("mix", "fp16")]
    save()
  for shape in filter(None, args.phases.split(";")):
    batch, tokens = map(int, shape.split(","))
    report["phases"].append(phases_ab(batch, tokens, "mix", key=key))
    save()
  best = None
  variant_plans = args.variant_plans.split(",")
  variant_batch, variant_tokens = map(int, args.variant_shape.split(","))
  for name in filter(None, args.variants.split(",")):
    config = VARIANTS[name]
    for plan in variant_plans:
      label = name if plan == variant_plans[0] else f"{name}+{plan}"
      try:
        r = report["variants"][label] = measure(variant_batch, variant_tokens, plan, key=key, config=config,
                                                with_xla=plan == variant_plans[0], gpu_time=args.gpu_time)
        print(f"variant {label}: {r['pallas_s'] * 1e6:.1f} us {r['pallas_TBps']:.2f} TB/s (compile "
              f"{r['pallas_compile_s']:.1f} s, err vs xla {_xla_error(r)})",
              flush=True)
        if label == name and (best is None or r["pallas_s"] < report["variants"][best]["pallas_s"]):
          best = name
      except Exception as e:
        report["variants"][label] = dict(plan=plan, error=repr(e)[:500], pallas_s=float("nan"),
                                         pallas_TBps=float("nan"), pallas_compile_s=float("nan"))
        print(f"variant {label} failed: {e!r}"[:800], flush=True)
      save()
  config = VARIANTS[best] if best else None
  report["sweep_config"] = dict(name=best or "default", **dataclasses.asdict(config or qd.DecodeConfig()))
  if best:
    for plan in [p for p in ("int2", "kivi2") if p not in variant_plans]:
      r = report["variants"][f"{best}+{plan}"] = measure(variant_batch, variant_tokens, plan, key=key, config=config,
                                                         with_xla=False)
      print(f"variant {best} on plan {plan}: {r['pallas_s'] * 1e6:.1f} us", flush=True)
  if not args.no_sweep:
    cudnn = {}
    wanted = [(b, t) for t in map(int, args.tokens.split(",")) for b in map(int, args.batches.split(","))]
    wanted.sort(key=lambda bt: PRIORITY.index(bt) if bt in PRIORITY else len(PRIORITY))
    for batch, tokens in wanted:
      for plan in args.plans.split(","):
        if time.time() - start > args.budget_s:
          report["skipped"].append((batch, tokens, plan))
          continue
        try:
          if (batch, tokens) not in cudnn:
            cudnn[batch, tokens] = measure_cudnn(batch, tokens, key=key, gpu_time=args.gpu_time)
          row = measure(batch, tokens, plan, key=key, config=config, gpu_time=args.gpu_time)
          row.update(cudnn[batch, tokens])
        except Exception as e:
          print(f"{batch} {tokens} {plan} failed: {e!r}"[:800], flush=True)
          report["skipped"].append((batch, tokens, plan, repr(e)[:300]))
          continue
        report["results"].append(row)
        cud = row.get("cudnn_s", float("nan"))
        xla = row.get("xla_s", float("nan"))
        print(f"B={batch} T={tokens} {plan}: {row['bytes'] / 1e6:.1f} MB pallas {row['pallas_s'] * 1e6:.1f} us "
              f"{row['pallas_TBps']:.2f} TB/s | cudnn {cud * 1e6:.1f} us | xla {xla * 1e6:.1f} us"
              f" | err vs xla {_xla_error(row)} "
              f"| compile {row['pallas_compile_s']:.1f} s", flush=True)
        if row.get("pallas_gpu_top"):
          print(f"  GPU {row['pallas_gpu_s'] * 1e6:.1f} us (span {row['pallas_gpu_span_s'] * 1e6:.1f}): "
                + ", ".join(f"{k} {v * 1e6:.1f}" for k, v in row["pallas_gpu_top"].items()), flush=True)
        save()
        jax.clear_caches()
    if report["results"]:
      roofline(report, os.path.join(args.out, args.tag + ".png"))
  save()
  print(markdown(report))
  print(f"total {time.time() - start:.0f} s")


if __name__ == "__main__":
  main()
