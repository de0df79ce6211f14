#!/bin/bash
# Call P (twenty-eighth session, H100): where the direct one-token round's two kernels spend their
# time. Nsight Compute --set full (caches and clocks as they run) of launches 300-301 of main's
# one-token BM_QuantMoe (K2.5 INT4: the gate-up K-split GEMV and the down row loop with the SiLU
# staging and combine folded), details and per-instruction SASS (executions, stall samples); the
# same for V3 FP8 (details only). Logs under $OUT/p.
set -u
source .gpu-host/env.sh
R=$OUT/p; mkdir -p $R; start=$(date +%s)
pack() { tar czf $OUT/p.tgz -C $OUT p; }
log() { echo "$* $(( $(date +%s) - start )) s" >> $R/log.txt; pack; }
nvidia-smi --query-gpu=name --format=csv,noheader > $R/gpu.txt
git log --oneline -1 > $R/head.txt 2>&1
cmake -S . -B build/p -G Ninja -DCMAKE_BUILD_TYPE=Release -DEAGLE3_BUILD_EXAMPLES=OFF -DEAGLE3_BUILD_TESTS=OFF > $R/build.log 2>&1
cmake --build build/p -j16 --target quant_moe_benchmark >> $R/build.log 2>&1; log "build rc=$?"
for m in 0 1; do
  timeout 120 ncu --set full --cache-control none --clock-control none --launch-skip 300 --launch-count 2 -o $R/moe1_m$m \
    build/p/benchmarks/quant_moe_benchmark --benchmark_filter="BM_QuantMoe/model:$m/tokens:1/" --benchmark_repetitions=1 > $R/ncu_m$m.log 2>&1
  log "ncu m$m rc=$?"
  ncu --import $R/moe1_m$m.ncu-rep --page details > $R/moe1_m$m.details.txt 2>&1
  if [ $m = 0 ]; then
    ncu --import $R/moe1_m$m.ncu-rep --page source --csv --print-source sass 2>/dev/null | gzip > $R/moe1_m$m.sass.csv.gz
  fi
  rm -f $R/moe1_m$m.ncu-rep; log "export m$m"
done
log done
