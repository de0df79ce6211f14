#!/bin/bash
# Call T (twenty-ninth session). From a checkout of branch moe-chain-round with .gpu-host carried:
# the chain's tests (short timeouts: a deadlock shows as a timeout; the whole suite is call U's);
# BM_QuantMoe at 1 / 4 / 8 tokens, models 0 and 1, in three
# configurations of the same binary, each twice: main's round (in-block combine off, chain off),
# moe-tile-combine's (in-block on, chain off) and this branch's (both on); then the one-token
# gate-up shapes' plan sweep (call R's). Logs under $OUT/t.
set -u
source .gpu-host/env.sh
R=$OUT/t; mkdir -p $R; start=$(date +%s)
pack() { tar czf $OUT/t.tgz -C $OUT t; }
log() { echo "$* $(( $(date +%s) - start )) s" >> $R/log.txt; pack; }
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader > $R/gpu.txt
cmake -S . -B build/t -G Ninja -DCMAKE_BUILD_TYPE=Release -DEAGLE3_BUILD_EXAMPLES=OFF > $R/build.log 2>&1
cmake --build build/t -j16 --target quant_gemv_test cuda_quantized_moe_test quant_moe_benchmark quant_gemv_benchmark >> $R/build.log 2>&1
log "build rc=$?"
timeout 60 build/t/tests/quant_gemv_test --gtest_filter='*Chain*' > $R/chain_gemv.txt 2>&1; log "chain gemv rc=$? $(grep -E '^\[  (PASSED|FAILED) ' $R/chain_gemv.txt | tr '\n' ' ')"
timeout 120 build/t/tests/cuda_quantized_moe_test --gtest_filter='*Chain*' > $R/chain_moe.txt 2>&1; log "chain moe rc=$? $(grep -E '^\[  (PASSED|FAILED) ' $R/chain_moe.txt | tr '\n' ' ')"
for cfg in "0 0" "1 0" "1 1"; do
  set -- $cfg
  for rep in 1 2; do
    EAGLE3_BENCH_QUANT_MOE_IN_BLOCK=$1 EAGLE3_BENCH_QUANT_MOE_CHAIN=$2 timeout 60 build/t/benchmarks/quant_moe_benchmark \
      --benchmark_filter='BM_QuantMoe/model:[01]/tokens:(1|4|8)/' --benchmark_repetitions=3 \
      --benchmark_report_aggregates_only=true > $R/moe_ib$1_ch$2.$rep.txt 2>&1
    log "moe in_block=$1 chain=$2 rep $rep rc=$? $(grep median $R/moe_ib$1_ch$2.$rep.txt | awk '{print $2}' | tr '\n' ' ')"
  done
done
EAGLE3_BENCH_QUANT_TILED=1 timeout 60 build/t/benchmarks/quant_gemv_benchmark --benchmark_filter='BM_QuantGemvPlan/shape:(21|22)/m:1/' \
  --benchmark_repetitions=3 --benchmark_report_aggregates_only=true > $R/plans_1row.txt 2>&1; log "plans rc=$?"
# The chain's gate-up ring at 3 steps (ptxas spills 72 bytes): BM_QuantMoe K2.5 one token.
for d in 3; do
  sed -i "s/constexpr int kChainDepth = [0-9];/constexpr int kChainDepth = $d;/" cuda/quant_gemv_kernels.cu
  cmake -S . -B build/t$d -G Ninja -DCMAKE_BUILD_TYPE=Release -DEAGLE3_BUILD_EXAMPLES=OFF -DEAGLE3_BUILD_TESTS=OFF > $R/build$d.log 2>&1
  cmake --build build/t$d -j16 --target quant_moe_benchmark >> $R/build$d.log 2>&1; log "build depth $d rc=$?"
  for rep in 1 2; do
    timeout 60 build/t$d/benchmarks/quant_moe_benchmark --benchmark_filter='BM_QuantMoe/model:[01]/tokens:1/' \
      --benchmark_repetitions=3 --benchmark_report_aggregates_only=true > $R/moe_depth$d.$rep.txt 2>&1
    log "moe depth $d rep $rep rc=$? $(grep median $R/moe_depth$d.$rep.txt | awk '{print $2}' | tr '\n' ' ')"
  done
done
log done
