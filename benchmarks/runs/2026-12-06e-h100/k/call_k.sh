#!/bin/bash
# Call K (same warm machine as call_j.sh, whose trees it reuses): the whole gpu suite on the tree of
# main and the three branches (rbf; among its binaries quant_gemv_test and cuda_quantized_moe_test
# hold the indexed items, the wide SiLU fold and the direct one-token round to the kernels), then
# Nsight Compute's launch, occupancy, warp-state and memory sections of the kernels of its one-token
# MoE rounds (two, the direct path) with the caches and clocks left as they run (what of each GEMV's
# time is ramp, staging and loads). If a branch is then left out of main, the suite runs once more
# on the merged main. Logs under $OUT/k.
set -u
source .gpu-host/env.sh
R=$OUT/k; mkdir -p $R; start=$(date +%s)
pack() { tar czf $OUT/k.tgz -C $OUT k; }
log() { echo "$* $(( $(date +%s) - start )) s" >> $R/log.txt; pack; }
(cd /tmp/rbf && scripts/gpu_suite.sh /tmp/rbf/b/tests $R/suite --sanitize none --jobs 4 --test-seconds 200) > $R/suite.log 2>&1; log "suite rc=$?"
for m in 0 1; do
  timeout 150 ncu --cache-control none --clock-control none --section LaunchStats --section Occupancy \
    --section WarpStateStats --section MemoryWorkloadAnalysis --section SpeedOfLight --launch-skip 300 --launch-count 3 \
    /tmp/rbf/b/benchmarks/quant_moe_benchmark --benchmark_filter="BM_QuantMoe/model:$m/tokens:1/" --benchmark_repetitions=1 \
    > $R/ncu_moe1_m$m.txt 2> $R/ncu_moe1_m$m.err
  log "ncu model $m rc=$?"
done
log done
