#!/bin/bash
# Call C (twenty-fifth session, not run: the session's device time ran out): branch int4-scale-after with its group sums in a pass of their own, against main (the tree
# with .gpu-host/int4.patch reversed). Logs under $OUT/c.
# Written beforehand, from a checkout of the branch: git diff main int4-scale-after -- CMakeLists.txt src include cuda tests > .gpu-host/int4.patch
set -u
source .gpu-host/env.sh
R=$OUT/c; mkdir -p $R; start=$(date +%s)
pack() { tar czf $OUT/c.tgz -C $OUT c; }
REPO=$(pwd)
nvidia-smi --query-gpu=name --format=csv,noheader | tee $R/gpu.txt
rm -rf /tmp/main; mkdir -p /tmp/main; cp -r CMakeLists.txt cmake src cuda include benchmarks tools testing tests /tmp/main/
(cd /tmp/main && git apply -R $REPO/.gpu-host/int4.patch) && echo "main patch ok"
cfg() { cmake -S $1 -B $2 -G Ninja -DCMAKE_BUILD_TYPE=Release -DEAGLE3_BUILD_EXAMPLES=OFF "${@:3}" > /dev/null; }
cfg . build/c; cfg /tmp/main /tmp/main/b -DEAGLE3_BUILD_TESTS=OFF
cmake --build build/c -j9 --target quant_gemv_test cuda_quantized_gemm_test cuda_quantized_moe_test quant_moe_benchmark quant_gemv_benchmark > $R/b_new.log 2>&1 & P1=$!
cmake --build /tmp/main/b -j7 --target quant_moe_benchmark quant_gemv_benchmark > $R/b_main.log 2>&1 & P2=$!
wait $P1; echo "new build rc=$? $(( $(date +%s) - start )) s"; wait $P2; echo "main build rc=$? $(( $(date +%s) - start )) s"
timeout 90 build/c/tests/quant_gemv_test > $R/quant_gemv_test.txt 2>&1; echo "quant_gemv_test rc=$? $(grep -E '^\[  (PASSED|FAILED) ' $R/quant_gemv_test.txt | tr '\n' ' ') $(( $(date +%s) - start )) s"; pack
gemv() {
  EAGLE3_BENCH_QUANT_TILED=1 timeout 40 $2/benchmarks/quant_gemv_benchmark --benchmark_filter='BM_QuantGemv/shape:(12|13|17|19|22|24|26)/m:(1|8)/' \
    --benchmark_repetitions=3 --benchmark_report_aggregates_only=true > $R/gemv_$1.txt 2>&1
  echo "gemv $1 rc=$? $(( $(date +%s) - start )) s"; grep median $R/gemv_$1.txt | awk '{print $1, $2}' | sed 's/BM_QuantGemv\/shape://; s/\/iterations.*manual_time_median//' | tr '\n' ';'; echo; pack
}
gemv main /tmp/main/b; gemv new build/c
moe() {
  timeout 40 $2/benchmarks/quant_moe_benchmark --benchmark_filter='BM_QuantMoe/model:[01]/tokens:(1|4|8|16|64)/' --benchmark_repetitions=3 \
    --benchmark_report_aggregates_only=true > $R/moe_$1.txt 2>&1
  echo "moe $1 rc=$? $(( $(date +%s) - start )) s"; grep median $R/moe_$1.txt | awk '{print $1, $2}' | sed 's/BM_QuantMoe\/model://; s/\/iterations.*manual_time_median//' | tr '\n' ';'; echo; pack
}
moe main /tmp/main/b; moe new build/c
for t in cuda_quantized_gemm_test cuda_quantized_moe_test; do timeout 60 build/c/tests/$t > $R/$t.txt 2>&1; echo "$t rc=$? $(grep -E '^\[  (PASSED|FAILED) ' $R/$t.txt | tr '\n' ' ') $(( $(date +%s) - start )) s"; done; pack
gemv new2 build/c; gemv main2 /tmp/main/b
echo "done $(( $(date +%s) - start )) s"
