"""Mosaic GPU decode attention over a layer's 16-bit segments (its FP16 windows and the rest: text and
generated tokens), as a `mosaic_int2.KernelPlan`, so that `mosaic_int2.launch_together` runs them in the launch
of the layer's quantized pools.

Why: at batch 8 x 32k the layer was a Mosaic launch of the INT2 and INT4 pools, then the Triton launch of these
segments (~34 µs of ~87 on an H100, s52), one after the other. The quantized kernels are bound by their SMs'
issue rate on an H200 and these segments by memory alone; in one grid, CTAs of both kinds run at once on
different SMs.

A program (warpgroup) is a (pair, split): its share of each segment's 64-token steps, in order, under one
online softmax. A step: K [64, H] and V [64, H] by TMA; S^T = K q^T (wgmma, q's 8 rows read transposed:
G <= 8 heads in columns); P^T stored [8, 64] and read transposed; O^T [H, 8] += V^T P (V read transposed from
shared memory). Outputs as the quantized plans' (`quantized_decode.mosaic_set`, eight columns): o_t
[N, J, H, 8], m and l [N, J, 8], scores in base 2.

Measured (H100, s53, the first form: a reduction and a V wgmma waited for each step): batch 8 x 16k 7.5 % shorter
than the Triton launch after the Mosaic one, 32k no shorter (`benchmarks/results/decode_attention_notes.md`,
"Session 53"); hence `DecodeConfig.mosaic_dense` is off by default.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from pallas_kernels import mosaic_int2

STEP = 64  # tokens a step: the score wgmma's M
HEADS = 8  # columns: the query heads of a KV head, zero rows to 8
PARAMS = 32  # int32 a pair's row of segment parameters (a TMA moves >= 128 bytes)
REDUCTION = 256  # f32 elements of a warpgroup's scratch for a column reduction of [64, 8]


@dataclasses.dataclass(frozen=True)
class Segment:
  """16-bit keys and values [N, T, H] (T >= `STEP`) and, for each of the n pairs, the row of k and v it reads
  (`row` [n]), its first token (`start` [n]) and its token count (`length` [n])."""
  k: jax.Array
  v: jax.Array
  row: jax.Array
  start: jax.Array
  length: jax.Array


def serves(segments, g: int, h: int) -> bool:
  """Whether `dense_plan` takes these segments: at most 8 query heads, head dim 128, 16-bit keys and values of
  one dtype with at least a step's tokens, JAX >= 0.11."""
  dtypes = {s.k.dtype for s in segments} | {s.v.dtype for s in segments}
  return (g <= HEADS and h == mosaic_int2.HEAD_DIM and len(dtypes) == 1
          and next(iter(dtypes)) in (jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float16))
          and all(s.k.shape[1] >= STEP and s.k.shape == s.v.shape for s in segments) and mosaic_int2.available())


def parameters(segments, n: int) -> jax.Array:
  """[n, PARAMS] int32: segment i's (row, start, length) of each pair in columns 3i, 3i + 1, 3i + 2."""
  columns = [jnp.broadcast_to(jnp.asarray(x, jnp.int32), (n,)) for s in segments for x in (s.row, s.start, s.length)]
  return jnp.pad(jnp.stack(columns, axis=1), ((0, 0), (0, PARAMS - len(columns))))


def dense_plan(q, segments, *, splits: int, warpgroups: int = 4, working: int | None = None, stages: int = 2,
               lagged_max: bool = True, in_place: bool = True, approx_math: bool = False,
               interpret=None) -> mosaic_int2.KernelPlan:
  """The plan: q [n, G, H] f32 (scaled, base 2), `segments` (`Segment`s), `splits` programs a pair. A CTA has
  `warpgroups` (as the plans it is launched beside) of which `working` (default all; a divisor of `splits`) are
  programs, each with `stages` K/V slots of 32 KB: those bound the copies a CTA keeps in flight, and its shared
  memory (3 programs of 2 slots: 224,424 bytes of an SM's 232,448, offline, s53).

  `lagged_max`: a step's P is taken against the maximum agreed so far; each warp votes whether a score exceeds it
  by more than `mosaic_int2.LAG_MARGIN`, and only where one does is the maximum reduced across the warps and P
  taken again (as the INT2 kernel's `lagged_max`): no shared-memory reduction and barrier a step.
  `in_place` (compiled only; the interpret mode cannot store to an accumulator): O^T accumulates in a wgmma
  accumulator, and a step's V wgmma is waited for by the next step's score wgmma, so a step's chain is one wait
  and one barrier; a slot is fetched again once the next step's barrier has passed (every warp's wgmmas read it)."""
  from jax.experimental import pallas as pl
  from jax.experimental.pallas import mosaic_gpu as plgpu

  n, g, h = q.shape
  working = warpgroups if working is None else working
  if not serves(segments, g, h):
    raise ValueError(f"dense_plan serves <= {HEADS} heads of dim {mosaic_int2.HEAD_DIM} over 16-bit segments of "
                     f">= {STEP} tokens, one dtype: got q {q.shape}, "
                     f"{[(s.k.shape, s.k.dtype, s.v.shape, s.v.dtype) for s in segments]}")
  if not 1 <= working <= warpgroups or splits % working:
    raise ValueError(f"dense_plan: working warpgroups ({working}) must divide splits ({splits}) and be at most "
                     f"{warpgroups}")
  if 3 * len(segments) > PARAMS:
    raise ValueError(f"dense_plan takes at most {PARAMS // 3} segments, got {len(segments)}")
  dtype = segments[0].k.dtype
  rows_q = jnp.pad(q.astype(dtype), ((0, 0), (0, HEADS - g), (0, 0)))  # the score wgmma's B, read transposed
  params = parameters(segments, n)
  layout = plgpu.Layout
  compiled = interpret is None
  in_place = in_place and compiled
  neg = mosaic_int2._NEG

  def swizzled():  # rows of 256 bytes (128 bf16 channels), as the tensor cores read them; plain when interpreted
    return (plgpu.TilingTransform((8, 64)), plgpu.SwizzleTransform(128)) if compiled else ()

  def smem(shape, dtype_, tiled=False):
    return plgpu.SMEM(shape, dtype_, transforms=swizzled() if tiled else ())

  def kernel(pair, split, params_g, q_g, *refs):
    sources = refs[:2 * len(segments)]
    o_g, m_g, l_g, params_s, q_s, k_s, v_s, p_s, o_s, ml_s, votes_s, scratch_s, bars = refs[2 * len(segments):]
    wg = lax.axis_index("wg") if warpgroups > 1 else 0

    def program_body():
      program = split * working + wg
      my_params, my_q, my_k, my_v, my_p = (x.at[wg] for x in (params_s, q_s, k_s, v_s, p_s))
      setup = bars.at[wg * (stages + 1) + stages]
      plgpu.copy_gmem_to_smem(params_g.at[pl.ds(pair, 1)], my_params, setup)
      plgpu.copy_gmem_to_smem(q_g.at[pair], my_q, setup)
      plgpu.barrier_wait(setup)
      token = plgpu.broadcasted_iota(jnp.int32, (STEP, HEADS), 0, layout=layout.WGMMA)

      def column_reduce(x, op):  # over the rows (tokens), through the warpgroup's own scratch
        if compiled and warpgroups > 1:
          return mosaic_int2._column_reduce(x, op, scratch_s.at[wg])
        return x.max(axis=0) if op == "max" else x.sum(axis=0)

      def store_p(p):
        my_p.transpose((1, 0))[...] = p.astype(dtype)

      def softmax(s, m_run, index, rescale):
        """(maximum, P stored and fenced, alpha) of a step's scores s [64, 8]; `rescale(alpha)` where alpha is not
        1 (with the lagged maximum, only in the vote's branch)."""
        def reduced():  # the maximum reduced across the warps, P against it
          m_new = jnp.maximum(m_run, column_reduce(s, "max"))
          p_new = jnp.exp2(s - lax.broadcast_in_dim(m_new, s.shape, [1]))
          store_p(p_new)
          plgpu.commit_smem()
          alpha = jnp.exp2(m_run - m_new)
          rescale(alpha)
          return m_new, p_new, alpha
        if not lagged_max:
          return reduced()
        limit = lax.broadcast_in_dim(m_run + mosaic_int2.LAG_MARGIN, s.shape, [1])
        p = jnp.exp2(s - lax.broadcast_in_dim(m_run, s.shape, [1]))
        store_p(p)
        if compiled:  # each warp's vote beside P; P's barrier publishes both (two slots: a fast warp's next vote)
          votes = votes_s.at[wg, lax.rem(index, 2)]
          mosaic_int2._vote_by_warp(s, limit, votes)
          plgpu.commit_smem()
          over = (votes[0] | votes[1] | votes[2] | votes[3]) != 0
        else:  # the interpret mode runs the warpgroup as one
          plgpu.commit_smem()
          over = jnp.any(s > limit)
        unchanged = plgpu.layout_cast(jnp.ones((HEADS,), jnp.float32), layout.WGMMA.reduce(0))
        return lax.cond(over, reduced, lambda: (m_run, p, unchanged))

      def segment_loop(i, tokens, k_g, v_g, o_acc, carry):  # segment i's steps of this program
        row, start, length = (my_params[0, 3 * i + j] for j in range(3))
        steps = (length + STEP - 1) // STEP
        per_program = (steps + splits - 1) // splits
        begin = program * per_program
        mine = jnp.clip(steps - begin, 0, per_program)
        end = start + length

        def tile(index):  # the step's first token, and the tile's: clamped to stay in the array (rows below masked)
          first = start + STEP * (begin + index)
          return first, jnp.minimum(first, tokens - STEP)

        def fetch(index):
          slot = lax.rem(index, stages)
          _, at = tile(index)
          barrier = bars.at[wg * (stages + 1) + slot]
          plgpu.copy_gmem_to_smem(k_g.at[row, pl.ds(at, STEP)], my_k.at[slot], barrier)
          plgpu.copy_gmem_to_smem(v_g.at[row, pl.ds(at, STEP)], my_v.at[slot], barrier)

        if in_place and i:  # the last segment's last V wgmma has read its slot (every warp: the barrier)
          plgpu.wgmma_wait(0)
          plgpu.commit_smem()
        for index in range(stages):
          pl.when(index < mine)(lambda index=index: fetch(index))

        def body(index, carry):
          acc, m_run, l_rows = carry
          slot = lax.rem(index, stages)
          plgpu.barrier_wait(bars.at[wg * (stages + 1) + slot])
          first, at = tile(index)

          def scores(s_acc):
            plgpu.wgmma(s_acc, my_k.at[slot], my_q.transpose((1, 0)))
            plgpu.wgmma_wait(0)  # in place: the last step's V wgmma too, before o_acc, P and its slot are reused
            return s_acc[...]
          s = pl.run_scoped(scores, plgpu.ACC((STEP, HEADS), jnp.float32))
          own = (token >= first - at) & (token < end - at)  # rows before the step (a clamped tile) or past the end
          s = jnp.where(own, s, neg)

          def rescale(alpha):  # in place: the last step's V wgmma was waited for with the score wgmma
            if in_place:
              o_acc[...] = o_acc[...] * lax.broadcast_in_dim(alpha, (h, HEADS), [1])
          m_new, p, alpha = softmax(s, m_run, index, rescale)
          l_rows = l_rows * lax.broadcast_in_dim(alpha, s.shape, [1]) + p
          if in_place:
            # P's barrier is past: every warp has waited for the last step's wgmmas, whose slot is free
            pl.when((index > 0) & (index - 1 + stages < mine))(lambda: fetch(index - 1 + stages))
            plgpu.wgmma(o_acc, my_v.at[slot].transpose((1, 0)), my_p.transpose((1, 0)))
            return acc, m_new, l_rows

          def attend(fresh):
            plgpu.wgmma(fresh, my_v.at[slot].transpose((1, 0)), my_p.transpose((1, 0)))
            plgpu.wgmma_wait(0)
            return fresh[...]
          acc = acc * lax.broadcast_in_dim(alpha, acc.shape, [1]) + pl.run_scoped(
              attend, plgpu.ACC((h, HEADS), jnp.float32))
          plgpu.commit_smem()  # every warp's wgmmas have read the slot and P before they are rewritten
          pl.when(index + stages < mine)(lambda: fetch(index + stages))
          return acc, m_new, l_rows
        return lax.fori_loop(0, mine, body, carry)

      def run(o_acc=None):
        carry = (None if in_place else plgpu.layout_cast(jnp.zeros((h, HEADS), jnp.float32), layout.WGMMA),
                 plgpu.layout_cast(jnp.full((HEADS,), neg, jnp.float32), layout.WGMMA.reduce(0)),
                 plgpu.layout_cast(jnp.zeros((STEP, HEADS), jnp.float32), layout.WGMMA))
        for i, segment in enumerate(segments):
          carry = segment_loop(i, segment.k.shape[1], sources[2 * i], sources[2 * i + 1], o_acc, carry)
        acc, m_run, l_rows = carry
        if in_place:
          plgpu.wgmma_wait(0)
          acc = o_acc[...]
        return acc, m_run, l_rows
      if in_place:
        acc, m_run, l_rows = pl.run_scoped(run, plgpu.ACC((h, HEADS), jnp.float32))
      else:
        acc, m_run, l_rows = run()
      o_s.at[wg][...] = acc
      ml_s.at[wg, 0][...] = m_run
      ml_s.at[wg, 1][...] = column_reduce(l_rows, "add")
      plgpu.commit_smem()
      plgpu.copy_smem_to_gmem(o_s.at[wg], o_g.at[pair, program])
      plgpu.copy_smem_to_gmem(ml_s.at[wg, 0], m_g.at[pair, program])
      plgpu.copy_smem_to_gmem(ml_s.at[wg, 1], l_g.at[pair, program])
      plgpu.wait_smem_to_gmem(0)
    if working < warpgroups:  # the others idle: their slots would not fit
      pl.when(wg < working)(program_body)
    else:
      program_body()

  groups = (working,)
  scratch = (smem((*groups, 1, PARAMS), jnp.int32), smem((*groups, HEADS, h), dtype, True),
             smem((*groups, stages, STEP, h), dtype, True), smem((*groups, stages, STEP, h), dtype, True),
             smem((*groups, HEADS, STEP), dtype, True), smem((*groups, h, HEADS), jnp.float32),
             smem((*groups, 2, HEADS), jnp.float32), smem((*groups, 2, 4), jnp.int32),
             smem((*groups, REDUCTION), jnp.float32),
             plgpu.Barrier(num_arrivals=2, num_barriers=working * (stages + 1)))
  operands = (params, rows_q, *(x for s in segments for x in (s.k, s.v)))
  return mosaic_int2.KernelPlan(
      body=kernel, operands=operands,
      out_type=(jax.ShapeDtypeStruct((n, splits, h, HEADS), jnp.float32),
                jax.ShapeDtypeStruct((n, splits, HEADS), jnp.float32),
                jax.ShapeDtypeStruct((n, splits, HEADS), jnp.float32)),
      grid=(n, splits // working), scratch=scratch, warpgroups=warpgroups,
      compiler_params=plgpu.CompilerParams(lowering_semantics=plgpu.LoweringSemantics.Lane,
                                           approx_math=approx_math, unsafe_no_auto_barriers=True),
      interpret=interpret)


def reference(q, segments) -> np.ndarray:
  """softmax(q . K^T) V over each pair's tokens of every segment, float64 (q scaled, base 2): [n, G, H]."""
  q = np.asarray(q, np.float64)
  out = []
  for pair in range(q.shape[0]):
    ks, vs = [], []
    for s in segments:
      row, start, length = (int(np.broadcast_to(np.asarray(x), (q.shape[0],))[pair])
                            for x in (s.row, s.start, s.length))
      ks.append(np.asarray(s.k[row, start:start + length], np.float64))
      vs.append(np.asarray(s.v[row, start:start + length], np.float64))
    k, v = np.concatenate(ks), np.concatenate(vs)
    scores = q[pair] @ k.T
    p = np.exp2(scores - scores.max(axis=1, keepdims=True))
    out.append(p @ v / p.sum(axis=1, keepdims=True))
  return np.stack(out)

