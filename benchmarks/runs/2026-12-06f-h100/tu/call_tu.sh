#!/bin/bash
# Call TU (twenty-ninth session): calls T and U in one machine's time (each machine start costs
# minutes). From a checkout of branch moe-chain-round with .gpu-host carried: the whole build; the
# chain's tests (short timeouts: a deadlock shows as a timeout); BM_QuantMoe at 1 / 4 / 8 tokens,
# models 0 and 1, in three configurations of the same binary, each twice: main's round (in-block
# combine off, chain off), moe-tile-combine's (in-block on, chain off) and this branch's (both on);
# the whole gpu suite; BM_QuantMoe at every token count, chain on and off, JSON. Logs under $OUT/u.
set -u
source .gpu-host/env.sh
R=$OUT/u; mkdir -p $R; start=$(date +%s)
pack() { tar czf $OUT/u.tgz -C $OUT u; }
log() { echo "$* $(( $(date +%s) - start )) s" >> $R/log.txt; pack; }
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader > $R/gpu.txt
cmake -S . -B build/u -G Ninja -DCMAKE_BUILD_TYPE=Release -DEAGLE3_BUILD_EXAMPLES=OFF > $R/build.log 2>&1
cmake --build build/u -j16 --target quant_gemv_test cuda_quantized_moe_test quant_moe_benchmark >> $R/build.log 2>&1
log "build rc=$?"
cmake --build build/u -j10 > $R/build_rest.log 2>&1 & BUILD=$!
timeout 60 build/u/tests/quant_gemv_test --gtest_filter='*Chain*' > $R/chain_gemv.txt 2>&1; log "chain gemv rc=$? $(grep -E '^\[  (PASSED|FAILED) ' $R/chain_gemv.txt | tr '\n' ' ')"
timeout 120 build/u/tests/cuda_quantized_moe_test --gtest_filter='*Chain*' > $R/chain_moe.txt 2>&1; log "chain moe rc=$? $(grep -E '^\[  (PASSED|FAILED) ' $R/chain_moe.txt | tr '\n' ' ')"
wait $BUILD; log "build rest rc=$?"
for rep in 1 2; do
  for cfg in "0 0" "1 0" "1 1"; do
    set -- $cfg
    EAGLE3_BENCH_QUANT_MOE_IN_BLOCK=$1 EAGLE3_BENCH_QUANT_MOE_CHAIN=$2 timeout 60 build/u/benchmarks/quant_moe_benchmark \
      --benchmark_filter='BM_QuantMoe/model:[01]/tokens:(1|4|8)/' --benchmark_repetitions=3 \
      --benchmark_report_aggregates_only=true > $R/moe_ib$1_ch$2.$rep.txt 2>&1
    log "moe in_block=$1 chain=$2 rep $rep rc=$? $(grep median $R/moe_ib$1_ch$2.$rep.txt | awk '{print $2}' | tr '\n' ' ')"
  done
done
scripts/gpu_suite.sh build/u/tests $R/suite --sanitize none --jobs 4 --test-seconds 200 > $R/suite.log 2>&1; log "suite rc=$?"
for ch in 1 0; do
  EAGLE3_BENCH_QUANT_MOE_CHAIN=$ch timeout 90 build/u/benchmarks/quant_moe_benchmark --benchmark_filter=BM_QuantMoe \
    --benchmark_repetitions=3 --benchmark_report_aggregates_only=true --benchmark_out=$R/quant_moe_benchmark.chain$ch.json \
    > $R/moe_chain$ch.txt 2>&1; log "moe chain=$ch rc=$? $(grep 'tokens:1/.*median' $R/moe_chain$ch.txt | awk '{print $2}' | tr '\n' ' ')"
done
log done
