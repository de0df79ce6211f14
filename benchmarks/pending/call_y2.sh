#!/bin/bash
# Call Y2 (thirtieth session), on call Y's warm machine (build/n of branch s30-gpu there): the INT4
# widen without its pair-0 shift (build/n) against the widen before it (build/w0: the tree with
# pending/widen.patch reversed), BM_QuantMoe K2.5 at 1, 4, 16, 64 tokens twice each; then Nsight Compute of
# K2.5's one-token round with clocks as they run (the chain kernel, and the two launches with the
# chain off): the full set, and the per-instruction SASS counters of the chain kernel. Logs under
# $OUT/y2.
set -u
source .gpu-host/env.sh
R=$OUT/y2; mkdir -p $R; start=$(date +%s)
pack() { tar czf $OUT/y2.tgz -C $OUT y2; }
log() { echo "$* $(( $(date +%s) - start )) s" >> $R/log.txt; pack; }
W0=/tmp/w0; rm -rf $W0; mkdir -p $W0; tar cf - --exclude=./build . | tar xf - -C $W0
(cd $W0 && patch -R -p1 < benchmarks/pending/widen.patch > $R/patch.log 2>&1 &&
  cmake -S . -B build/w0 -G Ninja -DCMAKE_BUILD_TYPE=Release -DEAGLE3_BUILD_EXAMPLES=OFF -DEAGLE3_BUILD_TESTS=OFF > $R/b0.log 2>&1 &&
  cmake --build build/w0 -j16 --target quant_moe_benchmark >> $R/b0.log 2>&1); log "build w0 rc=$?"
for rep in 1 2; do for t in n w0; do
  B=build/$t/benchmarks/quant_moe_benchmark; [ $t = w0 ] && B=$W0/$B
  timeout 60 $B --benchmark_filter='BM_QuantMoe/model:0/tokens:(1|4|16|64)/' --benchmark_repetitions=3 --benchmark_report_aggregates_only=true > $R/moe_$t.$rep.txt 2>&1
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
