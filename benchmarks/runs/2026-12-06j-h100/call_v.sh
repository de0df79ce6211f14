#!/bin/bash
# Call V (thirty-first session). On any one GPU, from a checkout of branch chain-trace with .gpu-host
# carried: BM_QuantMoe K2.5 one token with the chain's per-block %globaltimer trace of the last
# launch written to $OUT/v/trace.0.1 (EAGLE3_BENCH_CHAIN_TRACE), three runs. Logs under $OUT/v.
set -u
source .gpu-host/env.sh
R=$OUT/v; mkdir -p $R; start=$(date +%s)
pack() { tar czf $OUT/v.tgz -C $OUT v; }
log() { echo "$* $(( $(date +%s) - start )) s" >> $R/log.txt; pack; }
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader > $R/gpu.txt
cmake -S . -B build/v -G Ninja -DCMAKE_BUILD_TYPE=Release -DEAGLE3_BUILD_EXAMPLES=OFF -DEAGLE3_BUILD_TESTS=OFF > $R/build.log 2>&1
cmake --build build/v -j16 --target quant_moe_benchmark >> $R/build.log 2>&1; log "build rc=$?"
for i in 1 2 3; do
  EAGLE3_BENCH_CHAIN_TRACE=$R/trace$i timeout 40 build/v/benchmarks/quant_moe_benchmark \
    --benchmark_filter='BM_QuantMoe/model:0/tokens:1/' --benchmark_repetitions=3 --benchmark_report_aggregates_only=true \
    > $R/moe$i.txt 2>&1
  log "moe $i rc=$? $(grep median $R/moe$i.txt | awk '{print $2}')"
done
rm -f $R/build.log; log done
