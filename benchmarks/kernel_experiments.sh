#!/usr/bin/env bash
# The device plan for the kernels written offline (`results/decode_attention_notes.md`, "Session 30" and "Session
# 31"): s30's folded minimums (the default in s30-s31) and s31's 8-column softmax (`eight_column_softmax`,
# "pallas:mosaic_wg4_lean_eight", the default since s32), each variant checked against float64 before it is
# timed, the Triton kernel beside them. One part a device call (each < 10 min), results under $OUT:
#   bash benchmarks/kernel_experiments.sh kernels   # INT2 pools at batch 32 and 60 x 19,968 tokens: s28's lean
#                                                   # kernel, folded, folded + eight; then INT4's s30 variants
#   bash benchmarks/kernel_experiments.sh mix       # issue 5's batch 60 x 32k, mixed and INT2 plans: s28's
#                                                   # configuration (lean_all), the default, folded (GPU
#                                                   # time too); then the two with concurrent graphs
#   bash benchmarks/kernel_experiments.sh overlap   # (s31) the short form: serial / concurrent, back to back
#   bash benchmarks/kernel_experiments.sh step      # the 7B step at 32 x 100: the default against folded
#   bash benchmarks/kernel_experiments.sh bars      # (s32) issue 5's 32k rows at batch 60 and 8 under the
#                                                   # concurrent graph, a call a dispatch (calls cannot overlap
#                                                   # each other), many dispatches before a wait, cudnn beside;
#                                                   # the variants first (the fastest runs the row), GPU time too
#   bash benchmarks/kernel_experiments.sh small     # (next) 60 x 5 frames, where the quantized steps are 1.5-1.6 x
#                                                   # their floors (s32): ~1k-token pools a layer stay with Triton
#                                                   # (`mosaic_min_pool_tokens` 8k); the Mosaic kernels there, one
#                                                   # layer at 60 x 1k, then the 7B step at 60 x 5
#   bash benchmarks/kernel_experiments.sh combine   # (s33) the merged combine with channel blocks against one
#                                                   # program a (request, KV head) and XLA's merge: issue 5's 32k
#                                                   # rows at batch 60 and 8, and batch 1 x 1k (cudnn's GPU time)
#   bash benchmarks/kernel_experiments.sh combine_step  # (s33) the merge in one launch at small batches, 7B step
#   bash benchmarks/kernel_experiments.sh batch8    # (s33) batch 8 x 32k, a program a phase; 1 x 1k, many calls
#   bash benchmarks/kernel_experiments.sh pool512   # (s33) 60 x 5: the default's Mosaic pools from 512 tokens
#   (s34's `merge` part timed `merge_in_kernel`, the launch merging its own parts: slower everywhere on an H100 in
#    s35, and removed; `decode_attention_s35_*_h100.md`)
#   bash benchmarks/kernel_experiments.sh h200      # (s34) the headline rows with today's defaults (~9 min)
#   bash benchmarks/kernel_experiments.sh vldsm     # (s35; H100: < 1 %) V's codes by ldmatrix.trans: the INT2 and
#                                                   # INT4 kernels at batch 32 and 60, issue 5's batch 60 x 32k,
#                                                   # each beside the default; `vldsm_step`: the 32 x 100 step
#   bash benchmarks/kernel_experiments.sh ncu       # (s36) the default INT2 kernel and vldsm under Nsight Compute
#   bash benchmarks/kernel_experiments.sh profile   # (s36) the 7B step at 32 x 100, kernel by kernel
#   bash benchmarks/kernel_experiments.sh kivi      # (s37) KIVI's values from registers (`token_scaled_p`): kernels
#                                                   # at batch 32 and 60, then the 7B step's kivi2 and kivi4 rows
#   bash benchmarks/kernel_experiments.sh profile_small  # (s37) the 7B step at 60 x 5, kernel by kernel
#   bash benchmarks/kernel_experiments.sh headline  # (s38) issue 6's 32 x 100 row, every method but C
#   bash benchmarks/kernel_experiments.sh two_splits  # (s38) 2 splits a pair at batch 60 (the default since s38)
#   bash benchmarks/kernel_experiments.sh h200_s38  # (s38) issue 6's 32 x 100 and 60 x 5 rows, issue 5's 32k rows
#   bash benchmarks/kernel_experiments.sh paired    # (s38; s39 H100: no faster) two steps under one softmax
#   bash benchmarks/kernel_experiments.sh warpgroups  # (s39; H100: slower) five and six warpgroups a CTA
#   bash benchmarks/kernel_experiments.sh ncu_s39   # (s39) the default, paired and five warpgroups under ncu
#   bash benchmarks/kernel_experiments.sh narrow    # (s39; H100: kernel 1.0-1.3 % faster) both wgmmas 8 wide
#   bash benchmarks/kernel_experiments.sh h200_s39  # (s39) the bars' rows, short: 32 x 100, 60 x 5, issue 5's 32k
#   bash benchmarks/kernel_experiments.sh steps_s39  # (s39) 60 x 5 without split-K GEMMs; 32 x 100 narrow
#   bash benchmarks/kernel_experiments.sh c_long    # (s40) ablation C's paged kernel in the 7B step, 32 x 100, 1 x 100
#   bash benchmarks/kernel_experiments.sh c_short   # (s40) the same at 60 x 5 and 20 x 5
#   bash benchmarks/kernel_experiments.sh c_mosaic  # (s41) C's INT4 and INT2 windows through the Mosaic kernel's page
#                                                   # table: one layer at batch 32 x 19,968 and 60 x 1k against the
#                                                   # reordered cache and the Triton paged kernel; the 7B step at
#                                                   # 32 x 100 and 60 x 5, fp16 and windowquant beside
#   bash benchmarks/kernel_experiments.sh h200_s42  # (s42) h200_s39, then C's 7B step at 32 x 100 and 60 x 5
#   bash benchmarks/kernel_experiments.sh b8_s43    # (s43) batch 8 x 32k with the Mosaic launches' CTAs of 2 warpgroups
#   bash benchmarks/kernel_experiments.sh b8_default  # (s43) the new default at batch 8 x 32k / 16k against Triton's
#   bash benchmarks/kernel_experiments.sh cublas    # (s44; s45 H100: 0.5-3.3 % slower) the 7B step with cuBLAS' products
#   bash benchmarks/kernel_experiments.sh triton_first  # (s44; s45 H100: step slower) the Triton launch first
#   bash benchmarks/kernel_experiments.sh depth     # (s45, for an H200) the INT2 kernel with 3 and 4 stages, vldsm and
#                                                   # paired against their bases; issue 5's 32k rows with 3-4 stages
#   bash benchmarks/kernel_experiments.sh knockout  # (s46) the INT2 kernel with its conversions knocked out (a
#                                                   # diagnostic: keys, values, both constant); also in `depth`
#   bash benchmarks/kernel_experiments.sh narrow_out  # (s46) 8-column partials against s45's 16: 32k rows, 7B step
#   bash benchmarks/kernel_experiments.sh h100_next  # (s46) knockout, then the 7B step with 16-column partials and
#                                                   # KIVI's narrow scores beside the default (~9 min)
#   bash benchmarks/kernel_experiments.sh spread    # (s46) a group's copies by its warp g % 4: kernel, 7B step (C too)
#   bash benchmarks/kernel_experiments.sh h200_short  # (s46) kernels (spread, knockouts, ...) and the step, ~6 min
#   bash benchmarks/kernel_experiments.sh h200_steps  # (s46) an H200's 7B step at 32 x 100, s46's variants beside
#   bash benchmarks/kernel_experiments.sh depth_step  # (s45) the 7B step at 32 x 100 with 3 and 4 stages
#   bash benchmarks/kernel_experiments.sh kivi_narrow  # (s45; s46 H100: 2.8 %, the default) kivi2's 32 x 100
#                                                   # step, KIVI's score wgmma 8 wide against 16
#   bash benchmarks/kernel_experiments.sh h200_next  # (s45; s46: kivi_check and depth, ~8 min) then h200_steps
#   bash benchmarks/kernel_experiments.sh kivi_check  # (s46) KIVI's narrow INT2 kernel against float64 on a device
#   bash benchmarks/kernel_experiments.sh ncu_h200  # (s45) the INT2 kernel (2 and 4 stages) under ncu on an H200
#   bash benchmarks/kernel_experiments.sh h200_s47  # (s47) kivi_check; INT2 kernel: spread, knockouts (s48:
#                                                   # prefolded minimums too); step with C
#   bash benchmarks/kernel_experiments.sh prefolded  # (s48) the INT2 kernel with minimums folded before it
#   bash benchmarks/kernel_experiments.sh half_machine  # (s48) the INT2 kernel on half the SMs (64 CTAs): the SMs
#                                                   # bound it there, as on an H200; variants and knockouts
#   bash benchmarks/kernel_experiments.sh half_metadata  # (s48) the same, what the metadata loads cost
#   bash benchmarks/kernel_experiments.sh half_interleaved  # (s48) the same, a key part's wgmma as it is unpacked
#   bash benchmarks/kernel_experiments.sh half_vldsm  # (s48) the same, V's codes by ldmatrix.trans (narrow wgmmas)
#   bash benchmarks/kernel_experiments.sh vldsm_default  # (s48) the default (V by ldmatrix) against s47's: 32k rows,
#                                                   # the 7B step at 32 x 100 (fp16, windowquant, C)
#   bash benchmarks/kernel_experiments.sh h200_s48  # (s48) an H200's ~9 min: kernels at 16/32/60, vldsm_default
#   bash benchmarks/kernel_experiments.sh half_wg5  # (s48) half the SMs: five warpgroups a CTA against four
#   bash benchmarks/kernel_experiments.sh half_paired  # (s48) half the SMs: the default with paired steps
#   bash benchmarks/kernel_experiments.sh h200_s48_min  # (s48) an H200's ~4 min: kernels, the 7B step at 32 x 100
#   bash benchmarks/kernel_experiments.sh half_scaling  # (s49) half the SMs: the default's keys, values or both as
#                                                   # magic + code alone (no scales, minimums, loads or fmas)
#   bash benchmarks/kernel_experiments.sh half_factored  # (s49) half the SMs: the factored keys against the default
#   bash benchmarks/kernel_experiments.sh factored_step  # (s49) the 7B step at 32 x 100 with the factored keys
#   bash benchmarks/kernel_experiments.sh h200_s49  # (s49) an H200's ~9 min: issue 6's step, kernels, issue 5's rows
#   bash benchmarks/kernel_experiments.sh h200_s49_min  # (s49) an H200's ~6 min: issue 6's step, the kernels
#   bash benchmarks/kernel_experiments.sh b8_s51    # (s51) batch 8 x 32k (mix): the merge's grid and warps, and the
#                                                   # Mosaic launches' grids at 2-3 programs an SM (64-96 CTAs a
#                                                   # pool), concurrent graph and serial, by GPU span (~3 min)
#   bash benchmarks/kernel_experiments.sh triton_b8  # (s51) batch 8 x 32k: the Triton launch's grid
#   bash benchmarks/kernel_experiments.sh step_s51  # (s51) the 7B step at 32 x 100, s51's merge against s50's
#   (s36's `stages` timed the INT2 kernel with 3-5 pipeline stages: slower on an H100, removed;
#    `mosaic_int2_s36_stages_h100.md`)
# (`kernels` and `mix` ran on an H100 in s30 with other variants; `overlap` on an H200 in s31 with INT4's keys;
# `bars` on an H100 in s32, when `default` was still the folded kernel and eight was named apart.
# Since s32 eight is the default, so these parts set it against the folded kernel, named apart.)
set -euo pipefail
export PYTHONPATH=.${PYTHONPATH:+:$PYTHONPATH}  # the scripts run as files import `benchmarks.harness`
out=${OUT:-benchmarks/results}
tag=${TAG:-s42}  # results' names: mosaic_int2_<tag>_folded, ...
ko_variants=$(printf 'wg4_large_batch_ftz_lean_folded_eight_narrow_both_ko_%s ' keys values both)
bench() { python -m benchmarks.mosaic_int2_bench --tokens 19968 --splits 4 --out "$out" "$@"; }
# A variant against the default: the INT2 kernel at batch 32 and 60 (its mosaic_int2 variants $1 beside the default's,
# float64 checks first), issue 5's batch 60 x 32k (mix, int2) under quantized_decode's configuration $2, and the 7B
# step at 32 x 100 under "pallas:$2" (windowquant, fp16 beside); results tagged ${tag}_$3
against_default() {
  bench --batches 32 60 --variants wg4_large_batch_ftz_lean_folded_eight $1 --tag mosaic_int2_${tag}_$3 \
    || echo "(stopped: $3, INT2 kernels)"
  timeout 130 python benchmarks/decode_attention.py --variant-shape 60,32768 --variant-plans mix,int2 --no-sweep \
    --variants default,$2 --inner 1 --back-to-back 32 --gpu-time --out "$out" --tag ${tag}_b60_$3 \
    --compiler-options '{"xla_gpu_command_buffer_scheduling_mode": "CONCURRENT"}' || echo "(stopped: $3, b60)"
  XLA_PYTHON_CLIENT_MEM_FRACTION=0.95 timeout 280 python -m benchmarks.decode_throughput --settings 32x100 \
    --attention pallas pallas:$2 --methods fp16 windowquant --out "$out" --budget-s 260 --tag ${tag}_$3 \
    || echo "(stopped: $3, step)"
}
rows_against_s47() {  # (s48) issue 5's 32k rows at batch 60 and 8, the default against s47's ("mosaic_no_vldsm")
  for shape_runs in 60,32768:32 8,32768:64; do
    shape=${shape_runs%:*}
    timeout 100 python benchmarks/decode_attention.py --variant-shape $shape --variant-plans mix,int2 --no-sweep \
      --variants default,mosaic_no_vldsm --inner 1 --back-to-back ${shape_runs#*:} --gpu-time --out "$out" \
      --tag ${tag}_vldsm_${shape/,/x} --compiler-options '{"xla_gpu_command_buffer_scheduling_mode": "CONCURRENT"}' \
      || echo "(stopped: $1 $shape)"
  done
}

case "${1:-}" in
  kernels)
    bench --batches 32 60 --variants wg4_large_batch_ftz_vregs_permuted_keys_one_warp_fetch \
      wg4_large_batch_ftz_lean_folded wg4_large_batch_ftz_lean_folded_eight --tag mosaic_int2_${tag}_folded
    bench --bits 4 --batches 32 60 --variants wg4_large_batch_ftz_vregs_one_warp_fetch \
      wg4_large_batch_ftz_vregs_one_warp_fetch_folded wg4_large_batch_ftz_int4_lean \
      wg4_large_batch_ftz_int4_lean_folded --tag mosaic_int4_${tag} ;;
  mix)
    variants() { python benchmarks/decode_attention.py --variant-shape 60,32768 --variant-plans mix,int2 --no-sweep \
                   --variants mosaic_wg4_lean_all,default,mosaic_wg4_lean_folded --out "$out" "$@"; }
    variants --gpu-time --tag ${tag}_b60_variants
    # kernels without a data dependency (the pools' launches) run concurrently in the CUDA graph (s31: the mix
    # 505.5 -> 486.1 µs of GPU span on an H200); one call a dispatch, so that calls cannot overlap each other
    variants --inner 1 --gpu-time --variant-plans mix --variants default,mosaic_wg4_lean_folded \
      --compiler-options '{"xla_gpu_command_buffer_scheduling_mode": "CONCURRENT"}' --tag ${tag}_b60_concurrent ;;
  overlap)  # (s31) the short form of `mix` for one scarce call: GPU time a call, serial and concurrent, and
            # the clock with the host ahead; each run capped so the call ends in time
    within() { local t=$1; shift; timeout "$t" python benchmarks/decode_attention.py --variant-shape 60,32768 \
                 --no-sweep --out "$out" "$@" || echo "(stopped: $*)"; }
    one=(--inner 1 --gpu-time --variants default,mosaic_wg4_lean_folded)
    within 170 "${one[@]}" --variant-plans mix,int2 --tag ${tag}_b60_serial
    within 110 "${one[@]}" --variant-plans mix --tag ${tag}_b60_concurrent \
      --compiler-options '{"xla_gpu_command_buffer_scheduling_mode": "CONCURRENT"}'
    within 70 --variants default --variant-plans mix --back-to-back 8 --tag ${tag}_b60_back_to_back ;;
  step)
    XLA_PYTHON_CLIENT_MEM_FRACTION=0.95 python -m benchmarks.decode_throughput --settings 32x100 \
      --attention pallas pallas:mosaic_wg4_lean_folded \
      --methods windowquant fp16 rtn4 rtn2 --out "$out" --budget-s 480 --tag ${tag}_kernels ;;
  bars)
    within() { local t=$1; shift; timeout "$t" python benchmarks/decode_attention.py --tokens 32768 --plans mix \
                 --inner 1 --gpu-time --out "$out" \
                 --compiler-options '{"xla_gpu_command_buffer_scheduling_mode": "CONCURRENT"}' "$@" \
                 || echo "(stopped: $*)"; }
    within 250 --variant-shape 60,32768 --variant-plans mix,int2 --variants default,mosaic_wg4_lean_folded \
      --batches 60 --back-to-back 32 --tag ${tag}_b60_bars
    within 230 --variant-shape 8,32768 --variants default,mosaic_wg4_lean_folded,mosaic_wg4_lean_eight \
      --batches 8 --back-to-back 64 --tag ${tag}_b8_bars ;;
  small)
    timeout 200 python benchmarks/decode_attention.py --variant-shape 60,1024 --variant-plans mix,int2,kivi2 \
      --variants default,mosaic_wg4_lean_eight --no-sweep --inner 1 --back-to-back 64 --gpu-time --out "$out" \
      --compiler-options '{"xla_gpu_command_buffer_scheduling_mode": "CONCURRENT"}' --tag ${tag}_b60_1k \
      || echo "(stopped: variants at 60 x 1k)"
    XLA_PYTHON_CLIENT_MEM_FRACTION=0.95 python -m benchmarks.decode_throughput --settings 60x5 \
      --attention pallas pallas:mosaic_wg4_lean_eight --methods fp16 windowquant kivi2 kivi4 rtn4 \
      --out "$out" --budget-s 300 --tag ${tag}_small ;;
  combine)
    within() { local t=$1; shift; timeout "$t" python benchmarks/decode_attention.py --inner 1 --gpu-time \
                 --out "$out" --compiler-options '{"xla_gpu_command_buffer_scheduling_mode": "CONCURRENT"}' "$@" \
                 || echo "(stopped: $*)"; }
    within 150 --tokens 32768 --plans mix --variant-shape 8,32768 --batches 8 --back-to-back 64 \
      --variants default,fused_combine,mosaic_wg4_lean_eight --tag ${tag}_b8_combine
    within 90 --tokens 1024 --plans mix,fp16 --variant-shape 1,1024 --variant-plans mix --batches 1 \
      --back-to-back 64 --variants default,fused_combine --tag ${tag}_b1_combine
    within 150 --tokens 32768 --plans mix --variant-shape 60,32768 --batches 60 --back-to-back 32 \
      --variants default,eight_combine_one_block --tag ${tag}_b60_combine ;;
  batch8)  # (s33) batch 8 x 32k: a program a phase (the 16-bit and INT2 phases' programs side by side), Triton and
           # Mosaic; then batch 1 x 1k timed as the sweep times short calls (~2 ms of calls a dispatch), cudnn beside
    within() { local t=$1; shift; timeout "$t" python benchmarks/decode_attention.py --gpu-time --out "$out" \
                 --compiler-options '{"xla_gpu_command_buffer_scheduling_mode": "CONCURRENT"}' "$@" \
                 || echo "(stopped: $*)"; }
    within 200 --inner 1 --tokens 32768 --plans mix --variant-shape 8,32768 --batches 8 --back-to-back 64 \
      --variants default,parallel_phases,mosaic_wg4_lean_eight,eight_parallel_phases --tag ${tag}_b8_phases
    within 120 --tokens 1024 --plans mix,fp16 --variant-shape 1,1024 --variant-plans mix --batches 1 \
      --variants default,fused_combine --tag ${tag}_b1_inner ;;
  pool512)  # (s33) the default since s33 (pools of >= 512 tokens through the Mosaic kernel at >= 128 pairs) against
            # "pallas:triton", which is what the default ran at 60 x 5 until then (its pools were under 8k tokens)
    XLA_PYTHON_CLIENT_MEM_FRACTION=0.95 python -m benchmarks.decode_throughput --settings 60x5 \
      --attention pallas pallas:triton --methods fp16 windowquant kivi2 kivi4 A B --out "$out" --budget-s 200 \
      --tag ${tag}_pool512 ;;
  combine_step)  # the merge in one launch at every batch, in the 7B step where XLA's kernels merge by default
    XLA_PYTHON_CLIENT_MEM_FRACTION=0.95 python -m benchmarks.decode_throughput --settings 1x100 20x5 \
      --attention pallas pallas:fused_combine --methods windowquant fp16 --out "$out" --budget-s 200 \
      --tag ${tag}_fused_combine ;;
  h200)  # (s34, for the next H200) the headline rows with today's defaults: issue 5's batch 60 x 32k, the short
         # sweep (small calls layered since s34), then 60 x 5 against "pallas:triton"
    timeout 90 python benchmarks/decode_attention.py --tokens 32768 --plans mix --inner 1 --gpu-time --out "$out" \
      --compiler-options '{"xla_gpu_command_buffer_scheduling_mode": "CONCURRENT"}' --batches 8,60 \
      --back-to-back 32 --tag ${tag}_bars || echo "(stopped: h200, bars)"
    timeout 200 python benchmarks/decode_attention.py --gpu-time --batches 1,8,60 --tokens 1024,8192 \
      --plans mix,fp16 --out "$out" --tag ${tag}_short || echo "(stopped: h200, short)"
    timeout 250 bash "$0" pool512 ;;
  vldsm)  # (s35, for the next device) `values_by_ldmatrix`: 430 SASS in the INT2 main loop offline against 459,
          # 497 against 548 in INT4's (`mosaic_sass_s35_vldsm{,_int4}.md`); the kernels checked against float64
          # first, then issue 5's 60 x 32k rows (the variants' table checks against XLA's path); ~7 min
    timeout 130 python -m benchmarks.mosaic_int2_bench --tokens 19968 --splits 4 --out "$out" --batches 32 60 \
      --variants wg4_large_batch_ftz_lean_folded_eight wg4_large_batch_ftz_lean_folded_eight_vldsm \
      --tag mosaic_int2_${tag}_vldsm || echo "(stopped: vldsm, INT2 kernels)"
    timeout 110 python -m benchmarks.mosaic_int2_bench --tokens 19968 --splits 4 --out "$out" --batches 32 60 \
      --bits 4 --variants wg4_large_batch_ftz_int4_eight wg4_large_batch_ftz_int4_eight_vldsm \
      --tag mosaic_int4_${tag}_vldsm || echo "(stopped: vldsm, INT4 kernels)"
    timeout 170 python benchmarks/decode_attention.py --variant-shape 60,32768 --variant-plans mix,int2 --no-sweep \
      --variants default,mosaic_wg4_lean_eight_vldsm --inner 1 --back-to-back 32 --gpu-time --out "$out" \
      --compiler-options '{"xla_gpu_command_buffer_scheduling_mode": "CONCURRENT"}' --tag ${tag}_b60_vldsm \
      || echo "(stopped: vldsm, batch 60)" ;;
  vldsm_step)  # (s35) the 7B step at 32 x 100 with it, beside the default
    XLA_PYTHON_CLIENT_MEM_FRACTION=0.95 python -m benchmarks.decode_throughput --settings 32x100 \
      --attention pallas pallas:mosaic_wg4_lean_eight_vldsm --methods windowquant fp16 --out "$out" \
      --budget-s 300 --tag ${tag}_vldsm ;;
  ncu)  # (s36) where the INT2 kernel's time goes now: the default (eight) and vldsm under Nsight Compute (stall
        # reasons, issue, clocks), batch 32 x 19,968, 4 splits, as s26's profile of its ancestor
    for v in wg4_large_batch_ftz_lean_folded_eight wg4_large_batch_ftz_lean_folded_eight_vldsm; do
      timeout 200 python benchmarks/kernel_ncu.py profile --plans mosaic_int2 --kernel kernel_mosaic --variant "$v" \
        --batch 32 --tokens 19968 --splits 4 --out "$out/ncu_$v" --summary || echo "(stopped: ncu $v)"
    done ;;
  narrow)  # (s39) both wgmmas 8 columns wide (`narrow_scores`, `narrow_values`; the default since s39) against the
           # 16-wide kernel ("pallas:mosaic_wide", s38's default): INT2 kernels at
           # batch 32 and 60, issue 5's batch 60 x 32k, the 7B step at 32 x 100 (s39's call 8 timed these beside
           # `overlapped_steps`, since removed: 31 % slower)
    against_default "wg4_large_batch_ftz_lean_folded_eight_narrow wg4_large_batch_ftz_lean_folded_eight_narrow_both" \
      mosaic_wide narrow ;;
  ncu_s39)  # (s39) what changed where the time did not: the default, paired steps and five warpgroups under
            # Nsight Compute, batch 32 x 19,200 (whole splits at 4 and 5), pages packed into one archive
    for v in wg4_large_batch_ftz_lean_folded_eight wg4_large_batch_ftz_lean_folded_eight_paired \
             wg5_large_batch_ftz_lean_folded_eight; do
      timeout 170 python benchmarks/kernel_ncu.py profile --plans mosaic_int2 --kernel kernel_mosaic --variant "$v" \
        --batch 32 --tokens 19200 --splits 4 --out "$out/ncu_s39" --summary || echo "(stopped: ncu $v)"
    done
    tar czf "$out/ncu_mosaic_int2_b32_t19200_${tag}.tgz" -C "$out" --exclude='*.ncu-rep' ncu_s39 ;;
  ncu_half)  # (s50) where the keys' scaling costs its 14 % on half the SMs (batch 16 x 19,968, 4
            # splits: 64 CTAs, the SMs bound as on an H200): the default and its keys' scaling knocked out under
            # Nsight Compute (stall reasons, issue, shared-memory wavefronts), side by side (s50: ncu's first start on a
            # fresh machine took the first profile past 200 s)
    base=wg4_large_batch_ftz_lean_folded_eight_narrow_both_spread_vldsm
    for v in $base ${base}_ko_key_scaling; do
      timeout 300 python benchmarks/kernel_ncu.py profile --plans mosaic_int2 --kernel kernel_mosaic --variant "$v" \
        --batch 16 --tokens 19968 --splits 4 --out "$out/ncu_half_$v" --summary || echo "(stopped: ncu_half $v)"
    done ;;
  profile)  # (s36) where the 7B step's GPU time goes at 32 x 100 today (s28's profile is the last), kernel by kernel
    XLA_PYTHON_CLIENT_MEM_FRACTION=0.95 timeout 300 python -m benchmarks.decode_profile --settings 32x100 \
      --methods windowquant fp16 --top 40 --out "$out" --tag "$tag" || echo "(stopped: profile)" ;;
  kivi)  # (s37) KIVI's values from registers (`token_scaled_p`) against the shared-memory path KIVI's pools take by
         # default: the kernels at 19,968 tokens (float64 checks first), INT2 at batch 32 and 60, INT4 at 60; then
         # the 7B step at 32 x 100 and 60 x 5, kivi2 and kivi4 (issue 6's floors: kivi2 1.56 x and 1.53 x on an H200)
    timeout 150 python -m benchmarks.mosaic_int2_bench --tokens 19968 --splits 4 --kivi --batches 32 60 --out "$out" \
      --variants wg4_large_batch_ftz_kivi_eight wg4_large_batch_ftz_kivi_eight_scaled_p --tag mosaic_kivi_${tag} \
      || echo "(stopped: kivi, INT2 kernels)"
    timeout 90 python -m benchmarks.mosaic_int2_bench --tokens 19968 --splits 4 --kivi --bits 4 --batches 60 \
      --out "$out" --variants wg4_large_batch_ftz_kivi_eight wg4_large_batch_ftz_kivi_eight_scaled_p \
      --tag mosaic_kivi4_${tag} || echo "(stopped: kivi, INT4 kernels)"
    XLA_PYTHON_CLIENT_MEM_FRACTION=0.95 timeout 290 python -m benchmarks.decode_throughput --settings 32x100 60x5 \
      --attention pallas pallas:mosaic_wg4_kivi_scaled_p --methods kivi2 kivi4 --out "$out" --budget-s 270 \
      --tag ${tag}_kivi_scaled || echo "(stopped: kivi, steps)" ;;
  profile_small)  # (s37) where the 7B step's GPU time goes at 60 x 5 (windowquant 1.50 x its floor on an H200)
    XLA_PYTHON_CLIENT_MEM_FRACTION=0.95 timeout ${PROFILE_TIMEOUT:-300} python -m benchmarks.decode_profile --settings 60x5 \
      --methods windowquant kivi2 fp16 --top 40 --out "$out" --tag "${tag}_small" || echo "(stopped: profile)" ;;
  headline)  # (s38) issue 6's 32 x 100 row with today's defaults, every method but C (XLA-only; s32's row stands),
             # fp16 first: the H200's last such row is s32's, before s33-s37's defaults
    XLA_PYTHON_CLIENT_MEM_FRACTION=0.95 timeout 345 python -m benchmarks.decode_throughput --settings 32x100 \
      --attention pallas --methods fp16 windowquant kivi2 rtn2 kivi4 rtn4 A B --out "$out" --budget-s 320 \
      --tag ${tag}_headline || echo "(stopped: headline)" ;;
  h200_s38)  # (s38) the bars' rows on an H200 with today's defaults (2 splits at batch 60 since s38): issue 6's
             # 32 x 100 and 60 x 5, every method but C, then issue 5's batch 60 and 8 x 32k (as `bars`)
    XLA_PYTHON_CLIENT_MEM_FRACTION=0.95 timeout 340 python -m benchmarks.decode_throughput --settings 32x100 60x5 \
      --attention pallas --methods fp16 windowquant kivi2 rtn2 kivi4 rtn4 A B --out "$out" --budget-s 310 \
      --tag ${tag}_all || echo "(stopped: h200_s38, steps)"
    timeout 100 python benchmarks/decode_attention.py --tokens 32768 --plans mix --inner 1 --gpu-time --out "$out" \
      --compiler-options '{"xla_gpu_command_buffer_scheduling_mode": "CONCURRENT"}' --batches 8,60 \
      --back-to-back 32 --tag ${tag}_bars || echo "(stopped: h200_s38, bars)" ;;
  h200_s39)  # (s39) the bars' rows on an H200 in ~5 minutes of device time: issue 6's 32 x 100 (fp16, windowquant,
             # kivi2) and 60 x 5 (windowquant, kivi2, fp16), then issue 5's batch 60 and 8 x 32k (as `bars`)
    XLA_PYTHON_CLIENT_MEM_FRACTION=0.95 timeout 250 python -m benchmarks.decode_throughput --settings 32x100 60x5 \
      --attention pallas --methods fp16 windowquant kivi2 --out "$out" --budget-s 210 \
      --tag ${tag}_bars_steps || echo "(stopped: h200_s39, steps)"
    timeout 80 python benchmarks/decode_attention.py --tokens 32768 --plans mix --inner 1 --gpu-time --out "$out" \
      --compiler-options '{"xla_gpu_command_buffer_scheduling_mode": "CONCURRENT"}' --batches 8,60 \
      --back-to-back 32 --tag ${tag}_bars || echo "(stopped: h200_s39, bars)" ;;
  steps_s39)  # (s39, what an H100 gets if no H200 comes) the 7B step: 60 x 5 windowquant with XLA's split-K GEMMs
              # off (the o and down products' f32 partials, 6.9 MB a product at batch 60, are read back by the
              # residual adds), then 32 x 100 windowquant with both wgmmas 8 wide (s39 ran it as "pallas:mosaic_narrow"
              # against the default; since, the default is 8 wide and "pallas:mosaic_wide" the 16-wide)
    XLA_PYTHON_CLIENT_MEM_FRACTION=0.95 timeout 150 python -m benchmarks.decode_throughput --settings 60x5 \
      --attention pallas --methods windowquant --out "$out" --budget-s 130 --tag ${tag}_splitk \
      --xla-options 'no_split_k={"xla_gpu_experimental_force_split_k": 1}' || echo "(stopped: split-K)"
    XLA_PYTHON_CLIENT_MEM_FRACTION=0.95 timeout 170 python -m benchmarks.decode_throughput --settings 32x100 \
      --attention pallas pallas:mosaic_wide --methods windowquant --out "$out" --budget-s 150 \
      --tag ${tag}_narrow_step || echo "(stopped: narrow step)" ;;
  paired)  # (s38, for the next device) `paired_steps`: a block's two steps under one softmax (793 SASS a 128 keys
           # offline against 2 x 459): the INT2 kernel at batch 32 and 60 (float64 checks first), issue 5's batch
           # 60 x 32k (mix, int2), then the 7B step at 32 x 100 (issue 6's 80 %: windowquant, fp16 beside)
    against_default wg4_large_batch_ftz_lean_folded_eight_paired mosaic_paired paired ;;
  warpgroups)  # (s39) five and six warpgroups a CTA (96 and 80 registers a thread) against four, INT2 kernels at
               # batch 32 and 60 x 19,200 tokens (a multiple of 4, 5 and 6 steps of 64: no split reads a range)
    python -m benchmarks.mosaic_int2_bench --tokens 19200 --splits 4 --out "$out" --batches 32 60 \
      --variants wg4_large_batch_ftz_lean_folded_eight wg5_large_batch_ftz_lean_folded_eight \
      wg6_large_batch_ftz_lean_folded_eight --tag mosaic_int2_${tag}_wg || echo "(stopped: warpgroups)" ;;
  two_splits)  # (s38, run on an H100 before the change, when 2 splits were "pallas:mosaic_two_splits" and 4 the
               # default) 2 splits a pair where one wave holds them (a CTA's warpgroups two pairs' splits): since
               # s38 the default, 4 now "pallas:mosaic_four_splits"; the 7B step at 60 x 5, one layer at batch 60
    XLA_PYTHON_CLIENT_MEM_FRACTION=0.95 timeout 270 python -m benchmarks.decode_throughput --settings 60x5 \
      --attention pallas pallas:mosaic_four_splits --methods windowquant kivi2 --out "$out" --budget-s 250 \
      --tag ${tag}_two_splits || echo "(stopped: two_splits, step)"
    for tokens in 1024 32768; do
      timeout 130 python benchmarks/decode_attention.py --variant-shape 60,$tokens --variant-plans int2 --no-sweep \
        --variants default,mosaic_four_splits --inner 1 --gpu-time --out "$out" --tag ${tag}_two_splits_$tokens \
        --compiler-options '{"xla_gpu_command_buffer_scheduling_mode": "CONCURRENT"}' || echo "(stopped: $tokens)"
    done ;;
  c_long)  # (s40) ablation C's paged kernel in the 7B step, long videos: 32 x 100 and 1 x 100, fp16 and windowquant
           # beside (the floors' bar: every method within 1.5 x; XLA's reader of C, s32's rows, is 2.3-25 x)
    XLA_PYTHON_CLIENT_MEM_FRACTION=0.95 timeout 330 python -m benchmarks.decode_throughput --settings 32x100 1x100 \
      --attention pallas --methods fp16 windowquant C --out "$out" --budget-s 310 --tag ${tag}_C_long \
      || echo "(stopped: c_long)" ;;
  c_short)  # (s40) the same at the paper's settings, 60 x 5 and 20 x 5
    XLA_PYTHON_CLIENT_MEM_FRACTION=0.95 timeout 330 python -m benchmarks.decode_throughput --settings 60x5 20x5 \
      --attention pallas --methods fp16 windowquant C --out "$out" --budget-s 310 --tag ${tag}_C_short \
      || echo "(stopped: c_short)" ;;
  c_mosaic)  # (s41) ablation C's INT4 and INT2 windows through the Mosaic kernel's page table (the default at >= 128
             # pairs): one layer against the reordered cache and the Triton paged kernel, then the 7B step
    timeout 150 python benchmarks/interleaved_bench.py --batches 32 --tokens 19968 --plans mix int2 --out "$out" \
      --tag ${tag}_b32 || echo "(stopped: c_mosaic, batch 32)"
    timeout 60 python benchmarks/interleaved_bench.py --batches 60 --tokens 1024 --plans mix --out "$out" \
      --tag ${tag}_b60_1k || echo "(stopped: c_mosaic, batch 60 x 1k)"
    XLA_PYTHON_CLIENT_MEM_FRACTION=0.95 timeout 330 python -m benchmarks.decode_throughput --settings 32x100 60x5 \
      --attention pallas --methods fp16 windowquant C --out "$out" --budget-s 310 --tag ${tag}_C_mosaic \
      || echo "(stopped: c_mosaic, the 7B step)" ;;
  h200_s42)  # (s42) on an H200: h200_s39's bars' rows, then ablation C in the 7B step (its INT4 and INT2 windows
             # through the Mosaic kernel's page table since s41; C is unmeasured on an H200 since s32's XLA reader)
    bash "$0" h200_s39
    XLA_PYTHON_CLIENT_MEM_FRACTION=0.95 timeout 220 python -m benchmarks.decode_throughput --settings 32x100 60x5 \
      --attention pallas --methods C --out "$out" --budget-s 190 --tag ${tag}_C_h200 \
      || echo "(stopped: h200_s42, C)" ;;
  b8_s43)  # (s43) batch 8 x 32k, mix: the default (Triton, 32 pairs < 128), the large-batch Mosaic launches forced,
           # and those with CTAs of two warpgroups (half an SM's registers, so the 16-bit programs can run beside)
    timeout 300 python benchmarks/decode_attention.py --gpu-time --out "$out" --no-sweep \
      --compiler-options '{"xla_gpu_command_buffer_scheduling_mode": "CONCURRENT"}' --inner 1 --back-to-back 64 \
      --variant-shape 8,32768 --variant-plans mix \
      --variants default,mosaic_default,mosaic_wg2,mosaic_wg2_p2,mosaic_wg2_int2 \
      --tag ${tag}_b8_wg2 || echo "(stopped: b8_s43)" ;;
  b8_default)  # (s43) the default since s43 (the large-batch Mosaic launches at 32 pairs on long pools) against the
               # Triton kernel for every pool, at batch 8 x 32k and 8 x 16k
    for shape in 8,32768 8,16384; do
      timeout 120 python benchmarks/decode_attention.py --gpu-time --out "$out" --no-sweep \
        --compiler-options '{"xla_gpu_command_buffer_scheduling_mode": "CONCURRENT"}' --inner 1 --back-to-back 64 \
        --variant-shape $shape --variant-plans mix,int2 --variants default,triton_only \
        --tag ${tag}_default_${shape/,/x} || echo "(stopped: b8_default $shape)"
    done ;;
  cublas)  # (s44, untimed) the 7B step with cuBLAS' weight products, XLA's Triton ones beside in the same run: at
           # M = 32-60 XLA splits K and its f32 partials are read back by the next fusions (~1 ms of small kernels a
           # step at 60 x 5 on an H200), where cuBLAS' LM head streams its weights at 4.07 TB/s (s44's profiles)
    XLA_PYTHON_CLIENT_MEM_FRACTION=0.95 timeout 470 python -m benchmarks.decode_throughput --settings 60x5 32x100 \
      --attention pallas --methods fp16 windowquant kivi2 --out "$out" --budget-s 370 --tag ${tag}_cublas \
      --xla-options 'cublas={"xla_gpu_command_buffer_scheduling_mode": "CONCURRENT", "xla_gpu_enable_triton_gemm": false}' \
      || echo "(stopped: cublas)" ;;
  triton_first)  # (s44, untimed) the Triton launch (16-bit windows, the rest) ordered before the Mosaic ones: one
                 # layer at batch 8 x 32k and 8 x 16k (mix, all-INT2), then the 7B step at 32 x 100 and 60 x 5
    for shape in 8,32768 8,16384; do
      timeout 100 python benchmarks/decode_attention.py --gpu-time --out "$out" --no-sweep \
        --compiler-options '{"xla_gpu_command_buffer_scheduling_mode": "CONCURRENT"}' --inner 1 --back-to-back 64 \
        --variant-shape $shape --variant-plans mix,int2 --variants default,triton_first \
        --tag ${tag}_triton_first_${shape/,/x} || echo "(stopped: triton_first $shape)"
    done
    XLA_PYTHON_CLIENT_MEM_FRACTION=0.95 timeout 300 python -m benchmarks.decode_throughput --settings 32x100 60x5 \
      --attention pallas pallas:triton_first --methods fp16 windowquant --out "$out" --budget-s 260 \
      --tag ${tag}_triton_first_step || echo "(stopped: triton_first, the 7B step)" ;;
  depth)  # (s45, for an H200) 3 and 4 pipeline stages for the default's INT2 kernel (more bytes in flight: on an
          # H200 the kernel streams 57 % of the copy at the H100's speed), and the SASS cuts that the H100 could not
          # show (V's codes by ldmatrix.trans, paired steps: H100 < 1 %, where the kernel streams 80 %): the INT2
          # kernel at batch 32 and 60 (float64 checks first), then issue 5's 32k rows at batch 60 and 8
    timeout 200 python -m benchmarks.mosaic_int2_bench --tokens 19968 --splits 4 --out "$out" --batches 32 60 \
      --variants wg4_large_batch_ftz_lean_folded_eight_narrow_both wg4_large_batch_ftz_lean_folded_eight_narrow_both_s3 \
      wg4_large_batch_ftz_lean_folded_eight_narrow_both_s4 wg4_large_batch_ftz_lean_folded_eight \
      wg4_large_batch_ftz_lean_folded_eight_vldsm wg4_large_batch_ftz_lean_folded_eight_paired \
      wg4_large_batch_ftz_lean_folded_eight_narrow_both_spread ${ko_variants} --tag mosaic_int2_${tag}_depth \
      || echo "(stopped: depth, kernels)"
    for shape_runs in 60,32768:32 8,32768:64; do
      shape=${shape_runs%:*}
      timeout 130 python benchmarks/decode_attention.py --variant-shape $shape --variant-plans mix,int2 --no-sweep \
        --variants default,mosaic_s3,mosaic_s4,mosaic_spread,mosaic_wide_output --inner 1 \
        --back-to-back ${shape_runs#*:} --gpu-time \
        --out "$out" \
        --tag ${tag}_depth_${shape/,/x} --compiler-options '{"xla_gpu_command_buffer_scheduling_mode": "CONCURRENT"}' \
        || echo "(stopped: depth $shape)"
    done ;;
  knockout)  # (s46) what the conversions cost: the default's INT2 kernel with the keys', the values' or both register
             # operands constant (every byte still moved by TMA; timed unchecked, wrong by design), at batch 32 and 60
    timeout 150 python -m benchmarks.mosaic_int2_bench --tokens 19968 --splits 4 --out "$out" --batches 32 60 \
      --variants wg4_large_batch_ftz_lean_folded_eight_narrow_both ${ko_variants} --tag mosaic_int2_${tag}_knockout \
      || echo "(stopped: knockout)" ;;
  narrow_out)  # (s46) the Mosaic launches' partials 8 columns wide (the default since s46) against s45's 16 with 8
               # empty ("pallas:mosaic_wide_output"): issue 5's 32k rows at batch 8 and 60, then the 7B step at 32 x 100
    for shape_runs in 8,32768:64 60,32768:32; do
      shape=${shape_runs%:*}
      timeout 100 python benchmarks/decode_attention.py --variant-shape $shape --variant-plans mix,int2 --no-sweep \
        --variants default,mosaic_wide_output --inner 1 --back-to-back ${shape_runs#*:} --gpu-time --out "$out" \
        --tag ${tag}_narrow_out_${shape/,/x} \
        --compiler-options '{"xla_gpu_command_buffer_scheduling_mode": "CONCURRENT"}' \
        || echo "(stopped: narrow_out $shape)"
    done
    XLA_PYTHON_CLIENT_MEM_FRACTION=0.95 timeout 300 python -m benchmarks.decode_throughput --settings 32x100 \
      --attention pallas pallas:mosaic_wide_output --methods fp16 windowquant --out "$out" --budget-s 250 \
      --tag ${tag}_narrow_out_step || echo "(stopped: narrow_out, the 7B step)" ;;
  spread)  # (s46) each warpgroup's copies issued by its warp g % 4 ("pallas:mosaic_spread"): the INT2 kernel at batch
           # 32 and 60 (float64 checks first), then the 7B step at 32 x 100: windowquant, kivi2 and C (its paged Mosaic
           # launches issue twelve copies a step) under "pallas" and (since s47, spread the default) s46's default,
           # "pallas:mosaic_warp0_copies", fp16 beside
    timeout 100 python -m benchmarks.mosaic_int2_bench --tokens 19968 --splits 4 --out "$out" --batches 32 60 \
      --variants wg4_large_batch_ftz_lean_folded_eight_narrow_both \
      wg4_large_batch_ftz_lean_folded_eight_narrow_both_spread --tag mosaic_int2_${tag}_spread \
      || echo "(stopped: spread, kernels)"
    XLA_PYTHON_CLIENT_MEM_FRACTION=0.95 timeout 420 python -m benchmarks.decode_throughput --settings 32x100 \
      --attention pallas pallas:mosaic_warp0_copies --methods fp16 windowquant kivi2 C --out "$out" --budget-s 380 \
      --tag ${tag}_spread_step || echo "(stopped: spread, the 7B step)" ;;
  h200_short)  # (s46, an H200 with ~6 minutes of budget) the INT2 kernel at batch 32 and 60: the default, spread
               # copies, 4 stages, V's codes by ldmatrix.trans and paired steps against their base, the knockouts;
               # then the 7B step at 32 x 100: fp16, windowquant under "pallas" (spread copies since s47) and warp
               # 0's copies, kivi2
    timeout 170 python -m benchmarks.mosaic_int2_bench --tokens 19968 --splits 4 --out "$out" --batches 32 60 \
      --variants wg4_large_batch_ftz_lean_folded_eight_narrow_both \
      wg4_large_batch_ftz_lean_folded_eight_narrow_both_spread wg4_large_batch_ftz_lean_folded_eight_narrow_both_s4 \
      wg4_large_batch_ftz_lean_folded_eight \
      wg4_large_batch_ftz_lean_folded_eight_vldsm wg4_large_batch_ftz_lean_folded_eight_paired ${ko_variants} \
      --tag mosaic_int2_${tag}_short || echo "(stopped: h200_short, kernels)"
    XLA_PYTHON_CLIENT_MEM_FRACTION=0.95 timeout 200 python -m benchmarks.decode_throughput --settings 32x100 \
      --attention pallas pallas:mosaic_warp0_copies --methods fp16 windowquant kivi2 --out "$out" --budget-s 170 \
      --tag ${tag}_short_step || echo "(stopped: h200_short, step)" ;;
  h200_s47)  # (s47, an H200 with ~8 minutes of budget) KIVI's narrow kernel against float64; the INT2 kernel at
            # batch 32 and 60: the default, spread copies (float64 checks first) and the knockouts; then issue
            # 6's 7B step at 32 x 100 under "pallas" (spread copies) and warp 0's: fp16, windowquant, kivi2 and C (C's
            # paged launches, 1.62 x their floor in s44, are where a scheduler's extra copies weigh most)
    "$0" kivi_check || echo "(stopped: h200_s47, kivi_check)"
    timeout 160 python -m benchmarks.mosaic_int2_bench --tokens 19968 --splits 4 --out "$out" --batches 32 60 \
      --variants wg4_large_batch_ftz_lean_folded_eight_narrow_both \
      wg4_large_batch_ftz_lean_folded_eight_narrow_both_spread \
      wg4_large_batch_ftz_lean_folded_eight_narrow_both_spread_prefolded ${ko_variants} \
      --tag mosaic_int2_${tag}_spread_ko || echo "(stopped: h200_s47, kernels)"
    XLA_PYTHON_CLIENT_MEM_FRACTION=0.95 timeout 300 python -m benchmarks.decode_throughput --settings 32x100 \
      --attention pallas pallas:mosaic_warp0_copies --methods fp16 windowquant C kivi2 --out "$out" --budget-s 270 \
      --tag ${tag}_spread_step || echo "(stopped: h200_s47, step)" ;;
  prefolded)  # (s48) the default's INT2 kernel reading minimums folded before it (`prefolded_minimums`: 24 fewer
              # f16x2 fmas a thread and step, what a cache storing folded minimums would run), float64 checks first,
              # at batch 32 and 60, the knockouts beside (what all the conversions cost on this card)
    timeout 150 python -m benchmarks.mosaic_int2_bench --tokens 19968 --splits 4 --out "$out" --batches 32 60 \
      --variants wg4_large_batch_ftz_lean_folded_eight_narrow_both_spread \
      wg4_large_batch_ftz_lean_folded_eight_narrow_both_spread_prefolded ${ko_variants} \
      --tag mosaic_int2_${tag}_prefolded || echo "(stopped: prefolded)" ;;
  half_machine)  # (s48) the INT2 kernel where the SMs, not HBM, bound it on any Hopper: batch 16 x 19,968 at 4
                 # splits is 64 CTAs, one wave on half the SMs (each SM then has twice an H100's full-machine HBM
                 # share, more than an H200's 1.5x), beside batch 32 (128 CTAs, the full machine): the default,
                 # prefolded minimums, the knockouts, 4 stages, warp 0's copies; paired steps and V by ldmatrix
                 # against their (wide) base
    timeout 240 python -m benchmarks.mosaic_int2_bench --tokens 19968 --splits 4 --out "$out" --batches 16 32 \
      --variants wg4_large_batch_ftz_lean_folded_eight_narrow_both_spread \
      wg4_large_batch_ftz_lean_folded_eight_narrow_both_spread_prefolded ${ko_variants} \
      wg4_large_batch_ftz_lean_folded_eight_narrow_both_s4 wg4_large_batch_ftz_lean_folded_eight_narrow_both \
      wg4_large_batch_ftz_lean_folded_eight wg4_large_batch_ftz_lean_folded_eight_paired \
      wg4_large_batch_ftz_lean_folded_eight_vldsm --tag mosaic_int2_${tag}_half_machine \
      || echo "(stopped: half_machine)" ;;
  half_metadata)  # (s48) on half the SMs (batch 16, 64 CTAs) and the full machine: what the scales' and minimums'
                  # loads cost (the keys', the values', both cut to one a step) beside the keys' whole unpacking
    base=wg4_large_batch_ftz_lean_folded_eight_narrow_both_spread
    timeout 200 python -m benchmarks.mosaic_int2_bench --tokens 19968 --splits 4 --out "$out" --batches 16 32 \
      --variants $base ${base}_ko_key_metadata ${base}_ko_value_metadata ${base}_ko_metadata ${base}_ko_keys \
      ${base}_ko_values --tag mosaic_int2_${tag}_half_metadata || echo "(stopped: half_metadata)" ;;
  half_interleaved)  # (s48) on half the SMs and the full machine: each part of the keys unpacked just before its
                     # score wgmma (`interleaved_key_parts`), with and without prefolded minimums, against the default
    base=wg4_large_batch_ftz_lean_folded_eight_narrow_both_spread
    timeout 200 python -m benchmarks.mosaic_int2_bench --tokens 19968 --splits 4 --out "$out" --batches 16 32 \
      --variants $base ${base}_interleaved ${base}_interleaved_prefolded ${base}_prefolded \
      --tag mosaic_int2_${tag}_half_interleaved || echo "(stopped: half_interleaved)" ;;
  half_scaling)  # (s49) on half the SMs (batch 16) and the full machine (32): the default against its keys', values'
                 # or both operands as magic + code alone (knockouts "key_scaling", "value_scaling", "scaling": no
                 # scales, minimums, their loads or fmas; 381 / 387 / 333 SASS in the hot loop against 434) and
                 # against the whole conversions knocked out: the most a factored form could gain before its own work
    base=wg4_large_batch_ftz_lean_folded_eight_narrow_both_spread_vldsm
    timeout 200 python -m benchmarks.mosaic_int2_bench --tokens 19968 --splits 4 --out "$out" --batches 16 32 \
      --variants $base ${base}_ko_key_scaling ${base}_ko_value_scaling ${base}_ko_scaling ${base}_ko_keys \
      ${base}_ko_both --tag mosaic_int2_${tag}_half_scaling || echo "(stopped: half_scaling)" ;;
  half_factored)  # (s49) on half the SMs and the full machine: the factored keys (`factored_keys`: q^T times a step's
                  # scales as B, the keys as magic + code, the minimums a bias) against the default and its keys'
                  # scaling knocked out (what the factored form could gain at most), float64 checks first
    base=wg4_large_batch_ftz_lean_folded_eight_narrow_both_spread_vldsm
    timeout 200 python -m benchmarks.mosaic_int2_bench --tokens 19968 --splits 4 --out "$out" --batches 16 32 60 \
      --variants $base ${base}_factored ${base}_ko_key_scaling \
      --tag mosaic_int2_${tag}_half_factored \
      || echo "(stopped: half_factored)" ;;
  factored_step)  # (s49) the 7B step at 32 x 100 with INT2 windows' keys factored ("pallas:mosaic_factored") against
                  # the default, fp16 beside; then one layer at issue 5's batch 60 x 32k (mix, int2)
    XLA_PYTHON_CLIENT_MEM_FRACTION=0.95 timeout 280 python -m benchmarks.decode_throughput --settings 32x100 \
      --attention pallas pallas:mosaic_factored --methods fp16 windowquant --out "$out" --budget-s 260 \
      --tag ${tag}_factored_step || echo "(stopped: factored_step)"
    timeout 130 python benchmarks/decode_attention.py --variant-shape 60,32768 --variant-plans mix,int2 --no-sweep \
      --variants default,mosaic_factored --inner 1 --back-to-back 32 --gpu-time --out "$out" \
      --tag ${tag}_factored_60x32768 --compiler-options '{"xla_gpu_command_buffer_scheduling_mode": "CONCURRENT"}' \
      || echo "(stopped: factored_step, b60)" ;;
  half_vldsm)  # (s48) on half the SMs and the full machine: the default with V's codes by ldmatrix.trans (both
               # wgmmas narrow), float64 checks first
    base=wg4_large_batch_ftz_lean_folded_eight_narrow_both_spread
    timeout 150 python -m benchmarks.mosaic_int2_bench --tokens 19968 --splits 4 --out "$out" --batches 16 32 60 \
      --variants $base ${base}_vldsm --tag mosaic_int2_${tag}_half_vldsm || echo "(stopped: half_vldsm)" ;;
  vldsm_default)  # (s48) V's codes by ldmatrix, the default since s48, against s47's default ("pallas:mosaic_no_vldsm"):
                  # issue 5's 32k rows at batch 60 and 8 (errors against XLA), then the 7B step at 32 x 100: fp16,
                  # windowquant and C (its paged INT2 launches take it too); ~6 min
    rows_against_s47 vldsm_default
    XLA_PYTHON_CLIENT_MEM_FRACTION=0.95 timeout 330 python -m benchmarks.decode_throughput --settings 32x100 \
      --attention pallas pallas:mosaic_no_vldsm --methods fp16 windowquant C --out "$out" --budget-s 290 \
      --tag ${tag}_vldsm_step || echo "(stopped: vldsm_default, the 7B step)" ;;
  h200_s48)  # (s48, an H200, ~7 min) the INT2 kernel at batch 32, 60 and 16: the default (V by ldmatrix since s48),
             # s47's, s49's factored keys, paired steps and the default's knockouts (s49: the scaling ones,
             # `half_scaling`'s, and the whole conversions; float64 checks first); issue 5's 32k rows at batch 60
             # and 8 and issue 6's 7B step at 32 x 100 (fp16, windowquant, C, kivi2) with the default and s47's;
             # the 7B step at 60 x 5 with the default
    base=wg4_large_batch_ftz_lean_folded_eight_narrow_both_spread
    timeout 170 python -m benchmarks.mosaic_int2_bench --tokens 19968 --splits 4 --out "$out" --batches 32 60 16 \
      --variants ${base}_vldsm $base ${base}_vldsm_factored ${base}_vldsm_paired ${base}_vldsm_ko_key_scaling \
      ${base}_vldsm_ko_value_scaling ${base}_vldsm_ko_scaling ${base}_vldsm_ko_both \
      --tag mosaic_int2_${tag}_h200 \
      || echo "(stopped: h200_s48, kernels)"
    rows_against_s47 h200_s48
    XLA_PYTHON_CLIENT_MEM_FRACTION=0.95 timeout 300 python -m benchmarks.decode_throughput --settings 32x100 \
      --attention pallas pallas:mosaic_no_vldsm --methods fp16 windowquant C kivi2 --out "$out" --budget-s 260 \
      --tag ${tag}_h200_step || echo "(stopped: h200_s48, 32 x 100)"
    XLA_PYTHON_CLIENT_MEM_FRACTION=0.95 timeout 150 python -m benchmarks.decode_throughput --settings 60x5 \
      --attention pallas --methods fp16 windowquant C kivi2 --out "$out" --budget-s 120 \
      --tag ${tag}_h200_small || echo "(stopped: h200_s48, 60 x 5)" ;;
  h200_s49)  # (s49, an H200, ~9 min) issue 6's 7B step at 32 x 100 (fp16, windowquant, C, kivi2; windowquant with the
             # factored keys too), the INT2 kernel at batch 32, 60 and 16 (the default, s47's, the factored keys, the
             # keys' scaling and both conversions knocked out; float64 checks first), issue 5's 32k rows at batch 60
             # and 8 (the default against the factored keys)
    XLA_PYTHON_CLIENT_MEM_FRACTION=0.95 timeout 300 python -m benchmarks.decode_throughput --settings 32x100 \
      --attention pallas pallas:mosaic_factored --methods fp16 windowquant C kivi2 --out "$out" --budget-s 270 \
      --tag ${tag}_h200_step || echo "(stopped: h200_s49, 32 x 100)"
    base=wg4_large_batch_ftz_lean_folded_eight_narrow_both_spread
    timeout 150 python -m benchmarks.mosaic_int2_bench --tokens 19968 --splits 4 --out "$out" --batches 32 60 16 \
      --variants ${base}_vldsm $base ${base}_vldsm_factored ${base}_vldsm_ko_key_scaling \
      ${base}_vldsm_ko_both --tag mosaic_int2_${tag}_h200 || echo "(stopped: h200_s49, kernels)"
    for shape_runs in 60,32768:32 8,32768:64; do
      shape=${shape_runs%:*}
      timeout 70 python benchmarks/decode_attention.py --variant-shape $shape --variant-plans mix,int2 --no-sweep \
        --variants default,mosaic_factored --inner 1 --back-to-back ${shape_runs#*:} --gpu-time --out "$out" \
        --tag ${tag}_h200_factored_${shape/,/x} \
        --compiler-options '{"xla_gpu_command_buffer_scheduling_mode": "CONCURRENT"}' || echo "(stopped: $shape)"
    done ;;
  h200_s49_min)  # (s49, an H200, ~6 min) h200_s49's first two parts, shorter: issue 6's 7B step at 32 x 100 (fp16,
                 # windowquant, C, kivi2; windowquant with the factored keys), then the INT2 kernel at batch 32, 60
                 # and 16 (the default, the factored keys, the keys' scaling knocked out)
    XLA_PYTHON_CLIENT_MEM_FRACTION=0.95 timeout 260 python -m benchmarks.decode_throughput --settings 32x100 \
      --attention pallas pallas:mosaic_factored --methods fp16 windowquant C kivi2 --out "$out" --budget-s 240 \
      --tag ${tag}_h200_step || echo "(stopped: h200_s49_min, 32 x 100)"
    base=wg4_large_batch_ftz_lean_folded_eight_narrow_both_spread_vldsm
    timeout 100 python -m benchmarks.mosaic_int2_bench --tokens 19968 --splits 4 --out "$out" --batches 32 60 16 \
      --variants $base ${base}_factored ${base}_ko_key_scaling --tag mosaic_int2_${tag}_h200 \
      || echo "(stopped: h200_s49_min, kernels)" ;;
  b8_s51)  # (s51) batch 8 x 32k, mix, by GPU span: the default (`mosaic_default`: what the default runs there) against
           # the merge's grid at 16 / 32 channel blocks and 1-2 warps a program, and the Mosaic launches' grids for 2
           # or 3 programs an SM; under XLA's concurrent graph (the decode step's default), then the grids serially.
           # s51, H100: the grids at 2-3 programs an SM slower (serial span 121.8 / 106.2 µs against 99.6); the merge at
           # one warp and 32 blocks 5.5 µs against 7.1 (the default since; `results/s51_*_h100.md`)
    timeout 150 python benchmarks/decode_attention.py --variant-shape 8,32768 --variant-plans mix --no-sweep \
      --variants mosaic_default,combine_b16_w4,combine_b16_w2,combine_b8_w2,combine_b32_w1,mosaic_p2,mosaic_p3 \
      --inner 1 --back-to-back 64 --gpu-time --out "$out" --tag ${tag}_b8_variants \
      --compiler-options '{"xla_gpu_command_buffer_scheduling_mode": "CONCURRENT"}' || echo "(stopped: b8_s51)"
    timeout 80 python benchmarks/decode_attention.py --variant-shape 8,32768 --variant-plans mix --no-sweep \
      --variants mosaic_default,mosaic_p2,mosaic_p3 --inner 1 --back-to-back 64 --gpu-time --out "$out" \
      --tag ${tag}_b8_variants_serial || echo "(stopped: b8_s51, serial)" ;;
  triton_b8)  # (s51) batch 8 x 32k (mix), serial, by GPU span: the Triton launch's grid (`triton_*` variants) beside
              # the default
    timeout 120 python benchmarks/decode_attention.py --variant-shape 8,32768 --variant-plans mix --no-sweep \
      --variants mosaic_default,triton_j6,triton_p2,triton_p4,triton_p6,triton_s4 --inner 1 \
      --back-to-back 64 --gpu-time --out "$out" --tag ${tag}_b8_triton || echo "(stopped: triton_b8)" ;;
  step_s51)  # (s51) the 7B step at 32 x 100 with s51's merge (one warp, 8 channel blocks at 128 pairs) against s50's
             # ("pallas:combine_four_warps": 4 blocks, 4 warps), fp16 beside (timed under both: a repeat)
    XLA_PYTHON_CLIENT_MEM_FRACTION=0.95 timeout ${STEP_S:-280} python -m benchmarks.decode_throughput --settings 32x100 \
      --attention pallas pallas:combine_four_warps --methods ${STEP_METHODS:-windowquant fp16} --out "$out" \
      --budget-s $(( ${STEP_S:-280} - 30 )) --tag ${tag}_combine_step || echo "(stopped: step_s51)" ;;
  h200_s50)  # (s50, an H200, ~6 min) the bars' rows with today's defaults: issue 6's 7B step at 32 x 100 (fp16,
             # windowquant, C, kivi2), then issue 5's 32k rows (mix) at batch 8 and 60. (s50's H100 call found the
             # factored keys no faster in the kernel and their bias pass slow: not timed here.)
    XLA_PYTHON_CLIENT_MEM_FRACTION=0.95 timeout 260 python -m benchmarks.decode_throughput --settings 32x100 \
      --attention pallas --methods fp16 windowquant C kivi2 --out "$out" --budget-s 235 \
      --tag ${tag}_h200_step || echo "(stopped: h200_s50, 32 x 100)"
    timeout 100 python benchmarks/decode_attention.py --tokens 32768 --plans mix --inner 1 --gpu-time --out "$out" \
      --compiler-options '{"xla_gpu_command_buffer_scheduling_mode": "CONCURRENT"}' --batches 8,60 \
      --back-to-back 32 --tag ${tag}_bars || echo "(stopped: h200_s50, bars)" ;;
  b8_s52)  # (s52) batch 8 x 32k, mix, by GPU span: a launch a Mosaic pool (`mosaic_separate`; "mosaic_default" in s52's
           # runs, the default until s52) against a layer's INT2 and INT4 pools in one Mosaic launch
           # (`mosaic_int2.launch_together`): each pool's grid as alone (`mosaic_one_launch`, 256 CTAs) and sized for
           # 2 programs an SM (`mosaic_one_launch_p2`: one wave of 128 CTAs in all; what `mosaic_default` runs since
           # s52), each checked against the XLA path first ("err vs xla"); under XLA's concurrent graph, then serially.
           # s52, H100: serial span 93.6 / 93.1 / 86.8 µs, again 94.6 / 91.9 / 87.6 (`results/s52_*b8_one_launch*_h100.md`)
    timeout 110 python benchmarks/decode_attention.py --variant-shape 8,32768 --variant-plans mix --no-sweep \
      --variants mosaic_separate,mosaic_default,mosaic_one_launch,mosaic_one_launch_p2 --inner 1 --back-to-back 64 \
      --gpu-time --out "$out" --tag ${tag}_b8_one_launch \
      --compiler-options '{"xla_gpu_command_buffer_scheduling_mode": "CONCURRENT"}' || echo "(stopped: b8_s52)"
    timeout 90 python benchmarks/decode_attention.py --variant-shape 8,32768 --variant-plans mix --no-sweep \
      --variants mosaic_separate,mosaic_default,mosaic_one_launch,mosaic_one_launch_p2 --inner 1 --back-to-back 64 \
      --gpu-time --out "$out" --tag ${tag}_b8_one_launch_serial || echo "(stopped: b8_s52, serial)" ;;
  sizes_s52)  # (s52, run by hand that day) one launch at 128 and 240 pairs and batch 8 at 16k and 32k tokens, mix,
              # serial and concurrent graphs (`results/s52_one_launch_b{60,32}_*_h100.md`, `s52_run3_b8_*_h100.md`)
    for shape in 60,32768 32,19968 8,16384 8,32768; do
      for mode in serial concurrent; do
        opts=(); [ $mode = concurrent ] && opts=(--compiler-options \
          '{"xla_gpu_command_buffer_scheduling_mode": "CONCURRENT"}')
        timeout 110 python benchmarks/decode_attention.py --variant-shape $shape --variant-plans mix --no-sweep \
          --variants mosaic_separate,mosaic_default,mosaic_one_launch --inner 1 --back-to-back 64 --gpu-time \
          --out "$out" --tag ${tag}_sizes_b${shape%%,*}_t${shape##*,}_$mode "${opts[@]}" || echo "(stopped: $shape)"
      done
    done ;;
  step_s52)  # (s52) the 7B step at 32 x 100 with a layer's Mosaic pools in one launch ("pallas:mosaic_one_launch")
             # against the default's launch a pool; fp16 beside (issue 6's ratio)
    XLA_PYTHON_CLIENT_MEM_FRACTION=0.95 timeout ${STEP_S:-280} python -m benchmarks.decode_throughput --settings 32x100 \
      --attention pallas pallas:mosaic_one_launch --methods ${STEP_METHODS:-windowquant fp16} --out "$out" \
      --budget-s $(( ${STEP_S:-280} - 30 )) --tag ${tag}_one_launch_step || echo "(stopped: step_s52)" ;;
  bars_serial_s52)  # (s52, ~2 min) issue 5's 32k rows (mix, batch 8 and 60) under XLA's serial graph, then batch 8 x
                    # 32k serially: a launch a Mosaic pool (`mosaic_separate`) against the default (one launch below
                    # 64 pairs). s52, H100: batch 8's span 90.4 µs, 72 % of the copy (`results/s52_bars_serial_h100.md`);
                    # 95.1 against 87.2 (`results/s52_b8_default_serial_h100.md`)
    timeout 100 python benchmarks/decode_attention.py --tokens 32768 --plans mix --inner 1 --gpu-time --out "$out" \
      --batches 8,60 --back-to-back 32 --tag ${tag}_bars_serial || echo "(stopped: bars_serial_s52)"
    timeout 90 python benchmarks/decode_attention.py --variant-shape 8,32768 --variant-plans mix --no-sweep \
      --variants mosaic_separate,mosaic_default --inner 1 --back-to-back 64 --gpu-time --out "$out" \
      --tag ${tag}_b8_default_serial || echo "(stopped: bars_serial_s52, variants)" ;;
  between_s53)  # (s53, ~3 min) the pairs s52's rule fuses untimed: batch 12 (48 pairs) and 16 (64, the first left
                # alone) x 32k, mix, serial graph: a launch a pool, the default, one launch at every batch
    for b in 12 16; do
      timeout 80 python benchmarks/decode_attention.py --variant-shape $b,32768 --variant-plans mix --no-sweep \
        --variants mosaic_separate,mosaic_default,mosaic_one_launch --inner 1 --back-to-back 64 --gpu-time \
        --out "$out" --tag ${tag}_between_b$b || echo "(stopped: between_s53 b$b)"
    done ;;
  dense_s53)  # (s53, ~4 min) batch 8 x 32k and 16k, mix, by GPU span: the default (the 16-bit segments in a Triton launch
             # after the Mosaic one) against `mosaic_dense` (them in the Mosaic launch) by its share of the SMs (a
             # quarter, 3/8, a half) and CTA shape (w4: four programs of one slot; s3: two of three), each checked
             # against the XLA path first; serial graph, then 32k under the concurrent graph
    v=mosaic_default,mosaic_dense,mosaic_dense_q3,mosaic_dense_half,mosaic_dense_w4,mosaic_dense_s3
    for t in 32768 16384; do
      timeout 100 python benchmarks/decode_attention.py --variant-shape 8,$t --variant-plans mix --no-sweep \
        --variants $v --inner 1 --back-to-back 64 --gpu-time --out "$out" --tag ${tag}_dense_b8_t$t \
        || echo "(stopped: dense_s53 $t)"
    done
    timeout 100 python benchmarks/decode_attention.py --variant-shape 8,32768 --variant-plans mix --no-sweep \
      --variants $v --inner 1 --back-to-back 64 --gpu-time --out "$out" --tag ${tag}_dense_b8_concurrent \
      --compiler-options '{"xla_gpu_command_buffer_scheduling_mode": "CONCURRENT"}' || echo "(stopped: dense_s53 c)" ;;
  dense2_s53)  # (s53, ~3 min) batch 8 x 32k and 16k, mix, serial graph, by GPU span: the default against `mosaic_dense`'s
              # second form (the lagged maximum, O^T in place: a wait and a barrier a step), its first (`plain`), three
              # programs a CTA (`w3`; `w3_half` on half the SMs) and three slots (`s3`)
    v=mosaic_default,mosaic_dense,mosaic_dense_plain,mosaic_dense_w3,mosaic_dense_w3_half,mosaic_dense_s3
    for t in 32768 16384; do
      timeout 120 python benchmarks/decode_attention.py --variant-shape 8,$t --variant-plans mix --no-sweep \
        --variants $v --inner 1 --back-to-back 64 --gpu-time --out "$out" --tag ${tag}_dense2_b8_t$t \
        || echo "(stopped: dense2_s53 $t)"
    done ;;
  last_s53)  # (s53) on an H200 `bars_serial_s52` (issue 5's 32k rows, serial graph) first; then `dense2_s53`
    if nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200; then "$0" bars_serial_s52; fi
    "$0" dense2_s53 || echo "(stopped: last_s53, dense2_s53)" ;;
  first_s53)  # (s53) `dense_s53`, then on an H100 `between_s53` (an H200 runs `h200_s52` in a call of its own)
    "$0" dense_s53 || echo "(stopped: first_s53, dense_s53)"
    nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200 || "$0" between_s53 ;;
  h200_s52)  # (s52, an H200, ~8 min) `h200_s50` (the bars' rows under the concurrent graph, issue 6's 32 x 100 row),
             # then `bars_serial_s52`
    "$0" h200_s50 || echo "(stopped: h200_s52, h200_s50)"
    "$0" bars_serial_s52 || echo "(stopped: h200_s52, bars_serial_s52)" ;;
  half_wg5)  # (s48) on half the SMs (batch 16: 64 CTAs) and the full machine, 19,200 tokens (a multiple of 4 and 5
             # steps): the default (4 warpgroups a CTA, 4 splits) against five warpgroups (5 splits)
    timeout 150 python -m benchmarks.mosaic_int2_bench --tokens 19200 --splits 4 --out "$out" --batches 16 32 \
      --variants wg4_large_batch_ftz_lean_folded_eight_narrow_both_spread_vldsm \
      wg5_large_batch_ftz_lean_folded_eight_narrow_both_spread_vldsm --tag mosaic_int2_${tag}_half_wg5 \
      || echo "(stopped: half_wg5)" ;;
  half_paired)  # (s48) on half the SMs and the full machine: the default with a block's two steps under one softmax
                # (`paired_steps` with both wgmmas narrow and V by ldmatrix; 724 SASS a 128 keys against 2 x 434)
    base=wg4_large_batch_ftz_lean_folded_eight_narrow_both_spread_vldsm
    timeout 120 python -m benchmarks.mosaic_int2_bench --tokens 19968 --splits 4 --out "$out" --batches 16 32 60 \
      --variants $base ${base}_paired --tag mosaic_int2_${tag}_half_paired || echo "(stopped: half_paired)" ;;
  h200_s48_min)  # (s48, an H200 with ~5 minutes of budget) the INT2 kernel at batch 32 and 60: the default, s47's
                 # and both conversions knocked out (float64 checks first); the 7B step at 32 x 100 under "pallas":
                 # fp16, windowquant, C and kivi2
    base=wg4_large_batch_ftz_lean_folded_eight_narrow_both_spread
    timeout 90 python -m benchmarks.mosaic_int2_bench --tokens 19968 --splits 4 --out "$out" --batches 32 60 \
      --variants ${base}_vldsm $base ${base}_ko_both --tag mosaic_int2_${tag}_h200_min \
      || echo "(stopped: h200_s48_min, kernels)"
    XLA_PYTHON_CLIENT_MEM_FRACTION=0.95 timeout 200 python -m benchmarks.decode_throughput --settings 32x100 \
      --attention pallas --methods fp16 windowquant C kivi2 --out "$out" --budget-s 170 --tag ${tag}_h200_min_step \
      || echo "(stopped: h200_s48_min, 32 x 100)" ;;
  h200_steps)  # (s46, an H200's second call, after h200_next) issue 6's 7B step at 32 x 100: fp16, windowquant, kivi2
               # and C under "pallas", warp 0's copies (spread the default since s47), 4 stages and KIVI's 16-wide
               # scores (~6 min)
    XLA_PYTHON_CLIENT_MEM_FRACTION=0.95 timeout 560 python -m benchmarks.decode_throughput --settings 32x100 \
      --attention pallas pallas:mosaic_warp0_copies pallas:mosaic_stages4 pallas:mosaic_kivi_wide \
      --methods fp16 windowquant kivi2 C --out "$out" --budget-s 500 --tag ${tag}_h200_steps \
      || echo "(stopped: h200_steps)" ;;
  h100_next)  # (s46, an H100's one call, ~9 min) `knockout`, then the 7B step at 32 x 100: fp16, windowquant and
              # kivi2 under "pallas", s45's 16-column partials and KIVI's score wgmma 16 wide (s46 ran it with KIVI's
              # narrow scores as "pallas:mosaic_kivi_narrow", before they became the default)
    "$0" knockout || echo "(stopped: h100_next, knockout)"
    XLA_PYTHON_CLIENT_MEM_FRACTION=0.95 timeout 380 python -m benchmarks.decode_throughput --settings 32x100 \
      --attention pallas pallas:mosaic_wide_output pallas:mosaic_kivi_wide --methods fp16 windowquant kivi2 \
      --out "$out" --budget-s 330 --tag ${tag}_h100_step || echo "(stopped: h100_next, step)" ;;
  depth_step)  # (s45) the 7B step at 32 x 100 with 3 and 4 stages (windowquant; fp16 beside for issue 6's ratio)
    XLA_PYTHON_CLIENT_MEM_FRACTION=0.95 timeout 380 python -m benchmarks.decode_throughput --settings 32x100 \
      --attention pallas pallas:mosaic_stages3 pallas:mosaic_stages4 --methods fp16 windowquant --out "$out" \
      --budget-s 340 --tag ${tag}_depth_step || echo "(stopped: depth_step)" ;;
  kivi_narrow)  # (s45) KIVI's INT2 pools with the score wgmma 8 wide (the default since s46) against 16: kivi2's 7B
                # step at 32 x 100 (1.510 x its floor on an H200 in s44; s46 H100: 8 wide 2.8 % faster)
    XLA_PYTHON_CLIENT_MEM_FRACTION=0.95 timeout 300 python -m benchmarks.decode_throughput --settings 32x100 \
      --attention pallas pallas:mosaic_kivi_wide --methods kivi2 --out "$out" --budget-s 260 \
      --tag ${tag}_kivi_narrow || echo "(stopped: kivi_narrow)" ;;
  kivi_check)  # (s46) KIVI's INT2 kernel with the 8-wide score wgmma (the default since s46, timed on an H100 in the 7B
               # step, checked in the interpret mode) against float64 on the device, beside s45's, at batch 32
    timeout 90 python -m benchmarks.mosaic_int2_bench --tokens 19968 --splits 4 --kivi --batches 32 --out "$out" \
      --variants wg4_large_batch_ftz_kivi_eight_scaled_p wg4_large_batch_ftz_kivi_eight_scaled_p_narrow \
      --tag mosaic_kivi_${tag}_narrow_check || echo "(stopped: kivi_check)" ;;
  h200_next)  # (s45; since s46 `kivi_check` and `depth`, ~8 min) KIVI's narrow kernel against float64; the INT2 kernel
              # with 2-4 stages, ldmatrix.trans and paired steps against their bases, spread copies and the knockouts;
              # issue 5's 32k rows at batch 60 and 8 with 3 and 4 stages, spread copies and 16-column partials. Then
              # `h200_steps` on the same machine
    "$0" kivi_check || echo "(stopped: h200_next, kivi_check)"
    "$0" depth || echo "(stopped: h200_next, depth)" ;;
  ncu_h200)  # (s45) the default INT2 kernel and (s46) spread copies under Nsight Compute on an H200 (every ncu profile
             # since s26 was an H100's, where the kernel streams 80 % of the copy): batch 32 x 19,968, 4 splits; the
             # per-scheduler issue counts say whether scheduler 0 carried the copies (s46's reading of the SASS)
    base=wg4_large_batch_ftz_lean_folded_eight_narrow_both
    for v in $base ${base}_spread; do
      timeout 170 python benchmarks/kernel_ncu.py profile --plans mosaic_int2 --kernel kernel_mosaic --variant "$v" \
        --batch 32 --tokens 19968 --splits 4 --out "$out/ncu_h200" --summary || echo "(stopped: ncu $v)"
    done
    tar czf "$out/ncu_mosaic_int2_b32_t19968_${tag}.tgz" -C "$out" --exclude='*.ncu-rep' ncu_h200 ;;
  *) echo "usage: $0 PART, one of:" >&2
     echo "kernels mix overlap step bars small combine combine_step batch8 pool512 h200 vldsm vldsm_step ncu" >&2
     echo "profile kivi profile_small headline two_splits h200_s38 paired warpgroups ncu_s39 narrow h200_s39" >&2
     echo "steps_s39 c_long c_short c_mosaic h200_s42 b8_s43 b8_default cublas triton_first depth depth_step" >&2
     echo "kivi_narrow h200_next ncu_h200 knockout narrow_out h100_next spread h200_steps prefolded h200_s47" >&2
     echo "half_machine half_metadata half_interleaved half_vldsm vldsm_default h200_s48 half_wg5 half_paired h200_s48_min" >&2
     echo "h200_short kivi_check h200_s47 b8_s52 sizes_s52 step_s52 bars_serial_s52" >&2
     echo "h200_s52 between_s53 first_s53 dense_s53 dense2_s53 last_s53" >&2
     exit 2 ;;
esac
