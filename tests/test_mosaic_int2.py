"""The Mosaic GPU INT2 kernel (pallas_kernels/mosaic_int2.py) against float64 dequantize-then-attend.

JAX >= 0.11 only (Python >= 3.12): skipped under the project's Python 3.11 / JAX 0.10 environment, run by
`.ci/run`'s second step (see the README). On a CPU the kernel runs in Mosaic GPU's interpret mode (the
plain conversions; the inline-PTX path is checked against the same reference on the H200 by
`benchmarks/mosaic_int2_bench.py`), and both paths are lowered for CUDA, which checks their layouts.
"""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from pallas_kernels import mosaic_int2 as mi

pytestmark = pytest.mark.skipif(not mi.available(), reason="the Mosaic GPU kernel needs jax >= 0.11")


@pytest.fixture(scope="module")
def interpret():
  import jax
  return mi.interpret_params() if jax.default_backend() == "cpu" else None


FACTORED = "wg4_large_batch_ftz_lean_folded_eight_narrow_both_spread_vldsm_factored"  # s49's factored keys


def random_case(seed, pairs, tokens, groups, bits=2):
  rng = np.random.default_rng(seed)
  q = (rng.normal(size=(pairs, groups, mi.HEAD_DIM)) * 0.3).astype(np.float32)
  codes = lambda: rng.integers(0, 256, (pairs, tokens, mi.HEAD_DIM * bits // 8), dtype=np.uint8)
  meta = (pairs, tokens // mi.WINDOW, mi.HEAD_DIM)
  scale = lambda: (rng.uniform(0.05, 0.3, meta) * 3 / ((1 << bits) - 1)).astype(np.float16)  # the same range
  minimum = lambda: (rng.normal(size=meta) * 0.5).astype(np.float16)
  return q, codes(), scale(), minimum(), codes(), scale(), minimum()


def random_pool(rng, b: int, kh: int, bits: int, windows: int):
  """A `quantized_decode.PoolArrays` of `windows` windows a (request, KV head) pair: bf16 keys or values, or random
  codes of `bits` bits with a scale and minimum a window and channel."""
  import jax.numpy as jnp

  from pallas_kernels import quantized_decode as qd
  h, tokens = mi.HEAD_DIM, windows * mi.WINDOW
  if bits == 16:
    return qd.PoolArrays(jnp.asarray(rng.normal(size=(b, kh, tokens, h)), jnp.bfloat16), None, None, 16)
  codes = jnp.asarray(rng.integers(0, 256, (b, kh, tokens, h * bits // 8), dtype=np.uint8))
  scale = jnp.asarray(rng.uniform(0.02, 0.1, (b, kh, windows, h)), jnp.float16)
  return qd.PoolArrays(codes, scale, -scale * jnp.asarray(rng.integers(0, 1 << bits, scale.shape), jnp.float16), bits)


def assert_range_matches(case, first, count, windows, splits, interpret, options):
  """`range_partials` over windows [first, first + count) of the case's pool, merged, against float64 on that
  slice; returns its o_t."""
  q, kc, ks, km, vc, vs, vm = case
  o_t, m, l = mi.range_partials(q, kc, ks, km, vc, vs, vm, first, count, windows=windows, splits=splits,
                                interpret=interpret, **options)
  tokens, windows_ = slice(first * mi.WINDOW, (first + count) * mi.WINDOW), slice(first, first + count)
  want = mi.reference(q, kc[:, tokens], ks[:, windows_], km[:, windows_], vc[:, tokens], vs[:, windows_],
                      vm[:, windows_])
  np.testing.assert_allclose(np.asarray(mi.merge(o_t, m, l, q.shape[1])), want, atol=2e-3, rtol=0)
  return o_t


@pytest.mark.parametrize("seed,pairs,tokens,groups,splits", [
    (0, 3, 256, 7, 2),  # Qwen2-7B's GQA group, two splits of two steps
    (1, 2, 128, 8, 1),  # a full 8-head group, one split
    (2, 1, 192, 1, 3),  # one query head, three splits of one step
    (7, 2, 320, 7, 2),  # 5 steps over 2 splits: read as a range, the surplus windows masked
])
@pytest.mark.parametrize("bits", [2, 4])
def test_matches_dequantize_then_attend(interpret, seed, pairs, tokens, groups, splits, bits):
  case = random_case(seed, pairs, tokens, groups, bits)
  out = np.asarray(mi.attend(*case, splits=splits, interpret=interpret))
  want = mi.reference(*case)
  assert out.shape == want.shape == (pairs, groups, mi.HEAD_DIM)
  np.testing.assert_allclose(out, want, atol=2e-3, rtol=0)


@pytest.mark.parametrize("option,value", [("overlap_values", False), ("keys_in_smem", True), ("bias_in_kernel", True),
                                          ("steps_per_block", 2), ("dequantize_keys", True), ("lagged_max", True),
                                          ("values_scaled_after", True), ("in_place_values", True)])
@pytest.mark.parametrize("bits", [2, 4])
def test_orderings_match(interpret, option, value, bits):
  """The values dequantized before the score wgmma, the keys through shared memory, the minimums' biases
  computed in the kernel, two steps a pipeline iteration, or the keys dequantized in registers (no bias),
  compute the same."""
  case = random_case(4, 2, 256, 7, bits)
  out = np.asarray(mi.attend(*case, splits=1, interpret=interpret, options=((option, value),)))
  np.testing.assert_allclose(out, mi.reference(*case), atol=2e-3, rtol=0)


RANGES = [(3, 7, 10, 1), (0, 8, 8, 2), (5, 4, 6, 2), (12, 4, 6, 2), (9, 7, 16, 4), (2, 1, 8, 3), (4, 0, 4, 2)]
# Every range under the plain kernel and the dequantized keys (INT2, INT4); the other options under four of them: one
# split, a range that runs off the pool, four splits, an empty range (s50, CI time)
RANGE_CASES = ([(options, r) for options in ({}, dict(dequantize_keys=True, lagged_max=True),
                                             dict(bits=4, dequantize_keys=True, lagged_max=True)) for r in RANGES]
               + [(options, r) for options in (dict(bias_in_kernel=True), dict(steps_per_block=2),
                                               dict(bias_in_kernel=True, steps_per_block=2), dict(dequantize_keys=True),
                                               dict(dequantize_keys=True, steps_per_block=2), dict(bits=4))
                  for r in (RANGES[0], RANGES[3], RANGES[4], RANGES[6])])


@pytest.mark.parametrize("options,first,count,windows,splits", [(o, *r) for o, r in RANGE_CASES])
def test_a_range_of_the_pool(interpret, first, count, windows, splits, options):
  """A layer's windows of a shared pool: an odd first window, a count below the static bound (the splits
  share the count's steps; some get none), a bound running past the pool, a single window, no window."""
  options = dict(options)  # the parameter itself stays as given
  q, kc, ks, km, vc, vs, vm = random_case(5, 2, 16 * mi.WINDOW, 7, options.pop("bits", 2))
  o_t, m, l = mi.range_partials(q, kc, ks, km, vc, vs, vm, first, count, windows=windows, splits=splits,
                                interpret=interpret, **options)
  if count == 0:  # every split empty: nothing weighs anything
    np.testing.assert_array_equal(np.asarray(l), 0)
    np.testing.assert_array_equal(np.asarray(o_t), 0)
    return
  out = np.asarray(mi.merge(o_t, m, l, q.shape[1]))
  tokens = slice(first * mi.WINDOW, (first + count) * mi.WINDOW)
  windows_ = slice(first, first + count)
  want = mi.reference(q, kc[:, tokens], ks[:, windows_], km[:, windows_], vc[:, tokens], vs[:, windows_],
                      vm[:, windows_])
  np.testing.assert_allclose(out, want, atol=2e-3, rtol=0)


def paged_case(seed, pairs, plan, groups, bits):
  """Ablation C's heaps (uint16 [pairs, 1, U]) holding windows of `plan` (bits a window, original order) as
  records (`wq_jax.interleaved`: codes, a row of scales, a row of minimums; 16-bit windows garbage here), the
  page table (`format_starts`: 16-bit, INT4, INT2 records, window order within one), and the `bits` windows as a
  pool for the reference: (q, heaps, table, first, count), (q, kc, ks, km, vc, vs, vm)."""
  rng = np.random.default_rng(seed)
  size = lambda b: mi.WINDOW * mi.HEAD_DIM * b // 8 + (0 if b == 16 else 4 * mi.HEAD_DIM)
  starts = np.cumsum([0] + [size(b) for b in plan])[:-1]
  total = -(-int(starts[-1] + size(plan[-1])) // 256) * 256 + size(16)  # room past the end, as the cache keeps
  q, kc, ks, km, vc, vs, vm = random_case(seed, pairs, mi.WINDOW * max(1, plan.count(bits)), groups, bits)
  heaps = []
  for codes, scale, minimum in ((kc, ks, km), (vc, vs, vm)):
    heap = rng.integers(0, 1 << 16, (pairs, total // 2), dtype=np.uint16).view(np.uint8).reshape(pairs, total)
    for i, w in enumerate(w for w, b in enumerate(plan) if b == bits):
      record = np.concatenate([codes[:, mi.WINDOW * i:mi.WINDOW * (i + 1)].reshape(pairs, -1),
                               scale[:, i].view(np.uint8), minimum[:, i].view(np.uint8)], axis=1)
      heap[:, starts[w]:starts[w] + record.shape[1]] = record
    heaps.append(heap.view(np.uint16)[:, None])
  table = np.concatenate([starts[np.asarray(plan) == b] // 2 for b in (16, 4, 2)]).astype(np.int32)
  first = sum(plan.count(b) for b in (16, 4, 2)[:(16, 4, 2).index(bits)])
  return (q, *heaps, table, first, plan.count(bits)), (q, kc, ks, km, vc, vs, vm)


PAGED_OPTIONS = dict(warpgroups=4, overlap_values=False, dequantize_keys=True, lagged_max=True,
                     eight_column_softmax=True)


@pytest.mark.parametrize("bits", [2, 4])
@pytest.mark.parametrize("plan,splits,options", [
    ([2, 16, 4, 2, 2, 4, 16, 2, 2, 4, 2], 4, {}),  # odd count: the last step's second window masked
    ([4, 2, 2, 16, 2, 4, 4, 2, 2, 2, 4, 2, 16, 2, 2, 2, 4, 2], 2, dict(steps_per_block=2)),
    ([16, 2, 4, 2], 1, {}),  # one window of each; one split a pair
    ([16, 16, 4, 4], 4, {})])  # no INT2 window: every split empty
def test_paged_windows_where_their_records_lie(interpret, bits, plan, splits, options):
  """`paged`: ablation C's windows read through the page table from records of every format in original order
  (each fetched where it lies), the partials merged, against float64 on those windows as a pool."""
  paged, pool = paged_case(17, 4, plan, 7, bits)
  q, k_heap, v_heap, table, first, count = paged
  o_t, m, l = mi.paged_partials(q, k_heap, v_heap, table, first, count, bits=bits, splits=splits,
                                interpret=interpret, **PAGED_OPTIONS, **options)
  if count == 0:
    np.testing.assert_array_equal(np.asarray(l), 0)
    return
  np.testing.assert_allclose(np.asarray(mi.merge(o_t, m, l, q.shape[1])), mi.reference(*pool), atol=2e-3, rtol=0)


def test_paged_reading_is_refused_where_it_cannot_go():
  paged, _ = paged_case(0, 4, [2, 2], 7, 2)
  q, k_heap, v_heap, table, first, count = paged
  with pytest.raises(ValueError, match="paged: a range of windows through a page table"):
    mi.paged_partials(q, k_heap, v_heap, table, first, count, bits=2, splits=4, warpgroups=1)


def c_layer(seed, batch, kv_heads, groups, plan, capacity=8):
  """A layer of ablation C's cache as `interleaved_decode` reads it (`wq_jax.interleaved.InterleavedLayer`'s
  fields; f16 values and scales, its rest segment partly filled), q pre-scaled, and float64 keys and values of
  every window in original order then the rest, with the rest's valid mask, for the reference."""
  import types
  rng = np.random.default_rng(seed)
  pairs, h, s = batch * kv_heads, mi.HEAD_DIM, mi.WINDOW
  size = lambda b: s * h * b // 8 + (0 if b == 16 else 4 * h)
  starts = np.cumsum([0] + [size(b) for b in plan])[:-1]
  total = -(-int(starts[-1] + size(plan[-1])) // 256) * 256 + size(16)
  heaps, dense = [], []
  for _ in range(2):
    heap = np.zeros((pairs, total), np.uint8)
    windows = []
    for w, bits in enumerate(plan):
      if bits == 16:
        x = (rng.normal(size=(pairs, s, h)) * 0.5).astype(np.float16)
        heap[:, starts[w]:starts[w] + size(16)] = x.view(np.uint8).reshape(pairs, -1)
        windows.append(x.astype(np.float64))
        continue
      codes = rng.integers(0, 256, (pairs, s, h * bits // 8), dtype=np.uint8)
      scale = (rng.uniform(0.05, 0.3, (pairs, h)) * 3 / ((1 << bits) - 1)).astype(np.float16)
      minimum = (rng.normal(size=(pairs, h)) * 0.5).astype(np.float16)
      heap[:, starts[w]:starts[w] + size(bits)] = np.concatenate(
          [codes.reshape(pairs, -1), scale.view(np.uint8), minimum.view(np.uint8)], axis=1)
      levels = np.concatenate([(codes >> (bits * p)) & ((1 << bits) - 1) for p in range(8 // bits)], axis=-1)
      windows.append(levels * scale[:, None].astype(np.float64) + minimum[:, None].astype(np.float64))
    heaps.append(heap.view(np.uint16).reshape(batch, kv_heads, -1))
    dense.append(np.concatenate(windows, axis=1))
  rest_len = rng.integers(1, capacity + 1, batch).astype(np.int32)
  rest = [(rng.normal(size=(batch, kv_heads, capacity, h)) * 0.5).astype(np.float16) for _ in range(2)]
  counts = np.array([plan.count(b) for b in (16, 4, 2)], np.int32)
  table = np.concatenate([starts[np.asarray(plan) == b] // 2 for b in (16, 4, 2)]).astype(np.int32)
  layer = types.SimpleNamespace(
      k_heap=heaps[0], v_heap=heaps[1], plan=np.asarray(plan, np.int32), format_starts=table, format_counts=counts,
      rest_k=rest[0], rest_v=rest[1], rest_len=rest_len, capacity=capacity, layer=None, window_size=s,
      dtype="float16", meta_dtype="float16")
  k, v = (np.concatenate([d.reshape(batch, kv_heads, -1, h), r.astype(np.float64)], axis=2)
          for d, r in zip(dense, rest))
  valid = np.concatenate([np.ones((batch, len(plan) * s), bool), np.arange(capacity)[None] < rest_len[:, None]], 1)
  q = (rng.normal(size=(batch, kv_heads, groups, h)) * 0.1).astype(np.float32)
  return layer, q, k, v, valid


@pytest.mark.parametrize("mosaic,variant", [((), None), ((2,), None), ((4,), None), ((4, 2), None),
                                            ((4, 2), "MOSAIC_WIDE_OUTPUT")])
def test_ablation_c_through_both_kernels(interpret, mosaic, variant, monkeypatch):
  """Ablation C's layer (`interleaved_decode`): the formats in `mosaic` through the Mosaic kernel's paged reading,
  the others and the rest through the Triton kernel (interpret modes), the sets merged by the combine, against
  float64 attention over every window in original order and the rest; with a variant's Mosaic configuration
  (s46: 16-column partials, as until then; with it, the formats in one launch at every batch). Since s52 both
  formats go in one launch below 64 pairs (`mosaic_one_launch`)."""
  from pallas_kernels import interleaved_decode as paged
  from pallas_kernels import quantized_decode as qd
  layer, q, k, v, valid = c_layer(19, 2, 2, 7, [2, 16, 4, 2, 2, 4, 16, 2, 4, 2, 2])
  config = dataclasses.replace(getattr(qd, variant), mosaic_one_launch=True) if variant else None
  together = []  # the plans of each launch_together
  monkeypatch.setattr(mi, "launch_together", lambda plans, _launch=mi.launch_together: (
      together.append(len(plans)), _launch(plans))[1])
  out = np.asarray(paged.interleaved_decode(q, layer, interpret=True, mosaic=mosaic, mosaic_config=config))
  assert together == ([2] if len(mosaic) == 2 else [])  # the default too since s52: 4 pairs, below 64
  logits = np.where(valid[:, None, None], np.einsum("bkgh,bkth->bkgt", q.astype(np.float64), k), -np.inf)
  p = np.exp(logits - logits.max(axis=-1, keepdims=True))
  want = np.einsum("bkgt,bkth->bkgh", p / p.sum(axis=-1, keepdims=True), v)
  np.testing.assert_allclose(out, want, atol=3e-3, rtol=0)


@pytest.mark.parametrize("spike", [None, 11])
@pytest.mark.parametrize("dequantize_keys,eight_column_softmax", [(False, False), (True, False), (True, True)])
def test_lagged_maximum_follows_rising_scores(interpret, spike, dequantize_keys, eight_column_softmax):
  """`lagged_max`: scores rising 5 a step (in base 2; P against a stale maximum, up to 2^8 where within
  the margin, recomputed past it), and a window 60 above the rest: the same attention as the reference."""
  q, kc, ks, km, vc, vs, vm = random_case(9, 2, 16 * mi.WINDOW, 1)
  rise = 2.5 * np.arange(16)
  if spike is not None:
    rise[spike] = 60.0
  direction = q[:, 0] / (q[:, 0] ** 2).sum(axis=1, keepdims=True)  # q . direction = 1
  km = (km + rise[None, :, None] * direction[:, None, :]).astype(np.float16)
  options = dict(lagged_max=True, dequantize_keys=dequantize_keys, eight_column_softmax=eight_column_softmax)
  out = np.asarray(mi.attend(q, kc, ks, km, vc, vs, vm, splits=2, interpret=interpret,
                             options=tuple(options.items())))
  np.testing.assert_allclose(out, mi.reference(q, kc, ks, km, vc, vs, vm), atol=2e-3, rtol=0)


@pytest.mark.parametrize("first,count,windows", [(None, None, None), (3, 29, 32), (5, 6, 12)])
@pytest.mark.parametrize("faster", [{}, dict(dequantize_keys=True, lagged_max=True),
                                    dict(dequantize_keys=True, lagged_max=True, values_scaled_after=True)])
def test_four_warpgroups_a_cta(interpret, first, count, windows, faster):
  """Four programs a CTA (`warpgroups=4`: each its own buffers and pipeline): the whole pool (4 blocks a
  split, more than the pipeline's 2 slots), and ranges whose last splits get fewer blocks or none."""
  case = random_case(8, 3, 32 * mi.WINDOW, 7)
  options = dict(warpgroups=4, overlap_values=False, **faster)
  if first is None:
    out = np.asarray(mi.attend(*case, splits=4, interpret=interpret, options=tuple(options.items())))
    np.testing.assert_allclose(out, mi.reference(*case), atol=2e-3, rtol=0)
    return
  assert_range_matches(case, first, count, windows, 4, interpret, options)


@pytest.mark.parametrize("splits,first,count,windows", [(1, None, None, None), (2, 3, 29, 32), (1, 5, 6, 12)])
def test_a_ctas_warpgroups_take_several_pairs(interpret, splits, first, count, windows):
  """Fewer splits than warpgroups: a CTA's four programs are every split of 4 / splits pairs (the default's
  kernel options, eight columns, KIVI-free); the whole pool and ranges, against float64."""
  q, kc, ks, km, vc, vs, vm = random_case(11, 4, 32 * mi.WINDOW, 7)
  options = dict(warpgroups=4, overlap_values=False, dequantize_keys=True, lagged_max=True,
                 eight_column_softmax=True)
  if first is None:
    out = np.asarray(mi.attend(q, kc, ks, km, vc, vs, vm, splits=splits, interpret=interpret,
                               options=tuple(options.items())))
    np.testing.assert_allclose(out, mi.reference(q, kc, ks, km, vc, vs, vm), atol=2e-3, rtol=0)
    return
  o_t = assert_range_matches((q, kc, ks, km, vc, vs, vm), first, count, windows, splits, interpret, options)
  assert o_t.shape[:2] == (4, splits)


@pytest.mark.parametrize("bits,warpgroups,splits,first,count,windows", [
    (2, 4, 4, None, None, None), (2, 4, 4, 3, 29, 32), (2, 1, 2, 5, 7, 12), (2, 4, 2, 0, 3, 4), (4, 1, 2, 3, 29, 32)])
def test_paired_steps_share_one_softmax(interpret, bits, warpgroups, splits, first, count, windows):
  """`paired_steps`: a block's two 64-key steps under one softmax (one vote a block); the whole pool, ranges whose
  last block ends mid-step or mid-window, one and four warpgroups, INT2 (and INT4, which the configurations give
  it not: its blocks of four warpgroups exceed shared memory), against float64."""
  q, kc, ks, km, vc, vs, vm = random_case(13, 4, 32 * mi.WINDOW, 7, bits)
  options = dict(mi.VARIANTS["wg4_large_batch_ftz_lean_folded_eight_paired"], warpgroups=warpgroups,
                 overlap_values=warpgroups == 1, fetch_by_one_warp=warpgroups > 1, permuted_keys=bits == 2)
  if first is None:
    out = np.asarray(mi.attend(q, kc, ks, km, vc, vs, vm, splits=splits, interpret=interpret,
                               options=tuple(options.items())))
    np.testing.assert_allclose(out, mi.reference(q, kc, ks, km, vc, vs, vm), atol=2e-3, rtol=0)
    return
  assert_range_matches((q, kc, ks, km, vc, vs, vm), first, count, windows, splits, interpret, options)


@pytest.mark.parametrize("first,count,windows,splits", [(3, 29, 32, 2), (0, 3, 4, 4)])
def test_paired_steps_with_narrow_wgmmas_match(interpret, first, count, windows, splits):
  """(s48) the default's kernel (both wgmmas narrow, V by ldmatrix on a device) with a block's two steps under one
  softmax: ranges whose last block ends mid-step or mid-window, four warpgroups, against float64."""
  options = mi.VARIANTS["wg4_large_batch_ftz_lean_folded_eight_narrow_both_spread_vldsm_paired"]
  assert options["paired_steps"] and options["narrow_values"] and options["values_by_ldmatrix"]
  assert_range_matches(random_case(19, 4, 32 * mi.WINDOW, 7), first, count, windows, splits, interpret, options)


@pytest.mark.parametrize("bits,warpgroups,splits,first,count,windows,narrow_values", [
    (2, 4, 4, None, None, None, False), (2, 4, 2, 3, 25, 32, False), (4, 1, 2, 5, 7, 12, False),
    (2, 4, 4, None, None, None, True), (2, 4, 2, 3, 25, 32, True), (4, 1, 2, 5, 7, 12, True)])
def test_narrow_wgmmas_match(interpret, bits, warpgroups, splits, first, count, windows, narrow_values):
  """`narrow_scores`: the score wgmma 8 columns wide, its B q's rows read transposed a part at a time (INT2's
  parts of 32 channels, INT4's of 64); with `narrow_values` the V wgmma too (P^T stored transposed); the whole pool
  and ranges, one and four warpgroups, against float64, the partials 8 columns wide."""
  case = random_case(15, 4, 32 * mi.WINDOW, 7, bits)
  options = dict(warpgroups=warpgroups, overlap_values=warpgroups == 1, dequantize_keys=True, lagged_max=True,
                 eight_column_softmax=True, narrow_scores=True)
  if narrow_values:
    options.update(narrow_values=True, values_in_registers=True, in_place_values=True, magic_exponents=True)
  if first is None:
    out = np.asarray(mi.attend(*case, splits=splits, interpret=interpret, options=tuple(options.items())))
    np.testing.assert_allclose(out, mi.reference(*case), atol=2e-3, rtol=0)
    return
  o_t = assert_range_matches(case, first, count, windows, splits, interpret, options)
  assert o_t.shape[-1] == mi.COLUMNS // 2  # both window parities' heads in 8 columns: no empty 8-15 written (s46)


def test_sixteen_columns_out_match_and_keep_8_to_15_empty(interpret):
  """`sixteen_columns_out` (the outputs as before s46, for a comparison in one run): the same partials as the
  default's 8 columns, with columns 8-15 and their m (-1e30) and l (0) empty, through a range and four warpgroups."""
  case = random_case(17, 4, 32 * mi.WINDOW, 7, 2)
  options = mi.VARIANTS["wg4_large_batch_ftz_lean_folded_eight_narrow_both"]
  o_t = assert_range_matches(case, 3, 25, 32, 4, interpret, dict(options, sixteen_columns_out=True))
  assert o_t.shape[-1] == mi.COLUMNS and not np.asarray(o_t)[..., mi.COLUMNS // 2:].any()


@pytest.mark.parametrize("stages", [3, 4])
def test_deeper_pipelines_match(interpret, stages):
  """The default's kernel (both wgmmas narrow) with 3 and 4 pipeline stages (`MOSAIC_STAGES3`, `_4`, s45): a range
  long enough that every slot is refilled, a CTA's four warpgroups two pairs' splits, against float64."""
  case = random_case(16, 4, 32 * mi.WINDOW, 7, 2)
  options = mi.VARIANTS[f"wg4_large_batch_ftz_lean_folded_eight_narrow_both_s{stages}"]
  assert_range_matches(case, 3, 25, 32, 2, interpret, options)


def test_narrow_scores_need_the_eight_column_softmax():
  with pytest.raises(ValueError, match="narrow_scores"):
    mi.attend(*random_case(16, 1, 4 * mi.WINDOW, 7), splits=1, options=(("narrow_scores", True),))


@pytest.mark.parametrize("what,base", [("keys", ""), ("values", ""), ("both", ""), ("keys", "_spread"),
                                       ("key_metadata", "_spread"), ("value_metadata", "_spread"),
                                       ("metadata", "_spread"), ("key_scaling", "_spread_vldsm"),
                                       ("scaling", "_spread_vldsm")])
def test_knockouts_lower_and_are_refused_where_they_cannot_go(interpret, what, base):
  """`knockout` (s46's diagnostic, wrong by design; s48's metadata loads cut) lowers for CUDA, and is refused in the
  interpret mode (which could only check it against nothing), by another name, and off the register paths."""
  import jax
  options = mi.VARIANTS[f"wg4_large_batch_ftz_lean_folded_eight_narrow_both{base}_ko_{what}"]
  assert options["knockout"] == what
  case = random_case(0, 4, 512, 7)
  shapes = [jax.ShapeDtypeStruct(x.shape, x.dtype) for x in case]
  text = jax.jit(lambda q, *pool: mi.pool_partials(q, *pool, splits=4, **options)).trace(*shapes).lower(
      lowering_platforms=("cuda",)).as_text()
  assert "mosaic_gpu" in text
  with pytest.raises(ValueError, match="knockout: a compiled diagnostic"):
    mi.attend(*case, splits=4, interpret=interpret, options=tuple(options.items()))
  with pytest.raises(ValueError, match="knockout: one of"):
    mi.attend(*case, splits=4, options=tuple(dict(options, knockout="scores").items()))
  with pytest.raises(ValueError, match="knockout: a compiled diagnostic"):
    mi.attend(*case, splits=4, options=tuple(dict(options, permuted_keys=False).items()))


@pytest.mark.parametrize("what,changes,needs", [("key_scaling", {"folded_minimums": False}, "folded_minimums"),
                                                ("value_scaling", {}, "values_by_ldmatrix")])
def test_scaling_knockouts_are_refused_off_their_paths(what, changes, needs):
  """s49's knockouts keep a path's conversions and drop its scaling: refused where that path is not taken (s47's
  default: V's codes by byte loads, not ldmatrix)."""
  options = dict(mi.VARIANTS["wg4_large_batch_ftz_lean_folded_eight_narrow_both_spread"], knockout=what, **changes)
  case = random_case(0, 4, 512, 7)
  with pytest.raises(ValueError, match=f"knockout {what!r}: .* need {needs}"):
    mi.attend(*case, splits=4, options=tuple(options.items()))


def test_query_rows_are_q_padded_to_eight_heads_in_f16():
  q = np.random.default_rng(4).normal(size=(3, 7, mi.HEAD_DIM)).astype(np.float32)
  got = np.asarray(mi.query_rows(q))
  assert got.dtype == np.float16 and got.shape == (3, 8, mi.HEAD_DIM)
  np.testing.assert_array_equal(got[:, :7], q.astype(np.float16))
  assert not got[:, 7].any()


def test_paired_steps_are_refused_where_they_cannot_go():
  q, kc, ks, km, vc, vs, vm = random_case(14, 4, 4 * mi.WINDOW, 7)
  options = dict(mi.VARIANTS["wg4_large_batch_ftz_lean_folded_eight_paired"], steps_per_block=1)
  with pytest.raises(ValueError, match="paired_steps"):
    mi.attend(q, kc, ks, km, vc, vs, vm, splits=2, interpret=mi.interpret_params(), options=tuple(options.items()))


def test_cta_splits_are_what_a_ctas_programs_can_take():
  """A multiple of the warpgroups (one pair's splits), or a divisor whose pairs fill whole CTAs; else rounded up."""
  assert [mi.cta_splits(j, 4, 240) for j in (1, 2, 3, 4, 5, 8)] == [1, 2, 4, 4, 8, 8]
  assert mi.cta_splits(2, 4, 3) == 4 and mi.cta_splits(1, 4, 6) == 4 and mi.cta_splits(1, 4, 8) == 1
  assert mi.cta_splits(3, 1, 5) == 3


def test_pairs_that_cannot_share_a_cta_are_refused():
  """Two splits of four warpgroups put two pairs in a CTA: three pairs cannot be split so."""
  q, kc, ks, km, vc, vs, vm = random_case(12, 3, 4 * mi.WINDOW, 7)
  with pytest.raises(ValueError, match="warpgroups=4 needs splits"):
    mi.attend(q, kc, ks, km, vc, vs, vm, splits=2, interpret=mi.interpret_params(),
              options=(("warpgroups", 4), ("overlap_values", False)))


@pytest.mark.parametrize("bits,warpgroups,first,count,windows,splits", [
    (2, 1, 3, 7, 10, 1), (4, 1, 5, 4, 6, 2), (2, 4, 3, 29, 32, 4), (2, 1, 4, 0, 4, 2)])
def test_eight_column_softmax_over_ranges(interpret, bits, warpgroups, first, count, windows, splits):
  """`eight_column_softmax`: both windows' rows in 8 columns, the other 8 empty; ranges that end mid-step,
  four warpgroups a CTA, no window at all."""
  q, kc, ks, km, vc, vs, vm = random_case(5, 2, 32 * mi.WINDOW, 7, bits)
  options = dict(dequantize_keys=True, lagged_max=True, eight_column_softmax=True, warpgroups=warpgroups,
                 overlap_values=warpgroups == 1)
  o_t, m, l = mi.range_partials(q, kc, ks, km, vc, vs, vm, first, count, windows=windows, splits=splits,
                                interpret=interpret, **options)
  assert not np.asarray(l)[..., 8:].any() and (np.asarray(m)[..., 8:] <= -1e29).all()  # the empty columns
  if count == 0:
    np.testing.assert_array_equal(np.asarray(o_t), 0)
    return
  tokens, windows_ = slice(first * mi.WINDOW, (first + count) * mi.WINDOW), slice(first, first + count)
  want = mi.reference(q, kc[:, tokens], ks[:, windows_], km[:, windows_], vc[:, tokens], vs[:, windows_],
                      vm[:, windows_])
  np.testing.assert_allclose(np.asarray(mi.merge(o_t, m, l, q.shape[1])), want, atol=2e-3, rtol=0)


def test_splits_and_window_parities_merge(interpret):
  """The same keys over 1 and 4 splits give the same attention (the merge of partial softmaxes)."""
  case = random_case(3, 2, 256, 7)
  one = np.asarray(mi.attend(*case, splits=1, interpret=interpret))
  four = np.asarray(mi.attend(*case, splits=4, interpret=interpret))
  np.testing.assert_allclose(one, four, atol=2e-4, rtol=0)  # P is rounded to f16 after different maxima


@pytest.mark.parametrize("options", [dict(fast_unpack=False), dict(), dict(magic_exponents=True),
                                     dict(overlap_values=False), dict(ptx_fma=False, auto_barriers=True),
                                     dict(defer_values_wgmma=True), dict(values_by_part=True),
                                     dict(keys_in_smem=True), dict(ranged=True),
                                     dict(ranged=True, defer_values_wgmma=True), dict(bias_in_kernel=True),
                                     dict(ranged=True, bias_in_kernel=True, defer_values_wgmma=True,
                                          overlap_values=False),
                                     dict(steps_per_block=2, defer_values_wgmma=True, overlap_values=False),
                                     dict(ranged=True, steps_per_block=2, bias_in_kernel=True,
                                          defer_values_wgmma=True, overlap_values=False),
                                     dict(dequantize_keys=True, overlap_values=False),
                                     dict(lagged_max=True, overlap_values=False),
                                     dict(ranged=True, dequantize_keys=True, lagged_max=True, defer_values_wgmma=True,
                                          overlap_values=False),
                                     dict(ranged=True, dequantize_keys=True, defer_values_wgmma=True,
                                          overlap_values=False),
                                     dict(warpgroups=4, overlap_values=False),
                                     dict(ranged=True, warpgroups=4, overlap_values=False, steps_per_block=2),
                                     dict(ranged=True, warpgroups=4, overlap_values=False, dequantize_keys=True,
                                          lagged_max=True),
                                     dict(bits=4), dict(bits=4, keys_in_smem=True, values_by_part=True),
                                     dict(bits=4, ranged=True, dequantize_keys=True, lagged_max=True,
                                          defer_values_wgmma=True, overlap_values=False),
                                     dict(ranged=True, warpgroups=4, overlap_values=False, dequantize_keys=True,
                                          lagged_max=True, grid_dependency_wait=True),
                                     dict(values_scaled_after=True), dict(bits=4, values_scaled_after=True),
                                     dict(ranged=True, warpgroups=4, overlap_values=False, dequantize_keys=True,
                                          lagged_max=True, values_scaled_after=True),
                                     dict(in_place_values=True), dict(in_place_values=True, lagged_max=True),
                                     dict(dequantize_keys=True, magic_exponents=True, lagged_max=True),
                                     dict(ranged=True, warpgroups=4, overlap_values=False, dequantize_keys=True,
                                          lagged_max=True, in_place_values=True, magic_exponents=True),
                                     dict(ldmatrix_metadata=True), dict(bits=4, ldmatrix_metadata=True),
                                     dict(ranged=True, warpgroups=4, overlap_values=False, dequantize_keys=True,
                                          lagged_max=True, in_place_values=True, magic_exponents=True,
                                          ldmatrix_metadata=True),
                                     *(dict(mi.VARIANTS[name], ranged=True) for name in (  # s25's kernel and on
                                         "wg4_large_batch_ftz_block2", "wg4_large_batch_ftz_thread_order",
                                         "wg4_large_batch_ftz_s3", "wg4_large_batch_ftz_vregs",
                                         "wg4_large_batch_ftz_vregs_one_warp_fetch",
                                         "wg4_large_batch_ftz_vregs_permuted_keys",
                                         "wg4_large_batch_ftz_lean_folded",
                                         "wg4_large_batch_ftz_lean_folded_eight",  # s31
                                         "wg4_large_batch_ftz_lean_folded_eight_vldsm")),  # s35
                                     mi.VARIANTS["wg4_large_batch_ftz_lean_folded_eight_vldsm"],
                                     dict(mi.VARIANTS["wg4_large_batch_ftz_lean_folded_eight_vldsm"], ranged=True,
                                          bits=4, permuted_keys=False),  # as INT4's pools take it (s35)
                                     dict(warpgroups=4, dequantize_keys=True, lagged_max=True, magic_exponents=True,
                                          values_in_registers=True),
                                     dict(warpgroups=4, dequantize_keys=True, lagged_max=True, magic_exponents=True,
                                          values_in_registers=True, metadata_in_thread_order=True),
                                     *(dict(mi.VARIANTS[name], ranged=True, bits=4) for name in (  # INT4, s27
                                         "wg4_large_batch_ftz_vregs", "wg4_large_batch_ftz_vregs_one_warp_fetch",
                                         "wg4_large_batch_ftz_int4_lean_folded")),  # s30
                                     # s31: the 8-column softmax as INT4's and KIVI's pools take it (pool_options)
                                     dict(mi.VARIANTS["wg4_large_batch_ftz_lean_folded_eight"], ranged=True, bits=4,
                                          permuted_keys=False),
                                     dict(mi.VARIANTS["wg4_large_batch_ftz_lean_folded_eight"], ranged=True,
                                          values_per_token=True, values_in_registers=False, folded_minimums=False),
                                     *(dict(mi.VARIANTS["wg4_large_batch_ftz_kivi"], ranged=ranged, bits=bits)
                                       for ranged in (False, True) for bits in (2, 4)),  # KIVI's values, s27
                                     # s38: two pairs' splits a CTA; two steps under one softmax
                                     dict(mi.VARIANTS["wg4_large_batch_ftz_lean_folded_eight"], ranged=True, splits=2),
                                     dict(mi.VARIANTS["wg4_large_batch_ftz_lean_folded_eight_paired"], ranged=True),
                                     # s39: the score wgmma 8 wide (INT2, and INT4's wider parts); 5 warpgroups
                                     dict(mi.VARIANTS["wg4_large_batch_ftz_lean_folded_eight_narrow"], ranged=True),
                                     dict(mi.VARIANTS["wg4_large_batch_ftz_lean_folded_eight_narrow"], ranged=True,
                                          bits=4, permuted_keys=False),
                                     dict(mi.VARIANTS["wg5_large_batch_ftz_lean_folded_eight"], ranged=True),
                                     # s39: both wgmmas 8 wide (INT2, whole pool and range; INT4)
                                     dict(mi.VARIANTS["wg4_large_batch_ftz_lean_folded_eight_narrow_both"],
                                          ranged=True),
                                     dict(mi.VARIANTS["wg4_large_batch_ftz_lean_folded_eight_narrow_both"], splits=4),
                                     dict(mi.VARIANTS["wg4_large_batch_ftz_lean_folded_eight_narrow_both"], ranged=True,
                                          splits=2),  # the default at batch >= 45: a CTA two pairs' splits
                                     dict(mi.VARIANTS["wg4_large_batch_ftz_lean_folded_eight_narrow_both"],
                                          ranged=True, bits=4, permuted_keys=False),
                                     # (s46) a group's copies issued by its warp g % 4: a range, and C's pages
                                     dict(mi.VARIANTS["wg4_large_batch_ftz_lean_folded_eight_narrow_both_spread"],
                                          ranged=True),
                                     dict(mi.VARIANTS["wg4_large_batch_ftz_lean_folded_eight_narrow_both_spread"],
                                          paged=True, splits=4),
                                     dict(mi.VARIANTS["wg4_large_batch_ftz_lean_folded_eight_narrow_both_spread"],
                                          ranged=True, splits=2),  # (s47) the default at batch >= 45
                                     # (s48) the default: V's codes by ldmatrix, both wgmmas narrow, a range at
                                     # batch >= 45's 2 splits, and C's pages
                                     dict(mi.VARIANTS["wg4_large_batch_ftz_lean_folded_eight_narrow_both_spread_vldsm"],
                                          ranged=True, splits=2),
                                     dict(mi.VARIANTS["wg4_large_batch_ftz_lean_folded_eight_narrow_both_spread_vldsm"],
                                          paged=True, splits=4),
                                     dict(mi.VARIANTS[
                                         "wg4_large_batch_ftz_lean_folded_eight_narrow_both_spread_vldsm_paired"],
                                         ranged=True, splits=4),
                                     # (s49) the factored keys over a range (the bias a window from XLA)
                                     dict(mi.VARIANTS[FACTORED], ranged=True, splits=2),
                                     # (s48) the minimums folded before the kernel
                                     dict(mi.VARIANTS[
                                         "wg4_large_batch_ftz_lean_folded_eight_narrow_both_spread_prefolded"],
                                         ranged=True, splits=2),
                                     # ablation C's windows through a page table (INT2, and INT4's as configured)
                                     dict(mi.VARIANTS["wg4_large_batch_ftz_lean_folded_eight_narrow_both"], paged=True,
                                          splits=4),
                                     dict(mi.VARIANTS["wg4_large_batch_ftz_lean_folded_eight"], paged=True, bits=4,
                                          permuted_keys=False, splits=2)])
def test_lowers_for_cuda(options):
  """Layouts, the inline PTX and the pipeline lower for CUDA (on any machine); with `grid_dependency_wait`
  the kernel asks to be launched under PDL."""
  import jax
  options = dict(options)  # the parameter itself stays as given
  shapes = [jax.ShapeDtypeStruct(x.shape, x.dtype) for x in random_case(0, 4, 512, 7, options.pop("bits", 2))]
  if options.get("values_per_token"):  # KIVI's value metadata: a token's 4 groups of 32 channels
    shapes[5:] = [jax.ShapeDtypeStruct((4, 512, mi.HEAD_DIM // 32), np.float16)] * 2
  splits = options.pop("splits", options.get("warpgroups", 2))
  if options.pop("paged", False):
    bits = 4 if shapes[1].shape[-1] == 64 else 2
    plan = [2, 4, 16, 4, 2] * 60  # a page table of 300 windows: rows of 32 (a copy moves <= 256 along a dimension)
    (_, k_heap, v_heap, table, first, count), _ = paged_case(0, 4, plan, 7, bits)
    shapes = [shapes[0], *(jax.ShapeDtypeStruct(x.shape, x.dtype) for x in (k_heap, v_heap, table))]
    lower = jax.jit(lambda q, k_heap, v_heap, table: mi.paged_partials(
        q, k_heap, v_heap, table, first, count, bits=bits, splits=splits, **options))
  elif options.pop("ranged", False):
    lower = jax.jit(lambda q, kc, ks, km, vc, vs, vm: mi.range_partials(
        q, kc, ks, km, vc, vs, vm, 3, 9, windows=12, splits=splits, **options))
  else:
    lower = jax.jit(lambda q, *pool: mi.pool_partials(q, *pool, splits=splits, **options))
  text = lower.trace(*shapes).lower(lowering_platforms=("cuda",)).as_text()
  assert "mosaic_gpu" in text
  assert ("uses_pdl" in text) == options.get("grid_dependency_wait", False)


@pytest.mark.parametrize("scale", [1e-6, 0.3, 1e5])  # f16's subnormals, q's range, past f16's largest
@pytest.mark.parametrize("part_scaled,bits", [(True, 2), (True, 4), (False, 2)])
def test_query_operands_are_q_transposed_twice_in_f16(scale, part_scaled, bits):
  """Column c of q^T is head c % 8 (zero past the group), times (2^bits)^-p on part p's rows: as numpy rounds
  the product to f16 (subnormals kept; past f16's range inf, and no NaN in the other columns)."""
  q = (np.random.default_rng(3).normal(size=(3, 7, mi.HEAD_DIM)) * scale).astype(np.float32)
  part = np.arange(mi.HEAD_DIM) // (mi.HEAD_DIM * bits // 8)
  scaled = q * ((2.0 ** bits) ** -part if part_scaled else 1.0)
  want = np.zeros((3, mi.HEAD_DIM, mi.COLUMNS), np.float16)
  with np.errstate(over="ignore"):  # 1e5 rounds to inf, on purpose
    for c in range(mi.COLUMNS):
      if c % 8 < 7:
        want[:, :, c] = scaled[:, c % 8].astype(np.float16)
  got = np.asarray(mi.query_operands(q, part_scaled=part_scaled, bits=bits))
  assert got.dtype == np.float16
  np.testing.assert_array_equal(got, want)


def test_thread_order_puts_a_threads_pairs_together():
  """`thread_order` is its own inverse, and at f16 32p + 8l + 2g + e it puts channel 32p + 8g + 2l + e: the
  pairs of part p that lane l % 4 = l needs (column groups g = 0..3 of the WGMMA layout) in 16 bytes."""
  channels = np.arange(mi.HEAD_DIM)
  ordered = mi.thread_order(channels)
  np.testing.assert_array_equal(mi.thread_order(ordered), channels)
  for part in range(4):
    for lane in range(4):
      chunk = ordered[32 * part + 8 * lane: 32 * part + 8 * lane + 8]
      np.testing.assert_array_equal(chunk, [32 * part + 8 * g + 2 * lane + e for g in range(4) for e in range(2)])
  # the permuted keys' q^T: q's channels permuted before `query_operands` give its rows permuted, for any axis
  q = np.random.default_rng(0).normal(size=(3, 7, mi.HEAD_DIM)).astype(np.float32)
  for scaled in (False, True):
    np.testing.assert_array_equal(np.asarray(mi.query_operands(mi.thread_order(q, axis=2), part_scaled=scaled)),
                                  np.take(np.asarray(mi.query_operands(q, part_scaled=scaled)), ordered, axis=1))


@pytest.mark.parametrize("bits", [2, 4])
def test_key_order_puts_a_threads_channels_together(bits):
  """`permuted_keys`: column 8g + 2l + e of part p (W = 128 bits / 8 channels a part) is channel W p + (W / 4) l +
  2g + e, whose code is in byte (W / 4) l + 2g + e of a token's packed row (as `reference` unpacks it: byte j
  holds channel W p + j at bits p x bits), the one `_keys_by_thread` takes from lane l's load; q^T's rows follow
  q's channels."""
  width, channels = mi.HEAD_DIM * bits // 8, np.arange(mi.HEAD_DIM)
  ordered = np.asarray(mi.key_order(channels, bits))
  np.testing.assert_array_equal(np.sort(ordered), channels)
  row = np.random.default_rng(bits).integers(0, 256, width).astype(np.uint8)  # one token's code bytes
  codes = np.concatenate([(row >> bits * p) & ((1 << bits) - 1) for p in range(8 // bits)])  # as `reference`
  for part in range(8 // bits):
    for lane in range(4):
      for g in range(width // 8):
        for e in range(2):
          channel = ordered[width * part + 8 * g + 2 * lane + e]
          assert channel == width * part + width // 4 * lane + 2 * g + e
          byte = row[width // 4 * lane + 2 * g + e]
          assert (byte >> bits * part) & ((1 << bits) - 1) == codes[channel]
  q = np.random.default_rng(0).normal(size=(3, 7, mi.HEAD_DIM)).astype(np.float32)
  np.testing.assert_array_equal(np.asarray(mi.query_operands(mi.key_order(q, bits, axis=2), part_scaled=False)),
                                np.take(np.asarray(mi.query_operands(q, part_scaled=False)), ordered, axis=1))


def test_metadata_in_thread_order_matches(interpret):
  """The kernel given its scales and minimums in `thread_order` computes what it computes given them in order
  (the interpret mode puts them back; the 16-byte loads run on the H200's float64 checks)."""
  q, kc, ks, km, vc, vs, vm = random_case(5, 2, 256, 7)
  options = dict(dequantize_keys=True, lagged_max=True, overlap_values=False, metadata_in_thread_order=True)
  out = np.asarray(mi.attend(q, kc, *(mi.thread_order(x) for x in (ks, km)), vc,
                             *(mi.thread_order(x) for x in (vs, vm)), splits=2, interpret=interpret,
                             options=tuple(options.items())))
  np.testing.assert_allclose(out, mi.reference(q, kc, ks, km, vc, vs, vm), atol=2e-3, rtol=0)
  with pytest.raises(ValueError, match="thread_order"):
    mi.attend(q, kc, ks, km, vc, vs, vm, splits=2, interpret=interpret,
              options=(("metadata_in_thread_order", True),))


def test_value_rows_are_the_parts_of_a_threads_byte_column():
  """`values_in_registers`: O^T's rows are a permutation of the channels, and the rows a thread holds in the
  WGMMA layout (16w + j, + 8, + 64, + 72) are channels b, b + 32, b + 64, b + 96 of one byte column b."""
  channels = mi.value_row_channels()
  np.testing.assert_array_equal(np.sort(channels), np.arange(mi.HEAD_DIM))
  for warp in range(4):
    for j in range(8):
      row = 16 * warp + j
      np.testing.assert_array_equal(channels[[row, row + 8, row + 64, row + 72]],
                                    8 * warp + j + 32 * np.arange(4))


def swizzled(codes):
  """A [64, R] uint8 tile as TMA stores it under the R-byte swizzle (R = 32, 64): flat shared memory, byte
  offset o at o ^ ((o >> 3) & (R - 16)) (a row's 16-byte chunks permuted by the row's bits above them)."""
  swizzle = lambda offset: offset ^ ((offset >> 3) & (codes.shape[1] - 16))
  memory = np.zeros(codes.size, np.uint8)
  memory[swizzle(np.arange(codes.size))] = codes.reshape(-1)
  return memory, swizzle


def ldmatrix_x4_trans(memory, addresses, lane):
  """PTX's `ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16`, one lane's four registers: lane l gives the address
  of row l % 8 of matrix l // 8 (8 b16 elements); with `.trans` lane (j = l // 4, f = l % 4) receives, of each
  matrix, element j of rows 2f (low half) and 2f + 1 (high half)."""
  j, f = divmod(lane, 4)
  b16 = lambda address: int(memory[address]) | int(memory[address + 1]) << 8
  return [b16(addresses[8 * k + 2 * f] + 2 * j) | b16(addresses[8 * k + 2 * f + 1] + 2 * j) << 16
          for k in range(4)]


@pytest.mark.parametrize("bits", [2, 4])
def test_values_by_ldmatrix_emulated_bit_for_bit(bits):
  """`values_by_ldmatrix`, emulated in numpy for every thread of a warpgroup: its two `ldmatrix.x4.trans` of the
  swizzled [64, H bits / 8] code tile (lane l's address: token 32 load + l, the warp's 16-byte chunk), the
  rotation (`ldmatrix_value_rotation`) and each part's LOP3 under its magic exponent (`folded_part_constants`
  0 and 1) give magic + the code of the row's channel (`value_row_channels(by_ldmatrix=True)`) at both of the
  register's tokens (8i + 2f, + 1). O^T's rows are a permutation of the channels, and a thread's rows of one M
  tile (h = 0, 1) are adjacent channels of one part, so a window's scales come as one pair."""
  row_bytes = mi.HEAD_DIM * bits // 8
  codes = np.random.default_rng(bits).integers(0, 256, (mi.STEP, row_bytes), dtype=np.uint8)
  memory, swizzle = swizzled(codes)
  channels = mi.value_row_channels(by_ldmatrix=True, bits=bits)
  np.testing.assert_array_equal(np.sort(channels), np.arange(mi.HEAD_DIM))
  constants = [mi.folded_part_constants(m, bits) for m in range(2)]
  width = mi.HEAD_DIM * bits // 8  # channels a part: byte j's part p is channel j + width p
  checked = 0
  for warp in range(4):
    for load in range(2):
      addresses = [swizzle((32 * load + lane) * row_bytes + 16 * mi.ldmatrix_value_chunk(warp, bits))
                   for lane in range(32)]
      for lane in range(32):
        j, f = divmod(lane, 4)
        for k, register in enumerate(ldmatrix_x4_trans(memory, addresses, lane)):
          i = 4 * load + k
          for h in range(2):
            for m in range(2):
              r = mi.ldmatrix_value_rotation(warp, h, m, bits)
              rotated = (register >> r | register << (32 - r)) & 0xFFFFFFFF
              _, mask, exponent, magic = constants[m]
              kept = rotated & 0x10001 * mask | 0x10001 * exponent
              halves = np.array([kept & 0xFFFF, kept >> 16], np.uint16).view(np.float16).astype(np.float64)
              channel = channels[16 * warp + j + 8 * h + 64 * m]
              assert channel == mi.ldmatrix_value_channel(warp, j, h, m, bits)
              tokens = [8 * i + 2 * f, 8 * i + 2 * f + 1]
              want = [codes[t, channel % width] >> bits * (channel // width) & (1 << bits) - 1 for t in tokens]
              np.testing.assert_array_equal(halves - magic, want)
              checked += 1
  assert checked == 4 * 32 * 8 * 4  # every register of V^T's [128, 64] (32 f16x2 a thread)
  for warp in range(4):
    for j in range(8):
      for m in range(2):
        first = mi.ldmatrix_value_channel(warp, j, 0, m, bits)
        assert first % 2 == 0 and mi.ldmatrix_value_channel(warp, j, 1, m, bits) == first + 1
        # what the kernel's metadata loads and O^T's store compute from the thread's index (MLIR, not this helper)
        assert first == (16 * (warp % 2) + 2 * j + 64 * (warp // 2) + 32 * m if bits == 2 else
                         16 * warp + 2 * j + 64 * m)


def test_values_by_ldmatrix_match_and_are_refused_where_they_cannot_go(interpret):
  """The option computes the same attention (the interpret mode takes the shared-memory path; the ldmatrix path
  runs on the device's float64 checks), INT2's and INT4's, and is refused without V^T in registers and the
  minimums folded, or with the metadata in `thread_order`."""
  options = dict(mi.VARIANTS["wg4_large_batch_ftz_lean_folded_eight_vldsm"])
  for bits, change in ((2, {}), (4, dict(permuted_keys=False))):
    case = random_case(8, 2, 256, 7, bits=bits)
    out = np.asarray(mi.attend(*case, splits=4, interpret=interpret, options=tuple(dict(options, **change).items())))
    np.testing.assert_allclose(out, mi.reference(*case), atol=2e-3, rtol=0)
  for change in (dict(folded_minimums=False), dict(values_in_registers=False),
                 dict(permuted_keys=False, metadata_in_thread_order=True)):
    with pytest.raises(ValueError, match="values_by_ldmatrix"):
      mi.attend(*random_case(8, 1, 256, 7), splits=4, interpret=interpret,
                options=tuple(dict(options, **change).items()))


def test_wgmma_layout_is_as_the_register_paths_assume():
  """`_values_transposed`, `_keys_by_thread` and `_store_in_channel_order` place a thread's registers by the
  WGMMA layout: first row 16 (warp % 4) + lane // 4, first column 2 (lane % 4), and these static offsets. A JAX
  whose layout differs would make them wrong on the GPU only; here it fails on any machine."""
  from jax.experimental.mosaic import gpu as mgpu
  layout = mgpu.WGMMA_LAYOUT
  assert (layout.tiling.tiles, layout.warp_dims, layout.lane_dims, layout.vector_dim) == (
      ((64, 8), (16, 8), (8, 8), (2,)), (-7,), (-3, -2), -1)
  offsets = lambda shape: sorted((row, col) for _, row, col in mi._register_offsets(shape))
  assert offsets((128, 64)) == sorted((r, c) for r in (0, 8, 64, 72) for c in range(0, 64, 8))
  assert offsets((128, 16)) == sorted((r, c) for r in (0, 8, 64, 72) for c in (0, 8))
  assert offsets((64, 32)) == sorted((r, c) for r in (0, 8) for c in range(0, 32, 8))
  assert offsets((64, 64)) == sorted((r, c) for r in (0, 8) for c in range(0, 64, 8))  # INT4's key parts


def kivi_values(case, seed=1):
  """`case` with KIVI's value metadata: a scale and minimum a token and group of 32 channels, [N, T, 4]."""
  q, kc, ks, km, vc, _, _ = case
  rng = np.random.default_rng(seed)
  bits = vc.shape[-1] * 8 // mi.HEAD_DIM
  shape = (*vc.shape[:2], mi.HEAD_DIM // 32)
  scale = (rng.uniform(0.05, 0.3, shape) * 3 / ((1 << bits) - 1)).astype(np.float16)
  return q, kc, ks, km, vc, scale, (rng.normal(size=shape) * 0.5).astype(np.float16)


_KIVI_DEQUANTIZED_KEYS = dict(dequantize_keys=True, lagged_max=True, warpgroups=2, overlap_values=False,
                              magic_exponents=True, eight_column_softmax=True)  # INT4 KIVI pools' default (s32)
# the V wgmma on exact codes against P times a token's scale (s37)
_KIVI_SCALED_P = dict(_KIVI_DEQUANTIZED_KEYS, in_place_values=True, token_scaled_p=True)


# The plain path, INT4's default and INT2's (its score wgmma 8 wide, `kivi_narrow_scores`, s45) at both widths, s37's
# at INT2. (s50, CI time: two older sets went, the keys dequantized without the eight-column softmax and the deferred
# V wgmma; only s27-s31's benchmark variants give KIVI's pools those, and other tests take the options without them)
@pytest.mark.parametrize("bits,options", [(2, {}), (4, {}), (2, _KIVI_DEQUANTIZED_KEYS), (4, _KIVI_DEQUANTIZED_KEYS),
                                          (2, _KIVI_SCALED_P), (2, dict(_KIVI_SCALED_P, narrow_scores=True)),
                                          (4, dict(_KIVI_SCALED_P, narrow_scores=True))])
def test_values_per_token_match(interpret, bits, options):
  """KIVI's values (a scale and minimum a token and group of 32 channels) give the attention of the dequantized
  cache; the reference's per-token reading matters (a window's reading of the same numbers is far off)."""
  case = kivi_values(random_case(3, 2, 256, 7, bits=bits))
  options = dict(options, values_per_token=True)
  out = np.asarray(mi.attend(*case, splits=2, interpret=interpret, options=tuple(options.items())))
  want = mi.reference(*case)
  np.testing.assert_allclose(out, want, atol=2e-3, rtol=0)
  q, kc, ks, km, vc, vs, vm = case
  as_windows = lambda x: np.repeat(x[:, ::mi.WINDOW], mi.HEAD_DIM // 4, axis=2)  # a window's first token, per channel
  assert np.abs(mi.reference(q, kc, ks, km, vc, as_windows(vs), as_windows(vm)) - want).max() > 0.05
  first, count = 1, 5  # a range at an odd window: the token pairs' offset
  o_t, m, l = mi.range_partials(q, kc, ks, km, vc, vs, vm, first, count, windows=8, splits=2,
                                interpret=interpret, **options)
  part = (slice(None), slice(first * mi.WINDOW, (first + count) * mi.WINDOW))
  np.testing.assert_allclose(np.asarray(mi.merge(o_t, m, l, 7)),
                             mi.reference(q, kc[part], ks[:, first:first + count], km[:, first:first + count],
                                          vc[part], vs[part], vm[part]), atol=2e-3, rtol=0)


def test_eight_column_softmax_needs_dequantized_keys_and_the_lagged_maximum():
  case = random_case(0, 1, 128, 7)
  for options in (dict(eight_column_softmax=True), dict(eight_column_softmax=True, lagged_max=True),
                  dict(eight_column_softmax=True, dequantize_keys=True)):
    with pytest.raises(ValueError, match="eight_column_softmax"):
      mi.attend(*case, splits=1, options=tuple(options.items()))


def _wgmma_accumulators(jaxpr, found):
  """The accumulator shapes of every `wgmma` in a traced kernel (nested jaxprs included)."""
  for eqn in jaxpr.eqns:
    if eqn.primitive.name == "wgmma_ref":
      found.add(tuple(eqn.invars[0].aval.shape))
    for param in eqn.params.values():
      for sub in param if isinstance(param, (list, tuple)) else [param]:
        inner = getattr(sub, "jaxpr", sub)
        if hasattr(inner, "eqns"):
          _wgmma_accumulators(inner, found)
  return found


def test_token_scaled_p_takes_two_tiles_of_values():
  """With `token_scaled_p` the values' wgmma runs as two tiles of 64 channels, each against its own B (the
  interpret mode traces the same structure the GPU runs): no [128, 16] accumulator, where the shared-memory path
  has one. Guards the option against being dropped on its way in (the results alone would still match)."""
  import jax
  case = kivi_values(random_case(3, 2, 256, 7))
  options = dict(dequantize_keys=True, lagged_max=True, warpgroups=2, overlap_values=False, magic_exponents=True,
                 eight_column_softmax=True, values_per_token=True, in_place_values=True)
  shapes = {flag: _wgmma_accumulators(jax.make_jaxpr(lambda *a: mi.int2_decode(
      *a, splits=2, interpret=mi.interpret_params(), token_scaled_p=flag, **options))(*case).jaxpr, set())
            for flag in (False, True)}
  assert (mi.HEAD_DIM, mi.COLUMNS) in shapes[False]
  assert shapes[True] == {(mi.STEP, mi.COLUMNS)}  # the scores' and the two tiles'


def test_token_scaled_p_needs_values_per_token_and_the_eight_column_softmax():
  case = kivi_values(random_case(3, 1, 128, 7))
  base = dict(dequantize_keys=True, lagged_max=True, magic_exponents=True, in_place_values=True, token_scaled_p=True)
  for options in (dict(base, eight_column_softmax=True), dict(base, values_per_token=True),
                  dict(base, values_per_token=True, eight_column_softmax=True, in_place_values=False)):
    with pytest.raises(ValueError, match="token_scaled_p"):
      mi.int2_decode(*case[:3], case[3], *case[4:], splits=1, **options)


def test_values_per_token_are_refused_where_they_cannot_go():
  case = kivi_values(random_case(3, 1, 128, 7))
  for option in ("values_in_registers", "values_scaled_after", "ldmatrix_metadata"):
    with pytest.raises(ValueError, match="values_per_token"):
      mi.int2_decode(*case[:3], case[3], *case[4:], splits=1, values_per_token=True, dequantize_keys=True,
                     magic_exponents=True, **{option: True})
  with pytest.raises(ValueError, match="values_per_token"):  # a window's metadata where a token's is expected
    mi.int2_decode(*random_case(3, 1, 128, 7), splits=1, values_per_token=True, dequantize_keys=True)


def test_int4_value_rows_are_the_parts_of_two_byte_columns():
  """INT4 with `values_in_registers`: the four rows of a thread (groups g, channel b + 32 g of
  `value_row_channels`) come from bytes b and b + 32, parts 0 and 1 (byte j holds channels j and j + 64); INT2's
  from the four parts of byte b."""
  for b in range(32):
    for group in range(4):
      for bits in (2, 4):
        offset, part = mi.value_row_byte(group, bits)
        assert b + offset + part * mi.HEAD_DIM * bits // 8 == b + 32 * group
        assert offset + b < mi.HEAD_DIM * bits // 8 and part < 8 // bits


def test_values_in_registers_match(interpret):
  """The option computes the same attention (the interpret mode goes through shared memory; the register
  path runs on the H200's float64 checks), and is refused without magic exponents."""
  case = random_case(6, 2, 256, 7)
  options = dict(dequantize_keys=True, lagged_max=True, magic_exponents=True, values_in_registers=True)
  out = np.asarray(mi.attend(*case, splits=2, interpret=interpret, options=tuple(options.items())))
  np.testing.assert_allclose(out, mi.reference(*case), atol=2e-3, rtol=0)
  with pytest.raises(ValueError, match="values_in_registers"):
    mi.attend(*case, splits=2, interpret=interpret, options=(("values_in_registers", True),))
  out = np.asarray(mi.attend(*case, splits=2, interpret=interpret,
                             options=tuple(dict(options, permuted_keys=True).items())))
  np.testing.assert_allclose(out, mi.reference(*case), atol=2e-3, rtol=0)
  with pytest.raises(ValueError, match="permuted_keys"):
    mi.attend(*case, splits=2, interpret=interpret, options=(("permuted_keys", True),))
  with pytest.raises(ValueError, match="fetch_by_one_warp"):
    mi.attend(*case, splits=2, interpret=interpret, options=(("fetch_by_one_warp", True),))
  with pytest.raises(ValueError, match="folded_minimums"):  # the register paths' (device-checked, s30)
    mi.attend(*case, splits=2, interpret=interpret, options=(("folded_minimums", True),))
  int4 = random_case(7, 2, 256, 7, bits=4)  # INT4 takes the option since s27 (and permuted keys since s30)
  out = np.asarray(mi.attend(*int4, splits=2, interpret=interpret, options=tuple(options.items())))
  np.testing.assert_allclose(out, mi.reference(*int4), atol=2e-3, rtol=0)
  with pytest.raises(ValueError, match="permuted_keys"):  # INT4 takes them since s30, not without dequantize_keys
    mi.attend(*int4, splits=2, interpret=interpret, options=(("permuted_keys", True),))


@pytest.mark.parametrize("magic_exponents,bits", [(False, 2), (True, 2), (False, 4), (True, 4)])
def test_unpacking_constants(magic_exponents, bits):
  """The inline PTX's arithmetic, emulated bit for bit in numpy for every byte: prmt's high byte, the
  part's AND (and OR), then the f16 subtraction of the magic number give (2^bits)^p c (or c)."""
  byte = np.arange(256, dtype=np.uint16)
  for part in range(8 // bits):
    mask, exponent, magic = mi.part_constants(part, magic_exponents, bits)
    half = (byte | (0 if magic_exponents else 0x6400)) & mask | exponent
    value = half.view(np.float16).astype(np.float64) - np.array(magic, np.uint16).view(np.float16)
    code = (byte >> (bits * part)) & ((1 << bits) - 1)
    np.testing.assert_array_equal(value, code * (1 if magic_exponents else (1 << bits) ** part))


@pytest.mark.parametrize("bits", [2, 4])
def test_folded_unpacking_constants(bits):
  """`folded_minimums`' arithmetic, emulated bit for bit in numpy for every byte: the shift, the part's AND and
  OR give magic + c exactly, and one f16 fma with the scale and the folded minimum (m - magic s, rounded to f16
  once) gives c s + m within the folded minimum's rounding, at most s / 32 (f16 fmas: exact in float64, then
  rounded once)."""
  byte = np.arange(256, dtype=np.uint32)
  rng = np.random.default_rng(0)
  scale = rng.uniform(1e-3, 1.0, 64).astype(np.float16).astype(np.float64)
  minimum = rng.uniform(-4.0, 4.0, 64).astype(np.float16).astype(np.float64)
  f16 = lambda x: np.asarray(x, np.float64).astype(np.float16).astype(np.float64)
  for part in range(8 // bits):
    shift, mask, exponent, magic = mi.folded_part_constants(part, bits)
    assert magic <= 64
    half = ((byte << shift) & mask | exponent).astype(np.uint16)
    value = half.view(np.float16).astype(np.float64)
    code = (byte >> (bits * part)) & ((1 << bits) - 1)
    np.testing.assert_array_equal(value, magic + code)
    folded = f16(minimum - magic * scale)  # once a window and channel
    x = f16(value[:, None] * scale + folded)  # a code's fma
    exact = code[:, None] * scale + minimum
    bound = (np.abs(folded) + np.abs(exact)) * 2.0 ** -11 + 1e-7
    assert np.all(np.abs(x - exact) <= bound), part
    assert np.all(np.abs(folded - (minimum - magic * scale)) <= scale / 32 + np.abs(minimum) * 2.0 ** -11)


@pytest.mark.parametrize("bits", [2, 4])
def test_fold_minimums_is_what_the_kernel_folds_a_step(bits):
  """`fold_minimums` (s48, for `prefolded_minimums`): channel c's minimum less the magic number of its part
  (c // (H bits / 8), `folded_part_constants`) times its scale, rounded once; `unfold_minimums` inverts it
  within that rounding."""
  _, _, scale, minimum, *_ = random_case(3, 2, 4 * mi.WINDOW, 7, bits)
  folded = np.asarray(mi.fold_minimums(scale, minimum, bits))
  width = mi.HEAD_DIM * bits // 8
  magic = np.array([mi.folded_part_constants(c // width, bits)[3] for c in range(mi.HEAD_DIM)])
  exact = minimum.astype(np.float64) - magic * scale.astype(np.float64)
  assert folded.dtype == np.float16
  np.testing.assert_array_equal(folded, exact.astype(np.float16))
  back = np.asarray(mi.unfold_minimums(scale, folded, bits)).astype(np.float64)
  assert np.all(np.abs(back - minimum) <= np.abs(exact) * 2.0 ** -10 + np.abs(minimum) * 2.0 ** -10)


@pytest.mark.parametrize("bits", [2, 4])
def test_prefolded_minimums_match(interpret, bits):
  """`prefolded_minimums` (s48): the default's kernel reading minimums folded before it (`fold_minimums`) gives
  the attention of the plain pool, through a range and four warpgroups (the interpret mode unfolds them; the
  register path, which reads them as they are, is checked on a device by `mosaic_int2_bench`). The folded
  minimum's f16 rounding is the kernel's own fold's (at most s / 32 a window and channel: up to 0.009 here, where
  the scales reach 0.3), so the tolerance is 1e-2; a wrong fold is off by magic x s, 1 or more."""
  q, kc, ks, km, vc, vs, vm = random_case(18, 4, 32 * mi.WINDOW, 7, bits)
  options = dict(mi.VARIANTS["wg4_large_batch_ftz_lean_folded_eight_narrow_both_spread_prefolded"])
  if bits == 4:
    options["permuted_keys"] = False  # INT4 pools as `pool_options` configures them
  folded = (q, kc, ks, mi.fold_minimums(ks, km, bits), vc, vs, mi.fold_minimums(vs, vm, bits))
  o_t, m, l = mi.range_partials(*folded, 3, 25, windows=32, splits=4, interpret=interpret, **options)
  want = mi.reference(q, kc[:, 96:896], ks[:, 3:28], km[:, 3:28], vc[:, 96:896], vs[:, 3:28], vm[:, 3:28])
  np.testing.assert_allclose(np.asarray(mi.merge(o_t, m, l, q.shape[1])), want, atol=1e-2, rtol=0)


def test_interleaved_key_parts_lower_and_are_refused_where_they_cannot_go(interpret):
  """`interleaved_key_parts` (s48, an option: slower on an H100, its float64 checks passed there) lowers for CUDA
  with each key part's wgmma issued after its unpacking, and is refused where the register path's keys are not
  run (the interpret mode, unpermuted keys) or with a knockout."""
  import jax
  options = mi.VARIANTS["wg4_large_batch_ftz_lean_folded_eight_narrow_both_spread_interleaved"]
  case = random_case(0, 4, 512, 7)
  shapes = [jax.ShapeDtypeStruct(x.shape, x.dtype) for x in case]
  text = jax.jit(lambda q, *pool: mi.range_partials(q, *pool, 3, 9, windows=12, splits=4, **options)).trace(
      *shapes).lower(lowering_platforms=("cuda",)).as_text()
  assert "mosaic_gpu" in text
  for change, kwargs in ((dict(), dict(interpret=interpret)), (dict(permuted_keys=False), {}),
                         (dict(knockout="values"), {})):
    with pytest.raises(ValueError, match="interleaved_key_parts"):
      mi.attend(*case, splits=4, options=tuple(dict(options, **change).items()), **kwargs)


def test_prefolded_minimums_are_refused_where_they_cannot_go():
  with pytest.raises(ValueError, match="prefolded_minimums"):
    mi.attend(*random_case(16, 1, 4 * mi.WINDOW, 7), splits=1, options=(("prefolded_minimums", True),))


def test_bad_shapes_are_refused():
  q, kc, ks, km, vc, vs, vm = random_case(0, 1, 128, 7)
  with pytest.raises(ValueError, match="multiple of 64"):
    mi.int2_decode(q, kc, ks, mi.key_bias(q, km), vc, vs, vm, splits=3)
  with pytest.raises(ValueError, match="a bias"):
    mi.int2_decode(q, kc, ks, mi.key_bias(q, km)[:, :1], vc, vs, vm, splits=1)
  with pytest.raises(ValueError, match="up to 8 query heads"):
    mi.query_operands(np.zeros((1, 9, mi.HEAD_DIM), np.float32))


# Configurations that differ from these only in options the interpret mode does not run (PDL's wait, O^T in place,
# magic exponents, ldmatrix, registers for V^T) are held to their lowering for CUDA instead.
# Each configuration that wires the launches its own way (s50, CI time: those whose DecodeConfig differs from one
# here only in the kernel's options, whose own tests cover them, are left out: lagged_max (dequantize_keys'),
# values_after, ftz, ftz_block2 (merged's) and lean_eight (vregs_int4's, but for KIVI's pools, which are not here))
@pytest.mark.parametrize("variant", ["default", "bias_in_kernel", "four_warpgroups", "dequantize_keys", "int2_int4",
                                     "merged", "vregs_int4", "two_splits", "paired", "narrow", "wide", "two_warpgroups",
                                     "triton_first", "wide_output", "factored", "one_launch", "separate"])
def test_as_the_int2_phase_of_quantized_decode(interpret, variant, monkeypatch):
  """`DecodeConfig(int2_mosaic=True)`: the INT2 pool through this kernel, the 16-bit and INT4 pools and the
  rest through the Triton kernel, merged by the combine; layer ranges at odd windows, below the bound.
  `int2_int4`: the INT4 pool through this kernel too. Since s52 a layer's Mosaic pools below 64 pairs go in one
  launch (`mosaic_int2.launch_together`, each pool's grid its share of a wave); `one_launch` at every batch with each
  pool's grid as alone; `separate` a launch a pool."""
  import jax
  import jax.numpy as jnp

  from pallas_kernels import quantized_decode as qd
  b, kh, g, h, window = 2, 2, 7, mi.HEAD_DIM, mi.WINDOW
  rng = np.random.default_rng(6)

  k_pools, v_pools = (tuple(random_pool(rng, b, kh, bits, w) for bits, w in ((16, 3), (4, 4), (2, 9)))
                      for _ in range(2))
  offsets, counts, slice_windows = jnp.array([1, 0, 3]), jnp.array([2, 3, 5]), (2, 3, 6)
  rest_k, rest_v = (jnp.asarray(rng.normal(size=(b, kh, 24, h)), jnp.bfloat16) for _ in range(2))
  rest_len = jnp.array([10, 20])
  qg = jnp.asarray(rng.normal(size=(b, kh, g, h)), jnp.float32)
  assert qd.mosaic_serves(k_pools[2], v_pools[2], g, h, window)
  assert not qd.mosaic_serves(k_pools[1], v_pools[1], g, h, window)
  assert qd.mosaic_serves(k_pools[1], v_pools[1], g, h, window, bits=(2, 4))
  config = dict(default=qd.DecodeConfig(int2_mosaic=True), bias_in_kernel=qd.MOSAIC_BIAS_IN_KERNEL,
                four_warpgroups=qd.MOSAIC_FOUR_WARPGROUPS, dequantize_keys=qd.MOSAIC_DEQUANTIZED_KEYS,
                int2_int4=qd.MOSAIC_INT2_INT4, merged=qd.MOSAIC_FOUR_WARPGROUPS_MERGED,  # the combine in one launch
                vregs_int4=qd.MOSAIC_FOUR_WARPGROUPS_VREGS_INT4,
                # one SM of 4 programs: its 4 pairs take 2 splits, two pairs a CTA
                two_splits=dataclasses.replace(qd.MOSAIC_DEFAULT, multiprocessors=1, mosaic_one_launch=False),
                paired=qd.MOSAIC_PAIRED,  # INT2's blocks of two steps, INT4's a step
                narrow=qd.MOSAIC_DEFAULT, wide=qd.MOSAIC_WIDE,  # INT2's wgmmas 8 wide (s39), 16
                two_warpgroups=qd.MOSAIC_TWO_WARPGROUPS,  # CTAs of two warpgroups (s43)
                # the Triton launch before the Mosaic one (s44)
                triton_first=qd.DecodeConfig(int2_mosaic=True, triton_first=True),
                wide_output=qd.MOSAIC_WIDE_OUTPUT,  # s45's 16-column partials, 8 empty (s46)
                factored=qd.MOSAIC_FACTORED,  # INT2 windows' keys factored (s49)
                one_launch=qd.MOSAIC_ONE_LAUNCH, separate=qd.MOSAIC_SEPARATE_LAUNCHES)[variant]
  together = []  # the plans of each launch_together
  monkeypatch.setattr(mi, "launch_together", lambda plans, _launch=mi.launch_together: (
      together.append(len(plans)), _launch(plans))[1])
  if variant == "two_splits":
    assert qd.mosaic_splits(b * kh, 3, config) == 2
  pool_tokens = tuple(w * window for w in slice_windows)
  attend = lambda: qd.quantized_decode(qg, k_pools, v_pools, offsets, counts, rest_k, rest_v, rest_len,
                                       window_size=window, tokens_hint=sum(pool_tokens) + 24, pool_tokens=pool_tokens,
                                       q_scale=h ** -0.5, config=config, interpret=interpret is not None)
  # triton_first: the Mosaic launch's q comes through a barrier with the Triton launch's partials
  assert ("optimization_barrier" in str(jax.make_jaxpr(attend)())) == (variant == "triton_first")
  out = attend()
  want = qd.reference(qg * h ** -0.5, k_pools, v_pools, offsets, counts, rest_k, rest_v, rest_len,
                      window_size=window)
  np.testing.assert_allclose(np.asarray(out), np.asarray(want), atol=3e-3, rtol=0)
  fused = config.int4_mosaic and config.mosaic_one_launch is not False  # 4 pairs: below 64
  assert set(together) == ({2} if fused else set())  # (traced twice: make_jaxpr, then run)
  assert fused == (variant not in ("default", "bias_in_kernel", "four_warpgroups", "dequantize_keys", "merged",
                                   "triton_first", "two_splits", "separate"))
  if variant not in ("default", "int2_int4"):  # the views run the kernels again (CI time): one and two launches
    return
  # partial_softmaxes (the benchmarks' view): both launches' partials in one array, for combine_splits
  o, m, l = qd.partial_softmaxes(qg, k_pools, v_pools, offsets, counts, rest_k, rest_v, rest_len,
                                 window_size=window, tokens_hint=sum(pool_tokens) + 24, pool_tokens=pool_tokens,
                                 q_scale=h ** -0.5, config=config,
                                 interpret=interpret is not None)
  np.testing.assert_allclose(np.asarray(qd.combine_splits(o, m, l)[:, :, :g]), np.asarray(out), atol=1e-5, rtol=0)
  sets = jax.eval_shape(lambda: qd._partial_softmax_sets(  # traced, not run (CI time)
      qg, k_pools, v_pools, offsets, counts, rest_k, rest_v, rest_len, window_size=window,
      tokens_hint=sum(pool_tokens) + 24, pool_tokens=pool_tokens, q_scale=h ** -0.5, config=config,
      interpret=interpret is not None)[0])
  assert len(sets) == (3 if variant == "int2_int4" else 2)  # Triton's, then a Mosaic launch a pool


def test_kivi_pools_through_quantized_decode(interpret):
  """`MOSAIC_KIVI`: KIVI's INT2 and INT4 pools (values a token and group of 32 channels) in Mosaic launches, the
  high-precision residual and the rest through Triton, merged; without `kivi_mosaic` they stay with Triton."""
  import jax
  import jax.numpy as jnp

  from pallas_kernels import quantized_decode as qd
  b, kh, g, h, window = 2, 2, 7, mi.HEAD_DIM, mi.WINDOW
  rng = np.random.default_rng(8)

  def pool(bits, windows, per_token):
    tokens = windows * window
    if bits == 16:
      return qd.PoolArrays(jnp.asarray(rng.normal(size=(b, kh, tokens, h)), jnp.bfloat16), None, None, 16)
    codes = jnp.asarray(rng.integers(0, 256, (b, kh, tokens, h * bits // 8), dtype=np.uint8))
    meta = (b, kh, tokens, h // 32) if per_token else (b, kh, windows, h)
    scale = jnp.asarray(rng.uniform(0.02, 0.1, meta), jnp.float16)
    return qd.PoolArrays(codes, scale, -scale * jnp.asarray(rng.integers(0, 1 << bits, meta), jnp.float16), bits,
                         32 if per_token else 0)

  shapes = ((16, 3), (4, 4), (2, 9))
  k_pools = tuple(pool(bits, w, False) for bits, w in shapes)
  v_pools = tuple(pool(bits, w, True) for bits, w in shapes)
  offsets, counts, slice_windows = jnp.array([1, 0, 3]), jnp.array([2, 3, 5]), (2, 3, 6)
  rest_k, rest_v = (jnp.asarray(rng.normal(size=(b, kh, 24, h)), jnp.bfloat16) for _ in range(2))
  rest_len = jnp.array([10, 20])
  qg = jnp.asarray(rng.normal(size=(b, kh, g, h)), jnp.float32)
  assert not qd.mosaic_serves(k_pools[2], v_pools[2], g, h, window)
  assert qd.mosaic_serves(k_pools[2], v_pools[2], g, h, window, kivi=True)
  pool_tokens = tuple(w * window for w in slice_windows)
  kwargs = dict(window_size=window, tokens_hint=sum(pool_tokens) + 24, pool_tokens=pool_tokens, q_scale=h ** -0.5,
                interpret=interpret is not None)
  want = qd.reference(qg * h ** -0.5, k_pools, v_pools, offsets, counts, rest_k, rest_v, rest_len,
                      window_size=window)
  # MOSAIC_DEFAULT (s39): KIVI's pools keep the wide wgmmas (`pool_options`)
  for config, launches in ((qd.MOSAIC_KIVI, 3), (qd.MOSAIC_KIVI_SCALED_P, 3),
                           (qd.MOSAIC_FOUR_WARPGROUPS_VREGS_INT4, 1), (qd.MOSAIC_DEFAULT, 3)):
    out = qd.quantized_decode(qg, k_pools, v_pools, offsets, counts, rest_k, rest_v, rest_len, config=config,
                              **kwargs)
    np.testing.assert_allclose(np.asarray(out), np.asarray(want), atol=3e-3, rtol=0)
    sets = jax.eval_shape(lambda: qd._partial_softmax_sets(  # traced, not run (CI time)
        qg, k_pools, v_pools, offsets, counts, rest_k, rest_v, rest_len, config=config, **kwargs)[0])
    assert len(sets) == launches  # Triton's, then a Mosaic launch a KIVI pool where kivi_mosaic is on


@pytest.mark.parametrize("batch,windows,int4_windows,launches,mosaic", [
    (32, 1024, 8, 2, True), (31, 255, 128, 2, False), (32, 15, 8, 1, False), (32, 15, 384, 2, True),
    (32, 1024, 384, 3, True), (8, 1024, 8, 2, True), (8, 255, 8, 1, False)])
def test_the_default_tiling_takes_the_kernel_at_large_batches(batch, windows, int4_windows, launches, mosaic):
  """Traced for a GPU (not interpret mode), the default tiling's partials come from the Triton launches (the
  INT4 pool's apart where it holds 2^18 tokens or more) and a Mosaic one for each INT2 or INT4 pool of 512 tokens
  a layer or more where there are 128 (request, KV head) pairs, or (since s43) 32 pairs and a pool of 8k tokens,
  else from the Triton launches alone;
  "pallas:triton"'s tiling never takes the Mosaic kernel. Where it takes it, the sets are merged in one Pallas
  launch (`LARGE_BATCH_MOSAIC`'s fused combine), else by XLA."""
  import jax
  import jax.numpy as jnp
  from pallas_kernels import quantized_decode as qd
  kh, g, h, window = 4, 7, mi.HEAD_DIM, mi.WINDOW
  spec = jax.ShapeDtypeStruct

  def pool(bits, w):
    if bits == 16:
      return qd.PoolArrays(spec((batch, kh, w * window, h), jnp.bfloat16), None, None, 16)
    meta = spec((batch, kh, w, h), jnp.float16)
    return qd.PoolArrays(spec((batch, kh, w * window, h * bits // 8), jnp.uint8), meta, meta, bits)

  k_pools = v_pools = tuple(pool(bits, w) for bits, w in ((16, 64), (4, int4_windows), (2, windows)))
  rest = spec((batch, kh, 64, h), jnp.bfloat16)
  pool_tokens = (64 * window, int4_windows * window, windows * window)

  def sets(config):
    def run(qg, k_pools, v_pools, rest_k, rest_v):
      return qd._partial_softmax_sets(qg, k_pools, v_pools, jnp.zeros(3, jnp.int32), jnp.ones(3, jnp.int32),
                                      rest_k, rest_v, jnp.ones(batch, jnp.int32), window_size=window,
                                      pool_tokens=pool_tokens, config=config, interpret=False)[0]
    return len(jax.eval_shape(run, spec((batch, kh, g, h), jnp.float32), k_pools, v_pools, rest, rest))

  assert sets(qd.DecodeConfig()) == launches
  assert sets(qd.TRITON_ONLY) == 1 + (batch * kh * int4_windows * window >= qd.DecodeConfig().int4_launch_min_tokens)

  def attend(qg, k_pools, v_pools, rest_k, rest_v):
    return qd.quantized_decode(qg, k_pools, v_pools, jnp.zeros(3, jnp.int32), jnp.ones(3, jnp.int32), rest_k,
                               rest_v, jnp.ones(batch, jnp.int32), window_size=window, pool_tokens=pool_tokens)
  jaxpr = str(jax.make_jaxpr(attend)(spec((batch, kh, g, h), jnp.float32), k_pools, v_pools, rest, rest))
  assert ("wq_combine" in jaxpr) == mosaic
  # 9 query heads a KV head: a large launch the Mosaic kernel does not serve keeps the caller's combine (XLA's)
  jaxpr = str(jax.make_jaxpr(attend)(spec((batch, kh, 9, h), jnp.float32), k_pools, v_pools, rest, rest))
  assert "wq_combine" not in jaxpr and "wq_quantized_decode" in jaxpr


def test_lagged_max_leaves_one_barrier_a_step():
  """The step's usual path with `lagged_max` and `dequantize_keys` waits at one warpgroup barrier (P's),
  where the default waits at four (q's scaling, the maximum's two, P's); the recomputation keeps three."""
  from benchmarks import mosaic_loop_barriers as barriers
  assert barriers.loop_barriers(barriers.kernel_mlir("deferred_dequantized_keys_lagged")) == (1, 3)
  assert barriers.loop_barriers(barriers.kernel_mlir("deferred_values_first")) == (4, 0)
  assert barriers.loop_barriers(barriers.kernel_mlir("values_first_wg4_keys_lagged")) == (1, 3)  # 4 a CTA


def test_offline_sass_tool_takes_the_serialized_module():
  """`benchmarks/mosaic_sass.py` hands the plugin's compiler the module as the custom call carries it: MLIR
  bytecode, after Mosaic's serialization pass, from a lowering for CUDA on this machine."""
  from benchmarks import mosaic_sass
  module = mosaic_sass.serialized_module("wg4_large_batch_ftz_vregs", batch=8, tokens=512, splits=4)
  assert module[:4] == b"ML\xefR"  # MLIR's bytecode magic



def test_factored_keys_match(interpret):
  """`factored_keys` (s49): q^T times each step's key scales as the score wgmma's B, the keys' codes as its A and
  the minimums as a bias a window, each row taking its window's 8 columns, over a pool of four warpgroups' splits,
  against float64 (the interpret mode's exact codes; the register path's magic + code is checked on a device by
  `mosaic_int2_bench`)."""
  case = random_case(19, 4, 32 * mi.WINDOW, 7)
  out = np.asarray(mi.attend(*case, splits=4, interpret=interpret, options=tuple(mi.VARIANTS[FACTORED].items())))
  np.testing.assert_allclose(out, mi.reference(*case), atol=2e-3, rtol=0)


@pytest.mark.parametrize("first,count,windows,splits", [(3, 7, 10, 4), (2, 1, 8, 4)])
def test_factored_keys_over_a_range_match(interpret, first, count, windows, splits):
  """`factored_keys` over a layer's range: the bias of the range's windows (-1e30 outside it) masks the rest."""
  assert_range_matches(random_case(21, 4, 16 * mi.WINDOW, 7), first, count, windows, splits, interpret,
                       mi.VARIANTS[FACTORED])


def test_unfactored_options_are_the_defaults():
  """Launches the factored keys do not serve (INT4's, KIVI's, C's pages) take the default's options back."""
  from pallas_kernels import quantized_decode as qd
  factored, default = dict(qd.MOSAIC_FACTORED.mosaic_options), dict(qd.MOSAIC_DEFAULT.mosaic_options)
  assert mi.unfactored(factored) == default and mi.unfactored(default) == default
  for bits, kivi in ((4, False), (2, True), (4, True)):
    assert qd.pool_options(factored, bits, kivi=kivi) == qd.pool_options(default, bits, kivi=kivi)
  assert qd.pool_options(factored, 2, kivi=False)["factored_keys"]


def test_factored_bias_is_q_against_the_minimums_less_the_magic_share():
  """The bias of magic + code keys: q . m less sum_c magic_c B_c with B_c = f16(f16(q_c) s_c), the kernel's rounded
  B, in f32 a window and head (columns 8-15 again), so that B . (magic + c) + bias = B . c + q . m up to f32 sums;
  without magic, q . m."""
  q, _, ks, km, *_ = random_case(20, 2, 4 * mi.WINDOW, 7)
  got = np.asarray(mi.factored_bias(q, ks, km))
  magic = np.array([mi.folded_part_constants(c // 32, 2)[3] for c in range(mi.HEAD_DIM)])
  b = (q.astype(np.float16)[:, None] * ks.astype(np.float16)[:, :, None]).astype(np.float64)  # numpy: f16 products
  want = np.einsum("ngh,nwh->nwg", q.astype(np.float64), km.astype(np.float64)) - (b * magic).sum(-1)
  assert got.shape == (2, 4, 16) and not got[..., 7].any()
  np.testing.assert_allclose(got[..., :7], want, rtol=1e-5, atol=1e-3)
  np.testing.assert_array_equal(got[..., 8:], got[..., :8])
  np.testing.assert_allclose(np.asarray(mi.factored_bias(q, ks, km, magic=False)), np.asarray(mi.key_bias(q, km)))


def test_factored_keys_lower_and_are_refused_where_they_cannot_go():
  """`factored_keys` lowers for CUDA (the scaled q^T a step, the keys as magic + code) and is refused with narrow
  scores, without the keys' permuted register path, or on INT4 codes (its q^T permutation is INT2's)."""
  import jax
  options = mi.VARIANTS[FACTORED]
  case = random_case(0, 4, 512, 7)
  shapes = [jax.ShapeDtypeStruct(x.shape, x.dtype) for x in case]
  text = jax.jit(lambda q, *pool: mi.pool_partials(q, *pool, splits=4, **options)).trace(*shapes).lower(
      lowering_platforms=("cuda",)).as_text()
  assert "mosaic_gpu" in text
  for change in (dict(narrow_scores=True), dict(permuted_keys=False)):
    with pytest.raises(ValueError, match="factored_keys"):
      mi.attend(*case, splits=4, options=tuple(dict(options, **change).items()))
  with pytest.raises(ValueError, match="factored_keys: INT2"):
    mi.attend(*random_case(0, 4, 512, 7, bits=4), splits=4, options=tuple(options.items()))


def test_pools_launched_together_give_what_their_own_launches_give(interpret):
  """`launch_together` (s52): an INT2 and an INT4 pool's ranges as the large-batch configuration takes them
  (`quantized_decode.mosaic_plan`'s options), each CTA its own pool's kernel and shared memory, one launch: the
  same partials as a launch each, to the bit, and float64's after the merge; plans that cannot share a launch
  are refused."""
  from pallas_kernels import quantized_decode as qd
  config = qd.large_batch(qd.DecodeConfig())
  cases = {2: (random_case(31, 4, 16 * mi.WINDOW, 7, 2), 3, 11, 14), 4: (random_case(32, 4, 12 * mi.WINDOW, 7, 4),
                                                                        1, 9, 12)}
  plans, alone = [], []
  for bits, (case, first, count, windows) in cases.items():
    options = qd.mosaic_plan(4, windows, bits, config)[1]
    assert options["warpgroups"] == 4
    plans.append(mi.range_plan(*case, first, count, windows=windows, splits=4, interpret=interpret, **options))
    alone.append(mi.range_partials(*case, first, count, windows=windows, splits=4, interpret=interpret, **options))
  together = mi.launch_together(plans)
  for (bits, (case, first, count, _)), mine, own in zip(cases.items(), together, alone):
    for x, y in zip(mine, own):
      np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
    q, kc, ks, km, vc, vs, vm = case
    tokens, windows_ = slice(first * mi.WINDOW, (first + count) * mi.WINDOW), slice(first, first + count)
    want = mi.reference(q, kc[:, tokens], ks[:, windows_], km[:, windows_], vc[:, tokens], vs[:, windows_],
                        vm[:, windows_])
    np.testing.assert_allclose(np.asarray(mi.merge(*mine, q.shape[1])), want, atol=2e-3, rtol=0)
  case, first, count, windows = cases[2]
  one_group = mi.range_plan(*case, first, count, windows=windows, splits=2, interpret=interpret,
                            **dict(qd.mosaic_plan(4, windows, 2, config)[1], warpgroups=1, fetch_by_one_warp=False,
                                   fetch_warp_by_group=False))
  with pytest.raises(ValueError, match="warpgroups a CTA"):
    mi.launch_together([plans[0], one_group])


def test_pools_launched_together_lower_for_cuda():
  """`launch_together`'s compiled path (inline PTX, register operands) lowers for CUDA: batch 8's INT2 and INT4 pools
  as the default configures them, one custom call, a grid of both pools' CTAs; ablation C's paged launches alike."""
  import jax

  from pallas_kernels import quantized_decode as qd
  config = qd.large_batch(qd.DecodeConfig(multiprocessors=132))
  pools = [(2, 16), (4, 12)]  # bits, windows
  shapes = [jax.ShapeDtypeStruct(x.shape, x.dtype) for bits, windows in pools
            for x in random_case(0, 32, windows * mi.WINDOW, 7, bits)]

  ctas = []

  def launch(*arrays):
    plans = []
    for i, (bits, windows) in enumerate(pools):
      splits, options = qd.mosaic_plan(32, windows, bits, config)
      plans.append(mi.range_plan(*arrays[7 * i:7 * i + 7], 1, windows - 1, windows=windows, splits=splits,
                                 **options))
    ctas.append(sum(plan.ctas for plan in plans))
    return mi.launch_together(plans)
  text = jax.jit(launch).trace(*shapes).lower(lowering_platforms=("cuda",)).as_text()
  calls = [line for line in text.splitlines() if "custom_call" in line and "mosaic_gpu" in line]
  assert len(calls) == 1 and ctas == [2 * 32 * 8 // 4]  # 8 splits a pool's pair, 4 a CTA
  # ablation C's INT2 and INT4 windows through one page table (`interleaved_decode`'s launch below 64 pairs)
  plan = [2, 16, 4, 2, 2, 4, 16, 2, 4, 2, 2] * 4
  (q, k_heap, v_heap, table, _, _), _ = paged_case(0, 32, plan, 7, 2)
  shapes = [jax.ShapeDtypeStruct(x.shape, x.dtype) for x in (q, k_heap, v_heap, table)]

  def paged(q, k_heap, v_heap, table):
    plans = []
    for bits, first in ((4, plan.count(16)), (2, plan.count(16) + plan.count(4))):
      splits, options = qd.mosaic_plan(32, len(plan), bits, config)
      plans.append(mi.paged_plan(q, k_heap, v_heap, table, first, plan.count(bits), bits=bits, splits=splits,
                                 **options))
    return mi.launch_together(plans)
  text = jax.jit(paged).trace(*shapes).lower(lowering_platforms=("cuda",)).as_text()
  assert len([line for line in text.splitlines() if "custom_call" in line and "mosaic_gpu" in line]) == 1
