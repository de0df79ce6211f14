#!/bin/bash
# Call S (thirty-first session). On any one GPU, from a checkout of main with .gpu-host carried:
# quant_moe_benchmark's BM_StreamCeiling and BM_QuantMoe at every row (3 repetitions, JSON), then,
# where the GPU is an H200, call N (RESULTS' quantized rows and the K2.5 / V3 steps) in the same
# build. Logs under $OUT/s (and $OUT/n).
set -u
source .gpu-host/env.sh
R=$OUT/s; mkdir -p $R; start=$(date +%s)
pack() { tar czf $OUT/s.tgz -C $OUT s; }
log() { echo "$* $(( $(date +%s) - start )) s" >> $R/log.txt; pack; }
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader > $R/gpu.txt
git log --oneline -1 > $R/head.txt 2>&1
cmake -S . -B build/n -G Ninja -DCMAKE_BUILD_TYPE=Release -DEAGLE3_BUILD_EXAMPLES=OFF -DEAGLE3_BUILD_TESTS=OFF > $R/build.log 2>&1
cmake --build build/n -j16 --target quant_moe_benchmark quant_gemv_benchmark decode_step_benchmark >> $R/build.log 2>&1
log "build rc=$?"
B=build/n/benchmarks
timeout 150 $B/quant_moe_benchmark --benchmark_filter='BM_(StreamCeiling|QuantMoe)/' --benchmark_repetitions=3 \
  --benchmark_report_aggregates_only=true --benchmark_out=$R/quant_moe_benchmark.json > $R/moe.txt 2>&1
log "moe rc=$?"
grep median $R/moe.txt | awk '{print $1, $2, $3}' > $R/medians.txt
if grep -q H200 $R/gpu.txt; then bash benchmarks/pending/call_n.sh; log "call n rc=$?"; fi
log done
