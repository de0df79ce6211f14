#!/bin/bash
# Call CC (thirty-fifth session): call CL first (call_cl.sh: main's and chain-cluster-x.patch's
# carried binaries, BM_QuantMoe K2.5 1 / 4 tokens at cluster 1 / 2 / 4, the chain's tests at 2 and 4),
# then chain-cluster.patch (the cluster path as the default, clusters of 4) applied to this tree,
# built here, and the whole gpu suite on it; then BM_QuantMoe (both models, every token count) on it.
# ~6 min with the machine's start. CC_QUICK=1: only quant_gemv_test and cuda_quantized_moe_test built
# and run (~3.5 min with the start); CC_MOE_FILTER narrows the last benchmark. Logs: $OUT/cl (cl.tgz),
# $OUT/cc (cc.tgz).
set -u
bash benchmarks/pending/call_cl.sh
source .gpu-host/env.sh
R=$OUT/cc; mkdir -p $R; start=$(date +%s)
pack() { tar czf $OUT/cc.tgz -C $OUT cc; }
log() { echo "$* $(( $(date +%s) - start )) s" >> $R/log.txt; pack; }
patch -p1 -s < benchmarks/pending/chain-cluster.patch; log "patch rc=$?"
cmake -S . -B /tmp/b -G Ninja -DCMAKE_BUILD_TYPE=Release -DEAGLE3_ENABLE_CUDA=ON -DEAGLE3_BUILD_EXAMPLES=OFF > $R/build.log 2>&1
# CC_QUICK=1 (a short lease): only the chain's tests and benchmark.
targets= only=
if [ "${CC_QUICK:-0}" = 1 ]; then
  targets="--target quant_gemv_test cuda_quantized_moe_test quant_moe_benchmark"
  only="--only quant_gemv_test,cuda_quantized_moe_test"
fi
cmake --build /tmp/b -j16 $targets >> $R/build.log 2>&1; log "build rc=$?"
scripts/gpu_suite.sh /tmp/b/tests $R/suite $only --sanitize none --jobs 4 --test-seconds 200 > $R/suite.log 2>&1
log "suite rc=$?"; cp $R/suite/summary.txt $R/suite_summary.txt
timeout 120 /tmp/b/benchmarks/quant_moe_benchmark --benchmark_filter="${CC_MOE_FILTER:-BM_QuantMoe}" --benchmark_repetitions=3 \
  --benchmark_report_aggregates_only=true --benchmark_out=$R/quant_moe_benchmark.json > $R/moe.txt 2>&1
log "moe rc=$?"
log done
