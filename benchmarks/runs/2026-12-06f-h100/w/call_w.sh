#!/bin/bash
# Call W (twenty-ninth session), run inline on call TU's warm machine (build/u of branch
# moe-chain-round still there): the chain's gate-up ring at 3 steps (build/u3) against 2 (build/u),
# BM_QuantMoe one token twice each; then Nsight Compute --set full of the chain kernel (K2.5, one
# token; clocks as ncu sets them, kernels serialized).
source .gpu-host/env.sh; R=$OUT/w; mkdir -p $R; start=$(date +%s); log() { echo "$* $(( $(date +%s) - start )) s" >> $R/log.txt; }
sed -i "s/constexpr int kChainDepth = [0-9];/constexpr int kChainDepth = 3;/" cuda/quant_gemv_kernels.cu
cmake -S . -B build/u3 -G Ninja -DCMAKE_BUILD_TYPE=Release -DEAGLE3_BUILD_EXAMPLES=OFF -DEAGLE3_BUILD_TESTS=OFF > $R/b3.log 2>&1; cmake --build build/u3 -j16 --target quant_moe_benchmark >> $R/b3.log 2>&1; log "build3 rc=$?"
for rep in 1 2; do for t in u u3; do timeout 40 build/$t/benchmarks/quant_moe_benchmark --benchmark_filter='BM_QuantMoe/model:[01]/tokens:1/' --benchmark_repetitions=3 --benchmark_report_aggregates_only=true > $R/d_$t.$rep.txt 2>&1; log "$t rep $rep $(grep median $R/d_$t.$rep.txt | awk '{print $2}' | tr '\n' ' ')"; done; done
timeout 150 ncu --set full --import-source no -k regex:'QuantGemvChainKernel|QuantGemv' --launch-skip 20 --launch-count 4 build/u/benchmarks/quant_moe_benchmark --benchmark_filter='BM_QuantMoe/model:0/tokens:1/' --benchmark_min_time=0.01s > $R/ncu.txt 2>&1; log "ncu rc=$?"
