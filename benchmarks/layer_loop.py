"""How fast a decode step can stream a 7B model's layer weights, by how the layer loop is written.

A decode step at small batch is a chain of matrix-vector products over every
layer's weights: its floor is the weight bytes over the copy bandwidth. This
times Qwen2-7B's per-layer projections (q/k/v, o, gate, up, down; 28 layers,
bf16, 466 MB a layer) chained through a residual, three ways:

    scan     weights stacked [L, ...], `lax.scan` over layers (the layout the models use)
    unroll   the same stacked weights, `lax.scan(..., unroll=True)`
    list     one array per layer, a Python loop (no slicing of a stacked array)

    python -m benchmarks.layer_loop [--batches 1 32]

XLA_FLAGS set outside (e.g. --xla_gpu_enable_dynamic_slice_fusion=true) apply
to all three and are recorded in the results.
"""
from __future__ import annotations

import argparse
import os

import jax
import jax.numpy as jnp

from benchmarks.harness import best_copy_TBps, copy_bandwidth, time_fn, write_results

LAYERS, D, QKV, F = 28, 3584, 3584 + 2 * 512, 18944


def layer(h, w):
  x = h.astype(jnp.bfloat16)
  a = (x @ w["qkv"])[:, :D] @ w["o"]  # stands in for attention: the projections' bytes, no cache
  h = h + a.astype(h.dtype)
  x = h.astype(jnp.bfloat16)
  y = (jax.nn.silu(x @ w["gate"]) * (x @ w["up"])) @ w["down"]
  return h + y.astype(h.dtype)


def weights(key, stacked: bool):
  shapes = {"qkv": (D, QKV), "o": (D, D), "gate": (D, F), "up": (D, F), "down": (F, D)}
  keys = jax.random.split(key, len(shapes))
  make = lambda k, s, lead: 0.02 * jax.random.normal(k, (*lead, *s), jnp.bfloat16)
  if stacked:
    return {n: make(k, s, (LAYERS,)) for k, (n, s) in zip(keys, shapes.items())}
  return [{n: make(jax.random.fold_in(k, l), s, ()) for k, (n, s) in zip(keys, shapes.items())}
          for l in range(LAYERS)]


def step_scan(unroll):
  @jax.jit
  def step(h, w):
    return jax.lax.scan(lambda h, wl: (layer(h, wl), None), h, w, unroll=unroll)[0]
  return step


@jax.jit
def step_list(h, ws):
  for w in ws:
    h = layer(h, w)
  return h


def main():
  ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  ap.add_argument("--batches", type=int, nargs="+", default=[1, 32])
  ap.add_argument("--copy-TBps", type=float, default=None, help="copy bandwidth for the floor (default: measured)")
  args = ap.parse_args()
  copy = args.copy_TBps or (best_copy_TBps(copy_bandwidth()) if jax.default_backend() == "gpu" else None)
  rows = []
  for variant in ("scan", "unroll", "list"):
    w = weights(jax.random.PRNGKey(0), stacked=variant != "list")
    nbytes = sum(x.nbytes for x in jax.tree.leaves(w))
    fn = step_list if variant == "list" else step_scan(variant == "unroll")
    for batch in args.batches:
      h = jax.random.normal(jax.random.PRNGKey(1), (batch, D), jnp.float32)
      t = time_fn(fn, h, w, repeats=10)["median_s"]
      floor = nbytes / (copy * 1e12) if copy else float("nan")
      rows.append(dict(variant=variant, batch=batch, weight_GB=nbytes / 1e9, step_ms=t * 1e3,
                       floor_ms=floor * 1e3, step_over_floor=t / floor if copy else float("nan"),
                       xla_flags=os.environ.get("XLA_FLAGS", "")))
      print(rows[-1], flush=True)
    del w
  tag = "flags" if os.environ.get("XLA_FLAGS") else "default"
  write_results(f"layer_loop_{tag}", rows,
                ["variant", "batch", "weight_GB", "step_ms", "floor_ms", "step_over_floor", "xla_flags"],
                "Streaming a 7B model's layer weights in a decode step, by loop form",
                notes=f"floor: weight bytes / copy bandwidth ({copy} TB/s, torch device-to-device copy, same run)")


if __name__ == "__main__":
  main()
