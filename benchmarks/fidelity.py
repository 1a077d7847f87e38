"""Fidelity without real weights: how far each KV-cache method moves the next-token distribution.

Numerical fidelity on random weights, not task accuracy. For every method the
request is prefilled once (the prefill is full precision and the same for all
methods), the method's cache is built from it, and N decode steps run
teacher-forced on the fp16 cache's greedy tokens, so step j of every method is
conditioned on the same prefix. Per step: KL(p_fp16 || p_method) in nats and
whether the argmax agrees. Free-running greedy agreement is reported beside it
(after the first disagreement the sequences differ, so it mixes in the drift).
Decoding does not stop at EOS: random weights emit it anywhere.

    python -m benchmarks.fidelity --tiny [--frames 64] [--steps 32]
    python -m benchmarks.fidelity --preset llava-onevision-qwen2-7b-ov --frames 100 --steps 32

`--tiny` runs the tiny random-weight LLaVA-OneVision and Qwen2-VL of
`models.testing` (float32, so "fp16" keeps float32); `--preset` a full-size
random-weight LLaVA-OneVision from `benchmarks.full_size` (bf16).
"""
from __future__ import annotations

import argparse
import functools
import tempfile
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from benchmarks.harness import write_results
from models import qwen2
from wq_jax import generation, methods
from wq_jax.api import Model, as_batch, load_frames

METHODS = ("fp16", "rtn4", "rtn2", "kivi4", "kivi2", "windowquant")
TINY_PROMPT = "What is happening in this video?"
FULL_PROMPT = "w1 w2 w3 w4 w5 w6 w7 w8 w9 w10 w11 w12 w13 w14 w15 w16"  # the stand-in tokenizer's words
NOTES = (
    "Each method's cache is built from one shared full-precision prefill; every method then decodes {steps} "
    "steps teacher-forced on the fp16 cache's greedy tokens. kl_*: KL(p_fp16 || p_method) in nats over the "
    "steps; agreement: fraction of steps whose argmax equals fp16's; first_disagreement: the first such step "
    "(0-based; the prefill's own token is the same for all and not counted); free_agreement: greedy tokens "
    "equal to fp16's when each method runs free. ref_entropy: mean entropy of p_fp16 in nats (random weights "
    "give flat distributions: compare log_V, the uniform distribution's). cache_MB: device bytes of the cache "
    "held (bucket padding, metadata and room for the decoded tokens included); fp16_cache_MB: the same cache "
    "all in the model dtype. Random weights: these numbers measure the cache's numerical error, not answer "
    "quality; the JSON holds every step's KL.")
COLUMNS = ["model", "method", "steps", "kl_mean", "kl_median", "kl_max", "agreement", "first_disagreement",
           "free_agreement", "cache_MB", "fp16_cache_MB", "cache_ratio", "windows_16_4_2", "ref_entropy", "log_V"]


@functools.partial(jax.jit, static_argnames=("cfg", "implementation"))
def decode(params, cfg, cache, inputs, next_positions, force, *, implementation):
  """Logits [B, S, V] and greedy picks [B, S] of S decode steps.

  Step j reads one token a request: inputs[:, 0] first, then either inputs[:, j]
  (teacher forcing, `force` True) or the previous step's pick (free running).
  One compilation serves both, since `force` is traced.
  """
  b = inputs.shape[0]
  mrope = cfg.mrope_section is not None
  forced_next = jnp.concatenate([inputs[:, 1:], inputs[:, -1:]], axis=1).T  # [S, B]: step j's forced successor

  def body(carry, xs):
    cache, token = carry
    j, forced = xs
    pos = next_positions + j
    if mrope:
      pos = jnp.broadcast_to(pos, (3, b))
    logits, cache = qwen2.decode_step(params, cfg, token, pos, cache, implementation=implementation)
    pick = jnp.argmax(logits, axis=-1).astype(jnp.int32)
    return (cache, jnp.where(force, forced, pick)), (logits, pick)

  steps = jnp.arange(inputs.shape[1], dtype=jnp.int32)
  _, (logits, picks) = jax.lax.scan(body, (cache, inputs[:, 0]), (steps, forced_next))
  return logits.transpose(1, 0, 2), picks.T


@jax.jit
def compare(ref_logits, logits):
  """Per step: KL(p_ref || p) in nats, argmax agreement, and the reference's entropy; [B, S] each."""
  ref = jax.nn.log_softmax(ref_logits, axis=-1)
  got = jax.nn.log_softmax(logits, axis=-1)
  p = jnp.exp(ref)
  kl = jnp.sum(p * (ref - got), axis=-1)
  agree = jnp.argmax(ref_logits, axis=-1) == jnp.argmax(logits, axis=-1)
  return kl, agree, -jnp.sum(p * ref, axis=-1)


def fidelity(model: Model, frames, prompt: str, *, steps: int, method_names=METHODS,
             attention: str = "xla") -> tuple[list[dict], dict]:
  """One row per method (the first must be fp16, the reference), and the fp16 reference itself:
  {"tokens" [S] int32, "logits" [S, V] float32}, decode step j's greedy token and logits."""
  if method_names[0] != "fp16":
    raise ValueError("the first method is the reference and must be fp16")
  cfg = model.config.text
  params = model.params["decoder"]
  videos, prompts = as_batch(frames, prompt)
  p = generation.prefill_requests(model, load_frames(videos, None), prompts, max_new_tokens=steps)
  first_token = jnp.argmax(p.first_logits, axis=-1).astype(jnp.int32)  # the same for every method
  free_inputs = jnp.broadcast_to(first_token[:, None], (1, steps))  # only column 0 is read
  rows, ref = [], None
  for name in method_names:
    start = time.perf_counter()
    built = generation.plan_and_build(p, *methods.resolve(name), max_new_tokens=steps)
    plan, cache = built.plan, built.cache
    run = functools.partial(decode, params, cfg, cache, next_positions=p.next_positions, implementation=attention)
    free_logits, free_picks = run(free_inputs, force=jnp.bool_(False))
    if ref is None:  # fp16: its free run is the reference; step j reads the token step j-1 picked
      ref = {"tokens": np.asarray(free_picks)[0], "logits": np.asarray(free_logits)[0]}
      forced_inputs = jnp.concatenate([first_token[:, None], free_picks[:, :-1]], axis=1)
    logits, _ = run(forced_inputs, force=jnp.bool_(True))
    kl, agree, entropy = (np.asarray(x)[0] for x in compare(jnp.asarray(ref["logits"])[None], logits))
    miss = np.nonzero(~agree)[0]
    rows.append({
        "method": name, "steps": steps, "kl_mean": float(kl.mean()), "kl_median": float(np.median(kl)),
        "kl_max": float(kl.max()), "agreement": float(agree.mean()),
        "first_disagreement": int(miss[0]) if len(miss) else "none",
        "free_agreement": float((np.asarray(free_picks)[0] == ref["tokens"]).mean()),
        "cache_MB": cache.nbytes / 1e6, "fp16_cache_MB": generation.high_precision_bytes(cache) / 1e6,
        "cache_ratio": cache.nbytes / generation.high_precision_bytes(cache),
        "windows_16_4_2": "/".join(str(int((plan == b).sum())) for b in (16, 4, 2)),
        "ref_entropy": float(entropy.mean()), "log_V": float(np.log(cfg.vocab_size)), "kl_per_step": kl.tolist(),
    })
    print(f"  {name}: KL mean {kl.mean():.3g}, agreement {agree.mean():.3f} "
          f"({time.perf_counter() - start:.1f} s)", flush=True)
    del cache
  return rows, ref


# ----------------------------------------------------------------------------- models


def tiny_models(folder: Path, frames: int):
  """(label, Model, frames uint8 [T, H, W, 3]) for the tiny LLaVA-OneVision and Qwen2-VL, converted
  to float32 as the tests convert them."""
  import wq_jax
  from convert.__main__ import main as convert_main
  from models import testing
  from wq_jax import video as video_io

  builders = {"tiny-llava-onevision": (lambda f: testing.save_tiny_llava_onevision(f, seed=0), (64, 80)),
              "tiny-qwen2-vl": (lambda f: testing.save_tiny_qwen2_vl(f, "qwen2_vl", seed=1), (64, 64))}
  for label, (save, (h, w)) in builders.items():
    save(folder / label / "hf")
    if convert_main([str(folder / label / "hf"), str(folder / label / "ck"), "--dtype", "float32", "--quiet"]):
      raise RuntimeError(f"converting {label} failed")
    yield label, wq_jax.load(folder / label / "ck"), video_io.synthetic_frames(frames, h, w, seed=0)


def main():
  parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  source = parser.add_mutually_exclusive_group(required=True)
  source.add_argument("--tiny", action="store_true", help="the tiny LLaVA-OneVision and Qwen2-VL, on any device")
  source.add_argument("--preset",
                      help="a full-size LLaVA-OneVision or Qwen2-VL preset, e.g. llava-onevision-qwen2-7b-ov")
  parser.add_argument("--frames", type=int, default=None, help="default: 64 (tiny), 100 (preset)")
  parser.add_argument("--steps", type=int, default=32)
  parser.add_argument("--methods", nargs="+", default=list(METHODS), help="fp16 first: it is the reference")
  parser.add_argument("--attention", default="xla", help="decode attention: xla or pallas")
  args = parser.parse_args()
  frames = args.frames or (64 if args.tiny else 100)

  rows = []
  with tempfile.TemporaryDirectory() as tmp:
    if args.tiny:
      sources = tiny_models(Path(tmp), frames)
    else:
      from benchmarks import full_size
      from wq_jax import video as video_io
      model = full_size.model(args.preset, Path(tmp) / "model")
      side = full_size.frame_side(model)
      sources = [(args.preset, model, video_io.synthetic_frames(frames, side, side, seed=0))]
    for label, model, video in sources:
      print(label, flush=True)
      prompt = TINY_PROMPT if args.tiny else FULL_PROMPT
      model_rows, _ = fidelity(model, video, prompt, steps=args.steps, method_names=args.methods,
                               attention=args.attention)
      rows += [{"model": label, "frames": frames, **r} for r in model_rows]
  name = "fidelity_tiny" if args.tiny else f"fidelity_{args.preset}_f{frames}"
  path = write_results(
      name, rows, COLUMNS,
      f"Numerical fidelity on random weights, not task accuracy ({frames} frames, {args.steps} decode steps)",
      notes=NOTES.format(steps=args.steps))
  print(f"wrote {path}")


if __name__ == "__main__":
  main()
