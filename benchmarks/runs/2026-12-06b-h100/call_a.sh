#!/bin/bash
# Twenty-fifth session, call A, from a checkout of moe-planned-items (= int4-scale-after + planned
# items) with .gpu-host/int4.patch (main..int4-scale-after) and .gpu-host/planned.patch
# (int4-scale-after..moe-planned-items) written. Builds: build/i (top, whole tree: call B's suite),
# /tmp/br (branch = top - planned), /tmp/main (main = branch - int4), /tmp/il (branch + interleave),
# /tmp/r3 (top + rowloop-3blocks.patch). Logs under $OUT/a.
set -u
source .gpu-host/env.sh
R=$OUT/a; mkdir -p $R
start=$(date +%s)
pack() { tar czf $OUT/a.tgz -C $OUT a; }
REPO=$(pwd)
nvidia-smi --query-gpu=name --format=csv,noheader | tee $R/gpu.txt
for d in br main il r3; do rm -rf /tmp/$d; mkdir -p /tmp/$d; cp -r CMakeLists.txt cmake src cuda include benchmarks tools testing tests /tmp/$d/; [ $d = r3 ] || (cd /tmp/$d && git apply -R $REPO/.gpu-host/planned.patch) || echo "$d planned -R failed"; done
(cd /tmp/main && git apply -R $REPO/.gpu-host/int4.patch) && echo "main patch ok"
(cd /tmp/il && git apply $REPO/benchmarks/pending/int4-interleave.patch) && echo "interleave patch ok"
(cd /tmp/r3 && git apply $REPO/benchmarks/pending/rowloop-3blocks.patch) && echo "r3 patch ok"
cfg() { cmake -S $1 -B $2 -G Ninja -DCMAKE_BUILD_TYPE=Release -DEAGLE3_BUILD_EXAMPLES=OFF "${@:3}" > /dev/null; }
cfg . build/i; for d in br main il; do cfg /tmp/$d /tmp/$d/b -DEAGLE3_BUILD_TESTS=OFF; done; cfg /tmp/r3 /tmp/r3/b
cmake --build build/i -j8 > $R/b_top.log 2>&1 & P0=$!
for d in br main il; do cmake --build /tmp/$d/b -j2 --target quant_moe_benchmark quant_gemv_benchmark > $R/b_$d.log 2>&1 & done
cmake --build /tmp/r3/b -j2 --target quant_moe_benchmark quant_gemv_benchmark quant_gemv_test > $R/b_r3.log 2>&1 &
wait $P0; echo "top build rc=$? $(( $(date +%s) - start )) s"; wait; echo "all builds done $(( $(date +%s) - start )) s"
for d in br main il r3; do [ -x /tmp/$d/b/benchmarks/quant_moe_benchmark ] || { echo "$d build failed:"; tail -5 $R/b_$d.log; }; done
moe() {
  timeout 60 $2/benchmarks/quant_moe_benchmark --benchmark_filter='BM_QuantMoe/model:[01]/tokens:(1|4|8|16|64)/' --benchmark_repetitions=3 \
    --benchmark_report_aggregates_only=true > $R/moe_$1.txt 2>&1
  echo "moe $1 rc=$? $(( $(date +%s) - start )) s"; grep median $R/moe_$1.txt | awk '{print $1, $2}' | sed 's/BM_QuantMoe\/model://; s/\/iterations.*manual_time_median//' | tr '\n' ';'; echo; pack
}
moe main /tmp/main/b; moe branch /tmp/br/b; moe planned build/i; moe interleave /tmp/il/b; moe r3 /tmp/r3/b; moe main2 /tmp/main/b; moe branch2 /tmp/br/b; moe planned2 build/i; moe r3b /tmp/r3/b
EAGLE3_BENCH_QUANT_TILED=1 timeout 150 build/i/benchmarks/quant_gemv_benchmark --benchmark_filter='BM_QuantGemvPlan/shape:(19|24|27|28|29|30)/m:8/wk:[12]/' \
  --benchmark_repetitions=3 --benchmark_report_aggregates_only=true > $R/plans.txt 2>&1
echo "plans rc=$? $(( $(date +%s) - start )) s"; grep median $R/plans.txt | awk '{print $1, $2}' | sed 's/BM_QuantGemvPlan\/shape://; s/\/iterations.*manual_time_median//' | tr '\n' ';'; echo; pack
gemv() {
  EAGLE3_BENCH_QUANT_TILED=1 timeout 60 $2/benchmarks/quant_gemv_benchmark --benchmark_filter='BM_QuantGemv/shape:(12|13|17|19|22|24|26)/m:(1|8)/' \
    --benchmark_repetitions=3 --benchmark_report_aggregates_only=true > $R/gemv_$1.txt 2>&1
  echo "gemv $1 rc=$? $(( $(date +%s) - start )) s"; grep median $R/gemv_$1.txt | awk '{print $1, $2}' | sed 's/BM_QuantGemv\/shape://; s/\/iterations.*manual_time_median//' | tr '\n' ';'; echo; pack
}
gemv main /tmp/main/b; gemv branch /tmp/br/b; gemv interleave /tmp/il/b; gemv r3 /tmp/r3/b
timeout 120 /tmp/r3/b/tests/quant_gemv_test > $R/r3_quant_gemv_test.txt 2>&1; echo "r3 quant_gemv_test rc=$? $(grep -E '^\[  (PASSED|FAILED) ' $R/r3_quant_gemv_test.txt | tr '\n' ' ') $(( $(date +%s) - start )) s"; pack
echo "done $(( $(date +%s) - start )) s"
