"""Offline prototype (no GPU): a decode loop with V's codes packed along tokens, for SASS counts only.

The counters (results/ncu_int2_b8_t32768.md) put today's kernel at 44.8 warp-instructions a key, and a
warp-independent design on paper at ~17 (results/decode_attention_notes.md, item 4): q loaded once, K
unpacked per 16-key tile, V packed along tokens so that a part of a [16, 128] byte tile is 16
consecutive keys. This writes that loop, in Pallas' Triton lowering, as Triton IR; `kernel_sass.py
compile` counts its SASS:

    PYTHONPATH=. python benchmarks/prototype_token_packed_v.py --warps 1 --out /tmp/proto/w1
    python benchmarks/kernel_sass.py compile /tmp/proto/w1.ttir      # with pip's triton

It does not compute attention for any cache the library builds: it exists to ask whether Triton can
compile this layout into the short loop the paper count expects.
"""
from __future__ import annotations

import argparse
import functools
import json
import os

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu

from benchmarks import kernel_sass
from pallas_kernels import quantized_decode as qd

H, WINDOW, ROWS = 128, 32, 16  # head dim, keys a window, query rows (G padded)


def _kernel(q_ref, kc_ref, ks_ref, km_ref, vc_ref, vs_ref, vm_ref, o_ref, m_ref, l_ref, *, keys: int):
  windows = keys // WINDOW
  pid = pl.program_id(0)
  q_parts = [q_ref[pl.ds(pid * ROWS, ROWS), pl.ds(k * 32, 32)] for k in range(4)]

  def k_meta(ref, w, k):  # part k's [1, 32] of window w, over a 16-key tile
    return jnp.broadcast_to(ref[pl.ds(pid * windows + w, 1), pl.ds(k * 32, 32)], (16, 32))

  def v_meta(ref, w):
    return jnp.broadcast_to(ref[pl.ds(pid * windows + w, 1), :], (16, H))

  def step(i, carry):  # 64 keys: two windows, four 16-key tiles
    m, l, acc = carry
    scores = []
    for j in range(4):
      w = 2 * i + j // 2
      codes = kc_ref[pl.ds(pid * keys + i * 64 + 16 * j, 16), :]
      k_tile = qd._dequantize(codes, [k_meta(ks_ref, w, k) for k in range(4)],
                              [k_meta(km_ref, w, k) for k in range(4)], bits=2, inline_asm=True)
      scores.append(functools.reduce(jnp.add, [qd._dot_t(qk, kk) for qk, kk in zip(q_parts, k_tile)]))
    m_new = functools.reduce(jnp.maximum, [jnp.max(s, axis=1) for s in scores], m)
    corr = qd._exp2_ftz(m - m_new)
    probs = [qd._exp2_ftz(s - m_new[:, None]) for s in scores]
    l = l * corr + sum(jnp.sum(p, axis=1) for p in probs)
    codes = vc_ref[pl.ds(pid * (keys // 4) + i * 16, 16), :]  # part k: keys 16k..16k+15 of the step
    v_tiles = qd._dequantize(codes, [v_meta(vs_ref, 2 * i + k // 2) for k in range(4)],
                             [v_meta(vm_ref, 2 * i + k // 2) for k in range(4)], bits=2, inline_asm=True)
    acc = acc * corr[:, None]
    for p, v in zip(probs, v_tiles):
      acc = acc + qd._dot(p.astype(jnp.float16), v)
    return m_new, l, acc

  state = (jnp.full((ROWS,), -1e30, jnp.float32), jnp.zeros((ROWS,), jnp.float32), jnp.zeros((ROWS, H), jnp.float32))
  m, l, acc = lax.fori_loop(0, keys // 64, step, state)
  o_ref[...], m_ref[...], l_ref[...] = acc, m, l


def triton_ir(warps: int, programs: int = 32, keys: int = 4096) -> str:
  """The prototype's Triton IR, lowered for CUDA on any machine."""
  sds = jax.ShapeDtypeStruct
  windows = keys // WINDOW
  meta = sds((programs * windows, H), jnp.float16)
  args = [sds((programs * ROWS, H), jnp.float16), sds((programs * keys, 32), jnp.uint8), meta, meta,
          sds((programs * keys // 4, H), jnp.uint8), meta, meta]
  whole = lambda x: pl.BlockSpec(tuple(pl.Element(d) for d in x.shape), lambda i: (0,) * len(x.shape))

  def call(*a):
    return pl.pallas_call(
        functools.partial(_kernel, keys=keys), grid=(programs,), in_specs=[whole(x) for x in args],
        out_specs=[pl.BlockSpec((ROWS, H), lambda i: (i, 0)), pl.BlockSpec((ROWS,), lambda i: (i,)),
                   pl.BlockSpec((ROWS,), lambda i: (i,))],
        out_shape=[sds((programs * ROWS, H), jnp.float32), sds((programs * ROWS,), jnp.float32),
                   sds((programs * ROWS,), jnp.float32)],
        compiler_params=plgpu.CompilerParams(num_warps=warps, num_stages=3))(*a)

  return kernel_sass.triton_modules(call, *args)[0][0]


def main(argv=None):
  ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  ap.add_argument("--warps", type=int, default=1)
  ap.add_argument("--out", default="/tmp/proto/w1")
  args = ap.parse_args(argv)
  os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
  with open(args.out + ".ttir", "w") as f:
    f.write(triton_ir(args.warps))
  with open(args.out + ".ttir.json", "w") as f:
    json.dump(dict(num_warps=args.warps, num_stages=3), f)
  print(f"wrote {args.out}.ttir ({args.warps} warps)")


if __name__ == "__main__":
  main()
