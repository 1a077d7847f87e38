"""Can a Mosaic GPU kernel with warp-level MMA be built and checked without a GPU? (JAX >= 0.11 only)

The decode kernel's next form (`results/decode_attention_notes.md`, item 4) needs fragment layouts and
accumulators of its own choosing: Pallas' Mosaic GPU backend, whose `plgpu.mma` issues Ampere's
`mma.sync.m16n8k16` with `MMALayouts` operands, or its `plgpu.wgmma`. JAX 0.10 (the newest for
Python 3.11, this project's CI) has no `plgpu.mma` and writes Mosaic GPU kernels with `pallas_call`;
0.11 (on the lent H200) writes them with `plgpu.kernel`. This probe checks three things on a CPU. A
q [16, 128] x K^T [128, 32] product, the shape of a decode step's scores with the four warps of a
warpgroup each on 8 tokens (`m_warps=1`), is:

1. lowered for CUDA (`lowering_platforms=("cuda",)`): layout and transfer errors surface here (an
   untiled shared-memory operand, for one, fails with "Failed to synthesize a transfer pattern that
   avoids bank conflicts"; the tiling and swizzle transforms below fix it);
2. run in Mosaic GPU's interpret mode against `x @ y`. That mode has no rule for `mma` on a CPU, so
   `interpret_mma_on_cpu()` gives it one: acc + a @ b in float32, what the instruction computes.

3. the crux of an INT2 decode step in the other orientation (S^T = K q^T: 64 tokens as wgmma's M, q^T as
   a 16-wide B in shared memory): one part of the codes unpacked in registers and fed to `plgpu.wgmma`
   as its A operand, lowered for CUDA. Mosaic GPU refuses arithmetic on 8-bit values except bitwise
   operations ("Upcast to a 16- or 32-bit type"), so the part is masked in place, not shifted:
   `(codes & 3 << 2p).astype(f16)` is 4^p c, and q's part carries 4^-p (exact). JAX 0.11.2's interpret
   mode reads wgmma's A from shared memory only; `interpret_wgmma_with_register_lhs()`
   (`pallas_kernels/mosaic_int2.py`) extends it, and the
   part is then also run in interpret mode against the codes' product.

    python3.12 -m venv /tmp/venv12 && /tmp/venv12/bin/pip install jax==0.11.2 jaxlib==0.11.2
    PYTHONPATH=. /tmp/venv12/bin/python benchmarks/mosaic_mma_probe.py

It also reports why warp-level MMA cannot take the codes directly: uint8 codes loaded in the f16
`MMA_RHS` layout (two codes a register) do not lower under the shared-memory transforms tried.

Prints the lowered modules' sizes and the interpreted product's largest error; exits 1 above 1e-3 (a lost
or misplaced fragment is off by whole products).
"""
from __future__ import annotations

import sys

import jax
import jax.numpy as jnp

M, K, N = 16, 128, 32  # q rows (7 of a GQA group, padded), head dim, tokens (8 a warp)


def interpret_mma_on_cpu() -> None:
  """Registers a CPU lowering for `plgpu.mma` (acc + a @ b in float32), so interpret mode runs it."""
  from jax._src.interpreters import mlir
  from jax._src.pallas.mosaic_gpu import primitives

  def mma(acc, a, b):
    return acc + jnp.dot(a.astype(jnp.float32), b.astype(jnp.float32))

  mlir.register_lowering(primitives.mma_p, mlir.lower_fun(mma, multiple_results=False), platform="cpu")


def scores_kernel(interpret=None):
  """q [M, K] f16 . k_t [K, N] f16 -> [M, N] f32 through shared memory and one warp-level MMA."""
  from jax.experimental.pallas import mosaic_gpu as plgpu

  def body(q_gmem, k_gmem, out_gmem, q_smem, k_smem, out_smem, barrier):
    plgpu.copy_gmem_to_smem(q_gmem, q_smem, barrier.at[0])
    plgpu.copy_gmem_to_smem(k_gmem, k_smem, barrier.at[0])
    plgpu.barrier_wait(barrier.at[0])
    q = plgpu.load(q_smem.at[()], layout=plgpu.Layout.MMA_LHS(jnp.float16, m_warps=1))
    k = plgpu.load(k_smem.at[()], layout=plgpu.Layout.MMA_RHS(jnp.float16, m_warps=1))
    acc = plgpu.layout_cast(jnp.zeros((M, N), jnp.float32), plgpu.Layout.MMA_ACC(jnp.float32, m_warps=1))
    out_smem[...] = plgpu.mma(acc, q, k)
    plgpu.commit_smem()
    plgpu.copy_smem_to_gmem(out_smem, out_gmem)
    plgpu.wait_smem_to_gmem(0)

  def swizzled(shape, row_bytes):  # 8-row tiles of one swizzle span: what the MMA operand loads need
    return plgpu.SMEM(shape, jnp.float16, transforms=(plgpu.TilingTransform((8, row_bytes // 2)),
                                                      plgpu.SwizzleTransform(row_bytes)))

  return plgpu.kernel(
      body, out_type=jax.ShapeDtypeStruct((M, N), jnp.float32),
      scratch_types=[swizzled((M, K), 128), swizzled((K, N), 2 * N), plgpu.SMEM((M, N), jnp.float32),
                     plgpu.Barrier(num_arrivals=2, num_barriers=1)],
      compiler_params=plgpu.CompilerParams(lowering_semantics=plgpu.LoweringSemantics.Lane),
      interpret=interpret)


def int2_scores_kernel(part: int, tokens: int = 64, width: int = 32, rows: int = 16, interpret=None):
  """codes [tokens, width] uint8 (4 parts of 2 bits) . q_t [width, rows] f16 -> [tokens, rows] f32 for one
  part: the part's codes, masked in place and converted in registers, are wgmma's A operand."""
  from jax.experimental import pallas as pl
  from jax.experimental.pallas import mosaic_gpu as plgpu

  def body(codes_gmem, q_gmem, out_gmem, codes_smem, q_smem, barrier):
    plgpu.copy_gmem_to_smem(codes_gmem, codes_smem, barrier.at[0])
    plgpu.copy_gmem_to_smem(q_gmem, q_smem, barrier.at[0])
    plgpu.barrier_wait(barrier.at[0])

    def scoped(acc_ref):
      keys = (codes_smem[...] & jnp.uint8(3 << (2 * part))).astype(jnp.float16)  # 4**part * code, exact
      plgpu.wgmma(acc_ref, keys, q_smem)
      plgpu.wgmma_wait(0)
      return acc_ref[...]

    out_gmem[...] = pl.run_scoped(scoped, plgpu.ACC((tokens, rows), jnp.float32))

  def swizzled(shape, dtype, row_bytes):  # the interpret mode takes plain buffers
    return plgpu.SMEM(shape, dtype, transforms=() if interpret else (
        plgpu.TilingTransform((8, row_bytes // jnp.dtype(dtype).itemsize)), plgpu.SwizzleTransform(row_bytes)))

  return plgpu.kernel(
      body, out_type=jax.ShapeDtypeStruct((tokens, rows), jnp.float32),
      scratch_types=[swizzled((tokens, width), jnp.uint8, width), swizzled((width, rows), jnp.float16, 2 * rows),
                     plgpu.Barrier(num_arrivals=2, num_barriers=1)],
      compiler_params=plgpu.CompilerParams(lowering_semantics=plgpu.LoweringSemantics.Warpgroup),
      interpret=interpret)


def codes_in_f16_mma_layout(transforms) -> str:
  """Whether uint8 codes [32, 32] load straight into the f16 `MMA_RHS` layout (two codes a register) and
  lower for CUDA under these shared-memory transforms: "lowers", or XLA's reason."""
  from jax.experimental.pallas import mosaic_gpu as plgpu

  rhs = plgpu.Layout.MMA_RHS(jnp.float16, m_warps=1)

  def body(codes_gmem, out_gmem, codes_smem, out_smem, barrier):
    plgpu.copy_gmem_to_smem(codes_gmem, codes_smem, barrier.at[0])
    plgpu.barrier_wait(barrier.at[0])
    keys = (plgpu.load(codes_smem.at[()], layout=rhs) & jnp.uint8(3)).astype(jnp.float16)
    out_smem[...] = plgpu.layout_cast(keys, rhs).astype(jnp.float32)
    plgpu.commit_smem()
    plgpu.copy_smem_to_gmem(out_smem, out_gmem)
    plgpu.wait_smem_to_gmem(0)

  kernel = plgpu.kernel(
      body, out_type=jax.ShapeDtypeStruct((32, 32), jnp.float32),
      scratch_types=[plgpu.SMEM((32, 32), jnp.uint8, transforms=transforms), plgpu.SMEM((32, 32), jnp.float32),
                     plgpu.Barrier(num_arrivals=1, num_barriers=1)],
      compiler_params=plgpu.CompilerParams(lowering_semantics=plgpu.LoweringSemantics.Lane))
  try:
    jax.jit(kernel).trace(jax.ShapeDtypeStruct((32, 32), jnp.uint8)).lower(lowering_platforms=("cuda",))
    return "lowers"
  except Exception as e:  # the reason is the finding
    return f"{type(e).__name__}: {str(e).splitlines()[0][:100]}"


def main() -> int:
  major, minor = (int(x) for x in jax.__version__.split(".")[:2])
  if (major, minor) < (0, 11):
    print(f"jax {jax.__version__}: plgpu.mma and plgpu.kernel need jax >= 0.11 (Python >= 3.12)")
    return 2
  from jax._src.pallas.mosaic_gpu.interpret.params import InterpretGPUParams

  shapes = (jax.ShapeDtypeStruct((M, K), jnp.float16), jax.ShapeDtypeStruct((K, N), jnp.float16))
  text = jax.jit(scores_kernel()).trace(*shapes).lower(lowering_platforms=("cuda",)).as_text()
  print(f"jax {jax.__version__}: lowered for CUDA on {jax.default_backend()}: {len(text)} characters, "
        f"Mosaic GPU custom call: {'mosaic_gpu' in text}")
  interpret_mma_on_cpu()
  kq, kk = jax.random.split(jax.random.PRNGKey(0))
  q = jax.random.normal(kq, (M, K), jnp.float16)
  k_t = jax.random.normal(kk, (K, N), jnp.float16)
  out = scores_kernel(interpret=InterpretGPUParams())(q, k_t)
  error = float(jnp.max(jnp.abs(out - q.astype(jnp.float32) @ k_t.astype(jnp.float32))))
  print(f"interpret mode: largest error against q @ k_t: {error}")
  int2 = (jax.ShapeDtypeStruct((64, 32), jnp.uint8), jax.ShapeDtypeStruct((32, 16), jnp.float16))
  for part in range(4):
    text = jax.jit(int2_scores_kernel(part)).trace(*int2).lower(lowering_platforms=("cuda",)).as_text()
    print(f"INT2 part {part} -> wgmma A in registers: lowered for CUDA, {len(text)} characters")
  from jax.experimental.pallas import mosaic_gpu as plgpu
  for name, transforms in [("none", ()), ("tiled 8x32", (plgpu.TilingTransform((8, 32)),)),
                           ("tiled 8x32, swizzled 32", (plgpu.TilingTransform((8, 32)), plgpu.SwizzleTransform(32)))]:
    print(f"uint8 codes in the f16 MMA_RHS layout, {name}: {codes_in_f16_mma_layout(transforms)}")
  from pallas_kernels.mosaic_int2 import interpret_wgmma_with_register_lhs
  interpret_wgmma_with_register_lhs()
  codes = jax.random.randint(jax.random.PRNGKey(1), (64, 32), 0, 256).astype(jnp.uint8)
  q_t = jax.random.normal(jax.random.PRNGKey(2), (32, 16), jnp.float16)
  for part in range(4):
    out = int2_scores_kernel(part, interpret=InterpretGPUParams())(codes, q_t)
    want = (codes & (3 << 2 * part)).astype(jnp.float32) @ q_t.astype(jnp.float32)
    part_error = float(jnp.max(jnp.abs(out - want)))
    print(f"INT2 part {part}, interpret mode: largest error {part_error}")
    error = max(error, part_error)
  return 0 if error <= 1e-3 else 1


if __name__ == "__main__":
  sys.exit(main())
