#!/bin/bash
# Call J (twenty-seventh session, not run: no device time left). From a checkout of main with
# .gpu-host carried and, written beforehand:
#   git diff main rowloop-balance -- CMakeLists.txt src include cuda tests benchmarks > .gpu-host/rb.patch
#   git diff main moe-direct-decode -- CMakeLists.txt src include cuda tests benchmarks > .gpu-host/fd.patch
# (moe-direct-decode is one commit on moe-fold-tokens, one commit on main.)
# Trees: build/m = main (its benchmarks), /tmp/rb/b =
# rowloop-balance (the row loops' groups per warp by the busiest multiprocessor), /tmp/rbf/b = all
# three branches (SiLU-mul folded into verify rounds when EAGLE3_BENCH_QUANT_MOE_FOLD_SILU_TOKENS
# asks; one-token rounds without the slots kernel unless EAGLE3_BENCH_QUANT_MOE_DIRECT=0).
# rowloop-balance's host and GEMV tests; the chosen plans of the down shapes on main and rb; rb's
# explicit row-loop sweep (it does not depend on the chooser); BM_QuantMoe on main, rb, and rbf
# three ways (defaults; the wide fold; direct off), each twice. rbf is built whole: call_k.sh runs
# its GEMV and MoE tests and then the whole gpu suite from it. Logs under $OUT/j.
set -u
source .gpu-host/env.sh
R=$OUT/j; mkdir -p $R; start=$(date +%s)
pack() { tar czf $OUT/j.tgz -C $OUT j; }
log() { echo "$* $(( $(date +%s) - start )) s" >> $R/log.txt; pack; }
REPO=$(pwd)
nvidia-smi --query-gpu=name --format=csv,noheader > $R/gpu.txt
# rbf gets everything the whole suite reads (the shipped models, the examples' sources).
for d in rb rbf; do rm -rf /tmp/$d; mkdir -p /tmp/$d; cp -r CMakeLists.txt cmake src cuda include benchmarks tools testing tests /tmp/$d/; done
cp -r models examples docs scripts README.md /tmp/rbf/
(cd /tmp/rb && git apply $REPO/.gpu-host/rb.patch) && log "rb patch ok"
(cd /tmp/rbf && git apply $REPO/.gpu-host/rb.patch && git apply $REPO/.gpu-host/fd.patch) && log "rbf patches ok"
cfg() { cmake -S $1 -B $2 -G Ninja -DCMAKE_BUILD_TYPE=Release -DEAGLE3_BUILD_EXAMPLES=OFF "${@:3}" > /dev/null; }
cfg . build/m -DEAGLE3_BUILD_TESTS=OFF; cfg /tmp/rb /tmp/rb/b; cfg /tmp/rbf /tmp/rbf/b
cmake --build /tmp/rb/b -j4 --target quant_gemv_benchmark quant_moe_benchmark quant_gemv_plan_test quant_gemv_test \
  > $R/b_rb.log 2>&1 & P1=$!
cmake --build /tmp/rbf/b -j8 > $R/b_rbf.log 2>&1 & P2=$!
cmake --build build/m -j4 --target quant_gemv_benchmark quant_moe_benchmark > $R/b_m.log 2>&1 & P3=$!
wait $P1; log "rb build rc=$?"; wait $P2; log "rbf build rc=$?"; wait $P3; log "main build rc=$?"
t() { timeout 200 /tmp/rb/b/tests/$1 > $R/rb_$1.txt 2>&1; log "rb $1 rc=$? $(grep -E '^\[  (PASSED|FAILED) ' $R/rb_$1.txt | tr '\n' ' ')"; }
t quant_gemv_plan_test; t quant_gemv_test
gemv() {
  EAGLE3_BENCH_QUANT_TILED=1 timeout 90 $2/benchmarks/quant_gemv_benchmark --benchmark_filter='BM_QuantGemv/shape:(15|16|17|25|26)/m:(1|8)/' \
    --benchmark_repetitions=3 --benchmark_report_aggregates_only=true > $R/gemv_$1.txt 2>&1; log "gemv $1 rc=$?"
}
gemv main build/m; gemv rb /tmp/rb/b
EAGLE3_BENCH_QUANT_TILED=1 timeout 150 /tmp/rb/b/benchmarks/quant_gemv_benchmark \
  --benchmark_filter='BM_QuantGemvRowLoop/shape:(16|17|25|26)/m:8/loops:([0-9]|1[0-6])/' \
  --benchmark_repetitions=3 --benchmark_report_aggregates_only=true > $R/rowloops.txt 2>&1; log "rowloops rc=$?"
moe() {  # name, tree, then VAR=value settings for the run
  env "${@:3}" timeout 60 $2/benchmarks/quant_moe_benchmark --benchmark_filter='BM_QuantMoe/model:[01]/tokens:(1|4|8|12|16|64)/' \
    --benchmark_repetitions=3 --benchmark_report_aggregates_only=true > $R/moe_$1.txt 2>&1; log "moe $1 rc=$?"
}
for rep in "" 2; do
  moe main$rep build/m; moe rb$rep /tmp/rb/b; moe rbf$rep /tmp/rbf/b
  moe rbf_wide$rep /tmp/rbf/b EAGLE3_BENCH_QUANT_MOE_FOLD_SILU_TOKENS=64
  moe rbf_staged$rep /tmp/rbf/b EAGLE3_BENCH_QUANT_MOE_DIRECT=0
done
log done
