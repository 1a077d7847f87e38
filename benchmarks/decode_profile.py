"""Where a decode step's GPU time goes, kernel by kernel: generate's decode loop under the JAX profiler.

    XLA_PYTHON_CLIENT_MEM_FRACTION=0.95 python -m benchmarks.decode_profile \
        [--settings 1x100 32x100] [--methods fp16 windowquant] [--attention pallas] [--steps 9]

Random-weight LLaVA-OneVision-Qwen2-7B (bf16), caches built as benchmarks.decode_throughput builds
them (one prefill a video length, repeated along the request axis). Each loop is compiled, run once
to warm up, then run once under `jax.profiler.trace`; the Perfetto trace's GPU stream events are
summed per kernel. Per loop: its wall time a step, the GPU's busy time a step (the union of kernel
intervals) and the idle rest, kernels a step, and the kernels that take the most time, grouped by
name with trailing instance numbers removed (`loop_add_fusion_12` -> `loop_add_fusion`); then the idle
time by the kernel that ends each gap (`(idle before K)`: ~2 µs at every launch, or long gaps before a few).
"""
from __future__ import annotations

import argparse
import collections
import glob
import gzip
import json
import os
import re
import tempfile
import time
from pathlib import Path

import jax

from benchmarks import decode_throughput as dt
from benchmarks import full_size, harness
from wq_jax import generation

COLUMNS = ["setting", "method", "attention", "kernel", "per_step", "us_step", "share"]


def _complete_events(trace: dict) -> list[tuple[str, str, dict]]:
  """(process name, thread name, event) of every complete ('X') event of a Chrome/Perfetto trace."""
  events = trace["traceEvents"] if isinstance(trace, dict) else trace
  processes = {e["pid"]: e["args"]["name"] for e in events if e.get("ph") == "M" and e.get("name") == "process_name"}
  threads = {(e["pid"], e["tid"]): e["args"]["name"] for e in events
             if e.get("ph") == "M" and e.get("name") == "thread_name"}
  return [(processes.get(e["pid"], ""), threads.get((e["pid"], e.get("tid")), ""), e)
          for e in events if e.get("ph") == "X"]


def kernel_events(trace: dict) -> list[dict]:
  """The complete events on the GPU streams of a trace. A device's stream lines hold the kernels; its
  derived lines ("XLA Ops", "XLA Modules") repeat them."""
  return [e for process, thread, e in _complete_events(trace) if "GPU" in process and "Stream" in thread]


def device_lines(trace: dict) -> dict:
  """Events per line of every device process ("process / thread": count), to see what a trace holds."""
  return dict(collections.Counter(f"{process} / {thread}" for process, thread, _ in _complete_events(trace)
                                  if "host" not in process))


def busy_us(events: list[dict]) -> float:
  """Time covered by at least one event (the union of their intervals), µs."""
  total, end = 0.0, float("-inf")
  for start, stop in sorted((e["ts"], e["ts"] + e["dur"]) for e in events):
    if stop > end:
      total += stop - max(start, end)
      end = stop
  return total


def kernel_name(event: dict) -> str:
  return re.sub(r"([._]\d+)+$", "", event["name"])


def idle_before(events: list[dict]) -> dict:
  """The GPU's idle time (no kernel running) by the kernel that ends it: name -> (gaps, total µs). Whether the
  idle is a small gap at every launch or long ones before a few kernels (host launches between CUDA graphs,
  a custom call outside the graph) is what says how to cut it."""
  gaps = collections.defaultdict(lambda: [0, 0.0])
  end = None
  for e in sorted(events, key=lambda e: e["ts"]):
    if end is not None and e["ts"] > end:
      entry = gaps[kernel_name(e)]
      entry[0] += 1
      entry[1] += e["ts"] - end
    end = max(end if end is not None else e["ts"], e["ts"] + e["dur"])
  return {name: tuple(v) for name, v in gaps.items()}


def summarize(events: list[dict], steps: int) -> dict:
  """Per decode step: busy and spanned GPU time, kernel count, time by kernel name, and the idle time by the
  kernel that ends it."""
  if not events:
    return {"busy_us_step": 0.0, "span_us_step": 0.0, "kernels_step": 0.0, "by_kernel": [], "idle_before": []}
  span = max(e["ts"] + e["dur"] for e in events) - min(e["ts"] for e in events)
  by_name = collections.defaultdict(lambda: [0, 0.0])
  samples = {}  # a kernel name's first event's arguments (the profiler's HLO op and module, where given)
  for e in events:
    samples.setdefault(kernel_name(e), e.get("args", {}))
    entry = by_name[kernel_name(e)]
    entry[0] += 1
    entry[1] += e["dur"]
  busy = busy_us(events)
  kernels = sorted(by_name.items(), key=lambda kv: -kv[1][1])
  idle = sorted(idle_before(events).items(), key=lambda kv: -kv[1][1])
  return {"busy_us_step": busy / steps, "span_us_step": span / steps, "kernels_step": len(events) / steps,
          "by_kernel": [{"kernel": k, "per_step": n / steps, "us_step": us / steps, "share": us / busy,
                         "sample_args": samples[k]} for k, (n, us) in kernels],
          "idle_before": [{"kernel": f"(idle before {k})", "per_step": n / steps, "us_step": us / steps,
                           "share": us / max(span - busy, 1e-9)} for k, (n, us) in idle]}


def profile_loop(compiled, arrays, log_dir: Path) -> tuple[dict, float]:
  """One warm-up call, one timed call, one call under the profiler: its trace and the timed call's seconds."""
  jax.block_until_ready(compiled(*arrays))
  start = time.perf_counter()
  jax.block_until_ready(compiled(*arrays))
  seconds = time.perf_counter() - start
  with jax.profiler.trace(str(log_dir), create_perfetto_trace=True):
    jax.block_until_ready(compiled(*arrays))
  path = sorted(glob.glob(str(log_dir / "**" / "perfetto_trace.json.gz"), recursive=True))[-1]
  with gzip.open(path) as f:
    return json.load(f), seconds


def main(argv=None):
  ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  ap.add_argument("--preset", default="llava-onevision-qwen2-7b-ov")
  ap.add_argument("--tiny", action="store_true", help="the tests' tiny LLaVA-OneVision (CPU: no GPU streams)")
  ap.add_argument("--settings", nargs="+", default=["1x100", "32x100"])
  ap.add_argument("--methods", nargs="+", default=["fp16", "windowquant"], choices=list(dt.METHODS))
  ap.add_argument("--attention", nargs="+", default=["pallas"])
  ap.add_argument("--steps", type=int, default=9, help="tokens a loop makes (steps - 1 decode steps)")
  ap.add_argument("--top", type=int, default=25, help="kernels listed a loop")
  ap.add_argument("--tag", default="", help="appended to the results' name")
  ap.add_argument("--out", type=Path)
  args = ap.parse_args(argv)
  for name in args.attention:
    if name.startswith("pallas:"):
      dt.register_kernel_variant(name, ap)
  settings = [dt.Setting.parse(s) for s in args.settings]
  rows, loops = [], []
  with tempfile.TemporaryDirectory() as tmp:
    tmp = Path(tmp)
    model = (full_size.tiny_llava_onevision(tmp / "model") if args.tiny
             else full_size.model(args.preset, tmp / "model"))
    frames = sorted({s.frames for s in settings})
    prefills = {f: dt.prefill_one(model, f, args.steps) for f in frames}
    built = {(f, m): dt.build(prefills[f], m, args.steps) for f in frames for m in args.methods}
    jobs = [dt.Job({"setting": s.name, "method": m, "attention": a}, built[s.frames, m], s.batch, a)
            for s in settings for m in args.methods for a in args.attention]
    frames_of = {s.name: s.frames for s in settings}
    compiled = {}  # a video length's loops compile together (decode_throughput.compile_all)
    for f in frames:
      ours = [job for job in jobs if frames_of[job.label["setting"]] == f]
      compiled.update(zip(map(id, ours), dt.compile_all(model, prefills[f], ours, args.steps, workers=8)))
    for i, job in enumerate(jobs):
      loop, _ = compiled[id(job)].result()
      prefilled = prefills[frames_of[job.label["setting"]]]
      cache, logits, positions = dt.batch_inputs(prefilled, job.built, job.batch)
      call = generation.decode_call(model, cache, logits, positions, steps=args.steps, eos_ids=dt.NO_EOS,
                                    attention=job.attention)
      trace, seconds = profile_loop(loop, call.arrays, tmp / f"trace{i}")
      del cache, call
      summary = summarize(kernel_events(trace), args.steps - 1)
      wall = seconds / (args.steps - 1) * 1e6
      loops.append({**job.label, "wall_us_step": wall, "lines": device_lines(trace), **summary})
      print(f"{job.label}: wall {wall:.0f} µs/step, GPU busy {summary['busy_us_step']:.0f}, "
            f"{summary['kernels_step']:.0f} kernels/step", flush=True)
      rows.append({**job.label, "kernel": "(wall clock)", "us_step": wall})
      rows.append({**job.label, "kernel": "(GPU busy: union of kernels)", "us_step": summary["busy_us_step"],
                   "per_step": summary["kernels_step"]})
      rows += [{**job.label, **{c: k[c] for c in COLUMNS[3:]}} for k in summary["by_kernel"][:args.top]]
      rows.append({**job.label, "kernel": "(GPU idle within the span)",
                   "us_step": summary["span_us_step"] - summary["busy_us_step"]})
      rows += [{**job.label, **k} for k in summary["idle_before"][:args.top // 2]]
  tag = "tiny" if args.tiny else args.preset
  path = harness.write_results(
      f"decode_profile_{tag}{'_' + args.tag if args.tag else ''}", rows, COLUMNS,
      f"Decode-step GPU time by kernel, random-weight {tag}",
      notes=("per_step: launches a decode step; us_step: their GPU time a step (a profiled loop of "
             f"{args.steps - 1} steps after a warm-up); share: of the GPU's busy time (of its idle time in "
             "the '(idle before K)' rows: the gaps with no kernel running that kernel K ends). The wall clock is an "
             f"unprofiled call of the same loop. XLA_FLAGS: `{os.environ.get('XLA_FLAGS', '')}`"), out_dir=args.out)
  path.with_name(path.stem + "_loops.json").write_text(json.dumps(loops, indent=1))
  print(path.read_text())


if __name__ == "__main__":
  main()
