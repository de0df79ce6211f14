#!/bin/bash
# Call M (twenty-eighth session): call L ran from a checkout of rowloop-cap, so its "main" tree was
# rowloop-cap and its second patch did not apply (its n tree is rowloop-cap + direct-only). This
# is the row-loop cap's A/B from a checkout of main: build/m = main, /tmp/c = main + cap.patch,
# each twice. Logs under $OUT/m.
set -u
source .gpu-host/env.sh
R=$OUT/m; mkdir -p $R; start=$(date +%s)
pack() { tar czf $OUT/m.tgz -C $OUT m; }
log() { echo "$* $(( $(date +%s) - start )) s" >> $R/log.txt; pack; }
REPO=$(pwd)
nvidia-smi --query-gpu=name --format=csv,noheader > $R/gpu.txt
git -C $REPO log --oneline -1 > $R/head.txt 2>&1
grep -n "kRowLoopSteps = " cuda/quant_gemv_plan.cc >> $R/head.txt
rm -rf /tmp/c; mkdir -p /tmp/c
cp -r CMakeLists.txt cmake src cuda include benchmarks tools testing tests /tmp/c/
(cd /tmp/c && git apply $REPO/.gpu-host/cap.patch) && log "patch ok"
grep -n "kRowLoopSteps = " /tmp/c/cuda/quant_gemv_plan.cc >> $R/head.txt
cfg() { cmake -S $1 -B $2 -G Ninja -DCMAKE_BUILD_TYPE=Release -DEAGLE3_BUILD_EXAMPLES=OFF "${@:3}" > /dev/null; }
cfg . build/m -DEAGLE3_BUILD_TESTS=OFF; cfg /tmp/c /tmp/c/b
cmake --build /tmp/c/b -j8 --target quant_gemv_benchmark quant_moe_benchmark quant_gemv_plan_test > $R/b_c.log 2>&1 & P1=$!
cmake --build build/m -j8 --target quant_gemv_benchmark quant_moe_benchmark > $R/b_m.log 2>&1 & P2=$!
wait $P1; log "c build rc=$?"; wait $P2; log "main build rc=$?"
/tmp/c/b/tests/quant_gemv_plan_test > $R/c_plan_test.txt 2>&1; log "plan test rc=$?"
gemv() {
  EAGLE3_BENCH_QUANT_TILED=1 timeout 90 $2/benchmarks/quant_gemv_benchmark --benchmark_filter='BM_QuantGemv/shape:(15|16|17|25|26)/m:(1|8)/' \
    --benchmark_repetitions=3 --benchmark_report_aggregates_only=true > $R/gemv_$1.txt 2>&1; log "gemv $1 rc=$?"
}
moe() {
  timeout 80 $2/benchmarks/quant_moe_benchmark --benchmark_filter='BM_QuantMoe/model:[01]/tokens:(1|4|8|10|12|14|16|64)/' \
    --benchmark_repetitions=3 --benchmark_report_aggregates_only=true > $R/moe_$1.txt 2>&1; log "moe $1 rc=$?"
}
gemv main build/m; gemv c /tmp/c/b
for rep in "" 2; do moe main$rep build/m; moe c$rep /tmp/c/b; done
log done
