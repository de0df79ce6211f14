#!/bin/bash
# Call P (twenty-first session): the dense shared join at 4 / 8 / 16 tokens with the new MoE
# kernels (BM_MoeDecode V2-Lite TP 1 and V2 TP 8 rank, join 0 / 1).
set -u
source .gpu-host/env.sh
R=$OUT/p; mkdir -p $R
start=$(date +%s)
cmake -S . -B build/gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DEAGLE3_BUILD_TESTS=OFF -DEAGLE3_BUILD_EXAMPLES=OFF > $R/build.log 2>&1 && cmake --build build/gpu -j16 --target decode_ops_benchmark >> $R/build.log 2>&1
echo "build rc=$? $(( $(date +%s) - start )) s"
timeout 60 build/gpu/benchmarks/decode_ops_benchmark --benchmark_filter='BM_MoeDecode/model:[23]/tokens:(4|8|16)/join' --benchmark_repetitions=5 \
  --benchmark_report_aggregates_only=true --benchmark_out=$R/moe_join.json > $R/moe_join.txt 2>&1
echo "moe rc=$? $(( $(date +%s) - start )) s"; grep median $R/moe_join.txt | awk '{print $1, $2, $3}' | sed 's/\/iterations.*manual_time_median//'
echo "done $(( $(date +%s) - start )) s"
