#!/bin/bash
# Call F (thirtieth session). On any one GPU, from a checkout of branch chain-fixed-work with
# .gpu-host carried: build/f (the branch) and build/m (main's kernels: the tree with
# pending/fixed-work.patch reversed, in /tmp/m), in parallel; the chain's tests on build/f
# (quant_gemv_test *Chain*: ChainedRound with and without the gated rows; cuda_quantized_moe_test
# *Chain*); BM_QuantMoe K2.5 at 1 and 4 tokens: m, f (gated once), f with EAGLE3_QUANT_CHAIN_GATED=0,
# twice each (the MoE chain test between the two rounds); then the whole gpu suite (SUITE=0: not). Logs under $OUT/f.
set -u
source .gpu-host/env.sh
R=$OUT/f; mkdir -p $R; start=$(date +%s)
pack() { tar czf $OUT/f.tgz -C $OUT f; }
log() { echo "$* $(( $(date +%s) - start )) s" >> $R/log.txt; pack; }
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader > $R/gpu.txt
rm -rf /tmp/m; mkdir -p /tmp/m; tar cf - --exclude=./build . | tar xf - -C /tmp/m
(cd /tmp/m && patch -R -p1 < benchmarks/pending/fixed-work.patch > $R/patch.log 2>&1 &&
  cmake -S . -B build/m -G Ninja -DCMAKE_BUILD_TYPE=Release -DEAGLE3_BUILD_EXAMPLES=OFF -DEAGLE3_BUILD_TESTS=OFF > $R/bm.log 2>&1 &&
  cmake --build build/m -j8 --target quant_moe_benchmark >> $R/bm.log 2>&1; echo "build m rc=$?" >> $R/builds.txt) &
(cmake -S . -B build/f -G Ninja -DCMAKE_BUILD_TYPE=Release -DEAGLE3_BUILD_EXAMPLES=OFF > $R/bf.log 2>&1 &&
  cmake --build build/f -j8 --target quant_gemv_test cuda_quantized_moe_test quant_moe_benchmark >> $R/bf.log 2>&1; echo "build f rc=$?" >> $R/builds.txt) &
wait; log "$(cat $R/builds.txt | tr '\n' ' ')"
timeout 60 build/f/tests/quant_gemv_test --gtest_filter='*Chain*' > $R/gemv_chain.txt 2>&1
log "gemv chain rc=$? $(grep -E '^\[  (PASSED|FAILED) ' $R/gemv_chain.txt | tr '\n' ' ')"
bench() {
  for t in m f f0; do
    B=build/f/benchmarks/quant_moe_benchmark; [ $t = m ] && B=/tmp/m/build/m/benchmarks/quant_moe_benchmark
    env $([ $t = f0 ] && echo EAGLE3_QUANT_CHAIN_GATED=0) timeout 40 $B --benchmark_filter='BM_QuantMoe/model:0/tokens:(1|4)/' \
      --benchmark_repetitions=3 --benchmark_report_aggregates_only=true > $R/moe_$t.$1.txt 2>&1
    log "moe $t rep $1 rc=$? $(grep median $R/moe_$t.$1.txt | awk '{print $2}' | tr '\n' ' ')"
  done
}
bench 1
timeout 60 build/f/tests/cuda_quantized_moe_test --gtest_filter='*Chain*' > $R/moe_chain.txt 2>&1
log "moe chain rc=$? $(grep -E '^\[  (PASSED|FAILED) ' $R/moe_chain.txt | tr '\n' ' ')"
bench 2
# SUITE=0 leaves out the rest: the whole gpu suite on the branch (~60 s more build, ~130 s).
if [ "${SUITE:-1}" = 1 ]; then
  cmake --build build/f -j16 > $R/build_rest.log 2>&1; log "build rest rc=$?"
  scripts/gpu_suite.sh build/f/tests $R/suite --sanitize none --jobs 4 --test-seconds 200 > $R/suite.log 2>&1
  log "suite rc=$?"
  cp $R/suite/summary.txt $R/suite_summary.txt 2>/dev/null; tar czf $OUT/suite.tgz -C $R suite; rm -rf $R/suite; pack
fi
log done
