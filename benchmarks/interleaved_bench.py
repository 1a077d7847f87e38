"""What the reorder buys: one layer's decode attention over the same windows, reordered and unreordered.

For each batch and plan (Qwen2-7B attention: 4 KV heads, 7 query heads each, head dim 128, window 32, bf16),
random keys and values are quantized by one random plan (the plan's shares of 16-bit, INT4 and INT2 windows
at random positions) into both layouts:
  - `reordered`: the WindowQuant cache (`cache.build_cache`) under the default `"pallas"` path;
  - `paged (default)`: ablation C's unreordered heap under `interleaved_decode` as `"pallas"` runs it (since
    session 41 its INT4 and INT2 windows through the Mosaic kernel's page table at >= 128 pairs on JAX >= 0.11);
  - `paged triton, W warps / S stages`: the same with every format through the Triton paged kernel, a row a
    tiling;
  - `xla reader`: ablation C's heap under XLA's every-format reader (what C ran before session 40).
Each row: the median time a call (`--calls` calls dispatched back to back, one wait, so the host's dispatch
overlaps the GPU), the cache's bytes read (`nbytes` of each layout: the heap is the records plus padding),
bandwidth, its fraction of the copy (torch's device-to-device copy, measured in the same run) and the largest
difference from the reordered path's output (same windows, same codes: rounding only).

    PYTHONPATH=. python benchmarks/interleaved_bench.py --batches 32 --tokens 19968 --plans mix int2
"""
from __future__ import annotations

import argparse
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from benchmarks.harness import best_copy_TBps, copy_bandwidth, write_results
from pallas_kernels import quantized_decode as qd
from pallas_kernels.interleaved_decode import interleaved_decode
from wq_jax import attention, cache
from wq_jax.interleaved import build_interleaved_cache, interleaved_attention

HEADS, KV_HEADS, HEAD_DIM, WINDOW, TEXT = 28, 4, 128, 32, 64
PLANS = {"fp16": (1.0, 0.0, 0.0), "mix": (0.15, 0.35, 0.5), "int4": (0.0, 1.0, 0.0), "int2": (0.0, 0.0, 1.0)}


def random_plan(windows: int, shares, seed: int) -> np.ndarray:
  """[1, W]: the plan's shares of 16, 4 and 2 bits at random positions."""
  n16, n4 = round(shares[0] * windows), round(shares[1] * windows)
  plan = np.array([16] * n16 + [4] * n4 + [2] * (windows - n16 - n4), np.int32)
  return np.random.default_rng(seed).permutation(plan)[None]


def caches(batch: int, tokens: int, plan_name: str, seed: int = 0):
  """Both layouts of one layer quantized by one plan, and the query."""
  windows = (tokens - TEXT) // WINDOW
  t = TEXT + windows * WINDOW
  key = jax.random.split(jax.random.PRNGKey(seed), 3)
  k = jax.random.normal(key[0], (1, batch, KV_HEADS, t, HEAD_DIM), jnp.bfloat16)
  v = jax.random.normal(key[1], (1, batch, KV_HEADS, t, HEAD_DIM), jnp.bfloat16)
  plan = random_plan(windows, PLANS[plan_name], seed)
  args = dict(visual_start=TEXT // 2, num_visual=windows * WINDOW, seq_lens=[t] * batch, max_new_tokens=16,
              window_size=WINDOW)
  reordered = cache.build_cache(k, v, plan, **args)
  unreordered = build_interleaved_cache(k, v, plan, **args)
  del k, v
  q = jax.random.normal(key[2], (batch, HEADS, HEAD_DIM), jnp.bfloat16)
  return reordered, unreordered, q


def seconds_a_call(fn, *args, calls: int, repeats: int = 5) -> float:
  jax.block_until_ready(fn(*args))
  times = []
  for _ in range(repeats):
    start = time.perf_counter()
    out = [fn(*args) for _ in range(calls)]
    jax.block_until_ready(out)
    times.append((time.perf_counter() - start) / calls)
  return float(np.median(times))


def layer_bytes(c) -> int:
  """The bytes a layer's call reads: the cache's arrays (one layer here), rest segment included."""
  return sum(int(x.size) * x.dtype.itemsize for x in jax.tree_util.tree_leaves(c)
             if hasattr(x, "dtype") and x.ndim >= 3)


def main():
  ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  ap.add_argument("--batches", type=int, nargs="+", default=[32])
  ap.add_argument("--tokens", type=int, default=19968)
  ap.add_argument("--plans", nargs="+", default=["mix", "int2"], choices=list(PLANS))
  ap.add_argument("--tilings", nargs="*", default=["4,2,8,1"],
                  help="paged kernel: warps,stages[,programs a multiprocessor the split count plans for[,windows a "
                       "quantized step]]")
  ap.add_argument("--calls", type=int, default=20)
  ap.add_argument("--xla", action="store_true", help="time XLA's every-format reader too (slow)")
  ap.add_argument("--out", default=str(Path(__file__).parent / "results"))
  ap.add_argument("--tag", default="interleaved")
  args = ap.parse_args()

  copy = copy_bandwidth()
  copy_tbps = best_copy_TBps(copy)
  scale = HEAD_DIM ** -0.5
  rows = []
  for batch in args.batches:
    for plan in args.plans:
      reordered, unreordered, q = caches(batch, args.tokens, plan)
      r_layer, c_layer = reordered.layer(0, stacked=True), unreordered.layer(0)
      qg = (q.astype(jnp.float32) * scale).reshape(batch, KV_HEADS, HEADS // KV_HEADS, HEAD_DIM)
      want = jax.jit(lambda q, l: attention.decode_attention(q, l, implementation="pallas"))(q, r_layer)
      runs = [("reordered (pallas)", reordered, lambda q, qg, r, c: attention.decode_attention(
          q, r, implementation="pallas")),
              ("paged (default)", unreordered, lambda q, qg, r, c: interleaved_decode(qg, c))]
      for tiling in args.tilings:
        warps, stages, *rest = (int(x) for x in tiling.split(","))
        programs = rest[0] if rest else qd.DecodeConfig().programs_per_multiprocessor
        windows = rest[1] if len(rest) > 1 else 1
        config = qd.DecodeConfig(num_warps=warps, num_stages=stages, programs_per_multiprocessor=programs,
                                 tile_windows=windows)
        runs.append((f"paged triton, {warps} warps / {stages} stages / {programs} a multiprocessor / {windows} "
                     "windows a step", unreordered,
                     lambda q, qg, r, c, config=config: interleaved_decode(qg, c, config=config, mosaic=())))
      if args.xla:
        runs.append(("xla reader", unreordered, lambda q, qg, r, c: interleaved_attention(qg, c)))
      for name, layout, fn in runs:
        f = jax.jit(fn)
        try:
          seconds = seconds_a_call(f, q, qg, r_layer, c_layer, calls=args.calls)
          out = f(q, qg, r_layer, c_layer).reshape(want.shape)
          err = float(jnp.max(jnp.abs(out.astype(jnp.float32) - want.astype(jnp.float32))))
        except Exception as e:  # a tiling that does not compile is a result too
          rows.append(dict(batch=batch, tokens=args.tokens, plan=plan, reader=name, error=repr(e)[:160]))
          print(rows[-1], flush=True)
          continue
        nbytes = layer_bytes(layout.layer(0) if name.startswith("reordered") else c_layer)
        rows.append(dict(batch=batch, tokens=args.tokens, plan=plan, reader=name, us=seconds * 1e6,
                         MB=nbytes / 1e6, TBps=nbytes / seconds / 1e12,
                         pct_copy=100 * nbytes / seconds / 1e12 / copy_tbps, max_abs_diff=err))
        print(rows[-1], flush=True)
      del reordered, unreordered
  notes = (f"- copy bandwidth: {copy}\n- one layer, Qwen2-7B attention shapes, window 32, bf16 values, f16 scales; "
           "the same random plan and codes in both layouts; µs a call: median of 5 repeats of "
           f"{args.calls} calls dispatched back to back\n- reordered: the default `\"pallas\"` path (Mosaic INT2 "
           "kernel at >= 128 pairs on JAX >= 0.11, Triton otherwise); paged: `interleaved_decode` (default: its INT4 "
           "and INT2 windows through the Mosaic kernel's page table where the reordered pools take that kernel; "
           "triton: every format through the Triton paged kernel)")
  path = write_results(f"interleaved_{args.tag}", rows,
                       ["batch", "tokens", "plan", "reader", "us", "MB", "TBps", "pct_copy", "max_abs_diff", "error"],
                       "Decode attention, reordered against unreordered (ablation C) layouts", notes,
                       Path(args.out))
  print(path)


if __name__ == "__main__":
  main()
