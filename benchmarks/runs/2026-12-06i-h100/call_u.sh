#!/bin/bash
# Call U (thirty-first session). On any one GPU, from a checkout of branch chain-l2 with .gpu-host
# carried: call T (the stream's loads-in-flight sweep), then the chain's tests with the L2-ahead
# experiment at its strongest (EAGLE3_QUANT_CHAIN_L2=2) and BM_QuantMoe K2.5 at 1 token with
# EAGLE3_QUANT_CHAIN_L2=0 / 1 / 2, twice. Logs under $OUT/t and $OUT/u.
set -u
bash benchmarks/pending/call_t.sh
source .gpu-host/env.sh
R=$OUT/u; mkdir -p $R; start=$(date +%s)
pack() { tar czf $OUT/u.tgz -C $OUT u; }
log() { echo "$* $(( $(date +%s) - start )) s" >> $R/log.txt; pack; }
cmake --build build/n -j16 --target quant_gemv_test cuda_quantized_moe_test > $R/build.log 2>&1 ||
  { cmake -S . -B build/n -DEAGLE3_BUILD_TESTS=ON >> $R/build.log 2>&1 &&
    cmake --build build/n -j16 --target quant_gemv_test cuda_quantized_moe_test >> $R/build.log 2>&1; }
log "build tests rc=$?"
EAGLE3_QUANT_CHAIN_L2=2 timeout 60 build/n/tests/quant_gemv_test --gtest_filter='*Chain*' > $R/gemv_chain.txt 2>&1
log "gemv chain rc=$? $(grep -E '^\[  (PASSED|FAILED) ' $R/gemv_chain.txt | tr '\n' ' ')"
EAGLE3_QUANT_CHAIN_L2=2 timeout 60 build/n/tests/cuda_quantized_moe_test > $R/moe_test.txt 2>&1
log "moe test rc=$? $(grep -E '^\[  (PASSED|FAILED) ' $R/moe_test.txt | tr '\n' ' ')"
for rep in 1 2; do
  for l2 in 0 1 2; do
    EAGLE3_QUANT_CHAIN_L2=$l2 timeout 40 build/n/benchmarks/quant_moe_benchmark --benchmark_filter='BM_QuantMoe/model:0/tokens:1/' \
      --benchmark_repetitions=3 --benchmark_report_aggregates_only=true > $R/moe_l2$l2.$rep.txt 2>&1
    log "moe l2=$l2 rep $rep rc=$? $(grep median $R/moe_l2$l2.$rep.txt | awk '{print $2}')"
  done
done
log done
