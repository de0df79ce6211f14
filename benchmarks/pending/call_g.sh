#!/bin/bash
# Call G (twenty-sixth session, not run: no device time left). From a checkout of branch
# int4-rowloop-sums, with .gpu-host carried and, written beforehand:
#   git diff main int4-rowloop-sums -- CMakeLists.txt src include cuda tests > .gpu-host/g.patch
# Trees: build/g = int4-rowloop-sums, /tmp/main/b = main. The branch's GEMV / MoE tests, both trees'
# quant_gemv_benchmark and quant_moe_benchmark (each MoE tree twice), then one Nsight Compute pass
# over main's one-token MoE rounds (each kernel's duration: what the graph's 28-34 us are made of).
# Logs under $OUT/g.
set -u
source .gpu-host/env.sh
R=$OUT/g; mkdir -p $R; start=$(date +%s)
pack() { tar czf $OUT/g.tgz -C $OUT g; }
REPO=$(pwd)
nvidia-smi --query-gpu=name --format=csv,noheader | tee $R/gpu.txt
rm -rf /tmp/main; mkdir -p /tmp/main; cp -r CMakeLists.txt cmake src cuda include benchmarks tools testing tests /tmp/main/
(cd /tmp/main && git apply -R $REPO/.gpu-host/g.patch) && echo "main patch ok"
cfg() { cmake -S $1 -B $2 -G Ninja -DCMAKE_BUILD_TYPE=Release -DEAGLE3_BUILD_EXAMPLES=OFF "${@:3}" > /dev/null; }
cfg . build/g; cfg /tmp/main /tmp/main/b -DEAGLE3_BUILD_TESTS=OFF
B="quant_moe_benchmark quant_gemv_benchmark"
cmake --build build/g -j10 --target $B quant_gemv_test cuda_quantized_gemm_test cuda_quantized_moe_test > $R/b_g.log 2>&1 & P1=$!
cmake --build /tmp/main/b -j6 --target $B > $R/b_main.log 2>&1 & P2=$!
wait $P1; echo "g build rc=$? $(( $(date +%s) - start )) s"; wait $P2; echo "main build rc=$? $(( $(date +%s) - start )) s"
for t in quant_gemv_test cuda_quantized_gemm_test cuda_quantized_moe_test; do
  timeout 240 build/g/tests/$t > $R/g_$t.txt 2>&1; echo "g $t rc=$? $(grep -E '^\[  (PASSED|FAILED) ' $R/g_$t.txt | tr '\n' ' ') $(( $(date +%s) - start )) s"
done; pack
gemv() {
  EAGLE3_BENCH_QUANT_TILED=1 timeout 60 $2/benchmarks/quant_gemv_benchmark --benchmark_filter='BM_QuantGemv/shape:(12|13|17|19|22|24|26)/m:(1|8)/' \
    --benchmark_repetitions=3 --benchmark_report_aggregates_only=true > $R/gemv_$1.txt 2>&1
  echo "gemv $1 rc=$? $(( $(date +%s) - start )) s"; grep median $R/gemv_$1.txt | awk '{print $1, $2}' | sed 's/BM_QuantGemv\/shape://; s/\/iterations.*manual_time_median//' | tr '\n' ';'; echo; pack
}
moe() {
  timeout 40 $2/benchmarks/quant_moe_benchmark --benchmark_filter='BM_QuantMoe/model:[01]/tokens:(1|4|8|16|64)/' --benchmark_repetitions=3 \
    --benchmark_report_aggregates_only=true > $R/moe_$1.txt 2>&1
  echo "moe $1 rc=$? $(( $(date +%s) - start )) s"; grep median $R/moe_$1.txt | awk '{print $1, $2}' | sed 's/BM_QuantMoe\/model://; s/\/iterations.*manual_time_median//' | tr '\n' ';'; echo; pack
}
gemv main /tmp/main/b; gemv g build/g
moe main /tmp/main/b; moe g build/g; moe main2 /tmp/main/b; moe g2 build/g
for m in 0 1; do
  timeout 120 ncu --metrics gpu__time_duration.sum --csv --launch-skip 300 --launch-count 40 \
    /tmp/main/b/benchmarks/quant_moe_benchmark --benchmark_filter="BM_QuantMoe/model:$m/tokens:1/" --benchmark_repetitions=1 \
    > $R/ncu_moe1_m$m.csv 2> $R/ncu_moe1_m$m.err
  echo "ncu model $m rc=$? $(( $(date +%s) - start )) s"; pack
done
echo "done $(( $(date +%s) - start )) s"
