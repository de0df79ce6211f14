#!/bin/bash
# Next call for issue 20 (written in the twenty-third session, not yet run): where the grouped
# quantized MoE's two GEMVs wait. Nsight Compute's stall reasons per issued instruction and the
# source-level counters of the gate-up (QuantGemvKernel) and down (QuantGemvRowLoopKernel) GEMVs, K2.5
# INT4 (model 0) and V3 FP8 (model 1) TP 8 ranks at 16 and 64 tokens. From the repository root on
# the GPU host, with .gpu-host carried; logs under $OUT/n.
set -u
source .gpu-host/env.sh
R=$OUT/n; mkdir -p $R
start=$(date +%s)
pack() { tar czf $OUT/n.tgz -C $OUT n; }
cmake -S . -B build/n -G Ninja -DCMAKE_BUILD_TYPE=Release -DEAGLE3_BUILD_TESTS=OFF -DEAGLE3_BUILD_EXAMPLES=OFF > /dev/null &&
  cmake --build build/n -j16 --target quant_moe_benchmark > $R/build.log 2>&1
echo "build rc=$? $(( $(date +%s) - start )) s"
B=build/n/benchmarks
STALLS='regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio'
for c in "0 64" "0 16" "1 64" "1 16"; do
  set -- $c
  timeout 90 ncu --metrics "$STALLS" --section SourceCounters --kernel-name regex:'QuantGemv' --launch-skip 20 \
    --launch-count 2 --print-units base --csv --page raw \
    $B/quant_moe_benchmark --benchmark_filter="BM_QuantMoe/model:$1/tokens:$2/" --benchmark_min_time=0.01s \
    > $R/stalls_m$1_t$2.csv 2>&1
  echo "ncu m$1 t$2 rc=$? $(( $(date +%s) - start )) s"
  gzip -f $R/stalls_m$1_t$2.csv
  pack
done
echo "done $(( $(date +%s) - start )) s"
