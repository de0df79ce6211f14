#!/bin/bash
# Call Y (thirtieth session). On any one GPU (H100 or H200), from a checkout of branch s30-gpu
# (main + review-mends + chain-rowloops) with .gpu-host carried: quant_gemv_test and
# cuda_quantized_moe_test whole (review-mends' grid sizing and shared combine check); the chain's
# down row-loop sweep (call X without call N); the chain at 2 and 3 blocks a multiprocessor
# (EAGLE3_QUANT_CHAIN_BLOCKS); then Nsight Compute of K2.5's one-token round (the
# ... (call Y2 takes the rest). Logs under $OUT/y.
set -u
source .gpu-host/env.sh
R=$OUT/y; mkdir -p $R; start=$(date +%s)
pack() { tar czf $OUT/y.tgz -C $OUT y; }
log() { echo "$* $(( $(date +%s) - start )) s" >> $R/log.txt; pack; }
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader > $R/gpu.txt
cmake -S . -B build/n -G Ninja -DCMAKE_BUILD_TYPE=Release -DEAGLE3_BUILD_EXAMPLES=OFF > $R/build.log 2>&1
cmake --build build/n -j16 --target quant_gemv_test cuda_quantized_moe_test quant_moe_benchmark >> $R/build.log 2>&1
log "build rc=$?"
for t in quant_gemv_test cuda_quantized_moe_test; do
  timeout 200 build/n/tests/$t > $R/$t.txt 2>&1
  log "$t rc=$? $(grep -E '^\[  (PASSED|FAILED) ' $R/$t.txt | tr '\n' ' ')"
done
CALL_N=0 OUT=$OUT bash benchmarks/pending/call_x.sh
EAGLE3_QUANT_CHAIN_BLOCKS=3 timeout 60 build/n/tests/quant_gemv_test --gtest_filter='*Chain*' > $R/chain_b3.txt 2>&1
log "chain test blocks=3 rc=$? $(grep -E '^\[  (PASSED|FAILED) ' $R/chain_b3.txt | tr '\n' ' ')"
for rep in 1 2; do for nb in 2 3; do
  EAGLE3_QUANT_CHAIN_BLOCKS=$nb timeout 40 build/n/benchmarks/quant_moe_benchmark --benchmark_filter='BM_QuantMoe/model:0/tokens:1/' \
    --benchmark_repetitions=3 --benchmark_report_aggregates_only=true > $R/moe_b$nb.$rep.txt 2>&1
  log "moe blocks=$nb rep $rep rc=$? $(grep median $R/moe_b$nb.$rep.txt | awk '{print $2}' | tr '\n' ' ')"
done; done
log done
