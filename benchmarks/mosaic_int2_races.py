"""Are the Mosaic INT2 kernel's results the same on every call? A race shows as partials that change from
call to call, or that are not finite, where the launch has more programs than the GPU holds at once.

For each variant, batch and split count: one random INT2 pool and one set of queries, the kernel called
`--calls` times. Reported per case: the calls with any non-finite partial, the (pair, split)s ever
non-finite, the largest difference between calls, and each split's error on its own tokens against
float64 dequantize-then-attend (on the first pairs and on the bad ones, where the splits divide the pool).

    PYTHONPATH=. python benchmarks/mosaic_int2_races.py --batches 32 60 --splits 8 --out benchmarks/results
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import jax
import numpy as np

from benchmarks import mosaic_int2_bench as bench
from benchmarks.harness import provenance
from pallas_kernels import mosaic_int2 as mi


def split_errors(q, pool, parts, splits, pairs) -> dict:
  """Each split merged alone against the reference on its own tokens: {pair: [error a split]}."""
  o_t, m, l = (np.asarray(x) for x in parts)
  tokens = pool[0].shape[1] // splits
  errors = {}
  for n in pairs:
    row = []
    for s in range(splits):
      got = np.asarray(mi.merge(o_t[n:n + 1, s:s + 1], m[n:n + 1, s:s + 1], l[n:n + 1, s:s + 1], q.shape[1]))
      window = lambda x, per: np.asarray(x)[n:n + 1, s * tokens // per:(s + 1) * tokens // per]
      piece = [window(x, 1) if x.dtype == np.uint8 else window(x, mi.WINDOW) for x in pool]
      want = mi.reference(np.asarray(q)[n:n + 1], *piece)
      row.append(float(np.abs(got - want).max()) if np.isfinite(got).all() else float("nan"))
    errors[int(n)] = row
  return errors


def case(variant, batch, tokens, splits, calls, key) -> dict:
  pairs = batch * 4
  pool = bench.int2_pool(key, pairs, tokens)
  q = bench.scaled_queries(jax.random.fold_in(key, 1), pairs)
  fn = jax.jit(lambda q, *pool: mi.pool_partials(q, *pool, splits=splits, interpret=bench.INTERPRET,
                                                 **mi.VARIANTS[variant]))
  divides = not tokens % (mi.STEP * dict(mi.VARIANTS[variant]).get("steps_per_block", 1) * splits)
  runs = [jax.tree.map(np.asarray, fn(q, *pool)) for _ in range(calls)]
  bad_calls, bad = 0, set()
  for o_t, m, l in runs:
    finite = np.isfinite(o_t).all(axis=(2, 3)) & np.isfinite(m).all(axis=2) & np.isfinite(l).all(axis=2)
    bad_calls += int(not finite.all())
    bad |= {(int(n), int(s)) for n, s in zip(*np.nonzero(~finite))}
  spread = max(float(np.nanmax(np.abs(a - b))) for r in runs[1:] for a, b in zip(r, runs[0])) if calls > 1 else 0
  row = dict(variant=variant, batch=batch, tokens=tokens, splits=splits, calls=calls, bad_calls=bad_calls,
             bad_pair_splits=sorted(bad)[:64], bad_count=len(bad), spread_between_calls=spread)
  if divides:
    look = sorted({0, 1} | {n for n, _ in sorted(bad)[:4]})
    row["split_errors"] = split_errors(q, pool, runs[0], splits, look)
  print(json.dumps(row), flush=True)
  return row


def main(argv=None) -> int:
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--variants", nargs="+", default=["fast", "deferred_values_first", "values_first"],
                  choices=list(mi.VARIANTS))
  ap.add_argument("--batches", type=int, nargs="+", default=[32, 60])
  ap.add_argument("--splits", type=int, nargs="+", default=[8])
  ap.add_argument("--tokens", type=int, default=32768)
  ap.add_argument("--calls", type=int, default=8)
  ap.add_argument("--out", type=Path, default=Path("benchmarks/results"))
  ap.add_argument("--tag", default="mosaic_int2_races")
  args = ap.parse_args(argv)
  if jax.default_backend() != "gpu":
    bench.INTERPRET = mi.interpret_params()
  rows = [case(v, b, args.tokens, j, args.calls, jax.random.PRNGKey(b * 100 + j))
          for b in args.batches for j in args.splits for v in args.variants]
  report = dict(provenance=provenance(), rows=rows)
  args.out.mkdir(parents=True, exist_ok=True)
  (args.out / f"{args.tag}.json").write_text(json.dumps(report, indent=1))
  return int(any(r["bad_calls"] or r["spread_between_calls"] > 0 for r in rows))


if __name__ == "__main__":
  sys.exit(main())
