#!/bin/bash
# Call E (same warm machine as call D): benchmarks/pending/rowloop-3blocks.patch on int4-exact-sub.
# The branch's benchmarks from call D's build/d are kept aside, the patch applied in place, and the
# touched targets rebuilt. Logs under $OUT/e.
set -u
source .gpu-host/env.sh
R=$OUT/e; mkdir -p $R; start=$(date +%s)
pack() { tar czf $OUT/e.tgz -C $OUT e; }
[ -d build/d ] || cmake -S . -B build/d -G Ninja -DCMAKE_BUILD_TYPE=Release -DEAGLE3_BUILD_EXAMPLES=OFF > /dev/null
cmake --build build/d -j16 --target quant_moe_benchmark quant_gemv_benchmark > $R/b_sub.log 2>&1; echo "sub build rc=$? $(( $(date +%s) - start )) s"
mkdir -p /tmp/sub; cp build/d/benchmarks/quant_moe_benchmark build/d/benchmarks/quant_gemv_benchmark /tmp/sub/
git apply benchmarks/pending/rowloop-3blocks.patch && echo "patch ok"
cmake --build build/d -j16 --target quant_moe_benchmark quant_gemv_benchmark quant_gemv_test > $R/b_r3.log 2>&1; echo "r3 build rc=$? $(( $(date +%s) - start )) s"
timeout 90 build/d/tests/quant_gemv_test > $R/r3_quant_gemv_test.txt 2>&1; echo "r3 quant_gemv_test rc=$? $(grep -E '^\[  (PASSED|FAILED) ' $R/r3_quant_gemv_test.txt | tr '\n' ' ') $(( $(date +%s) - start )) s"
moe() {
  timeout 40 $2/quant_moe_benchmark --benchmark_filter='BM_QuantMoe/model:[01]/tokens:(1|4|8|16|64)/' --benchmark_repetitions=3 \
    --benchmark_report_aggregates_only=true > $R/moe_$1.txt 2>&1
  echo "moe $1 rc=$? $(( $(date +%s) - start )) s"; grep median $R/moe_$1.txt | awk '{print $1, $2}' | sed 's/BM_QuantMoe\/model://; s/\/iterations.*manual_time_median//' | tr '\n' ';'; echo; pack
}
moe sub /tmp/sub; moe r3 build/d/benchmarks; moe sub2 /tmp/sub; moe r3b build/d/benchmarks
echo "done $(( $(date +%s) - start )) s"
