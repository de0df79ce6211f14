#!/bin/bash
# Call SE (thirty-seventh session), from branch scales-early: EAGLE3_EXP_SCALES_EARLY=1 stages fp8's
# scale rows before the programmatic wait (the first tile's, in both GEMV kernels), the same values
# in the same places: the same bits. Built here from the carried tree. BM_QuantMoe V3 models 1-2 at
# 1 / 4 tokens and BM_QuantGemv's one-row FP8 shapes, off / on alternated twice; then
# quant_gemv_test with it on. ~4 min with the start. Logs: $OUT/se (se.tgz).
set -u
source .gpu-host/env.sh
R=$OUT/se; mkdir -p $R; start=$(date +%s)
pack() { tar czf $OUT/se.tgz -C $OUT se; }
log() { echo "$* $(( $(date +%s) - start )) s" >> $R/log.txt; pack; }
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv,noheader > $R/gpu.txt
git log --oneline -1 > $R/head.txt 2>&1
cmake -S . -B /tmp/b -G Ninja -DCMAKE_BUILD_TYPE=Release -DEAGLE3_ENABLE_CUDA=ON -DEAGLE3_BUILD_EXAMPLES=OFF > $R/build.log 2>&1
cmake --build /tmp/b -j16 --target quant_gemv_test quant_moe_benchmark quant_gemv_benchmark >> $R/build.log 2>&1
log "build rc=$?"
sed_names() { sed 's/BM_Quant[A-Za-z]*.\(model\|shape\)://; s/.iterations.*manual_time_median//'; }
run() {  # tag [env...]
  local tag=$1; shift
  env "$@" timeout 40 /tmp/b/benchmarks/quant_moe_benchmark --benchmark_filter='BM_QuantMoe/model:[1-2]/tokens:(1|4)/' \
    --benchmark_repetitions=3 --benchmark_report_aggregates_only=true > $R/moe_$tag.txt 2>&1
  env EAGLE3_BENCH_QUANT_TILED=1 "$@" timeout 40 /tmp/b/benchmarks/quant_gemv_benchmark \
    --benchmark_filter='BM_QuantGemv/shape:(0|2|5|21)/m:1/' > $R/gemv_$tag.txt 2>&1
  log "$tag $(cat $R/moe_$tag.txt $R/gemv_$tag.txt | grep median | awk '{print $1, $2}' | sed_names | tr '\n' ' ')"
}
for r in 1 2; do run off.$r; run on.$r EAGLE3_EXP_SCALES_EARLY=1; done
EAGLE3_EXP_SCALES_EARLY=1 timeout 150 /tmp/b/tests/quant_gemv_test > $R/t_on.txt 2>&1
log "quant_gemv_test (on) rc=$? $(grep -E '^\[  (PASSED|FAILED) ' $R/t_on.txt | tr '\n' ' ')"
log done
