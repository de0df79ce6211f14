#!/bin/bash
# Call L (twenty-eighth session). From a checkout of main with .gpu-host carried and, written
# beforehand:
#   git diff main direct-only -- CMakeLists.txt src include cuda tests benchmarks > .gpu-host/do.patch
#   git diff main rowloop-cap -- CMakeLists.txt src include cuda tests benchmarks ':!benchmarks/NOTES.md' > .gpu-host/cap.patch
# Trees: build/m = main (its benchmarks); /tmp/n/b = main + direct-only (one-token MoE rounds in
# two kernels, without the SiLU-fold option) + rowloop-cap (row loops at most 8 steps a warp),
# built whole: the whole gpu suite runs from it, then quant_gemv_benchmark's down shapes and
# BM_QuantMoe on both trees, each twice. Logs under $OUT/l.
set -u
source .gpu-host/env.sh
R=$OUT/l; mkdir -p $R; start=$(date +%s)
pack() { tar czf $OUT/l.tgz -C $OUT l; }
log() { echo "$* $(( $(date +%s) - start )) s" >> $R/log.txt; pack; }
REPO=$(pwd)
nvidia-smi --query-gpu=name --format=csv,noheader > $R/gpu.txt
rm -rf /tmp/n; mkdir -p /tmp/n
cp -r CMakeLists.txt cmake src cuda include benchmarks tools testing tests models examples docs scripts README.md /tmp/n/
(cd /tmp/n && git apply $REPO/.gpu-host/do.patch && git apply $REPO/.gpu-host/cap.patch) && log "patches ok"
cfg() { cmake -S $1 -B $2 -G Ninja -DCMAKE_BUILD_TYPE=Release -DEAGLE3_BUILD_EXAMPLES=OFF "${@:3}" > /dev/null; }
cfg . build/m -DEAGLE3_BUILD_TESTS=OFF; cfg /tmp/n /tmp/n/b
cmake --build /tmp/n/b -j12 > $R/b_n.log 2>&1 & P1=$!
cmake --build build/m -j4 --target quant_gemv_benchmark quant_moe_benchmark > $R/b_m.log 2>&1 & P2=$!
wait $P1; log "n build rc=$?"; wait $P2; log "main build rc=$?"
(cd /tmp/n && scripts/gpu_suite.sh /tmp/n/b/tests $R/suite --sanitize none --jobs 4 --test-seconds 200) > $R/suite.log 2>&1; log "suite rc=$?"
gemv() {
  EAGLE3_BENCH_QUANT_TILED=1 timeout 90 $2/benchmarks/quant_gemv_benchmark --benchmark_filter='BM_QuantGemv/shape:(15|16|17|25|26)/m:(1|8)/' \
    --benchmark_repetitions=3 --benchmark_report_aggregates_only=true > $R/gemv_$1.txt 2>&1; log "gemv $1 rc=$?"
}
moe() {
  timeout 80 $2/benchmarks/quant_moe_benchmark --benchmark_filter='BM_QuantMoe/model:[01]/tokens:(1|4|8|10|12|14|16|64)/' \
    --benchmark_repetitions=3 --benchmark_report_aggregates_only=true > $R/moe_$1.txt 2>&1; log "moe $1 rc=$?"
}
gemv main build/m; gemv n /tmp/n/b
for rep in "" 2; do moe main$rep build/m; moe n$rep /tmp/n/b; done
log done
