#!/bin/bash
# Call C (twenty-fifth session, not run: the session's device time ran out). From a checkout of
# branch int4-fma-correction (one commit on int4-scale-after), with .gpu-host carried and, written
# beforehand:
#   git diff main int4-scale-after -- CMakeLists.txt src include cuda tests > .gpu-host/int4.patch
#   git diff int4-scale-after int4-fma-correction -- CMakeLists.txt src include cuda tests > .gpu-host/fma.patch
# Trees: build/c = int4-fma-correction, /tmp/br/b = int4-scale-after (its group sums in a pass of
# their own), /tmp/main/b = main. Tests on the first two, benchmarks on all three. Logs under $OUT/c.
set -u
source .gpu-host/env.sh
R=$OUT/c; mkdir -p $R; start=$(date +%s)
pack() { tar czf $OUT/c.tgz -C $OUT c; }
REPO=$(pwd)
nvidia-smi --query-gpu=name --format=csv,noheader | tee $R/gpu.txt
for d in br main; do rm -rf /tmp/$d; mkdir -p /tmp/$d; cp -r CMakeLists.txt cmake src cuda include benchmarks tools testing tests /tmp/$d/; (cd /tmp/$d && git apply -R $REPO/.gpu-host/fma.patch) || echo "$d fma -R failed"; done
(cd /tmp/main && git apply -R $REPO/.gpu-host/int4.patch) && echo "main patch ok"
cfg() { cmake -S $1 -B $2 -G Ninja -DCMAKE_BUILD_TYPE=Release -DEAGLE3_BUILD_EXAMPLES=OFF "${@:3}" > /dev/null; }
cfg . build/c; cfg /tmp/br /tmp/br/b; cfg /tmp/main /tmp/main/b -DEAGLE3_BUILD_TESTS=OFF
T="quant_gemv_test cuda_quantized_gemm_test cuda_quantized_moe_test quant_moe_benchmark quant_gemv_benchmark"
cmake --build build/c -j6 --target $T > $R/b_fma.log 2>&1 & P1=$!
cmake --build /tmp/br/b -j6 --target $T > $R/b_br.log 2>&1 & P2=$!
cmake --build /tmp/main/b -j4 --target quant_moe_benchmark quant_gemv_benchmark > $R/b_main.log 2>&1 & P3=$!
wait $P1; echo "fma build rc=$? $(( $(date +%s) - start )) s"; wait $P2; echo "br build rc=$? $(( $(date +%s) - start )) s"; wait $P3; echo "main build rc=$? $(( $(date +%s) - start )) s"
tests() {
  for t in quant_gemv_test cuda_quantized_gemm_test cuda_quantized_moe_test; do
    timeout 90 $2/tests/$t > $R/$1_$t.txt 2>&1; echo "$1 $t rc=$? $(grep -E '^\[  (PASSED|FAILED) ' $R/$1_$t.txt | tr '\n' ' ') $(( $(date +%s) - start )) s"
  done; pack
}
tests br /tmp/br/b; tests fma build/c
gemv() {
  EAGLE3_BENCH_QUANT_TILED=1 timeout 40 $2/benchmarks/quant_gemv_benchmark --benchmark_filter='BM_QuantGemv/shape:(12|13|17|19|22|24|26)/m:(1|8)/' \
    --benchmark_repetitions=3 --benchmark_report_aggregates_only=true > $R/gemv_$1.txt 2>&1
  echo "gemv $1 rc=$? $(( $(date +%s) - start )) s"; grep median $R/gemv_$1.txt | awk '{print $1, $2}' | sed 's/BM_QuantGemv\/shape://; s/\/iterations.*manual_time_median//' | tr '\n' ';'; echo; pack
}
moe() {
  timeout 40 $2/benchmarks/quant_moe_benchmark --benchmark_filter='BM_QuantMoe/model:[01]/tokens:(1|4|8|16|64)/' --benchmark_repetitions=3 \
    --benchmark_report_aggregates_only=true > $R/moe_$1.txt 2>&1
  echo "moe $1 rc=$? $(( $(date +%s) - start )) s"; grep median $R/moe_$1.txt | awk '{print $1, $2}' | sed 's/BM_QuantMoe\/model://; s/\/iterations.*manual_time_median//' | tr '\n' ';'; echo; pack
}
gemv main /tmp/main/b; gemv br /tmp/br/b; gemv fma build/c
moe main /tmp/main/b; moe br /tmp/br/b; moe fma build/c; moe main2 /tmp/main/b; moe br2 /tmp/br/b; moe fma2 build/c
echo "done $(( $(date +%s) - start )) s"
