#!/bin/bash
# Call T (thirty-first session). On any one GPU, from a checkout of main with .gpu-host carried:
# BM_StreamCeiling at 1, 4 and 16 tokens of both models with 8 to 256 KiB of loads in flight a
# multiprocessor (EAGLE3_BENCH_STREAM=loads,blocks), 3 repetitions. Logs under $OUT/t.
set -u
source .gpu-host/env.sh
R=$OUT/t; mkdir -p $R; start=$(date +%s)
pack() { tar czf $OUT/t.tgz -C $OUT t; }
log() { echo "$* $(( $(date +%s) - start )) s" >> $R/log.txt; pack; }
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader > $R/gpu.txt
git log --oneline -1 > $R/head.txt 2>&1
cmake -S . -B build/n -G Ninja -DCMAKE_BUILD_TYPE=Release -DEAGLE3_BUILD_EXAMPLES=OFF -DEAGLE3_BUILD_TESTS=OFF > $R/build.log 2>&1
cmake --build build/n -j16 --target quant_moe_benchmark >> $R/build.log 2>&1; log "build rc=$?"
for s in 2,1 4,1 4,2 8,2 8,4 16,4; do
  EAGLE3_BENCH_STREAM=$s timeout 60 build/n/benchmarks/quant_moe_benchmark \
    --benchmark_filter='BM_StreamCeiling/model:[01]/tokens:(1|4|16)/' --benchmark_repetitions=3 \
    --benchmark_report_aggregates_only=true > $R/stream_$s.txt 2>&1
  log "stream $s rc=$? $(grep median $R/stream_$s.txt | awk '{print $2}' | tr '\n' ' ')"
done
log done
