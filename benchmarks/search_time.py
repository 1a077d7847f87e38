"""Window-level against token-level search time, and reorder + quantize time (issue: Core, item 7).

LLaVA-OneVision-Qwen2-7B shapes: 196 visual tokens a frame, D = 3584, 28 layers,
4 KV heads of 128, bf16, a 64-token prompt, batch 1; frames 5, 25, 100, 400.

    python -m benchmarks.search_time [--frames 5 25 100 400] [--no-quantize-above N]
"""
from __future__ import annotations

import argparse

import jax
import jax.numpy as jnp
import numpy as np

from benchmarks.harness import time_fn, write_results
from wq_jax import cache, search

TOKENS_PER_FRAME, WIDTH, LAYERS, KV_HEADS, HEAD_DIM, PROMPT, WINDOW = 196, 3584, 28, 4, 128, 64, 32


@jax.jit
def window_search(text, visual, sensitivity):
  scores = search.window_scores(text, visual, WINDOW)
  t_low, t_high = search.thresholds(sensitivity, 2.0)
  return search.plan_bits(scores, t_low, t_high)


@jax.jit
def token_search(text, visual, sensitivity):
  scores = search.token_scores(text, visual)
  t_low, t_high = search.thresholds(sensitivity, 2.0)
  return search.plan_token_bits(scores, t_low, t_high)


def measure(frames: int, quantize: bool, repeats: int) -> dict:
  m = frames * TOKENS_PER_FRAME
  keys = jax.random.split(jax.random.PRNGKey(frames), 4)
  text = jax.random.normal(keys[0], (1, PROMPT, WIDTH), jnp.bfloat16)
  visual = jax.random.normal(keys[1], (1, m, WIDTH), jnp.bfloat16)
  # Sensitivities spread over [0, 1] so that every bit width occurs.
  sensitivity = jnp.linspace(0.2, 0.99, LAYERS)
  row = {"frames": frames, "visual_tokens": m, "windows": m // WINDOW}
  row["window_search_ms"] = 1e3 * time_fn(window_search, text, visual, sensitivity, repeats=repeats)["median_s"]
  row["token_search_ms"] = 1e3 * time_fn(token_search, text, visual, sensitivity, repeats=repeats)["median_s"]
  row["token_over_window"] = row["token_search_ms"] / row["window_search_ms"]
  plan = np.asarray(window_search(text, visual, sensitivity))
  row.update({f"windows_{b}bit_pct": 100.0 * float((plan == b).mean()) for b in (16, 4, 2)})
  if quantize:
    t = m + PROMPT + 16
    kv_shape = (LAYERS, 1, KV_HEADS, t, HEAD_DIM)
    k = jax.random.normal(keys[2], kv_shape, jnp.bfloat16)
    v = jax.random.normal(keys[3], kv_shape, jnp.bfloat16)
    build = lambda: cache.build_cache(k, v, plan, visual_start=16, num_visual=m, seq_lens=[t], max_new_tokens=64)
    row["quantize_ms"] = 1e3 * time_fn(build, repeats=max(2, repeats // 3), warmup=1)["median_s"]
    c = build()
    rest = c.capacity
    fp16 = cache.planned_bytes(np.full_like(plan, 16), batch=1, kv_heads=KV_HEADS, head_dim=HEAD_DIM,
                               window_size=WINDOW, rest_tokens=rest)
    row["cache_MB"] = c.nbytes / 1e6
    row["fp16_cache_MB"] = fp16 / 1e6
    # A paper-like plan (SPEC §5 / Fig. 13): about 15 % 16-bit, 35 % INT4, 50 % INT2, window 0 fixed.
    mixed = np.random.default_rng(0).choice([16, 4, 2], size=plan.shape, p=[0.15, 0.35, 0.5]).astype(np.int32)
    mixed[:, 0] = 16
    c = cache.build_cache(k, v, mixed, visual_start=16, num_visual=m, seq_lens=[t], max_new_tokens=64)
    row["mixed_cache_MB"] = c.nbytes / 1e6
    del k, v, c
  return row


def main():
  parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--frames", type=int, nargs="+", default=[5, 25, 100, 400])
  parser.add_argument("--no-quantize-above", type=int, default=10**9,
                      help="skip the quantize timing above this many frames (host memory)")
  parser.add_argument("--repeats", type=int, default=10)
  args = parser.parse_args()
  rows = [measure(f, f <= args.no_quantize_above, args.repeats) for f in args.frames]
  for r in rows:
    print(r, flush=True)
  path = write_results(
      "search_time", rows,
      ["frames", "visual_tokens", "windows", "window_search_ms", "token_search_ms", "token_over_window",
       "quantize_ms", "cache_MB", "mixed_cache_MB", "fp16_cache_MB", "windows_16bit_pct", "windows_4bit_pct", "windows_2bit_pct"],
      "Window-level vs token-level search, and reorder + quantize time (LLaVA-OV-7B shapes, batch 1)",
      notes=("Search: scores + thresholds + plan, jitted, median of repeats after warm-up. Quantize: one jitted "
             "reorder + quantize of 28 layers' visual K/V (bf16, 4 KV heads x 128) into the three-pool cache, "
             "plan from the window search with layer sensitivities spread over [0.2, 0.99] and random "
             "embeddings (which puts almost every window at INT2); mixed_cache_MB is the same cache under a paper-like plan (15 % 16-bit, 35 % INT4, 50 % INT2). Cache MB include float16 metadata, bucket padding and a rest segment with room for 64 "
             "generated tokens."))
  print(f"wrote {path}")


if __name__ == "__main__":
  main()
