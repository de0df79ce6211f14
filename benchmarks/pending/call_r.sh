#!/bin/bash
# Call R (written in the twenty-eighth session, not run: no device time left). From a checkout of
# branch moe-tile-combine with .gpu-host carried: its GEMV and MoE tests, then BM_QuantMoe at one
# token with the in-block combine off and on (EAGLE3_BENCH_QUANT_MOE_IN_BLOCK, the same binary),
# each twice, with 4 / 8 tokens (unchanged expected); then the one-token gate-up shapes' plan sweep
# (BM_QuantGemvPlan shapes 21 / 22 at m 1: whether a plan without clusters, wk 8 split 1, now beats
# the chosen wk 4 split 2, whose cluster barriers took 18 % of call P's samples). Logs under $OUT/r.
set -u
source .gpu-host/env.sh
R=$OUT/r; mkdir -p $R; start=$(date +%s)
pack() { tar czf $OUT/r.tgz -C $OUT r; }
log() { echo "$* $(( $(date +%s) - start )) s" >> $R/log.txt; pack; }
nvidia-smi --query-gpu=name --format=csv,noheader > $R/gpu.txt
grep -c "kTileCombine" cuda/quant_gemv_kernels.cu > $R/tree.txt
cmake -S . -B build/r -G Ninja -DCMAKE_BUILD_TYPE=Release -DEAGLE3_BUILD_EXAMPLES=OFF > $R/build.log 2>&1
cmake --build build/r -j16 --target quant_gemv_test cuda_quantized_moe_test quant_moe_benchmark quant_gemv_benchmark >> $R/build.log 2>&1
log "build rc=$?"
for t in quant_gemv_test cuda_quantized_moe_test; do
  timeout 200 build/r/tests/$t > $R/$t.txt 2>&1; log "$t rc=$? $(grep -E '^\[  (PASSED|FAILED) ' $R/$t.txt | tr '\n' ' ')"
done
for rep in 1 2; do
  for v in 0 1; do
    EAGLE3_BENCH_QUANT_MOE_IN_BLOCK=$v timeout 60 build/r/benchmarks/quant_moe_benchmark \
      --benchmark_filter='BM_QuantMoe/model:[01]/tokens:(1|4|8)/' --benchmark_repetitions=3 \
      --benchmark_report_aggregates_only=true > $R/moe_inblock$v.$rep.txt 2>&1
    log "moe in_block=$v rep $rep rc=$? $(grep median $R/moe_inblock$v.$rep.txt | awk '{print $2}' | tr '\n' ' ')"
  done
done
EAGLE3_BENCH_QUANT_TILED=1 timeout 60 build/r/benchmarks/quant_gemv_benchmark --benchmark_filter='BM_QuantGemvPlan/shape:(21|22)/m:1/' \
  --benchmark_repetitions=3 --benchmark_report_aggregates_only=true > $R/plans_1row.txt 2>&1; log "plans rc=$?"
log done
