#!/bin/bash
# Call T9 (thirty-seventh session): branch tile-nine, the in-block combine for 9 items (a block of 9
# warps, a warp an item: V3 / R1 / K2-Instruct's top-8 with the shared expert joined). Built here
# from the carried tree. BM_QuantMoe models 0-2 at 1 / 4 tokens, alternated with
# EAGLE3_BENCH_QUANT_MOE_IN_BLOCK=0 (the counters), twice; Nsight Compute SpeedOfLight / LaunchStats
# of each Quant kernel of model 1 and model 2 at 1 token (where a V3 round's time goes: gate-up or
# down); BM_QuantGemvPlan of the 18- and 16-item gate-up shapes; then quant_gemv_test and
# cuda_quantized_moe_test. ~7 min with the start. Logs: $OUT/t9.
set -u
source .gpu-host/env.sh
R=$OUT/t9; mkdir -p $R; start=$(date +%s)
pack() { tar czf $OUT/t9.tgz -C $OUT t9; }
log() { echo "$* $(( $(date +%s) - start )) s" >> $R/log.txt; pack; }
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv,noheader > $R/gpu.txt
git log --oneline -1 > $R/head.txt 2>&1
cmake -S . -B /tmp/b -G Ninja -DCMAKE_BUILD_TYPE=Release -DEAGLE3_ENABLE_CUDA=ON -DEAGLE3_BUILD_EXAMPLES=OFF > $R/build.log 2>&1
cmake --build /tmp/b -j16 --target quant_gemv_test cuda_quantized_moe_test quant_moe_benchmark quant_gemv_benchmark >> $R/build.log 2>&1
log "build rc=$?"
B=/tmp/b/benchmarks/quant_moe_benchmark
moe() {  # tag filter [env...]
  local tag=$1 filter=$2; shift 2
  env "$@" timeout 60 $B --benchmark_filter="$filter" --benchmark_repetitions=3 \
    --benchmark_report_aggregates_only=true > $R/moe_$tag.txt 2>&1
  log "moe $tag rc=$? $(grep median $R/moe_$tag.txt | awk '{print $1, $2}' | sed 's/BM_QuantMoe.model://; s/.iterations.*manual_time_median//' | tr '\n' ' ')"
}
for r in 1 2; do
  moe new.$r 'BM_QuantMoe/model:[0-2]/tokens:(1|4)/'
  moe nib.$r 'BM_QuantMoe/model:[1-2]/tokens:1/' EAGLE3_BENCH_QUANT_MOE_IN_BLOCK=0
done
prof() {  # tag model [env...]
  local tag=$1 model=$2; shift 2
  env "$@" timeout 120 ncu --section SpeedOfLight --section LaunchStats --kernel-name regex:Quant --launch-skip 8 \
    --launch-count 6 $B --benchmark_filter="BM_QuantMoe/model:$model/tokens:1/" --benchmark_min_time=0.01 \
    > $R/ncu_$tag.txt 2>&1
  log "ncu $tag rc=$? $(grep -E '^  [A-Za-z].*\(|Duration' $R/ncu_$tag.txt | tr -s ' ' | cut -c1-60 | tr '\n' ';')"
}
prof m1 1
prof m2 2
# The 9-pair round's gate-up shape (18 items, 256 rows, K 7168) and K2.5's (16 items) under every
# plan of wk 1-8 and split 1-4: whether the chooser's clusters of 3 are still the fastest.
EAGLE3_BENCH_QUANT_TILED=1 timeout 150 /tmp/b/benchmarks/quant_gemv_benchmark \
  --benchmark_filter='BM_QuantGemvPlan/shape:(21|22)/m:1/' --benchmark_repetitions=3 \
  --benchmark_report_aggregates_only=true > $R/plans.txt 2>&1
log "plans rc=$? $(grep median $R/plans.txt | awk '{print $1, $2}' | sed 's/BM_QuantGemvPlan.shape://; s/.iterations.*manual_time_median//' | tr '\n' ' ')"
for t in quant_gemv_test cuda_quantized_moe_test; do
  timeout 200 /tmp/b/tests/$t > $R/t_$t.txt 2>&1
  log "$t rc=$? $(grep -E '^\[  (PASSED|FAILED) ' $R/t_$t.txt | tr '\n' ' ')"
done
log done
