"""Decode speed, memory and capacity of every KV-cache method on a full-size random-weight
LLaVA-OneVision-Qwen2-7B in bf16 (issue: end-to-end benchmarks on the H200).

    XLA_PYTHON_CLIENT_MEM_FRACTION=0.95 python -m benchmarks.decode_throughput --capacity --sweeps
        [--settings 60x5 20x5 1x100 32x100] [--methods fp16 rtn4 rtn2 kivi2 kivi4 windowquant A B C]
        [--attention xla pallas] [--norms xla pallas] [--steps 32] [--budget-s 450]
    python -m benchmarks.decode_throughput --tiny --capacity --sweeps   # the tests' tiny model, seconds on a CPU
    ... --preset qwen2-vl-7b-instruct   # Qwen2-VL-7B: the same decoder with M-RoPE, 448 px frames (128 tokens)

One prefill a video length. Every request of a setting (batch x frames) is the same synthetic
video and prompt, so the script prefills ONE request (vision tower and decoder in full precision:
generate's `prefill_requests`), builds each method's plan and cache from it (`plan_and_build`)
and repeats that cache along the request axis: `batch` real copies in device memory, the cache
generate would hold for the batch. The decode loop is generate's (`decode_call`), compiled ahead
of time, then one warm-up call and `--repeats` timed calls of `--steps` tokens, with no early stop
(no end-of-sequence id can occur). ms/step = median loop time / (steps - 1): the first token comes
from the prefill logits.

Per row: tokens/s = batch / step time; the cache's bytes (`nbytes`) and its bytes with every window
at 16 bits; the bytes a step reads (the decoder's weights, less the embedding table, of which it
gathers one row a request, plus the cache) and the floor = those bytes / the device's copy
bandwidth measured in this run; the speed-up over fp16 (same setting and attention) against the
byte-allowed one, (weights + fp16's cache) / (weights + the method's cache); device memory (the
allocator's bytes in use once the batch's cache is built, and its peak so far, which never
resets); the compiled loop's workspace (XLA's temp bytes); compile seconds.

Methods: `wq_jax.methods`' baselines and the paper's Table 8 ablations, which are
`WindowQuantConfig` switches (SPEC §5): A no fixed first window, B random bit widths (each layer's
searched counts at random windows), C no reorder (the interleaved layout: under "xla" XLA's reader
of every window in every format, under "pallas" the paged kernel `interleaved_decode`; no other
"pallas:*" name times it again).

--capacity: per method, the largest batch at the longest setting's frames and the most frames at
batch 1 that fit in device memory, from measured bytes: the cache per request and per frame (the
two video lengths' caches), the compiled loop's workspace per request, the device's free memory
after the weights. Then, last (it drops the prefills' K/V and every cache it does not need), the
largest batches of windowquant and fp16 that fit in what is free at that moment (3 % and 1 GB kept
back) are tried: the decode step compiles on shapes alone (XLA's autotuner allocates trial buffers),
the batch is built, and one step runs; the result says which phase failed, if one did.

--sweeps: windowquant at batch 1 and the longest setting's frames, alpha in {0.5, 1, 2, 3, 4}
(windows of 32) and window size in {8, 16, 32, 64, 128} (alpha 2). The weights are random, so
window scores come from random embeddings: plans and their counts are not the real model's, only
their costs are.

Compilations: a prefill a video length, a cache build a (video length, method), a decode loop a
(setting, method, attention). A setting's loops compile in parallel threads (`--compile-workers`),
all before any of them is timed. Results are rewritten after every row: JSON and markdown
(`benchmarks/results/decode_throughput_<preset or tiny>_*`) and a PNG of ms/step against the floor.
"""
from __future__ import annotations

import argparse
import concurrent.futures
import dataclasses
import functools
import gc
import json
import os
import statistics
import tempfile
import time
import traceback
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from benchmarks import full_size, harness
from wq_jax import generation, methods
from wq_jax import video as video_io
from wq_jax.methods import WindowQuantConfig

PROMPT = "w1 w2 w3 w4 w5 w6 w7 w8 w9 w10 w11 w12 w13 w14 w15 w16"
NO_EOS = [-1]  # no token id is -1: every loop runs all its steps
# name -> (registered method, config or None for its default)
METHODS = {
    "fp16": ("fp16", None), "rtn4": ("rtn4", None), "rtn2": ("rtn2", None),
    "kivi2": ("kivi2", None), "kivi4": ("kivi4", None), "windowquant": ("windowquant", None),
    "A": ("windowquant", WindowQuantConfig(fix_first_window=False)),
    "B": ("windowquant", WindowQuantConfig(random_plan=True)),
    "C": ("windowquant", WindowQuantConfig(reorder=False)),
}
# The kinds of pool each method's cache holds that a Mosaic path may serve: none for fp16, so its programs
# under a "pallas:mosaic_*" path are "pallas"'s; KIVI's only under a path that takes KIVI's values (a scale a
# token), rtn4's only under one that takes INT4.
MOSAIC_POOLS = {"fp16": (), "kivi2": ("kivi2",), "kivi4": ("kivi4",), "rtn4": (4,)}  # others: INT2 (and INT4)
# Ablation C's interleaved layout has two readers: XLA's (every window in every format) and, under any "pallas"
# name, the paged kernel (`pallas_kernels/interleaved_decode.py`, since session 40; its INT4 and INT2 windows
# through the Mosaic kernel's page table at large batches since s41, "pallas:triton" keeping the Triton one): timed
# under "xla", "pallas" and "pallas:triton" as asked, never again under another "pallas:*" name (each would run
# "pallas"'s kernels).
INTERLEAVED = {"C"}
ALPHAS = (0.5, 1.0, 2.0, 3.0, 4.0)
WINDOW_SIZES = (8, 16, 32, 64, 128)
TINY_SETTINGS = ["3x12", "1x24"]  # 3 and 6 windows of 32 visual tokens (9 a frame)

COLUMNS = ["setting", "method", "attention", "ms_step", "tok_s", "floor_ms", "step_over_floor",
           "speedup_vs_fp16", "byte_speedup", "achieved", "vs_fp16_attention", "cache_MB", "fp16_equiv_MB",
           "weights_MB", "windows_16_4_2", "in_use_GB", "peak_GB", "loop_temp_MB", "compile_s", "host_ms",
           "tokens_as_plain"]
CAPACITY_COLUMNS = ["method", "frames", "cache_MB_per_request", "workspace_MB_per_request", "workspace_MB_fixed",
                    "free_GB", "max_batch", "prefill_admits_batch", "cache_MB_per_frame", "max_frames_memory",
                    "max_frames_context", "verified_batch", "verified"]
SWEEP_COLUMNS = ["sweep", "alpha", "window_size", "windows_16_4_2", "tokens_16_4_2", "cache_MB", "ms_step",
                 "compile_s"]


@dataclasses.dataclass(frozen=True)
class Setting:
  batch: int
  frames: int

  @classmethod
  def parse(cls, text: str) -> Setting:
    batch, frames = text.lower().split("x")
    return cls(int(batch), int(frames))

  @property
  def name(self) -> str:
    return f"{self.batch}x{self.frames}"


@dataclasses.dataclass
class Built:
  """One method's cache of the one-request prefill, and how to repeat it into a batch."""
  cache: generation.BuiltCache
  axes: tuple[int, ...]  # per flattened cache leaf, its request axis (-1: a per-layer table)

  @property
  def per_request_bytes(self) -> int:
    return sum(x.nbytes for x, a in zip(jax.tree.leaves(self.cache.cache), self.axes) if a >= 0)

  @property
  def fixed_bytes(self) -> int:
    return sum(x.nbytes for x, a in zip(jax.tree.leaves(self.cache.cache), self.axes) if a < 0)


@dataclasses.dataclass
class Job:
  """One decode loop to compile and time: a built cache repeated to `batch` requests."""
  label: dict  # the row's identifying columns
  built: Built
  batch: int
  attention: str
  compiler_options: dict | None = None  # XLA options of this loop's compilation (`--xla-options`)
  norms: str = "xla"  # the decode step's residual adds and RMS norms: XLA's, or fused ("pallas", `--norms`)
  donate_state: bool = True  # False: every step writes new buffers (`--undonated`)
  per_call: int = 1  # steps a call of the compiled step (a loop on the device where more; `--steps-per-call`)


# ----------------------------------------------------------------------------- batches from one request


def request_axes(prefilled: generation.Prefilled, options: methods.CacheOptions, plan, steps: int) -> tuple[int, ...]:
  """Each cache leaf's request axis: where a two-request cache's shape differs from a one-request one's."""
  p = prefilled

  def build(keys, values, copies):
    return methods.build_method_cache(options, keys, values, plan, visual_start=p.visual_start,
                                      num_visual=p.num_visual, seq_lens=p.seq_lens * copies, max_new_tokens=steps)

  def twice(x):  # [L, 1, ...] -> [L, 2, ...]
    return jax.ShapeDtypeStruct((x.shape[0], 2 * x.shape[1], *x.shape[2:]), x.dtype)

  one = jax.eval_shape(functools.partial(build, copies=1), p.keys, p.values)
  two = jax.eval_shape(functools.partial(build, copies=2), twice(p.keys), twice(p.values))
  return tuple(next((i for i, (m, n) in enumerate(zip(a.shape, b.shape)) if m != n), -1)
               for a, b in zip(jax.tree.leaves(one), jax.tree.leaves(two)))


@functools.partial(jax.jit, static_argnames=("batch", "axes"))
def repeat_requests(tree, batch: int, axes: tuple[int, ...]):
  """Every leaf with a request axis (axes[i] >= 0) repeated `batch` times along it."""
  leaves, treedef = jax.tree.flatten(tree)
  return treedef.unflatten([x if a < 0 else jnp.repeat(x, batch, axis=a) for x, a in zip(leaves, axes)])


def batch_inputs(prefilled: generation.Prefilled, built: Built, batch: int, abstract: bool = False):
  """(cache, first logits, next positions) of `batch` copies of the request; shapes alone if `abstract`."""
  one = (built.cache.cache, prefilled.first_logits, prefilled.next_positions)
  repeat = functools.partial(repeat_requests, batch=batch, axes=built.axes + (0, 0))
  return jax.eval_shape(repeat, one) if abstract else repeat(one)


# ----------------------------------------------------------------------------- measuring


def prefill_one(model, frames: int, steps: int) -> generation.Prefilled:
  size = full_size.frame_side(model)
  video = video_io.synthetic_frames(frames, size, size, seed=0)
  return generation.prefill_requests(model, [video], [PROMPT], max_new_tokens=steps)


def build(prefilled: generation.Prefilled, name: str, steps: int, config=None) -> Built:
  """Method `name`'s cache of the one-request prefill (with `config` instead of the table's, if given)."""
  registered, default = METHODS[name]
  spec, config = methods.resolve(registered, config or default)
  built = generation.plan_and_build(prefilled, spec, config, max_new_tokens=steps)
  return Built(built, request_axes(prefilled, spec.cache_options(config), built.plan, steps))


def decoder_read_bytes(model) -> int:
  """Weight bytes a decode step reads: the decoder's, less the embedding table (one row a request
  is gathered) unless it is also the output head."""
  decoder = model.params["decoder"]
  total = sum(x.nbytes for x in jax.tree.leaves(decoder))
  return total if model.config.text.tie_word_embeddings else total - decoder["embed"].nbytes


def compile_all(model, prefilled, jobs: list[Job], steps: int, workers: int) -> list:
  """Futures of (compiled loop, seconds), in job order, all done: the loops compile on abstract
  shapes in threads, and none is timed while another compiles (autotuning runs on the device)."""
  def compile_one(job):
    cache, logits, positions = batch_inputs(prefilled, job.built, job.batch, abstract=True)
    start = time.perf_counter()
    call = generation.decode_call(model, cache, logits, positions, steps=steps, eos_ids=NO_EOS,
                                  attention=job.attention, norms=job.norms, steps_per_call=job.per_call)
    compiled = call.compile(job.compiler_options, job.donate_state)
    return compiled, time.perf_counter() - start

  pool = concurrent.futures.ThreadPoolExecutor(max_workers=max(1, min(workers, os.cpu_count() or 1)))
  futures = [pool.submit(compile_one, job) for job in jobs]
  pool.shutdown(wait=True)
  return futures


def time_loop(model, prefilled, job: Job, compiled, steps: int, repeats: int) -> dict:
  """One warm-up call, then the median of `repeats` calls; device memory once the batch's cache is built."""
  cache, logits, positions = jax.block_until_ready(batch_inputs(prefilled, job.built, job.batch))
  in_use = _stat("bytes_in_use")
  call = generation.decode_call(model, cache, logits, positions, steps=steps, eos_ids=NO_EOS,
                                attention=job.attention, norms=job.norms)
  tokens, made, _ = jax.block_until_ready(compiled(*call.arrays))
  if int(made) != steps:
    raise RuntimeError(f"the loop made {int(made)} of {steps} tokens")
  times, host = [], []
  timed = host_timed(compiled, host)
  for _ in range(repeats):
    start = time.perf_counter()
    jax.block_until_ready(timed(*call.arrays))
    times.append(time.perf_counter() - start)
  memory = compiled.memory_analysis()
  return {"loop_s": statistics.median(times), "loop_times_s": times, "host_s": statistics.median(host),
          "tokens": np.asarray(tokens),
          "cache_bytes": cache.nbytes,
          "fp16_equiv_bytes": generation.high_precision_bytes(cache), "in_use_bytes": in_use,
          "peak_bytes": _stat("peak_bytes_in_use"), "temp_bytes": getattr(memory, "temp_size_in_bytes", None)}


def host_timed(loop: generation.DecodeLoop, spent: list) -> generation.DecodeLoop:
  """`loop`, appending to `spent` the host's seconds in each call of its compiled step (one step, or K): a call
  returns once its work is enqueued, so where they match the GPU's time for it the host, not the GPU, paces the
  loop (the GPU idles between calls; session 28's profile found the idle time there, not between launches)."""
  def timed(*args):
    start = time.perf_counter()
    out = loop.step(*args)
    spent.append(time.perf_counter() - start)
    return out
  return generation.DecodeLoop(loop.static, step=timed)


def _stat(key: str) -> int | None:
  stats = harness.memory_stats()
  return int(stats[key]) if stats and key in stats else None


def _counts(plan: np.ndarray) -> str:
  return "/".join(str(int((plan == b).sum())) for b in (16, 4, 2))


def _gb(x):
  return None if x is None else x / 1e9


def _mb(x):
  return None if x is None else x / 1e6


# ----------------------------------------------------------------------------- the report


class Report:
  """Rows of the three tables, rewritten to disk after every change (a run cut short keeps its rows)."""

  def __init__(self, tag: str, title: str, device: dict, out_dir: Path | None):
    self.tag, self.title, self.device, self.out_dir = tag, title, device, out_dir
    self.rows, self.capacity, self.sweeps, self.skipped = [], [], [], []
    self.tokens = {}  # (setting, method, attention): the plain loop's greedy tokens [B, steps]

  def notes(self) -> str:
    d = self.device
    lines = [
        (f"- copy bandwidth (bytes read + written): {d['copy_TBps']:.3g} TB/s ({d['copy']}); "
         f"decoder weights read a step: {d['weight_bytes'] / 1e6:.6g} MB; "
         f"free device memory after the weights: {_gb(d['free_bytes'])} GB ({d['free_source']})"),
        ("- one request is prefilled once a video length (vision tower and decoder, full precision); every "
         "request of a batch is that same synthetic video and prompt, so each method's cache is built once "
         "from it and repeated along the request axis (real copies in memory): the plan is the one a batch "
         "of identical requests votes"),
        ("- ms_step: median decode-loop time / (steps - 1) after a warm-up call (the first token comes from "
         "the prefill logits); tok_s = batch / step; floor = (weights + cache bytes) / copy bandwidth; "
         "host_ms: the median time the host spends in a call of the compiled step (one step, or K where [K steps a "
         "call]; it returns once the work is enqueued: where it nears the calls' GPU time, the host paces the loop); "
         "tokens_as_plain: where a row's loop differs from its method and attention's plain one (XLA options, "
         "steps a call, norms, donation), the fraction of its greedy tokens equal to the plain loop's"),
        ("- speedup_vs_fp16: fp16's step / this step, same setting and attention, else fp16 under the "
         "first attention asked for (C runs under xla, pallas, pallas:triton and a pallas:mosaic_* path that serves "
         "INT2 pools, as asked: its paged kernels; a method is "
         "not timed again under a pallas:mosaic_* path that serves none of its pools: fp16, KIVI but under a "
         "KIVI one, rtn4 but under an INT4 one); "
         "vs_fp16_attention says which; byte_speedup: (weights + fp16 cache) / (weights + this cache); "
         "achieved = speedup_vs_fp16 / byte_speedup"),
        ("- A: no fixed first window; B: random bit widths, each layer's searched counts; C: no reorder "
         "(interleaved layout: XLA's every-format reader, or the paged Pallas kernel under pallas). Random weights: "
         "plans come from random embeddings; "
         "windows_16_4_2 counts every layer's windows at 16, 4 and 2 bits"),
        ("- peak_GB is the allocator's peak since the process started (it never resets); in_use_GB once "
         "the batch's cache is built (weights, that cache, and this process's one-request prefills and "
         "caches); loop_temp_MB: XLA's temp buffers of the compiled loop"),
    ]
    if self.skipped:
      lines.append(f"- skipped (time budget or error): {'; '.join(self.skipped)}")
    return "\n".join(lines)

  def write(self) -> None:
    notes = self.notes()
    harness.write_results(f"decode_throughput_{self.tag}", self.rows, COLUMNS, self.title, notes, self.out_dir)
    if self.capacity:
      harness.write_results(f"decode_throughput_{self.tag}_capacity", self.capacity, CAPACITY_COLUMNS,
                            f"Capacity: {self.title}", notes, self.out_dir)
    if self.sweeps:
      harness.write_results(f"decode_throughput_{self.tag}_sweeps", self.sweeps, SWEEP_COLUMNS,
                            f"WindowQuant alpha and window-size sweeps: {self.title}", notes, self.out_dir)

  def plot(self) -> None:
    if self.rows:
      plot(self.rows, (self.out_dir or harness.RESULTS) / f"decode_throughput_{self.tag}_{jax.default_backend()}.png")

  def fp16_row(self, setting: str, attention: str) -> dict | None:
    return next((r for r in self.rows if r["setting"] == setting and r["method"] == "fp16"
                 and r["attention"] == attention), None)


def plot(rows: list[dict], path: Path) -> None:
  """ms/step against the floor, a colour a method, a marker an attention implementation."""
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  fig, ax = plt.subplots(figsize=(7, 5))
  attentions = sorted({r["attention"] for r in rows})  # "xla", "pallas", and "pallas [NAME]" (`--xla-options`)
  markers = dict(zip(attentions, "o^sDvP*X"))
  for i, method in enumerate(METHODS):
    for attention, marker in markers.items():
      group = [r for r in rows if r["method"] == method and r["attention"] == attention]
      if group:
        ax.scatter([r["floor_ms"] for r in group], [r["ms_step"] for r in group], color=f"C{i}", marker=marker,
                   label=f"{method} {attention}")
  low = min(r["floor_ms"] for r in rows)
  top = max(r["ms_step"] for r in rows)
  ax.plot([low, top], [low, top], "k--", lw=1, label="step = floor")
  ax.set_xscale("log")
  ax.set_yscale("log")
  ax.set_xlabel("floor: (weights + cache bytes) / copy bandwidth (ms)")
  ax.set_ylabel("decode step (ms)")
  ax.legend(fontsize=6, ncol=2)
  fig.tight_layout()
  fig.savefig(path, dpi=120)
  plt.close(fig)


# ----------------------------------------------------------------------------- the three parts


class Budget:
  """Wall seconds since the start, against `--budget-s`."""

  def __init__(self, seconds: float):
    self.start, self.seconds = time.perf_counter(), seconds

  def spent(self) -> bool:
    return time.perf_counter() - self.start > self.seconds


def run_jobs(model, prefilled, jobs: list[Job], args, budget: Budget, report: Report, on_timed) -> None:
  """Compiles the jobs' loops in parallel, then times them one by one; `on_timed(job, timing)` makes the row."""
  futures = compile_all(model, prefilled, jobs, args.steps, args.compile_workers)
  for job, future in zip(jobs, futures):
    what = " ".join(str(v) for v in job.label.values())
    if budget.spent():
      report.skipped.append(f"{what} (budget)")
      continue
    try:
      compiled, compile_s = future.result()
      timing = time_loop(model, prefilled, job, compiled, args.steps, args.repeats)
      del compiled
    except Exception as e:  # one failed row (an out-of-memory, a kernel's limit) must not end the run
      report.skipped.append(f"{what}: {repr(e)[:300]}")
      print(f"{what} failed: {e!r}"[:800], flush=True)
      report.write()
      continue
    on_timed(job, dict(timing, compile_s=compile_s))
    report.write()


def _attentions(method: str, asked: list[str]) -> list[str]:
  """The attentions to time `method` under: a "pallas:mosaic_*" path only where it serves one of the
  method's pools, and "pallas:triton" only where the method has pools that "pallas" may send to the Mosaic
  kernel (at large batches, as `LARGE_BATCH_MOSAIC` says); else either would time "pallas" again. All of them
  where "pallas" was not asked."""
  if method in INTERLEAVED:  # its paged INT2 launches take a "pallas:mosaic_*" path's configuration (s46)
    return [a for a in asked if a in ("xla", "pallas", "pallas:triton")
            or (a.startswith("pallas:mosaic") and 2 in served(a))] or ["pallas"]
  if "pallas" not in asked:
    return asked
  bits = MOSAIC_POOLS.get(method, (2, 4))

  def differs(a):
    if a == "pallas:triton":
      from pallas_kernels import quantized_decode as qd
      large = dataclasses.replace(qd.DecodeConfig(), int2_mosaic=True, **qd.LARGE_BATCH_MOSAIC)
      return bool(set(bits) & _kinds(large))
    return not a.startswith("pallas:mosaic") or bool(set(bits) & served(a))
  return [a for a in asked if differs(a)]


def served(attention_name: str) -> set:
  """The kinds of pool (as MOSAIC_POOLS names them) a "pallas:mosaic_*" path sends to the Mosaic kernel: from
  its configuration where it is registered or a `decode_attention` variant, else by its name."""
  from benchmarks.decode_attention import VARIANTS
  from pallas_kernels import registration
  config = registration.CONFIGS.get(attention_name) or VARIANTS.get(attention_name.split(":", 1)[-1])
  if config is None:
    return {2, 4} if "int4" in attention_name else {2}
  return _kinds(config)


def _kinds(config) -> set:
  """The kinds of pool (as MOSAIC_POOLS names them) `config` sends to the Mosaic kernel."""
  widths = {2} if config.int2_mosaic else set()
  widths |= {4} if config.int4_mosaic else set()
  return widths | ({f"kivi{w}" for w in widths} if config.kivi_mosaic else set())


def main_rows(model, prefills, built, setting: Setting, args, device, budget, report, workspace) -> None:
  """Times every (method, attention) of a setting; notes each loop's workspace in `workspace`."""
  prefilled = prefills[setting.frames]
  jobs = [Job({"setting": setting.name, "method": m,
               "attention": a + (f" [{name}]" if name else "") + (" [pallas norms]" if norms == "pallas" else "")
               + ("" if donate else " [state not donated]") + (f" [{k} steps a call]" if k > 1 else "")},
              built[setting.frames, m], setting.batch, a, options, norms, donate, k)
          for name, options in [("", None), *args.xla_options]
          for donate in [True, *([False] if args.undonated else [])]
          for k in args.steps_per_call
          for norms in args.norms
          for m in args.methods for a in _attentions(m, args.attention)]

  def on_timed(job, t):
    m, a = job.label["method"], job.label["attention"]
    ms = 1e3 * t["loop_s"] / (args.steps - 1)
    floor = 1e3 * (device["weight_bytes"] + t["cache_bytes"]) / (device["copy_TBps"] * 1e12)
    row = dict(job.label, batch=setting.batch, frames=setting.frames, tokens=prefilled.seq_lens[0], ms_step=ms,
               tok_s=1e3 * setting.batch / ms, floor_ms=floor, step_over_floor=ms / floor,
               cache_MB=t["cache_bytes"] / 1e6, fp16_equiv_MB=t["fp16_equiv_bytes"] / 1e6,
               weights_MB=device["weight_bytes"] / 1e6, windows_16_4_2=_counts(job.built.cache.plan),
               in_use_GB=_gb(t["in_use_bytes"]), peak_GB=_gb(t["peak_bytes"]), loop_temp_MB=_mb(t["temp_bytes"]),
               compile_s=t["compile_s"], loop_times_s=t["loop_times_s"], steps=args.steps,
               host_ms=1e3 * t["host_s"])
    # a loop under other XLA options (or steps a call, norms, donation) makes the same greedy tokens as the
    # plain one of its method and attention, timed first: the fraction equal
    plain = (setting.name, m, job.attention)
    if job.label["attention"] == job.attention:
      report.tokens[plain] = t["tokens"]
    elif plain in report.tokens:
      row["tokens_as_plain"] = float(np.mean(report.tokens[plain] == t["tokens"]))
    report.rows.append(row)
    # An XLA-only layout (C) is compared with fp16 under the same attention where it ran, else under the
    # first one asked for: what it would replace.
    fp16 = report.fp16_row(setting.name, a) or report.fp16_row(setting.name, args.attention[0])
    if fp16 is not None:
      row["vs_fp16_attention"] = fp16["attention"]
      w = device["weight_bytes"]
      row["speedup_vs_fp16"] = fp16["ms_step"] / ms
      row["byte_speedup"] = (w + 1e6 * fp16["cache_MB"]) / (w + t["cache_bytes"])
      row["achieved"] = row["speedup_vs_fp16"] / row["byte_speedup"]
    if t["temp_bytes"] is not None:  # the larger of the attentions' workspaces
      by_batch = workspace.setdefault((setting.frames, m), {})
      by_batch[setting.batch] = max(by_batch.get(setting.batch, 0), t["temp_bytes"])
    print(f"{setting.name} {m} {a}: {ms:.3f} ms/step (floor {floor:.3f}), cache {t['cache_bytes'] / 1e6:.1f} MB, "
          f"compile {t['compile_s']:.1f} s", flush=True)

  run_jobs(model, prefilled, jobs, args, budget, report, on_timed)


def per_request(by_batch: dict[int, int]) -> tuple[float, float]:
  """(fixed, per request) bytes of the loop's workspace: a line through the two largest batches
  measured, or all of it per request when there is one."""
  if not by_batch:
    return 0.0, 0.0
  batches = sorted(by_batch)
  if len(batches) == 1:
    return 0.0, by_batch[batches[0]] / batches[0]
  b1, b2 = batches[-2:]
  slope = max(0.0, (by_batch[b2] - by_batch[b1]) / (b2 - b1))
  return max(0.0, by_batch[b2] - slope * b2), slope


TRY_MARGIN, TRY_RESERVE = 0.97, 1e9  # of the room left when a capacity try starts


def capacity_rows(model, prefills, built, workspace, args, device, report) -> None:
  """Predicted capacity per method at the longest video, then fp16's and windowquant's batches tried
  (after dropping from `built` every cache the tries do not read)."""
  longest, shortest = max(prefills), min(prefills)
  free = device["free_bytes"]
  tokens = prefills[longest].seq_lens[0]
  frame_tokens = ((tokens - prefills[shortest].seq_lens[0]) / (longest - shortest) if longest > shortest
                  else prefills[longest].num_visual / longest)
  prefill_need = generation.estimate_request_bytes(model, batch=1, tokens=tokens + args.steps)
  for m in args.methods:
    b = built[longest, m]
    ws_fixed, ws = per_request(workspace.get((longest, m), {}))
    cache_per_frame = (b.per_request_bytes - built[shortest, m].per_request_bytes) / (longest - shortest) \
        if longest > shortest else b.per_request_bytes / longest
    per_frame = cache_per_frame + ws / longest  # the workspace a request grows with its tokens
    row = {"method": m, "frames": longest, "cache_MB_per_request": b.per_request_bytes / 1e6,
           "workspace_MB_per_request": ws / 1e6, "workspace_MB_fixed": ws_fixed / 1e6, "free_GB": _gb(free),
           "cache_MB_per_frame": cache_per_frame / 1e6}
    if model.max_positions:
      text = tokens - frame_tokens * longest
      row["max_frames_context"] = int((model.max_positions - args.steps - text) // frame_tokens)
    if free is not None:
      fixed = b.fixed_bytes + ws_fixed
      row["max_batch"] = int((free - fixed) // (b.per_request_bytes + ws))
      row["prefill_admits_batch"] = int(free // prefill_need)
      text_share = b.per_request_bytes + ws - per_frame * longest
      if per_frame > 0:  # (KIVI's high-precision residual can make a short video's cache the larger)
        row["max_frames_memory"] = int((free - fixed - text_share) // per_frame)
    report.capacity.append(row)
    report.write()
  tried = ("windowquant", "fp16")  # the smaller batch's leftovers, if any, then weigh on the larger
  for key in [k for k in built if k != (longest, tried[0]) and k != (longest, tried[1])]:
    del built[key]  # free what the tries do not need
  for frames in prefills:  # the tries read only the prefills' first logits and positions
    prefills[frames] = dataclasses.replace(prefills[frames], keys=None, values=None, embeds=None)
  gc.collect()
  rows = {row["method"]: row for row in report.capacity}
  for m in tried:
    row = rows.get(m, {})
    if row.get("max_batch", 0) <= 0:
      continue
    b = built[longest, m]
    ws_fixed, ws = per_request(workspace.get((longest, m), {}))
    # The prediction counts the whole free memory; the try has what this process does not hold now,
    # less a margin: the allocator needs contiguous room for each leaf of tens of GB (at 568 of a
    # predicted 574 requests it failed on a 1.2 GB leaf), and a failed try leaves its buffers held.
    limit = _stat("bytes_limit")
    room = TRY_MARGIN * (limit - _stat("bytes_in_use")) - TRY_RESERVE if limit else free  # (CPU: --memory-gb)
    batch = min(row["max_batch"], int((room - ws_fixed) // (b.per_request_bytes + ws)))
    row.update(verified_batch=batch,
               verified=try_batch(model, prefills[longest], b, batch, args.attention[0], device))
    gc.collect()
    print(f"capacity {row}", flush=True)
    report.write()


def try_batch(model, prefilled, b: Built, batch: int, attention: str, device: dict) -> str:
  """Compiles the decode step for `batch` requests, then allocates `batch` copies of the cache and
  runs one step: 'ok' or the error, the phase and our innermost source line it came from, and
  what this process held besides the weights (its one-request prefills and caches) when it tried.

  The step compiles first, on shapes alone: XLA's autotuner allocates trial buffers while it
  compiles, and beside a full cache those failed (3.6 GB at 546 requests).
  """
  in_use = _stat("bytes_in_use")
  held = "" if in_use is None else f"; {_gb(in_use - device['weights_in_use'])} GB held besides the weights"
  phase = "compiling the step"
  try:
    shapes = batch_inputs(prefilled, b, batch, abstract=True)
    loop = generation.decode_call(model, *shapes, steps=2, eos_ids=NO_EOS, attention=attention).compile()
    temp = getattr(loop.memory_analysis(), "temp_size_in_bytes", None)
    phase = "building the batch"
    cache, logits, positions = jax.block_until_ready(batch_inputs(prefilled, b, batch))
    phase = f"decoding (batch built, {_gb(_stat('bytes_in_use'))} GB in use)"
    call = generation.decode_call(model, cache, logits, positions, steps=2, eos_ids=NO_EOS, attention=attention)
    jax.block_until_ready(loop(*call.arrays))
    return f"ok: one step ran, peak {_gb(_stat('peak_bytes_in_use'))} GB, step temp {_mb(temp)} MB{held}"
  except Exception as e:
    ours = [f for f in traceback.extract_tb(e.__traceback__)
            if "/wq_jax/" in f.filename or "/benchmarks/" in f.filename]
    where = f" at {Path(ours[-1].filename).name}:{ours[-1].lineno} `{ours[-1].line}`" if ours else ""
    return f"failed while {phase}{where}: {repr(e)[:300]}{held}"


def sweep_rows(model, prefilled, frames: int, args, budget, report) -> None:
  configs = [("alpha", WindowQuantConfig(alpha=a)) for a in args.alphas]
  configs += [("window", WindowQuantConfig(window_size=w)) for w in args.window_sizes if w != 32]
  jobs = [Job({"sweep": kind, "alpha": c.alpha, "window_size": c.window_size},
              build(prefilled, "windowquant", args.steps, c), 1, args.attention[0]) for kind, c in configs]

  def on_timed(job, t):
    plan, s = job.built.cache.plan, job.label["window_size"]
    report.sweeps.append(dict(
        job.label, frames=frames, windows_16_4_2=_counts(plan),
        tokens_16_4_2="/".join(str(s * int((plan == bits).sum())) for bits in (16, 4, 2)),
        cache_MB=t["cache_bytes"] / 1e6, ms_step=1e3 * t["loop_s"] / (args.steps - 1), compile_s=t["compile_s"]))
    print(f"sweep {report.sweeps[-1]}", flush=True)

  run_jobs(model, prefilled, jobs, args, budget, report, on_timed)


# ----------------------------------------------------------------------------- main


def _named_options(text: str) -> tuple[str, dict]:
  """'NAME=JSON' -> (NAME, the options dict)."""
  name, sep, options = text.partition("=")
  if not sep or not name:
    raise argparse.ArgumentTypeError(f"expected NAME=JSON, got {text!r}")
  try:
    return name, json.loads(options)
  except json.JSONDecodeError as e:
    raise argparse.ArgumentTypeError(f"{name}'s options are not JSON: {e}") from None


def parse_args(argv=None):
  gpu = jax.default_backend() == "gpu"
  parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--preset", default="llava-onevision-qwen2-7b-ov")
  parser.add_argument("--tiny", action="store_true", help="the tests' tiny LLaVA-OneVision (CPU, seconds)")
  parser.add_argument("--settings", nargs="+", help="BATCHxFRAMES (default 60x5 20x5 1x100 32x100)")
  parser.add_argument("--methods", nargs="+", default=list(METHODS), choices=list(METHODS))
  parser.add_argument("--attention", nargs="+", default=["xla", "pallas"] if gpu else ["xla"],
                      help="implementations; pallas:NAME is the kernel with benchmarks.decode_attention's "
                      "tiling variant NAME")
  parser.add_argument("--steps", type=int, default=32, help="tokens a loop makes (steps - 1 decode steps)")
  parser.add_argument("--repeats", type=int, default=2, help="timed calls a loop, after the warm-up")
  parser.add_argument("--capacity", action="store_true")
  parser.add_argument("--sweeps", action="store_true")
  parser.add_argument("--alphas", nargs="+", type=float, default=list(ALPHAS), help="--sweeps' alphas")
  parser.add_argument("--window-sizes", nargs="+", type=int, default=list(WINDOW_SIZES),
                      help="--sweeps' window sizes (32, the default, is the alpha sweep's)")
  parser.add_argument("--xla-options", nargs="+", default=[], type=_named_options, metavar="NAME=JSON",
                      help="also time every loop compiled with these XLA options, in the same run, e.g. "
                           "'graphs={\"xla_gpu_graph_min_graph_size\": 1}'; rows say [NAME] after the attention")
  parser.add_argument("--norms", nargs="+", default=["xla"], choices=["xla", "pallas"],
                      help="the decode step's residual adds and RMS norms: XLA's, and/or one Pallas launch each "
                           "(`pallas_kernels.residual_norm`); rows say [pallas norms] after the attention")
  parser.add_argument("--undonated", action="store_true",
                      help="also time every loop with a step that writes its state (token, index, rest segment...) "
                           "to new buffers, not the donated ones: rows say [state not donated]")
  parser.add_argument("--steps-per-call", nargs="+", type=int, default=[1],
                      help="steps a call of the compiled step: more than 1 runs them in a loop on the device "
                           "(`generation.decode_call(steps_per_call=)`); rows say [K steps a call]")
  parser.add_argument("--budget-s", type=float, default=1e9, help="start nothing new after this many seconds")
  parser.add_argument("--compile-workers", type=int, default=8)
  parser.add_argument("--memory-gb", type=float, help="device memory for --capacity where the allocator "
                      "reports none (CPU): the free bytes after the weights")
  parser.add_argument("--out", type=Path, help="results folder (default benchmarks/results)")
  parser.add_argument("--tag", default="", help="appended to the results' names (a run's time, say), so that "
                      "a run does not overwrite an earlier one")
  args = parser.parse_args(argv)
  args.settings = [Setting.parse(s) for s in args.settings or
                   (TINY_SETTINGS if args.tiny else ["60x5", "20x5", "1x100", "32x100"])]
  # fp16 first: every other row compares with it.
  args.methods = sorted(dict.fromkeys(args.methods), key=lambda m: m != "fp16")
  if args.steps < 2:
    parser.error("--steps must be at least 2 (the first token comes from the prefill)")
  if min(args.steps_per_call) < 1:
    parser.error("--steps-per-call: at least 1")
  from pallas_kernels import registration  # noqa: F401 (registers the kernel's own names)
  from wq_jax import attention
  for name in args.attention:
    # `pallas_kernels.registration` names some itself ("pallas:triton", the Mosaic configurations).
    if name.startswith("pallas:") and name not in attention.implementations():
      register_kernel_variant(name, parser)
  return args


def register_kernel_variant(name: str, parser) -> None:
  """Registers `pallas:VARIANT` as an attention implementation: the kernel with that tiling."""
  from benchmarks.decode_attention import VARIANTS
  from pallas_kernels import registration
  variant = name.split(":", 1)[1]
  if variant not in VARIANTS:
    parser.error(f"--attention {name}: no kernel variant {variant!r}; known: {', '.join(VARIANTS)}")
  registration.register_variant(name, VARIANTS[variant])


def measure_device(model, args) -> dict:
  """Free memory right after the weights are placed, then the copy bandwidth and the weight bytes."""
  stats = harness.memory_stats()
  if stats and "bytes_limit" in stats:
    free, source = stats["bytes_limit"] - stats["bytes_in_use"], "allocator: bytes_limit - bytes_in_use"
  else:
    free = None if args.memory_gb is None else args.memory_gb * 1e9
    source = "--memory-gb" if free is not None else "unknown"
  copy = harness.copy_bandwidth(1 << 24 if args.tiny else 1 << 32)
  copy_label = "torch copy" if "torch_copy_TBps" in copy else "jnp x + 1"
  return {"free_bytes": free, "free_source": source, "weights_in_use": stats and stats.get("bytes_in_use"),
          "copy": copy_label, "copy_all": copy,
          "copy_TBps": harness.best_copy_TBps(copy), "weight_bytes": decoder_read_bytes(model)}


def main(argv=None) -> Report:
  args = parse_args(argv)
  budget = Budget(args.budget_s)
  with tempfile.TemporaryDirectory() as tmp:
    if args.tiny:
      model, tag = full_size.tiny_llava_onevision(Path(tmp) / "model"), "tiny"
    else:
      model, tag = full_size.model(args.preset, Path(tmp) / "model"), args.preset
    device = measure_device(model, args)
    print(f"device {device}", flush=True)
    title = (f"Decode throughput, random-weight {'tiny LLaVA-OneVision' if args.tiny else args.preset}, "
             f"{model.dtype}, {args.steps} tokens a loop")
    report = Report(tag + (f"_{args.tag}" if args.tag else ""), title, device, args.out)
    frames = sorted({s.frames for s in args.settings})
    prefills = {f: prefill_one(model, f, args.steps) for f in frames}
    built = {(f, m): build(prefills[f], m, args.steps) for f in frames for m in args.methods}
    print(f"prefilled {frames} frames, built {len(built)} caches: {time.perf_counter() - budget.start:.1f} s",
          flush=True)
    workspace = {}  # (frames, method) -> {batch: the compiled loop's temp bytes}
    for setting in args.settings:
      if budget.spent():
        report.skipped.append(f"setting {setting.name} (budget)")
        continue
      main_rows(model, prefills, built, setting, args, device, budget, report, workspace)
      report.plot()
    if args.sweeps and not budget.spent():
      sweep_rows(model, prefills[max(frames)], max(frames), args, budget, report)
    if args.capacity:  # last: it drops the prefills' K/V and most caches (and it reads the rows' workspaces)
      capacity_rows(model, prefills, built, workspace, args, device, report)
    report.write()
  print(f"done in {time.perf_counter() - budget.start:.0f} s", flush=True)
  return report


if __name__ == "__main__":
  main()
