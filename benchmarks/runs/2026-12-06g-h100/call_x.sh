#!/bin/bash
# Call X (twenty-ninth session). On an H200 (needs_h200: the K2.5 and V3 ranks take 87 / 97 GB),
# from a checkout of branch chain-rowloops (main + an experiment's environment variable, unset
# here but for the sweep) with .gpu-host carried: the chained round's down tiles at 1, 2 (the
# chooser's) and 4 row loops (EAGLE3_QUANT_CHAIN_ROW_LOOPS): quant_gemv_test ChainedRound at 1 and
# 4, BM_QuantMoe one token twice each; then call N (RESULTS' quantized rows: BM_QuantMoe,
# BM_QuantGemv tiled, the K2.5 INT4 and V3 FP8 ranks' decode and 8-token verify steps, K2.5's
# decode step with the chain off; CALL_N=0 leaves it out, on an H100). Logs under $OUT/x and $OUT/n.
set -u
source .gpu-host/env.sh
R=$OUT/x; mkdir -p $R; start=$(date +%s)
pack() { tar czf $OUT/x.tgz -C $OUT x; }
log() { echo "$* $(( $(date +%s) - start )) s" >> $R/log.txt; pack; }
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader > $R/gpu.txt
cmake -S . -B build/n -G Ninja -DCMAKE_BUILD_TYPE=Release -DEAGLE3_BUILD_EXAMPLES=OFF > $R/build.log 2>&1
cmake --build build/n -j16 --target quant_gemv_test quant_moe_benchmark $([ "${CALL_N:-1}" = 1 ] && echo quant_gemv_benchmark decode_step_benchmark) >> $R/build.log 2>&1
log "build rc=$?"
for rl in 1 4; do
  EAGLE3_QUANT_CHAIN_ROW_LOOPS=$rl timeout 60 build/n/tests/quant_gemv_test --gtest_filter='*ChainedRound*' > $R/chain_rl$rl.txt 2>&1
  log "chain test rl=$rl rc=$? $(grep -E '^\[  (PASSED|FAILED) ' $R/chain_rl$rl.txt | tr '\n' ' ')"
done
for rep in 1 2; do
  for rl in 0 1 4; do
    EAGLE3_QUANT_CHAIN_ROW_LOOPS=$rl timeout 40 build/n/benchmarks/quant_moe_benchmark --benchmark_filter='BM_QuantMoe/model:0/tokens:1/' \
      --benchmark_repetitions=3 --benchmark_report_aggregates_only=true > $R/moe_rl$rl.$rep.txt 2>&1
    log "moe rl=$rl rep $rep rc=$? $(grep median $R/moe_rl$rl.$rep.txt | awk '{print $2}' | tr '\n' ' ')"
  done
done
if [ "${CALL_N:-1}" = 1 ]; then
  sed -i 's/^cmake -S . -B build\/n .*$//; s/^cmake --build build\/n .*$/true/' benchmarks/pending/call_n.sh
  bash benchmarks/pending/call_n.sh
fi
log done
