"""Command line: `python -m wq_jax generate ...` and `python -m wq_jax demo`."""
from __future__ import annotations

import argparse
import sys


def summary(g) -> str:
  """The plan per layer, the cache against 16-bit, and the speed, as a few lines."""
  lines = ["bit widths per layer (windows at 16 / 4 / 2 bits):"]
  for l, counts in enumerate(g.bits_per_layer()):
    lines.append(f"  layer {l:3d}: {counts[16]:5d} {counts[4]:5d} {counts[2]:5d}")
  mb, fp16 = g.kv_cache_bytes / 1e6, g.fp16_cache_bytes / 1e6
  lines.append(f"KV cache: {mb:.2f} MB held, {fp16:.2f} MB at 16 bits ({mb / fp16:.1%})")
  t = g.timings
  lines.append(f"prefill {t['prefill_s']:.3f} s, search {t['search_s']:.3f} s, quantize {t['quantize_s']:.3f} s, "
               f"decode {t['decode_s']:.3f} s ({t['tokens_per_s']:.1f} tokens/s)")
  return "\n".join(lines)


def _config(method: str, args):
  from wq_jax import WindowQuantConfig
  if method != "windowquant":
    return None
  return WindowQuantConfig(alpha=args.alpha, window_size=args.window_size,
                           fix_first_window=not args.no_fixed_first_window, random_plan=args.random_plan,
                           reorder=not args.no_reorder)


def cmd_generate(args) -> int:
  import wq_jax
  model = wq_jax.load(args.ckpt)
  g = wq_jax.generate(model, args.video, args.prompt, method=args.method, config=_config(args.method, args),
                      num_frames=args.frames, max_new_tokens=args.max_new_tokens, attention=args.attention,
                      temperature=args.temperature, top_p=args.top_p, seed=args.seed)
  print(g.text)
  print(summary(g), file=sys.stderr)
  if args.plot:
    from wq_jax.plots import plot_plan
    print(f"wrote {plot_plan(g.window_scores, g.bit_plan, args.plot, title=f'{args.method}: {args.prompt}')}",
          file=sys.stderr)
  return 0


def cmd_demo(args) -> int:
  from wq_jax.demo import run_demo
  run_demo(frames=args.frames)
  return 0


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(prog="python -m wq_jax", description=__doc__)
  sub = parser.add_subparsers(dest="command", required=True)
  gen = sub.add_parser("generate", help="answer a prompt about a video with a converted checkpoint")
  gen.add_argument("--ckpt", required=True, help="a folder written by `python -m convert`")
  gen.add_argument("--video", required=True, help="a video file (mp4, webm, avi, mkv)")
  gen.add_argument("--prompt", required=True)
  gen.add_argument("--method", default="windowquant",
                   choices=["fp16", "rtn4", "rtn2", "kivi4", "kivi2", "windowquant"])
  gen.add_argument("--frames", type=int, default=None, help="frames sampled uniformly (default 32)")
  gen.add_argument("--max-new-tokens", type=int, default=64)
  gen.add_argument("--attention", default="xla", help="decode attention: xla or pallas")
  gen.add_argument("--alpha", type=float, default=2.0)
  gen.add_argument("--window-size", type=int, default=32)
  gen.add_argument("--no-fixed-first-window", action="store_true", help="ablation A")
  gen.add_argument("--random-plan", action="store_true", help="ablation B")
  gen.add_argument("--no-reorder", action="store_true", help="ablation C")
  gen.add_argument("--temperature", type=float, default=0.0)
  gen.add_argument("--top-p", type=float, default=1.0)
  gen.add_argument("--seed", type=int, default=0)
  gen.add_argument("--plot", default=None, help="write the similarity and bit-plan charts to this PNG")
  gen.set_defaults(run=cmd_generate)
  demo = sub.add_parser("demo", help="a tiny random-weight model end to end, no download, CPU")
  demo.add_argument("--frames", type=int, default=32)
  demo.set_defaults(run=cmd_demo)
  args = parser.parse_args(argv)
  return args.run(args)


if __name__ == "__main__":
  sys.exit(main())
