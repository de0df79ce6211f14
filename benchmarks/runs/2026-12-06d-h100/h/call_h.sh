#!/bin/bash
# Call H: main's plan sweep of the 160-224-item gate-up shapes (wk 1, splits 1-8) and Nsight
# Compute's per-kernel times of main's one-token MoE rounds (K2.5 INT4, V3 FP8). Logs under $OUT/h.
set -u
source .gpu-host/env.sh
R=$OUT/h; mkdir -p $R; start=$(date +%s)
pack() { tar czf $OUT/h.tgz -C $OUT h; }
cmake -S . -B build/m -G Ninja -DCMAKE_BUILD_TYPE=Release -DEAGLE3_BUILD_EXAMPLES=OFF -DEAGLE3_BUILD_TESTS=OFF > /dev/null
cmake --build build/m -j16 --target quant_moe_benchmark quant_gemv_benchmark > $R/b_main.log 2>&1; echo "build rc=$? $(( $(date +%s) - start )) s" >> $R/log.txt
EAGLE3_BENCH_QUANT_TILED=1 timeout 150 build/m/benchmarks/quant_gemv_benchmark --benchmark_filter='BM_QuantGemvPlan/shape:(31|32|33|34|35)/m:8/wk:1/' \
  --benchmark_repetitions=3 --benchmark_report_aggregates_only=true > $R/plans.txt 2>&1
echo "plans rc=$? $(( $(date +%s) - start )) s" >> $R/log.txt; pack
for m in 0 1; do
  timeout 120 ncu --metrics gpu__time_duration.sum --csv --launch-skip 300 --launch-count 40 \
    build/m/benchmarks/quant_moe_benchmark --benchmark_filter="BM_QuantMoe/model:$m/tokens:1/" --benchmark_repetitions=1 \
    > $R/ncu_moe1_m$m.csv 2> $R/ncu_moe1_m$m.err
  echo "ncu model $m rc=$? $(( $(date +%s) - start )) s" >> $R/log.txt; pack
done
echo "done $(( $(date +%s) - start )) s" >> $R/log.txt; pack
