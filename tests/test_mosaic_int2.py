"""The Mosaic GPU INT2 kernel (pallas_kernels/mosaic_int2.py) against float64 dequantize-then-attend.

JAX >= 0.11 only (Python >= 3.12): skipped under the project's Python 3.11 / JAX 0.10 environment, run by
`.ci/run`'s second step (see the README). On a CPU the kernel runs in Mosaic GPU's interpret mode (the
plain conversions; the inline-PTX path is checked against the same reference on the H200 by
`benchmarks/mosaic_int2_bench.py`), and both paths are lowered for CUDA, which checks their layouts.
"""
from __future__ import annotations

import numpy as np
import pytest

from pallas_kernels import mosaic_int2 as mi

pytestmark = pytest.mark.skipif(not mi.available(), reason="the Mosaic GPU kernel needs jax >= 0.11")


@pytest.fixture(scope="module")
def interpret():
  import jax
  from jax.experimental.pallas import mosaic_gpu as plgpu

  from benchmarks.mosaic_mma_probe import interpret_wgmma_with_register_lhs
  if jax.default_backend() != "cpu":
    return None
  interpret_wgmma_with_register_lhs()  # the interpret mode of JAX 0.11.2 reads wgmma's A from shared memory
  return plgpu.InterpretGPUParams()


def random_case(seed, pairs, tokens, groups):
  rng = np.random.default_rng(seed)
  q = (rng.normal(size=(pairs, groups, mi.HEAD_DIM)) * 0.3).astype(np.float32)
  codes = lambda: rng.integers(0, 256, (pairs, tokens, mi.HEAD_DIM // 4), dtype=np.uint8)
  meta = (pairs, tokens // mi.WINDOW, mi.HEAD_DIM)
  scale = lambda: rng.uniform(0.05, 0.3, meta).astype(np.float16)
  minimum = lambda: (rng.normal(size=meta) * 0.5).astype(np.float16)
  return q, codes(), scale(), minimum(), codes(), scale(), minimum()


@pytest.mark.parametrize("seed,pairs,tokens,groups,splits", [
    (0, 3, 256, 7, 2),  # Qwen2-7B's GQA group, two splits of two steps
    (1, 2, 128, 8, 1),  # a full 8-head group, one split
    (2, 1, 192, 1, 3),  # one query head, three splits of one step
])
def test_matches_dequantize_then_attend(interpret, seed, pairs, tokens, groups, splits):
  case = random_case(seed, pairs, tokens, groups)
  out = np.asarray(mi.attend(*case, splits=splits, interpret=interpret))
  want = mi.reference(*case)
  assert out.shape == want.shape == (pairs, groups, mi.HEAD_DIM)
  np.testing.assert_allclose(out, want, atol=2e-3, rtol=0)


def test_values_first_matches(interpret):
  """Dequantizing the values before the score wgmma (`overlap_values=False`) computes the same."""
  case = random_case(4, 2, 128, 7)
  out = np.asarray(mi.attend(*case, splits=1, interpret=interpret, options=(("overlap_values", False),)))
  np.testing.assert_allclose(out, mi.reference(*case), atol=2e-3, rtol=0)


def test_splits_and_window_parities_merge(interpret):
  """The same keys over 1 and 4 splits give the same attention (the merge of partial softmaxes)."""
  case = random_case(3, 2, 256, 7)
  one = np.asarray(mi.attend(*case, splits=1, interpret=interpret))
  four = np.asarray(mi.attend(*case, splits=4, interpret=interpret))
  np.testing.assert_allclose(one, four, atol=2e-4, rtol=0)  # P is rounded to f16 after different maxima


@pytest.mark.parametrize("options", [dict(fast_unpack=False), dict(), dict(magic_exponents=True),
                                     dict(overlap_values=False), dict(ptx_fma=False, auto_barriers=True),
                                     dict(defer_values_wgmma=True)])
def test_lowers_for_cuda(options):
  """Layouts, the inline PTX and the pipeline lower for CUDA (on any machine)."""
  import jax
  shapes = [jax.ShapeDtypeStruct(x.shape, x.dtype) for x in random_case(0, 4, 512, 7)]
  lower = jax.jit(lambda q, kc, ks, km, vc, vs, vm: mi.int2_decode(
      q, kc, ks, mi.key_bias(q, km), vc, vs, vm, splits=2, **options))
  text = lower.trace(*shapes).lower(lowering_platforms=("cuda",)).as_text()
  assert "mosaic_gpu" in text


@pytest.mark.parametrize("magic_exponents", [False, True])
def test_unpacking_constants(magic_exponents):
  """The inline PTX's arithmetic, emulated bit for bit in numpy for every byte: prmt's high byte, the
  part's AND (and OR), then the f16 subtraction of the magic number give 4^p c (or c)."""
  byte = np.arange(256, dtype=np.uint16)
  for part in range(4):
    mask, exponent, magic = mi.part_constants(part, magic_exponents)
    half = (byte | (0 if magic_exponents else 0x6400)) & mask | exponent
    value = half.view(np.float16).astype(np.float64) - np.array(magic, np.uint16).view(np.float16)
    code = (byte >> (2 * part)) & 3
    np.testing.assert_array_equal(value, code * (1 if magic_exponents else 4 ** part))


def test_bad_shapes_are_refused():
  q, kc, ks, km, vc, vs, vm = random_case(0, 1, 128, 7)
  with pytest.raises(ValueError, match="multiple of 64"):
    mi.int2_decode(q, kc, ks, mi.key_bias(q, km), vc, vs, vm, splits=3)
  with pytest.raises(ValueError, match="up to 8 query heads"):
    mi.query_operands(np.zeros((1, 9, mi.HEAD_DIM), np.float32))
