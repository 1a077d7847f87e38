"""Prefill-side cost: search, reorder and quantize time against the prefill's; window- against token-level search.

The decoder of a full-size random-weight LLaVA-OneVision (default Qwen2-7B:
D = 3584, 28 layers, 4 KV heads of 128, bf16) prefills 16 prefix tokens, the
visual tokens (random embeddings, `tokens_per_frame` a frame) and a 64-token
prompt, batch 1, padded to a multiple of 64 as `generate` pads. The prefill is
`generate`'s own (`generation._prefill`, cudnn attention on GPU in 16-bit);
the vision tower is not timed. From its output, as `generate` does: the window
search (scores, thresholds, plan) on the embeddings with the prefill's layer
sensitivities, the token-level search for comparison, and the reorder +
quantize of the prefill's K/V into WindowQuant's cache. Each is a median of
repeats after warm-up (one compile per shape) and a percentage of the prefill.

    python -m benchmarks.prefill_cost [--preset llava-onevision-qwen2-7b-ov] [--frames 5 25 100 400]
    python -m benchmarks.prefill_cost --tiny   # the tiny test decoder, 9 tokens a frame: seconds on a CPU

Frame counts whose prefill would not fit the device's free memory are skipped
(estimated first, and an out-of-memory error is caught too); a row that fails
for another reason says so in its `skipped` column and the others still run.
"""
from __future__ import annotations

import argparse
import types

import jax
import jax.numpy as jnp
import numpy as np

from benchmarks.harness import time_fn, write_results
from benchmarks.search_time import token_search, window_search
from models import presets, qwen2
from wq_jax import generation, methods
from wq_jax.buckets import round_up

PREFIX, PROMPT, NEW_TOKENS = 16, 64, 64  # tokens before the video, after it, and room to generate
COLUMNS = ["frames", "tokens", "within_context", "prefill_ms", "window_search_ms", "token_search_ms",
           "quantize_ms", "window_search_pct", "token_search_pct", "quantize_pct", "search_quantize_pct",
           "windows_16_4_2", "skipped"]


class Decoder(types.SimpleNamespace):
  """What the benchmark needs of a model: decoder params and config, tokens a frame, dtype, context."""


def full_size_decoder(preset: str, dtype=jnp.bfloat16, seed: int = 0) -> Decoder:
  """A preset's decoder with random weights (std 0.02, as `benchmarks.full_size`), built on the device."""
  _, cfg = presets.config(preset)
  params = jax.jit(lambda key: qwen2.init(cfg.text, key, dtype))(jax.random.PRNGKey(seed))
  context = presets.hf_config(preset).text_config.max_position_embeddings
  return Decoder(params=params, cfg=cfg.text, tokens_per_frame=cfg.tokens_per_frame, dtype=jnp.dtype(dtype),
                 context=context, label=preset)


def tiny_decoder(seed: int = 0) -> Decoder:
  """The tiny LLaVA-OneVision's decoder of `models.testing` (64 wide, 2 layers), float32."""
  from models import llava_onevision, testing
  hf = testing.tiny_llava_onevision_config(testing.tiny_tokenizer())
  cfg = llava_onevision.parse_config(hf)
  params = qwen2.init(cfg.text, jax.random.PRNGKey(seed), jnp.float32)
  return Decoder(params=params, cfg=cfg.text, tokens_per_frame=cfg.tokens_per_frame, dtype=jnp.dtype(jnp.float32),
                 context=hf["text_config"]["max_position_embeddings"], label="tiny-llava-onevision")


def prefill_bytes(d: Decoder, tokens: int, flash: bool) -> int:
  """Device bytes a prefill of `tokens` needs beyond the weights: the K/V it returns, a second copy
  while the cache is built, the activations of a layer; without flash attention also the scores."""
  c = d.cfg
  kv = 2 * c.num_layers * c.num_kv_heads * tokens * c.head_dim * d.dtype.itemsize
  activations = tokens * (4 * c.hidden_size + 3 * c.intermediate_size) * 4
  scores = 0 if flash else 2 * c.num_heads * tokens * tokens * 4
  return 2 * kv + activations + scores


def measure(d: Decoder, frames: int, *, implementation, repeats: int, prefill_repeats: int) -> dict:
  m = frames * d.tokens_per_frame
  valid = PREFIX + m + PROMPT
  t = round_up(valid, generation.SEQ_ALIGN)
  row = {"frames": frames, "tokens": valid, "within_context": valid + NEW_TOKENS <= d.context}
  free = generation._device_free_bytes()
  if free is not None and prefill_bytes(d, t, implementation == "cudnn") > free:
    return {**row, "skipped": "memory (estimated)"}
  try:
    return {**row, **_timings(d, m, valid, t, implementation, repeats, prefill_repeats)}
  except jax.errors.JaxRuntimeError as e:  # a row that fails must not lose the others' device time
    reason = "memory (out of memory)" if "RESOURCE_EXHAUSTED" in str(e) else f"error: {str(e).splitlines()[0][:200]}"
    return {**row, "skipped": reason}


def _timings(d: Decoder, m: int, valid: int, t: int, implementation, repeats: int, prefill_repeats: int) -> dict:
  embeds = jax.random.normal(jax.random.PRNGKey(m), (1, t, d.cfg.hidden_size), d.dtype)
  mask = (jnp.arange(t) < valid).astype(jnp.int32)[None]
  positions = qwen2.text_positions(mask)
  prefill = lambda: generation._prefill(d.params, d.cfg, embeds, positions, mask, implementation=implementation)
  out = {"prefill_ms": 1e3 * time_fn(prefill, repeats=prefill_repeats, warmup=1)["median_s"]}
  pre = prefill()
  text = embeds[:, PREFIX + m: valid]
  visual = embeds[:, PREFIX: PREFIX + m]
  sensitivity = pre.sensitivity[:, 0]
  out["window_search_ms"] = 1e3 * time_fn(window_search, text, visual, sensitivity, repeats=repeats)["median_s"]
  out["token_search_ms"] = 1e3 * time_fn(token_search, text, visual, sensitivity, repeats=repeats)["median_s"]
  plan = np.asarray(window_search(text, visual, sensitivity))
  spec, config = methods.resolve("windowquant")
  options = spec.cache_options(config)
  # Host layout + one jitted reorder and quantize, as `generate` times its quantize_s.
  build = lambda: methods.build_method_cache(options, pre.keys, pre.values, plan, visual_start=PREFIX,
                                             num_visual=m, seq_lens=[valid], max_new_tokens=NEW_TOKENS)
  out["quantize_ms"] = 1e3 * time_fn(build, repeats=max(2, repeats // 3), warmup=1)["median_s"]
  for part in ("window_search", "token_search", "quantize"):
    out[f"{part}_pct"] = 100 * out[f"{part}_ms"] / out["prefill_ms"]
  out["search_quantize_pct"] = out["window_search_pct"] + out["quantize_pct"]
  out["windows_16_4_2"] = "/".join(str(int((plan == b).sum())) for b in (16, 4, 2))
  return out


def main():
  parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  source = parser.add_mutually_exclusive_group()
  source.add_argument("--preset", default="llava-onevision-qwen2-7b-ov", help="a LLaVA-OneVision preset")
  source.add_argument("--tiny", action="store_true", help="the tiny test decoder (float32), for a CPU")
  parser.add_argument("--frames", type=int, nargs="+", default=None,
                      help="default: 5 25 100 400 (preset), 4 16 64 (tiny)")
  parser.add_argument("--attention", choices=["auto", "cudnn", "xla"], default="auto",
                      help="prefill attention; auto picks as generate does (cudnn on GPU in 16-bit)")
  parser.add_argument("--repeats", type=int, default=10, help="search repeats (quantize: a third)")
  parser.add_argument("--prefill-repeats", type=int, default=3)
  args = parser.parse_args()

  d = tiny_decoder() if args.tiny else full_size_decoder(args.preset)
  frames = args.frames or ([4, 16, 64] if args.tiny else [5, 25, 100, 400])
  if args.attention == "auto":  # generate's choice reads only the model's dtype
    implementation = generation._prefill_attention(types.SimpleNamespace(dtype=d.dtype.name))
  else:
    implementation = None if args.attention == "xla" else args.attention
  rows = []
  for f in frames:
    rows.append(measure(d, f, implementation=implementation, repeats=args.repeats,
                        prefill_repeats=args.prefill_repeats))
    print(rows[-1], flush=True)
  c = d.cfg
  path = write_results(
      f"prefill_cost_{d.label}", rows, COLUMNS,
      f"Search, reorder and quantize time against prefill time ({d.label} decoder, batch 1)",
      notes=(f"Decoder: D = {c.hidden_size}, {c.num_layers} layers, {c.num_kv_heads} KV heads of {c.head_dim}, "
             f"{d.dtype.name}, random weights; {d.tokens_per_frame} visual tokens a frame between {PREFIX} prefix "
             f"and {PROMPT} prompt tokens (random embeddings), padded to a multiple of {generation.SEQ_ALIGN}. "
             f"prefill: generation._prefill with attention {implementation or 'xla'}, median of "
             f"{args.prefill_repeats} after a compiling run; the vision tower is not included. Search: "
             "scores + thresholds + plan (jitted); quantize: host layout + one jitted reorder + quantize of "
             "every layer's visual K/V into the three-pool cache (windowquant's options; the plan comes from "
             "random embeddings, so almost every window is INT2). *_pct: percent of the prefill; "
             "search_quantize_pct = window search + quantize. within_context: the prompt and "
             f"{NEW_TOKENS} new tokens fit the model's context ({d.context} tokens); beyond it, generate "
             "refuses the request and the row is timing of the shapes only."))
  print(f"wrote {path}")


if __name__ == "__main__":
  main()
