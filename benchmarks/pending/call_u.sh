#!/bin/bash
# Call U (twenty-ninth session), from a checkout of the tree to merge with .gpu-host carried: the
# whole build and the whole gpu suite (scripts/gpu_suite.sh), then BM_QuantMoe at every token count
# with the chain on and off (same binary), 3 repetitions, JSON. Logs under $OUT/u; the build stays
# in build/u for call V (call_v.sh) on the same machine.
set -u
source .gpu-host/env.sh
R=$OUT/u; mkdir -p $R; start=$(date +%s)
pack() { tar czf $OUT/u.tgz -C $OUT u; }
log() { echo "$* $(( $(date +%s) - start )) s" >> $R/log.txt; pack; }
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader > $R/gpu.txt
cmake -S . -B build/u -G Ninja -DCMAKE_BUILD_TYPE=Release -DEAGLE3_BUILD_EXAMPLES=OFF > $R/build.log 2>&1
cmake --build build/u -j16 >> $R/build.log 2>&1; log "build rc=$?"
scripts/gpu_suite.sh build/u/tests $R/suite --sanitize none --jobs 4 --test-seconds 200 > $R/suite.log 2>&1; log "suite rc=$?"
for ch in 1 0; do
  EAGLE3_BENCH_QUANT_MOE_CHAIN=$ch timeout 90 build/u/benchmarks/quant_moe_benchmark --benchmark_filter=BM_QuantMoe \
    --benchmark_repetitions=3 --benchmark_report_aggregates_only=true --benchmark_out=$R/quant_moe_benchmark.chain$ch.json \
    > $R/moe_chain$ch.txt 2>&1; log "moe chain=$ch rc=$? $(grep 'tokens:1/.*median' $R/moe_chain$ch.txt | awk '{print $2}' | tr '\n' ' ')"
done
log done
