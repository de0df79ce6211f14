#!/bin/bash
# Call Q (twenty-eighth session, H200, the device time left): RESULTS' quantized MoE rows at main
# (the direct one-token round, the row-loop cap): quant_moe_benchmark BM_QuantMoe, 3 repetitions,
# JSON. Logs under $OUT/q.
set -u
source .gpu-host/env.sh
R=$OUT/q; mkdir -p $R; start=$(date +%s)
pack() { tar czf $OUT/q.tgz -C $OUT q; }
log() { echo "$* $(( $(date +%s) - start )) s" >> $R/log.txt; pack; }
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader > $R/gpu.txt
grep -n "kRowLoopSteps = " cuda/quant_gemv_plan.cc > $R/tree.txt; grep -c "direct_one_token" cuda/quant_moe_kernels.cu >> $R/tree.txt
cmake -S . -B build/q -G Ninja -DCMAKE_BUILD_TYPE=Release -DEAGLE3_BUILD_EXAMPLES=OFF -DEAGLE3_BUILD_TESTS=OFF > $R/build.log 2>&1
cmake --build build/q -j16 --target quant_moe_benchmark >> $R/build.log 2>&1; log "build rc=$?"
timeout 60 build/q/benchmarks/quant_moe_benchmark --benchmark_filter=BM_QuantMoe --benchmark_repetitions=3 \
  --benchmark_report_aggregates_only=true --benchmark_out=$R/quant_moe_benchmark.json > $R/moe.txt 2>&1; log "moe rc=$?"
log done
