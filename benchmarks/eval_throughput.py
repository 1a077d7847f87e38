"""How long an evaluation takes: N NExT-QA-style questions at F frames on a full-size random-weight
LLaVA-OneVision-Qwen2-7B, per method, through the evaluation harness (issue: evaluation harness).

    python -m benchmarks.eval_throughput [--questions 100] [--frames 100] [--batch-size 1]
        [--methods fp16 windowquant] [--max-new-tokens 16] [--videos 4] [--video-frames 300]

It writes a synthetic NExT-QA folder (test.csv, and `--videos` mp4 clips of 640x480 with
`--video-frames` frames, NExT-QA's frame size, shared by the questions), then per method runs a
warm-up over every question length (it compiles) and times `wq_jax.eval.runner.run_task`
over all questions: decoding and sampling the video, preprocessing, `generate` on every local
device, scoring and the flushed JSONL rows. Decoding alone is timed once apart (it does not
depend on the method): NExT-QA's videos average about 40 s at 30 fps, so scale `media_s_per_q`
by their length over `--video-frames` for the real data. Random weights seldom emit EOS, so every answer runs the
full `--max-new-tokens`; a real model answers a letter in about two tokens.

Each method's run takes about N x (prefill + decode) seconds: run one or two methods per call
to stay within a time limit; results go to benchmarks/results/eval_throughput_*.
"""
from __future__ import annotations

import argparse
import csv
import logging
import tempfile
import time
from pathlib import Path

import jax
import numpy as np

from benchmarks import full_size
from benchmarks.harness import write_results
from wq_jax import parallel
from wq_jax import video as video_io
from wq_jax.eval import runner, tasks
from wq_jax.eval.media import load_media

WORDS = range(8, 18)  # question lengths in words, cycled
QUESTION = "why did the boy pick up one present from the group of them and move to the sofa"
OPTIONS = ("share with the girl", "approach lady sitting there", "unwrap it", "playing with toy train",
           "gesture something")


def write_nextqa(root: Path, questions: int, videos: int, video_frames: int) -> None:
  """A NExT-QA folder: test.csv with `questions` rows over `videos` synthetic 640x480 clips."""
  (root / "videos").mkdir(parents=True)
  for v in range(videos):
    frames = video_io.synthetic_frames(video_frames, 480, 640, seed=v)
    video_io.write_test_video(root / "videos" / f"{v}.mp4", frames, fps=30)
  rng = np.random.default_rng(0)
  with open(root / "test.csv", "w", newline="") as f:
    out = csv.writer(f)
    out.writerow(["video", "frame_count", "width", "height", "question", "answer", "qid", "type",
                  "a0", "a1", "a2", "a3", "a4"])
    for i in range(questions):
      # Questions of varied length, as the real ones are.
      words = QUESTION.split()[: WORDS[i % len(WORDS)]]
      out.writerow([i % videos, video_frames, 640, 480, " ".join(words), int(rng.integers(5)), i // videos,
                    "CW", *OPTIONS])


class CompileCounter(logging.Handler):
  """Counts jax's "Compiling ..." log records."""

  def __init__(self):
    super().__init__()
    self.count = 0

  def emit(self, record):
    self.count += record.getMessage().startswith("Compiling")


def timed_run(model, questions, cfg, output: Path, mesh) -> tuple[list[dict], float, int]:
  """(rows, seconds, compilations) of one run."""
  counter = CompileCounter()
  logger = logging.getLogger("jax")
  logger.addHandler(counter)
  try:
    with jax.log_compiles(True):
      start = time.perf_counter()
      rows = runner.run_task(model, questions, cfg, output, mesh=mesh)
      return rows, time.perf_counter() - start, counter.count
  finally:
    logger.removeHandler(counter)


def main():
  parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--preset", default="llava-onevision-qwen2-7b-ov")
  parser.add_argument("--questions", type=int, default=100)
  parser.add_argument("--frames", type=int, default=100)
  parser.add_argument("--batch-size", type=int, default=1)
  parser.add_argument("--methods", nargs="+", default=["fp16", "windowquant"])
  parser.add_argument("--max-new-tokens", type=int, default=16)
  parser.add_argument("--videos", type=int, default=4)
  parser.add_argument("--video-frames", type=int, default=300)
  args = parser.parse_args()

  with tempfile.TemporaryDirectory() as tmp:
    tmp = Path(tmp)
    write_nextqa(tmp / "nextqa", args.questions, args.videos, args.video_frames)
    questions = tasks.load("nextqa", tmp / "nextqa")
    start = time.perf_counter()
    for q in questions:
      load_media(q.media, args.frames)
    media_s = (time.perf_counter() - start) / len(questions)

    model = full_size.model(args.preset, tmp / "model")
    mesh = parallel.data_mesh() if jax.local_device_count() > 1 else None
    if mesh is not None:
      model = parallel.replicate(model, mesh)
    rows = []
    for method in args.methods:
      cfg = runner.RunConfig(task="nextqa", method=method, num_frames=args.frames, batch_size=args.batch_size,
                             max_new_tokens=args.max_new_tokens)
      # Warm-up: one batch of every question length, so the timed run should compile nothing.
      warmup = max(len(WORDS), args.batch_size)
      runner.run_task(model, questions[:warmup], cfg, tmp / f"warmup_{method}.jsonl", mesh=mesh, progress=False)
      done, total, compiles = timed_run(model, questions, cfg, tmp / f"{method}.jsonl", mesh)
      share = runner.summarize(done)[method]["window_share"]
      rows.append({
          "method": method, "questions": len(questions), "frames": args.frames, "batch": args.batch_size,
          "devices": jax.local_device_count(), "max_new_tokens": args.max_new_tokens, "total_s": total,
          "s_per_q": total / len(questions), "media_s_per_q": media_s,
          "errors": sum(r["error"] is not None for r in done), "compiles": compiles,
          "windows_16_4_2_%": "/".join("-" if v is None else f"{100 * v:.0f}" for v in share.values()),
      })
      print(rows[-1], flush=True)
  path = write_results(
      f"eval_throughput_{args.preset}_f{args.frames}_b{args.batch_size}_{'-'.join(args.methods)}", rows,
      ["method", "questions", "frames", "batch", "devices", "max_new_tokens", "total_s", "s_per_q", "media_s_per_q",
       "errors", "compiles", "windows_16_4_2_%"],
      f"python -m wq_jax.eval's runner: {args.questions} NExT-QA-style questions at {args.frames} frames on "
      f"random-weight {args.preset}",
      notes=(f"After a warm-up over every question length; `compiles` counts what the timed run still "
             f"compiled. Synthetic 640x480 videos of {args.video_frames} frames; media_s_per_q is decoding "
             "and sampling alone (included in total_s). Random weights: every answer runs the full "
             "max_new_tokens, and the plans are not the real model's."))
  print(f"wrote {path}")


if __name__ == "__main__":
  main()
