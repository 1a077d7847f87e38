"""End-to-end `generate` on a full-size random-weight LLaVA-OneVision-Qwen2-7B (issue: generate).

    python -m benchmarks.generate_e2e [--frames 100] [--batch 1] [--methods fp16 windowquant]
                                      [--attention xla pallas] [--max-new-tokens 64]

Each (method, attention) runs twice on the same request; the second run is
reported (the first compiles). Decode tokens/s counts generated tokens of the
batch over the decode loop's wall time. The weights are random, so the plan
comes from random embeddings and the text means nothing.
"""
from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import numpy as np

import wq_jax
from benchmarks import full_size
from benchmarks.harness import write_results
from wq_jax import video as video_io

PROMPT = "w1 w2 w3 w4 w5 w6 w7 w8 w9 w10 w11 w12 w13 w14 w15 w16"


def main():
  parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--preset", default="llava-onevision-qwen2-7b-ov")
  parser.add_argument("--frames", type=int, default=100)
  parser.add_argument("--batch", type=int, default=1)
  parser.add_argument("--methods", nargs="+", default=["fp16", "windowquant"])
  parser.add_argument("--attention", nargs="+", default=["xla"])
  parser.add_argument("--max-new-tokens", type=int, default=64)
  args = parser.parse_args()

  with tempfile.TemporaryDirectory() as tmp:
    model = full_size.model(args.preset, Path(tmp) / "model")
    side = full_size.frame_side(model)
    frames = video_io.synthetic_frames(args.frames, side, side, seed=0)
    videos = [frames] * args.batch if args.batch > 1 else frames
    prompts = [PROMPT] * args.batch if args.batch > 1 else PROMPT
    rows = []
    for attention in args.attention:
      for method in args.methods:
        for _ in range(2):
          g = wq_jax.generate(model, videos, prompts, method=method, max_new_tokens=args.max_new_tokens,
                              attention=attention)
        n = sum(len(t) for t in (g.token_ids if args.batch > 1 else [g.token_ids]))
        counts = np.array([[int((g.bit_plan == b).sum())] for b in (16, 4, 2)]).ravel()
        rows.append({
            "method": method, "attention": attention, "frames": args.frames, "batch": args.batch,
            "tokens": n, "decode_tok_s": g.timings["tokens_per_s"], "decode_s": g.timings["decode_s"],
            "prefill_s": g.timings["prefill_s"], "search_s": g.timings["search_s"],
            "quantize_s": g.timings["quantize_s"], "cache_MB": g.kv_cache_bytes / 1e6,
            "fp16_cache_MB": g.fp16_cache_bytes / 1e6,
            "windows_16_4_2": "/".join(map(str, counts)),
        })
        print(rows[-1], flush=True)
  path = write_results(
      f"generate_e2e_{args.preset}_f{args.frames}_b{args.batch}", rows,
      ["method", "attention", "frames", "batch", "tokens", "decode_tok_s", "decode_s", "prefill_s", "search_s",
       "quantize_s", "cache_MB", "fp16_cache_MB", "windows_16_4_2"],
      f"wq_jax.generate on random-weight {args.preset}, bf16, {args.frames} frames, batch {args.batch}",
      notes=("Second of two identical runs (the first compiles). Random weights and a stand-in tokenizer: "
             "speeds and bytes are the real model's, the text and plan are not meaningful."))
  print(f"wrote {path}")


if __name__ == "__main__":
  main()
