#!/bin/bash
# Issue 20, short form of call V: the INT4 GEMV test and BM_QuantMoe against main's kernels.
set -u
source .gpu-host/env.sh
R=$OUT/v; mkdir -p $R
start=$(date +%s)
pack() { tar czf $OUT/v.tgz -C $OUT v; }
REPO=$(pwd)
nvidia-smi --query-gpu=name --format=csv,noheader | tee $R/gpu.txt
rm -rf /tmp/base; mkdir -p /tmp/base; cp -r CMakeLists.txt cmake src cuda include benchmarks tools testing tests /tmp/base/ 2>/dev/null
(cd /tmp/base && git apply -R $REPO/.gpu-host/int4.patch) && echo "base patch ok"
cmake -S . -B build/v -G Ninja -DCMAKE_BUILD_TYPE=Release -DEAGLE3_BUILD_EXAMPLES=OFF > /dev/null
cmake -S /tmp/base -B /tmp/base/b -G Ninja -DCMAKE_BUILD_TYPE=Release -DEAGLE3_BUILD_EXAMPLES=OFF -DEAGLE3_BUILD_TESTS=OFF > /dev/null
cmake --build build/v -j11 --target quant_gemv_test quant_moe_benchmark > $R/b_new.log 2>&1 & P1=$!
cmake --build /tmp/base/b -j5 --target quant_moe_benchmark > $R/b_base.log 2>&1 & P2=$!
wait $P1; echo "new build rc=$? $(( $(date +%s) - start )) s"; wait $P2; echo "base build rc=$? $(( $(date +%s) - start )) s"
N=build/v; B=/tmp/base/b
timeout 75 $N/tests/quant_gemv_test > $R/quant_gemv_test.txt 2>&1; echo "quant_gemv_test rc=$? $(grep -E '^\[  (PASSED|FAILED) ' $R/quant_gemv_test.txt | tr '\n' ' ') $(( $(date +%s) - start )) s"
grep -E "^\[  FAILED|Failure" $R/quant_gemv_test.txt | head -8; gzip -f $R/quant_gemv_test.txt; pack
moe() {
  timeout 50 $2/benchmarks/quant_moe_benchmark --benchmark_filter='BM_QuantMoe/model:[01]/tokens:(1|8|16|64)/' --benchmark_repetitions=3 \
    --benchmark_report_aggregates_only=true > $R/moe_$1.txt 2>&1
  echo "moe $1 rc=$? $(( $(date +%s) - start )) s"; grep median $R/moe_$1.txt | awk '{print $1, $2}' | sed 's/BM_QuantMoe\/model://; s/\/iterations.*manual_time_median//' | tr '\n' ';'; echo; pack
}
moe new $N; moe base $B
echo "done $(( $(date +%s) - start )) s"
