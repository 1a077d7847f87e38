#!/usr/bin/env bash
# Session 29's device plan for the 7B decode loop (`results/decode_attention_notes.md`, "Session 29"): whether the
# host paces the step, and what stops it. One part a device call (each < 10 min), results under $OUT:
#   bash benchmarks/loop_experiments.sh state   # donated state vs new buffers vs no command buffers
#   bash benchmarks/loop_experiments.sh loops   # 8 steps a call on the device, with loops in the CUDA graph
#   bash benchmarks/loop_experiments.sh modes   # XLA's command-buffer update modes (VMM allocator)
#   bash benchmarks/loop_experiments.sh concurrent  # (s31) independent kernels of the CUDA graph concurrently
set -euo pipefail
out=${OUT:-benchmarks/results}
tag=${TAG:-s29}
run() { XLA_PYTHON_CLIENT_MEM_FRACTION=0.95 python -m benchmarks.decode_throughput --settings 32x100 \
          --attention pallas --methods fp16 windowquant --out "$out" --budget-s ${BUDGET:-420} "$@"; }
types="FUSION,CUBLAS,CUBLASLT,CUSTOM_CALL,CUDNN,WHILE,CONDITIONAL"
case "${1:-}" in
  state) run --undonated --xla-options 'nographs={"xla_gpu_enable_command_buffer": ""}' --tag ${tag}_state ;;
  loops) run --steps-per-call 1 8 --xla-options "loops={\"xla_gpu_enable_command_buffer\": \"$types\"}" \
           "unrolled={\"xla_gpu_enable_command_buffer\": \"$types\", \"xla_gpu_command_buffer_unroll_loops\": true}" \
           --tag ${tag}_loops ;;
  modes) XLA_FLAGS="${XLA_FLAGS:-} --xla_gpu_command_buffer_update_mode=SKIP_PROFILED" \
           run --xla-options 'always={"xla_gpu_command_buffer_update_mode": "ALWAYS_UPDATE"}' \
           'skiptemp={"xla_gpu_command_buffer_update_mode": "SKIP_TEMP"}' --tag ${tag}_update_mode ;;
  # a layer's pool launches read different pools and write different partials: in a graph scheduled by data
  # conflicts they may overlap (the INT2 kernel is bound by its instructions, the 16-bit one by HBM)
  concurrent) run --xla-options 'concurrent={"xla_gpu_command_buffer_scheduling_mode": "CONCURRENT"}' \
                --tag ${tag}_concurrent ;;
  *) echo "usage: $0 state|loops|modes|concurrent" >&2; exit 2 ;;
esac
