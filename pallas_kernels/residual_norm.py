"""The decoder's residual add and the RMS norm after it as one Pallas (Triton) launch.

In the decode step each layer adds its attention output to the residual stream and normalizes the sum for
the MLP, then adds the MLP's output and normalizes for the next layer. XLA runs each of those as an add, a
reduce and (where no matrix product takes it in) a multiply: ~5 small launches a layer (the H200 profile of
session 24). Here one program a row does both passes over a row of D values, `chunk` at a time (D need not be
a power of two: 3,584 for Qwen2-7B is 7 x 512), so a layer takes 2 launches. Timed on the H200 (session 26,
`benchmarks/results/decode_throughput_*_s26_norms_gpu.md`): 0.29-0.37 ms a 7B decode step slower than XLA's norms
at batch 1, 20 and 32, so it is an option (`generate(..., norms="pallas")`), not the default.

`add_rms_norm(h, delta, scale, eps)` returns (h + delta, rms_norm(h + delta) * scale) with
`models.layers.rms_norm`'s roundings: the sum in the residual's dtype, the norm in float32 over that rounded
sum, the normalized row rounded to it before the scale.
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu
from jaxtyping import Array, Float

MAX_CHUNK = 512  # values of a row a load


def chunk_of(d: int) -> int:
  """The largest power of two dividing d, at most MAX_CHUNK: a row is read in d / chunk loads of it."""
  return min(MAX_CHUNK, d & -d)


def _body(h_ref, d_ref, s_ref, sum_ref, x_ref, *, chunk: int, eps: float):
  row = pl.ds(pl.program_id(0), 1)
  width = h_ref.shape[1]
  f32 = jnp.float32

  def summed(c):  # [1, chunk] of h + delta, rounded as the residual stream is
    cols = pl.ds(c * chunk, chunk)
    return (h_ref[row, cols].astype(f32) + d_ref[row, cols].astype(f32)).astype(sum_ref.dtype)

  squares = jnp.zeros((1, chunk), f32)
  for c in range(width // chunk):
    v = summed(c)
    sum_ref[row, pl.ds(c * chunk, chunk)] = v
    squares += v.astype(f32) * v.astype(f32)
  inverse = lax.rsqrt(jnp.sum(squares) / width + eps)
  for c in range(width // chunk):  # h + delta again from its inputs, not read back from the output
    y = (summed(c).astype(f32) * inverse).astype(sum_ref.dtype)
    x_ref[row, pl.ds(c * chunk, chunk)] = (s_ref[:, pl.ds(c * chunk, chunk)].astype(f32)
                                           * y.astype(f32)).astype(x_ref.dtype)


def add_rms_norm(h: Float[Array, "B D"], delta: Float[Array, "B D"], scale: Float[Array, "D"], eps: float, *,
                 interpret: bool = False) -> tuple[Float[Array, "B D"], Float[Array, "B D"]]:
  """(h + delta, its RMS norm times scale), one program a row."""
  if h.shape != delta.shape or h.ndim != 2 or scale.shape != h.shape[1:]:
    raise ValueError(f"add_rms_norm takes h and delta [B, D] and scale [D]; got {h.shape}, {delta.shape}, "
                     f"{scale.shape}")
  b, d = h.shape
  total_dtype = jnp.result_type(h, delta)
  whole = lambda shape: pl.BlockSpec(tuple(pl.Element(n) for n in shape), lambda i: (0,) * len(shape))
  return pl.pallas_call(
      functools.partial(_body, chunk=chunk_of(d), eps=eps),
      grid=(b,),
      in_specs=[whole(h.shape), whole(delta.shape), whole((1, d))],
      out_specs=[whole(h.shape), whole(h.shape)],
      out_shape=[jax.ShapeDtypeStruct(h.shape, total_dtype),
                 jax.ShapeDtypeStruct(h.shape, jnp.result_type(scale, total_dtype))],
      compiler_params=plgpu.CompilerParams(num_warps=4, num_stages=1),
      interpret=interpret,
      name="wq_add_rms_norm",
  )(h, delta, scale.reshape(1, d))


def reference(h, delta, scale, eps):
  """What the decode step computes without the kernel (`models.layers.add_rms_norm`)."""
  from models import layers
  return layers.add_rms_norm(h, delta, scale, eps)
