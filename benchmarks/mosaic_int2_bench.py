"""The Mosaic GPU INT2 kernel (`pallas_kernels/mosaic_int2.py`) against the Triton kernel, one run (JAX >= 0.11).

For each batch (Qwen2-7B attention: 4 KV heads, 7 query heads each, head dim 128) and 32k tokens:
  - `mosaic`: the Mosaic kernel and the merge of its partials, over one INT2 pool of exactly `tokens`;
  - `triton`: the registered `"pallas:triton"` path on the `int2` plan of `decode_attention.py` (the same pool
    less two windows, plus 80 bf16 rest tokens), the way the model calls it;
  - a device-to-device copy of the Mosaic inputs' bytes (`jnp.copy`; the H200's torch copy reaches 4.28).
Times are medians of wall-clock dispatches of many calls, and the GPU time a call from a profile (the
kernels' summed durations). First, the kernel is checked against dequantize-then-attend in float64 on
fresh random data (a small case, and four pairs of each full-size case); a mismatch exits 1. Knockout variants
(`knockout` in their options: wrong by design, a diagnostic of what the conversions cost) are timed unchecked.

    PYTHONPATH=. python benchmarks/mosaic_int2_bench.py --batches 8 60 --splits 4 8 16
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from benchmarks import decode_attention as da
from benchmarks.harness import best_copy_TBps, copy_bandwidth, provenance
from pallas_kernels import mosaic_int2 as mi

GROUP = da.HEADS // da.KV_HEADS
INTERPRET = None  # on a CPU (a dry run of the script): Mosaic GPU's interpret mode


VARIANTS = mi.VARIANTS  # name: keyword arguments of mosaic_int2.int2_decode


def variant_splits(variant: str, splits: int, pairs: int) -> int:
  """`splits` as `variant`'s CTAs can take them (`mosaic_int2.cta_splits`: a multiple of its warpgroups, or a
  divisor whose pairs fill whole CTAs)."""
  return mi.cta_splits(splits, VARIANTS[variant].get("warpgroups", 1), pairs)


def attend(q, *pool, splits, variant="fast"):
  splits = variant_splits(variant, splits, q.shape[0])
  return mi.attend(q, *pool, splits=splits, interpret=INTERPRET, options=tuple(VARIANTS[variant].items()))


def kernel_pool(pool, variant: str):
  """The pool as `variant` reads it: its minimums folded (`mosaic_int2.fold_minimums`) and its scales and
  minimums in `mosaic_int2.thread_order` where it says so."""
  options = VARIANTS[variant]
  if options.get("prefolded_minimums"):
    bits = pool[0].shape[-1] * 8 // mi.HEAD_DIM
    k_codes, k_scale, k_min, v_codes, v_scale, v_min = pool
    pool = (k_codes, k_scale, mi.fold_minimums(k_scale, k_min, bits), v_codes, v_scale,
            mi.fold_minimums(v_scale, v_min, bits))
  if not options.get("metadata_in_thread_order"):
    return pool
  return tuple(mi.thread_order(x) if i in (1, 2, 4, 5) else x for i, x in enumerate(pool))


def int2_pool(key, pairs: int, tokens: int, bits: int = 2, per_token: bool = False):
  """Random INT2 (or INT4) keys and values [pairs, tokens, 32 (64)] with per-window f16 scales and minimums
  (`per_token`: the values' a token and group of 32 channels, KIVI's)."""
  keys = jax.random.split(key, 6)
  codes = lambda k: jax.random.bits(k, (pairs, tokens, mi.HEAD_DIM * bits // 8), jnp.uint8)
  window_meta = (pairs, tokens // mi.WINDOW, mi.HEAD_DIM)
  token_meta = (pairs, tokens, mi.HEAD_DIM // 32) if per_token else window_meta
  scale = lambda k, meta: (jax.random.uniform(k, meta, jnp.float32, 0.02, 0.1) * 3
                           / ((1 << bits) - 1)).astype(jnp.float16)
  minimum = lambda k, meta: (-jax.random.uniform(k, meta, jnp.float32, 0.0, 0.3)).astype(jnp.float16)
  return (codes(keys[0]), scale(keys[1], window_meta), minimum(keys[2], window_meta), codes(keys[3]),
          scale(keys[4], token_meta), minimum(keys[5], token_meta))


def per_token(variant: str) -> bool:
  """Whether `variant` reads KIVI's values (a scale and minimum a token and group of 32 channels)."""
  return bool(VARIANTS[variant].get("values_per_token"))


def scaled_queries(key, pairs: int):
  q = jax.random.normal(key, (pairs, GROUP, mi.HEAD_DIM), jnp.float32)
  return q * (mi.HEAD_DIM ** -0.5 * np.log2(np.e))  # base-2 scores, as the registered path scales them


def check(pairs, tokens, splits, key, subset=None, variant="fast", rising=False, bits=2) -> float:
  """Largest |error| of the kernel's attention against float64 dequantize-then-attend (on `subset` pairs).
  `rising`: the first head's scores rise 5 a step and one window is 60 above the rest (`lagged_max`'s
  recomputation after steps within its margin)."""
  pool = int2_pool(key, pairs, tokens, bits, per_token(variant))
  q = scaled_queries(jax.random.fold_in(key, 1), pairs)
  if rising:
    rise = 2.5 * jnp.arange(tokens // mi.WINDOW)
    rise = rise.at[len(rise) * 2 // 3].set(60.0)
    direction = q[:, 0] / (q[:, 0] ** 2).sum(axis=1, keepdims=True)  # q_0 . direction = 1
    pool = (*pool[:2], (pool[2] + rise[None, :, None] * direction[:, None, :]).astype(jnp.float16), *pool[3:])
  out = np.asarray(attend(q, *kernel_pool(pool, variant), splits=splits, variant=variant))
  take = slice(None) if subset is None else slice(0, subset)
  want = mi.reference(np.asarray(q)[take], *(np.asarray(x)[take] for x in pool))
  return float(np.abs(out[take] - want).max())


def _distinct(tree, i: int):
  """Another copy of the inputs (codes XOR-ed, the rest copied), so that timed calls stream from HBM."""
  return jax.tree.map(lambda x: x ^ jnp.uint8(i + 1) if x.dtype == jnp.uint8 else x + 0, tree)


def _timed(fn, inputs, queries, nbytes: int) -> dict:
  """`fn(q, *inputs[i])` over the queries in one jit: wall clock and GPU time a call, as decode_attention."""
  compiled, compile_s = da.compile_calls(fn, inputs, queries)
  t, _, finite, _ = da.bench(fn, inputs, queries, compiled=compiled)
  gpu = da.device_time(compiled, inputs, queries)
  return dict(bytes=nbytes, wall_s=t, compile_s=compile_s, finite=finite, inner=len(queries),
              gpu_s=gpu and gpu["kernel_s"], gpu_top=gpu and gpu["top"])


def time_mosaic(batch, tokens, splits, key, variant, bits=2):
  pairs = batch * da.KV_HEADS
  pool0 = kernel_pool(int2_pool(key, pairs, tokens, bits, per_token(variant)), variant)
  nbytes = sum(x.nbytes for x in pool0)
  inner = da.inner_calls(nbytes)
  pools = [pool0] + da.copies(lambda i: _distinct(pool0, i), nbytes, inner)[1:]
  qs = [scaled_queries(k, pairs) for k in jax.random.split(jax.random.fold_in(key, 3), inner)]
  return _timed(lambda q, *pool: attend(q, *pool, splits=splits, variant=variant), pools, qs, nbytes)


def time_triton(batch, tokens, key, bits=2, kivi=False):
  c0 = da.synthetic_cache(key, batch, tokens, f"{'kivi' if kivi else 'int'}{bits}")
  inner = da.inner_calls(c0.nbytes)
  caches = [c0] + da.copies(lambda i: _distinct(c0, i), c0.nbytes, inner)[1:]
  qs = da.queries(jax.random.fold_in(key, 1), batch, inner)
  return _timed(da.pallas_fn(None, "pallas:triton"), [(c,) for c in caches], qs, c0.nbytes)


def _copy_line(report: dict) -> str:
  if "copy" in report:  # harness.copy_bandwidth: torch's copy where torch has CUDA, and a jnp pass
    label = "torch copy" if "torch_copy_TBps" in report["copy"] else "jnp x + 1"
    return f"{best_copy_TBps(report['copy']):.2f} TB/s ({label})"
  return f"{report.get('copy_TBps', 0):.2f} TB/s (jnp copy)"  # the session-20 runs


def markdown(report: dict) -> str:
  """The report as a markdown table: every Mosaic row beside the Triton kernel's of the same batch."""
  prov = report["provenance"]
  lines = [f"# Mosaic GPU INT2 kernel against the Triton kernel (`{prov.get('command', '')}`)", "",
           f"- date: {prov.get('date')}", f"- device: {prov.get('device')}, jax {prov.get('jax')}",
           f"- copy (read + write): {_copy_line(report)}",
           "- checks (max |error| against float64 dequantize-then-attend; a variant that fails is not timed): "
           + "; ".join(f"{c['case']}: {c['max_abs_error']:.2g}" for c in report.get("checks", [])),
           *[f"- {case}: {error}" for case, error in report.get("check_errors", {}).items()],
           *([f"- timed unchecked (knockouts, wrong by design): {', '.join(report['unchecked'])}"]
             if report.get("unchecked") else []), "",
           "| batch | kernel | GPU µs a call | TB/s | against Triton |", "| ---: | --- | ---: | ---: | ---: |"]
  for row in report["rows"]:
    triton = row["triton"]["gpu_s"] or row["triton"]["wall_s"]
    plan = f"{'kivi' if report.get('kivi') else 'int'}{report.get('bits', 2)}"
    lines.append(f"| {row['batch']} | triton (`pallas`, {plan} plan) | {triton * 1e6:.1f} | "
                 f"{row['triton_TBps']:.3f} | 1 |")
    for name, value in row.items():
      if isinstance(value, dict) and name != "triton":
        t = value["gpu_s"] or value["wall_s"]
        lines.append(f"| {row['batch']} | mosaic `{name}` | {t * 1e6:.1f} | {row[name + '_TBps']:.3f} | "
                     f"{triton / t:.3f} |")
      elif name.endswith("_error"):
        lines.append(f"| {row['batch']} | mosaic `{name[:-6]}` | refused: {value[:80]} | | |")
  return "\n".join(lines) + "\n"


def write(report: dict, out: Path, tag: str) -> None:
  """The report so far (after every timed kernel): a run cut short keeps what it measured."""
  out.mkdir(parents=True, exist_ok=True)
  (out / f"{tag}.json").write_text(json.dumps(report, indent=1, default=str))
  (out / f"{tag}.md").write_text(markdown(report))


def main(argv=None) -> int:
  ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  ap.add_argument("--batches", type=int, nargs="+", default=[8, 60])
  ap.add_argument("--tokens", type=int, default=32768)
  ap.add_argument("--bits", type=int, default=2, choices=[2, 4], help="INT2 pools (against the int2 plan), or INT4")
  ap.add_argument("--kivi", action="store_true", help="the Triton kernel on KIVI's layout (values per token), for "
                  "variants with values_per_token")
  ap.add_argument("--splits", type=int, nargs="+", default=[4, 8, 16])
  ap.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=list(VARIANTS))
  ap.add_argument("--budget-s", type=float, default=1e9)
  ap.add_argument("--out", type=Path, default=Path("benchmarks/results"))
  ap.add_argument("--tag", default="mosaic_int2")
  ap.add_argument("--markdown", type=Path, help="only write this JSON report's markdown table beside it")
  args = ap.parse_args(argv)
  if args.markdown:
    args.markdown.with_suffix(".md").write_text(markdown(json.loads(args.markdown.read_text())))
    return 0
  if not mi.available():
    print(f"jax {jax.__version__}: the Mosaic INT2 kernel needs jax >= 0.11")
    return 2
  if jax.default_backend() == "cpu":
    global INTERPRET
    INTERPRET = mi.interpret_params()
  start = time.time()
  key = jax.random.PRNGKey(0)
  report = dict(provenance=provenance(), bits=args.bits, kivi=args.kivi, rows=[], checks=[])
  errors, checked = [], []  # a variant that fails or errs is reported and not timed; the run exits 1
  for variant in args.variants:
    if VARIANTS[variant].get("knockout"):  # wrong by design: timed, not checked
      report.setdefault("unchecked", []).append(variant)
      checked.append(variant)
      continue
    cases = [(f"{variant}, small: 6 pairs x 1024 tokens, 4 splits", (6, 1024, 4, key), {}),  # 4: `warpgroups`
             (f"{variant}, small, rising scores", (6, 1024, 4, key), dict(rising=True)),
             (f"{variant}, batch {args.batches[0]} x {args.tokens}: 4 pairs",
              (args.batches[0] * da.KV_HEADS, args.tokens, args.splits[0], key, 4), {})]
    for case, check_args, check_options in cases:
      try:
        errors.append((case, check(*check_args, variant=variant, bits=args.bits, **check_options)))
      except Exception as e:  # a variant the device refuses
        errors.append((case, float("nan")))
        report.setdefault("check_errors", {})[case] = repr(e)[:600]
    print(errors[-len(cases):], flush=True)
    if all(e < 5e-3 for _, e in errors[-len(cases):]):
      checked.append(variant)
  report["checks"] = [dict(case=c, max_abs_error=e) for c, e in errors]
  report["copy"] = copy_bandwidth(1 << 30)
  for batch in args.batches:
    tri = time_triton(batch, args.tokens, key, args.bits, args.kivi)
    row = dict(batch=batch, tokens=args.tokens, triton=tri,
               triton_TBps=tri["bytes"] / (tri["gpu_s"] or tri["wall_s"]) / 1e12)
    print(json.dumps(row, default=str), flush=True)
    report["rows"].append(row)  # filled in below, and written after each kernel
    write(report, args.out, args.tag)
    for variant in checked:
      for splits in args.splits:
        if time.time() - start > args.budget_s:
          break
        name = f"{variant}_j{variant_splits(variant, splits, batch * da.KV_HEADS)}"
        try:
          mos = time_mosaic(batch, args.tokens, splits, key, variant, args.bits)
          row[name] = mos
          row[f"{name}_TBps"] = mos["bytes"] / (mos["gpu_s"] or mos["wall_s"]) / 1e12
        except Exception as e:  # a variant the device refuses: recorded, not fatal
          row[f"{name}_error"] = repr(e)[:400]
        print(json.dumps({k: v for k, v in row.items() if k.startswith(name)}, default=str), flush=True)
        write(report, args.out, args.tag)
  bad = [c for c, e in errors if not e < 5e-3]
  print("checks:", "FAILED " + ", ".join(bad) if bad else "passed")
  return 1 if bad else 0


if __name__ == "__main__":
  sys.exit(main())
