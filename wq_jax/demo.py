"""`python -m wq_jax demo`: the whole pipeline on a tiny random-weight LLaVA-OneVision, no download.

It builds the checkpoint with transformers (random weights), converts it with
the real converter, writes a short synthetic mp4, and generates with `fp16` and
`windowquant`. The weights are random: the text means nothing; the plan, the
bytes and the agreement of the tokens are what it shows.
"""
from __future__ import annotations

import tempfile
import time
from pathlib import Path


PROMPT = "What is happening in this video?"


def run_demo(frames: int = 32, max_new_tokens: int = 16) -> dict:
  import wq_jax
  from convert.checkpoint import convert_checkpoint
  from wq_jax import video as video_io
  from wq_jax.__main__ import summary

  try:
    from models import testing
  except ImportError as e:  # pragma: no cover - torch is in the [test] extra
    raise SystemExit(f"the demo builds its model with transformers and torch: pip install torch ({e})")

  print("WindowQuant demo: a tiny LLaVA-OneVision with RANDOM weights, so the text means nothing.\n")
  start = time.perf_counter()
  with tempfile.TemporaryDirectory() as tmp:
    tmp = Path(tmp)
    testing.save_tiny_llava_onevision(tmp / "hf", seed=0)
    convert_checkpoint(tmp / "hf", tmp / "converted", dtype="float32", progress=False)
    model = wq_jax.load(tmp / "converted")
    clip = video_io.write_test_video(tmp / "clip.mp4", video_io.synthetic_frames(frames, 96, 128, seed=1))
    print(f"checkpoint converted; video {clip.name}: {frames} frames; prompt: {PROMPT!r}\n")
    results = {}
    for method in ("fp16", "windowquant"):
      g = wq_jax.generate(model, str(clip), PROMPT, method=method, num_frames=frames,
                          max_new_tokens=max_new_tokens)
      results[method] = g
      print(f"== {method}")
      print(f"tokens: {g.token_ids.tolist()}")
      print(f"text:   {g.text!r}")
      print(summary(g) + "\n")
  fp16, wq = results["fp16"], results["windowquant"]
  n = min(len(fp16.token_ids), len(wq.token_ids))
  same = int((fp16.token_ids[:n] == wq.token_ids[:n]).sum())
  print(f"windowquant plan (layers x windows, original order):\n{wq.bit_plan}")
  print(f"cache: windowquant {wq.kv_cache_bytes:,} bytes against fp16 {fp16.kv_cache_bytes:,} "
        f"({wq.kv_cache_bytes / fp16.kv_cache_bytes:.1%})")
  print(f"tokens agree: {same} of {n}" + (" (all)" if same == n else ""))
  print(f"demo took {time.perf_counter() - start:.1f} s (timings above include JIT compilation on first use)")
  return {"agree": same, "compared": n, "fp16_bytes": fp16.kv_cache_bytes, "wq_bytes": wq.kv_cache_bytes}
