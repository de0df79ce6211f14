#!/bin/bash
# Call FP3 (thirty-sixth session): fp8-round as merged: the FP8 in-block combine (up to 8 pairs),
# the MoE launcher's pair-bound workspace; the items-past-warps form and the FP8 chain dropped (calls
# FP / FP2). Built here from the carried tree. BM_QuantMoe 1 / 4 tokens, models 0-2, twice, and with
# EAGLE3_BENCH_QUANT_MOE_IN_BLOCK=0 once (main's FP8 path); then quant_gemv_test and
# cuda_quantized_moe_test. ~5 min with the start. Logs: $OUT/fp3 (fp3.tgz).
set -u
source .gpu-host/env.sh
R=$OUT/fp3; mkdir -p $R; start=$(date +%s)
pack() { tar czf $OUT/fp3.tgz -C $OUT fp3; }
log() { echo "$* $(( $(date +%s) - start )) s" >> $R/log.txt; pack; }
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv,noheader > $R/gpu.txt
cmake -S . -B /tmp/b -G Ninja -DCMAKE_BUILD_TYPE=Release -DEAGLE3_ENABLE_CUDA=ON -DEAGLE3_BUILD_EXAMPLES=OFF > $R/build.log 2>&1
cmake --build /tmp/b -j16 --target quant_gemv_test cuda_quantized_moe_test quant_moe_benchmark >> $R/build.log 2>&1
log "build rc=$?"
moe() {  # tag filter [env...]
  local tag=$1 filter=$2; shift 2
  env "$@" timeout 60 /tmp/b/benchmarks/quant_moe_benchmark --benchmark_filter="$filter" --benchmark_repetitions=3 \
    --benchmark_report_aggregates_only=true > $R/moe_$tag.txt 2>&1
  log "moe $tag rc=$? $(grep median $R/moe_$tag.txt | awk '{print $1, $2}' | sed 's/BM_QuantMoe.model://; s/.iterations.*manual_time_median//' | tr '\n' ' ')"
}
moe new.1 'BM_QuantMoe/model:[0-2]/tokens:(1|4)/'
moe nib.1 'BM_QuantMoe/model:[0-2]/tokens:1/' EAGLE3_BENCH_QUANT_MOE_IN_BLOCK=0
moe new.2 'BM_QuantMoe/model:[0-2]/tokens:(1|4)/'
for t in quant_gemv_test cuda_quantized_moe_test; do
  timeout 150 /tmp/b/tests/$t > $R/t_$t.txt 2>&1
  log "$t rc=$? $(grep -E '^\[  (PASSED|FAILED) ' $R/t_$t.txt | tr '\n' ' ')"
done
log done
