#!/usr/bin/env bash
# Session 30's device plan for the kernels written then (`results/decode_attention_notes.md`, "Session 30"): the
# magic number folded into the minimums (`folded_minimums`) and INT4's keys permuted (`permuted_keys` at 4 bits),
# against the lean kernels, each variant checked against float64 before it is timed, the Triton kernel beside
# them. One part a device call (each < 10 min), results under $OUT:
#   bash benchmarks/kernel_experiments.sh kernels   # INT2 and INT4 pools at batch 32 and 60 x 19,968 tokens
#   bash benchmarks/kernel_experiments.sh mix       # issue 5's batch 60 x 32k, mixed and INT2 plans: s28's
#                                                   # configuration (lean_all), the default (folded since s30),
#                                                   # and folded with INT4's keys permuted (GPU time too), then
#                                                   # again without command buffers
#   bash benchmarks/kernel_experiments.sh overlap   # (s31) mix's GPU time serial / concurrent, and back to back
#   bash benchmarks/kernel_experiments.sh step      # the 7B step at 32 x 100: the same three
# (Run once on an H100 in session 30, when `default` was still lean_all and the folded one named apart.)
set -euo pipefail
out=${OUT:-benchmarks/results}
tag=${TAG:-s31}  # results' names: mosaic_int2_<tag>_folded, ...
bench() { python -m benchmarks.mosaic_int2_bench --tokens 19968 --splits 4 --out "$out" "$@"; }
case "${1:-}" in
  kernels)
    bench --batches 32 60 --variants wg4_large_batch_ftz_vregs_permuted_keys_one_warp_fetch \
      wg4_large_batch_ftz_lean_folded --tag mosaic_int2_${tag}_folded
    bench --bits 4 --batches 32 60 --variants wg4_large_batch_ftz_vregs_one_warp_fetch \
      wg4_large_batch_ftz_vregs_one_warp_fetch_folded wg4_large_batch_ftz_int4_lean \
      wg4_large_batch_ftz_int4_lean_folded --tag mosaic_int4_${tag} ;;
  mix)
    variants() { python benchmarks/decode_attention.py --variant-shape 60,32768 --variant-plans mix,int2 --no-sweep \
                   --variants mosaic_wg4_lean_all,default,mosaic_wg4_lean_int4_keys --out "$out" "$@"; }
    variants --gpu-time --tag ${tag}_b60_variants
    # The clock's ~500 µs a dispatch over GPU time (s28: at batch 8 and 60, 4 to 32 calls a dispatch; not XLA
    # updating command buffers, s30): 16 calls a dispatch, and 8 dispatches sent before one wait
    variants --inner 16 --variants default --tag ${tag}_b60_variants_inner16
    variants --back-to-back 8 --variants default --tag ${tag}_b60_variants_back_to_back
    # kernels without a data dependency (the pools' launches) run concurrently in the CUDA graph: the INT2
    # kernel, bound by its instructions, beside the 16-bit launch, bound by HBM (GPU span is the time then).
    # One call a dispatch, so that calls do not overlap each other as a step's dependent layers could not.
    one=(--inner 1 --gpu-time --variant-plans mix --variants default,mosaic_wg4_lean_int4_keys)
    variants "${one[@]}" --tag ${tag}_b60_serial
    variants "${one[@]}" --compiler-options '{"xla_gpu_command_buffer_scheduling_mode": "CONCURRENT"}' \
      --tag ${tag}_b60_concurrent ;;
  overlap)  # (s31) the short form of `mix` for one scarce call: GPU time a call, serial and concurrent, and
            # the clock with the host ahead; each run capped so the call ends in time
    within() { local t=$1; shift; timeout "$t" python benchmarks/decode_attention.py --variant-shape 60,32768 \
                 --no-sweep --out "$out" "$@" || echo "(stopped: $*)"; }
    one=(--inner 1 --gpu-time --variants default,mosaic_wg4_lean_int4_keys)
    within 170 "${one[@]}" --variant-plans mix,int2 --tag ${tag}_b60_serial
    within 110 "${one[@]}" --variant-plans mix --tag ${tag}_b60_concurrent \
      --compiler-options '{"xla_gpu_command_buffer_scheduling_mode": "CONCURRENT"}'
    within 70 --variants default --variant-plans mix --back-to-back 8 --tag ${tag}_b60_back_to_back ;;
  step)
    XLA_PYTHON_CLIENT_MEM_FRACTION=0.95 python -m benchmarks.decode_throughput --settings 32x100 \
      --attention pallas:mosaic_wg4_lean_all pallas pallas:mosaic_wg4_lean_int4_keys \
      --methods windowquant fp16 rtn4 rtn2 --out "$out" --budget-s 480 --tag ${tag}_kernels ;;
  *) echo "usage: $0 kernels|mix|overlap|step" >&2; exit 2 ;;
esac
