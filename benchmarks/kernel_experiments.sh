#!/usr/bin/env bash
# Session 30's device plan for the folded minimums (`folded_minimums`, `results/decode_attention_notes.md`,
# "Session 30"): the lean kernels against themselves folded, each variant checked against float64 before it is
# timed, the Triton kernel beside them. One part a device call (each < 10 min), results under $OUT:
#   bash benchmarks/kernel_experiments.sh kernels   # INT2 and INT4 pools at batch 32 and 60 x 19,968 tokens
#   bash benchmarks/kernel_experiments.sh step      # the 7B step at 32 x 100: the default (lean_all) against folded
set -euo pipefail
out=${OUT:-benchmarks/results}
bench() { python -m benchmarks.mosaic_int2_bench --tokens 19968 --splits 4 --out "$out" "$@"; }
case "${1:-}" in
  kernels)
    bench --batches 32 60 --variants wg4_large_batch_ftz_vregs_permuted_keys_one_warp_fetch \
      wg4_large_batch_ftz_lean_folded --tag mosaic_int2_s30_folded
    bench --bits 4 --batches 32 60 --variants wg4_large_batch_ftz_vregs_one_warp_fetch \
      wg4_large_batch_ftz_vregs_one_warp_fetch_folded --tag mosaic_int4_s30_folded ;;
  step)
    XLA_PYTHON_CLIENT_MEM_FRACTION=0.95 python -m benchmarks.decode_throughput --settings 32x100 \
      --attention pallas pallas:mosaic_wg4_lean_folded \
      --methods windowquant fp16 rtn2 rtn4 kivi2 --out "$out" --budget-s 420 --tag s30_folded ;;
  *) echo "usage: $0 kernels|step" >&2; exit 2 ;;
esac
