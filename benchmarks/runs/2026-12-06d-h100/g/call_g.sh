#!/bin/bash
# Call G (twenty-sixth session, not run: no device time left), builds and tests. From a checkout of
# main, with .gpu-host carried and, written beforehand:
#   git diff main int4-rowloop-sums -- CMakeLists.txt src include cuda tests > .gpu-host/g.patch
#   git diff main quant-plan-tail -- CMakeLists.txt src include cuda tests > .gpu-host/tail.patch
#   git diff main int4-rowloop-mma -- CMakeLists.txt src include cuda tests > .gpu-host/mma.patch
# Trees: build/m = main, /tmp/g/b = int4-rowloop-sums (INT4 row loops with staged group sums),
# /tmp/tail/b = quant-plan-tail (the chooser's tail rule), /tmp/mma/b = int4-rowloop-mma (the row
# loops' correction as m16n8k8 products, on int4-rowloop-sums). Each branch's tests, then Nsight Compute
# over main's one-token MoE rounds (each kernel's duration). call_g2.sh, on the same warm machine,
# times them. Logs under $OUT/g.
set -u
source .gpu-host/env.sh
R=$OUT/g; mkdir -p $R; start=$(date +%s)
pack() { tar czf $OUT/g.tgz -C $OUT g; }
REPO=$(pwd)
nvidia-smi --query-gpu=name --format=csv,noheader | tee $R/gpu.txt
for d in g tail mma; do rm -rf /tmp/$d; mkdir -p /tmp/$d; cp -r CMakeLists.txt cmake src cuda include benchmarks tools testing tests /tmp/$d/; (cd /tmp/$d && git apply $REPO/.gpu-host/$d.patch) && echo "$d patch ok"; done
cfg() { cmake -S $1 -B $2 -G Ninja -DCMAKE_BUILD_TYPE=Release -DEAGLE3_BUILD_EXAMPLES=OFF "${@:3}" > /dev/null; }
cfg . build/m -DEAGLE3_BUILD_TESTS=OFF; cfg /tmp/g /tmp/g/b; cfg /tmp/tail /tmp/tail/b; cfg /tmp/mma /tmp/mma/b
B="quant_moe_benchmark quant_gemv_benchmark"
cmake --build /tmp/g/b -j5 --target $B quant_gemv_test cuda_quantized_gemm_test cuda_quantized_moe_test > $R/b_g.log 2>&1 & P1=$!
cmake --build /tmp/tail/b -j4 --target $B quant_gemv_plan_test quant_gemv_test cuda_quantized_moe_test > $R/b_tail.log 2>&1 & P2=$!
cmake --build /tmp/mma/b -j4 --target $B quant_gemv_test cuda_quantized_moe_test > $R/b_mma.log 2>&1 & P4=$!
cmake --build build/m -j3 --target $B > $R/b_main.log 2>&1 & P3=$!
wait $P1; echo "g build rc=$? $(( $(date +%s) - start )) s"; wait $P2; echo "tail build rc=$? $(( $(date +%s) - start )) s"
wait $P4; echo "mma build rc=$? $(( $(date +%s) - start )) s"; wait $P3; echo "main build rc=$? $(( $(date +%s) - start )) s"
t() { timeout 240 /tmp/$1/b/tests/$2 > $R/$1_$2.txt 2>&1; echo "$1 $2 rc=$? $(grep -E '^\[  (PASSED|FAILED) ' $R/$1_$2.txt | tr '\n' ' ') $(( $(date +%s) - start )) s"; pack; }
t tail quant_gemv_plan_test; t g quant_gemv_test; t g cuda_quantized_gemm_test; t g cuda_quantized_moe_test
t mma quant_gemv_test; t mma cuda_quantized_moe_test; t tail quant_gemv_test; t tail cuda_quantized_moe_test
for m in 0 1; do
  timeout 120 ncu --metrics gpu__time_duration.sum --csv --launch-skip 300 --launch-count 40 \
    build/m/benchmarks/quant_moe_benchmark --benchmark_filter="BM_QuantMoe/model:$m/tokens:1/" --benchmark_repetitions=1 \
    > $R/ncu_moe1_m$m.csv 2> $R/ncu_moe1_m$m.err
  echo "ncu model $m rc=$? $(( $(date +%s) - start )) s"; pack
done
echo "done $(( $(date +%s) - start )) s"
