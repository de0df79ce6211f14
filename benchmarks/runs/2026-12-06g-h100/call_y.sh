#!/bin/bash
# Call Y (thirtieth session). On any one GPU (H100 or H200), from a checkout of branch s30-gpu
# (main + review-mends + chain-rowloops + the session's experiments) with .gpu-host carried:
# 1. quant_gemv_test and cuda_quantized_moe_test whole on build/n (review-mends' grid sizing and
#    shared combine check; the INT4 widen with pair 0 unshifted, EAGLE3_QUANT_INT4_WIDEN=1);
# 2. the same tests on build/w2 (EAGLE3_QUANT_INT4_WIDEN=2: the 12s taken off in the products, not
#    main's bits); build/w0 (=0, main's widen) for the A/B;
# 3. the chain's down row-loop sweep (call X without call N), the chain at 2 and 3 blocks a
#    multiprocessor (EAGLE3_QUANT_CHAIN_BLOCKS), the widen variants (BM_QuantMoe K2.5 at 1, 4, 16,
#    64 tokens, n / w0 / w2 twice each);
# 4. time allowing, Nsight Compute of K2.5's one-token round with clocks as they run: the chain
#    kernel, the two launches with the chain off, and the chain's per-instruction SASS counters.
# Logs under $OUT/y (and $OUT/x from call X).
set -u
source .gpu-host/env.sh
R=$OUT/y; mkdir -p $R; start=$(date +%s)
pack() { tar czf $OUT/y.tgz -C $OUT y; }
log() { echo "$* $(( $(date +%s) - start )) s" >> $R/log.txt; pack; }
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader > $R/gpu.txt
cmake -S . -B build/n -G Ninja -DCMAKE_BUILD_TYPE=Release -DEAGLE3_BUILD_EXAMPLES=OFF > $R/build.log 2>&1
cmake --build build/n -j16 --target quant_gemv_test cuda_quantized_moe_test quant_moe_benchmark >> $R/build.log 2>&1
log "build rc=$?"
for v in 0 2; do
  (cmake -S . -B build/w$v -G Ninja -DCMAKE_BUILD_TYPE=Release -DEAGLE3_BUILD_EXAMPLES=OFF -DCMAKE_CUDA_FLAGS=-DEAGLE3_QUANT_INT4_WIDEN=$v > $R/b$v.log 2>&1 &&
    cmake --build build/w$v -j7 --target quant_moe_benchmark $([ $v = 2 ] && echo quant_gemv_test cuda_quantized_moe_test) >> $R/b$v.log 2>&1; echo "build w$v rc=$?" >> $R/builds.txt) &
done
for t in quant_gemv_test cuda_quantized_moe_test; do
  timeout 200 build/n/tests/$t > $R/$t.txt 2>&1
  log "$t rc=$? $(grep -E '^\[  (PASSED|FAILED) ' $R/$t.txt | tr '\n' ' ')"
done
wait; log "$(cat $R/builds.txt | tr '\n' ' ')"
for t in quant_gemv_test cuda_quantized_moe_test; do
  timeout 200 build/w2/tests/$t > $R/w2_$t.txt 2>&1
  log "w2 $t rc=$? $(grep -E '^\[  (PASSED|FAILED) ' $R/w2_$t.txt | tr '\n' ' ')"
done
CALL_N=0 OUT=$OUT bash benchmarks/pending/call_x.sh
EAGLE3_QUANT_CHAIN_BLOCKS=3 timeout 60 build/n/tests/quant_gemv_test --gtest_filter='*Chain*' > $R/chain_b3.txt 2>&1
log "chain test blocks=3 rc=$? $(grep -E '^\[  (PASSED|FAILED) ' $R/chain_b3.txt | tr '\n' ' ')"
for rep in 1 2; do for nb in 2 3; do
  EAGLE3_QUANT_CHAIN_BLOCKS=$nb timeout 40 build/n/benchmarks/quant_moe_benchmark --benchmark_filter='BM_QuantMoe/model:0/tokens:1/' \
    --benchmark_repetitions=3 --benchmark_report_aggregates_only=true > $R/moe_b$nb.$rep.txt 2>&1
  log "moe blocks=$nb rep $rep rc=$? $(grep median $R/moe_b$nb.$rep.txt | awk '{print $2}' | tr '\n' ' ')"
done; done
for rep in 1 2; do for t in n w0 w2; do
  timeout 60 build/$t/benchmarks/quant_moe_benchmark --benchmark_filter='BM_QuantMoe/model:0/tokens:(1|4|16|64)/' \
    --benchmark_repetitions=3 --benchmark_report_aggregates_only=true > $R/moe_$t.$rep.txt 2>&1
  log "moe $t rep $rep rc=$? $(grep median $R/moe_$t.$rep.txt | awk '{print $2}' | tr '\n' ' ')"
done; done
B=build/n/benchmarks/quant_moe_benchmark
if [ $(( $(date +%s) - start )) -lt 400 ]; then
  timeout 60 ncu --section SourceCounters --section WarpStateStats --section SpeedOfLight --clock-control none -k regex:'QuantGemvChain' \
    --launch-skip 20 --launch-count 1 -o $R/chain $B --benchmark_filter='BM_QuantMoe/model:0/tokens:1/' --benchmark_min_time=0.01s > $R/ncu_src.log 2>&1
  log "ncu src rc=$?"
  timeout 40 ncu -i $R/chain.ncu-rep --page source --print-source sass --csv > $R/chain_sass.csv 2>&1; log "sass rc=$?"
  timeout 20 ncu -i $R/chain.ncu-rep --print-details all > $R/chain_details.txt 2>&1
  gzip -f $R/chain_sass.csv; rm -f $R/chain.ncu-rep; pack
fi
if [ $(( $(date +%s) - start )) -lt 480 ]; then
  timeout 60 ncu --set full --import-source no --clock-control none -k regex:'QuantGemv' --launch-skip 20 --launch-count 1 \
    $B --benchmark_filter='BM_QuantMoe/model:0/tokens:1/' --benchmark_min_time=0.01s > $R/ncu_chain.txt 2>&1; log "ncu chain rc=$?"
fi
log done
