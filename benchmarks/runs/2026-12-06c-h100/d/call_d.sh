#!/bin/bash
# Call D (twenty-sixth session): from a checkout of branch int4-exact-sub, with .gpu-host carried and,
# written beforehand:
#   git diff main int4-exact-sub -- CMakeLists.txt src include cuda tests > .gpu-host/full.patch
#   git diff int4-fma-correction int4-exact-sub -- CMakeLists.txt src include cuda tests > .gpu-host/sub.patch
# Trees: build/d = int4-exact-sub (all targets), /tmp/fma/b = int4-fma-correction, /tmp/main/b = main
# (benchmarks only). quant_gemv_benchmark and quant_moe_benchmark on all three (each MoE tree twice),
# then the whole gpu suite on int4-exact-sub. Logs under $OUT/d.
set -u
source .gpu-host/env.sh
R=$OUT/d; mkdir -p $R; start=$(date +%s)
pack() { tar czf $OUT/d.tgz -C $OUT d; }
REPO=$(pwd)
nvidia-smi --query-gpu=name --format=csv,noheader | tee $R/gpu.txt
for d in fma main; do rm -rf /tmp/$d; mkdir -p /tmp/$d; cp -r CMakeLists.txt cmake src cuda include benchmarks tools testing tests /tmp/$d/; done
(cd /tmp/fma && git apply -R $REPO/.gpu-host/sub.patch) && echo "fma patch ok"
(cd /tmp/main && git apply -R $REPO/.gpu-host/full.patch) && echo "main patch ok"
cfg() { cmake -S $1 -B $2 -G Ninja -DCMAKE_BUILD_TYPE=Release -DEAGLE3_BUILD_EXAMPLES=OFF "${@:3}" > /dev/null; }
cfg . build/d; cfg /tmp/fma /tmp/fma/b -DEAGLE3_BUILD_TESTS=OFF; cfg /tmp/main /tmp/main/b -DEAGLE3_BUILD_TESTS=OFF
B="quant_moe_benchmark quant_gemv_benchmark"
cmake --build build/d -j12 > $R/b_sub.log 2>&1 & P1=$!
cmake --build /tmp/fma/b -j2 --target $B > $R/b_fma.log 2>&1 & P2=$!
cmake --build /tmp/main/b -j2 --target $B > $R/b_main.log 2>&1 & P3=$!
wait $P1; echo "sub build rc=$? $(( $(date +%s) - start )) s"; wait $P2; echo "fma build rc=$? $(( $(date +%s) - start )) s"; wait $P3; echo "main build rc=$? $(( $(date +%s) - start )) s"
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
gemv main /tmp/main/b; gemv fma /tmp/fma/b; gemv sub build/d
moe main /tmp/main/b; moe fma /tmp/fma/b; moe sub build/d; moe main2 /tmp/main/b; moe fma2 /tmp/fma/b; moe sub2 build/d
scripts/gpu_suite.sh build/d/tests $R/suite --sanitize none --jobs 4 --test-seconds 200 > $R/suite.log 2>&1
echo "suite rc=$? $(( $(date +%s) - start )) s"; tail -3 $R/suite.log; cat $R/suite/summary.txt; pack
echo "done $(( $(date +%s) - start )) s"
