#!/bin/bash
# Call V3 (written in the thirty-sixth session, not run yet): where a V3 FP8 decode round's time goes,
# 8 pairs (BM_QuantMoe model 1: in-block combine, 24.7 us on an H100) against 9 pairs (model 2: the
# shared expert joined, counters, 29.2 us), to choose the next step for the 9-pair round (a block of
# more warps for the in-block form, the ninth pair's rows as their own tiles, or the gate-up
# product). Nsight Compute (serialized) SpeedOfLight and LaunchStats of every kernel of 3 calls at
# 1 token, each model; then the same with EAGLE3_BENCH_QUANT_MOE_IN_BLOCK=0 for model 1. Built
# here from main. ~3 min with the start. Logs: $OUT/v3 (v3.tgz).
set -u
source .gpu-host/env.sh
R=$OUT/v3; mkdir -p $R; start=$(date +%s)
pack() { tar czf $OUT/v3.tgz -C $OUT v3; }
log() { echo "$* $(( $(date +%s) - start )) s" >> $R/log.txt; pack; }
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv,noheader > $R/gpu.txt
cmake -S . -B /tmp/b -G Ninja -DCMAKE_BUILD_TYPE=Release -DEAGLE3_ENABLE_CUDA=ON -DEAGLE3_BUILD_EXAMPLES=OFF \
  -DEAGLE3_BUILD_TESTS=OFF > $R/build.log 2>&1
cmake --build /tmp/b -j16 --target quant_moe_benchmark >> $R/build.log 2>&1; log "build rc=$?"
B=/tmp/b/benchmarks/quant_moe_benchmark
prof() {  # tag model [env...]
  local tag=$1 model=$2; shift 2
  env "$@" timeout 120 ncu --section SpeedOfLight --section LaunchStats --kernel-name regex:Quant --launch-skip 8 --launch-count 6 \
    $B --benchmark_filter="BM_QuantMoe/model:$model/tokens:1/" --benchmark_min_time=0.01 > $R/ncu_$tag.txt 2>&1
  log "ncu $tag rc=$? $(grep -E '^  [A-Za-z].*\(|Duration' $R/ncu_$tag.txt | tr -s ' ' | cut -c1-60 | tr '\n' ';')"
}
prof m1 1
prof m2 2
prof m1_counters 1 EAGLE3_BENCH_QUANT_MOE_IN_BLOCK=0
log done
