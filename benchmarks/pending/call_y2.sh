#!/bin/bash
# Call Y2 (thirtieth session), on call Y's warm machine (build/n of branch s30-gpu there): the INT4
# widen variants (EAGLE3_QUANT_INT4_WIDEN, a compile definition): 1, pair 0 without its shift
# (build/n); 0, main's (build/w0); 2, the 12s taken off by two more products (build/w2, whose
# quant_gemv_test and cuda_quantized_moe_test run: its sums are not main's bits), BM_QuantMoe K2.5 at
# 1, 4, 16, 64 tokens twice each; then Nsight Compute of
# K2.5's one-token round with clocks as they run (the chain kernel, and the two launches with the
# chain off): the full set, and the per-instruction SASS counters of the chain kernel. Logs under
# $OUT/y2.
set -u
source .gpu-host/env.sh
R=$OUT/y2; mkdir -p $R; start=$(date +%s)
pack() { tar czf $OUT/y2.tgz -C $OUT y2; }
log() { echo "$* $(( $(date +%s) - start )) s" >> $R/log.txt; pack; }
for v in 0 2; do
  (cmake -S . -B build/w$v -G Ninja -DCMAKE_BUILD_TYPE=Release -DEAGLE3_BUILD_EXAMPLES=OFF -DCMAKE_CUDA_FLAGS=-DEAGLE3_QUANT_INT4_WIDEN=$v > $R/b$v.log 2>&1 &&
    cmake --build build/w$v -j8 --target quant_moe_benchmark $([ $v = 2 ] && echo quant_gemv_test cuda_quantized_moe_test) >> $R/b$v.log 2>&1; echo "build w$v rc=$?" >> $R/builds.txt) &
done
wait; log "$(cat $R/builds.txt | tr '\n' ' ')"
for t in quant_gemv_test cuda_quantized_moe_test; do
  timeout 200 build/w2/tests/$t > $R/w2_$t.txt 2>&1
  log "w2 $t rc=$? $(grep -E '^\[  (PASSED|FAILED) ' $R/w2_$t.txt | tr '\n' ' ')"
done
for rep in 1 2; do for t in n w0 w2; do
  timeout 60 build/$t/benchmarks/quant_moe_benchmark --benchmark_filter='BM_QuantMoe/model:0/tokens:(1|4|16|64)/' --benchmark_repetitions=3 --benchmark_report_aggregates_only=true > $R/moe_$t.$rep.txt 2>&1
  log "moe $t rep $rep rc=$? $(grep median $R/moe_$t.$rep.txt | awk '{print $2}' | tr '\n' ' ')"
done; done
B=build/n/benchmarks/quant_moe_benchmark
timeout 120 ncu --set full --import-source no --clock-control none -k regex:'QuantGemv' --launch-skip 20 --launch-count 1 \
  $B --benchmark_filter='BM_QuantMoe/model:0/tokens:1/' --benchmark_min_time=0.01s > $R/ncu_chain.txt 2>&1; log "ncu chain rc=$?"
EAGLE3_BENCH_QUANT_MOE_CHAIN=0 timeout 120 ncu --set full --import-source no --clock-control none -k regex:'QuantGemv' --launch-skip 20 --launch-count 2 \
  $B --benchmark_filter='BM_QuantMoe/model:0/tokens:1/' --benchmark_min_time=0.01s > $R/ncu_two.txt 2>&1; log "ncu two rc=$?"
timeout 120 ncu --section SourceCounters --section WarpStateStats --clock-control none -k regex:'QuantGemvChain' --launch-skip 20 --launch-count 1 \
  -o $R/chain $B --benchmark_filter='BM_QuantMoe/model:0/tokens:1/' --benchmark_min_time=0.01s > $R/ncu_src.log 2>&1; log "ncu src rc=$?"
timeout 60 ncu -i $R/chain.ncu-rep --page source --print-source sass --csv > $R/chain_sass.csv 2>&1; log "sass rc=$?"
gzip -f $R/chain_sass.csv; rm -f $R/chain.ncu-rep
log done
