"""Where a decode step's time goes: the full-size LLM's step timed whole and with parts left out.

    python -m benchmarks.decode_step_parts [--batch 1] [--tokens 1024]

Random-weight LLaVA-OneVision-Qwen2-7B decoder (bf16), an fp16 cache of
`tokens` per request (random K/V). Variants, each one jitted call of one step:

    full          models.qwen2.decode_step ("xla" attention)
    full_pallas   the same with the Pallas kernel
    no_attention  attention replaced by q (no cache read; the projections stay)
    no_lm_head    the final norm and vocabulary projection left out
    layers_only   the 28 layers' matrix-vector products alone (as benchmarks.layer_loop)
    loop_of_8     8 steps of generate's decode loop (generation.decode_call), per step

Differences between rows place the time; the floor is the weight (+ cache)
bytes over the copy bandwidth measured in the same run.
"""
from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from benchmarks import full_size
from benchmarks.harness import best_copy_TBps, copy_bandwidth, time_fn, write_results
from models import qwen2
from wq_jax import attention, generation, methods


def main():
  ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  ap.add_argument("--batch", type=int, default=1)
  ap.add_argument("--tokens", type=int, default=1024)
  ap.add_argument("--preset", default="llava-onevision-qwen2-7b-ov")
  ap.add_argument("--only", nargs="+", help="variants to run (default: all)")
  args = ap.parse_args()
  copy = best_copy_TBps(copy_bandwidth()) if jax.default_backend() == "gpu" else float("nan")
  with tempfile.TemporaryDirectory() as tmp:
    model = full_size.model(args.preset, Path(tmp) / "m")
  params, cfg = model.params["decoder"], model.config.text
  b, t = args.batch, args.tokens
  shape = (cfg.num_layers, b, cfg.num_kv_heads, t, cfg.head_dim)
  kv = jax.random.normal(jax.random.PRNGKey(1), shape, jnp.bfloat16)
  spec, config = methods.resolve("fp16", None)
  plan = np.full((cfg.num_layers, 0), 16, np.int32)
  cache = methods.build_method_cache(spec.cache_options(config), kv, kv, plan, visual_start=t, num_visual=0,
                                     seq_lens=[t] * b, max_new_tokens=16)
  del kv
  tokens = jnp.zeros((b,), jnp.int32)
  pos = jnp.full((b,), t, jnp.int32)
  weight_bytes = sum(x.nbytes for x in jax.tree.leaves(params) if x.ndim >= 2) - params["embed"].nbytes
  rows = []

  def record(name, fn, *a, per=1, extra_bytes=0, jit=True):
    if args.only and name not in args.only:
      return
    s = time_fn(jax.jit(fn) if jit else fn, *a, repeats=10)["median_s"] / per
    floor = (weight_bytes + extra_bytes) / (copy * 1e12)
    rows.append(dict(variant=name, batch=b, tokens=t, step_ms=s * 1e3, floor_ms=floor * 1e3,
                     over_floor=s / floor))
    print(rows[-1], flush=True)

  record("full", lambda p, c: qwen2.decode_step(p, cfg, tokens, pos, c)[0], params, cache, extra_bytes=cache.nbytes)
  record("full_pallas", lambda p, c: qwen2.decode_step(p, cfg, tokens, pos, c, implementation="pallas")[0],
         params, cache, extra_bytes=cache.nbytes)
  original = attention.decode_attention
  attention.decode_attention = lambda q, layer, **kw: q
  try:
    record("no_attention", lambda p, c: qwen2.decode_step(p, cfg, tokens, pos, c)[0], params, cache)
  finally:
    attention.decode_attention = original
  original_head = qwen2.lm_head
  qwen2.lm_head = lambda p, c, h: h
  try:
    record("no_lm_head", lambda p, c: qwen2.decode_step(p, cfg, tokens, pos, c)[0], params, cache,
           extra_bytes=cache.nbytes)
  finally:
    qwen2.lm_head = original_head

  def layers_only(p):
    h = jnp.zeros((b, cfg.hidden_size), jnp.bfloat16)
    def body(h, lp):
      x = h[:, None]
      q, k, v = (qwen2._heads(lp[n], x) for n in "qkv")
      h = h + qwen2.out_proj(lp, q[:, 0])
      return qwen2.mlp_block(lp, cfg, h), None
    return jax.lax.scan(body, h, p["layers"], unroll=True)[0]
  record("layers_only", layers_only, params)
  logits = jnp.zeros((b, cfg.vocab_size), jnp.float32)
  loop = generation.decode_call(model, cache, logits, pos, steps=9, eos_ids=[-1])
  record("loop_of_8", lambda: loop()[0], per=8, extra_bytes=cache.nbytes, jit=False)
  write_results(f"decode_step_parts_b{b}_t{t}", rows, ["variant", "batch", "tokens", "step_ms", "floor_ms", "over_floor"],
                f"Where a decode step's time goes: random-weight {args.preset}, fp16 cache",
                notes=f"copy bandwidth {copy:.2f} TB/s (same run); floor: decoder weight bytes (no embedding table)"
                      " + cache bytes where the variant reads the cache")


if __name__ == "__main__":
  main()
