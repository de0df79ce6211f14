#!/bin/bash
# Issue 20, next call (written in the twenty-fourth session, not yet run): branch int4-scale-after
# validated whole and timed against main, with and without the two-group interleave
# (benchmarks/pending/int4-interleave.patch, which applies on the branch). Run from a checkout of the
# branch with .gpu-host carried and .gpu-host/int4.patch written beforehand:
#   git diff main int4-scale-after -- CMakeLists.txt src include cuda > .gpu-host/int4.patch
# Builds: build/i (the branch: the whole tree, for the gpu suite), /tmp/il (the branch + interleave),
# /tmp/main (the branch with int4.patch reversed). Logs under $OUT/i.
set -u
source .gpu-host/env.sh
R=$OUT/i; mkdir -p $R
start=$(date +%s)
pack() { tar czf $OUT/i.tgz -C $OUT i; }
REPO=$(pwd)
nvidia-smi --query-gpu=name --format=csv,noheader | tee $R/gpu.txt
for d in il main; do rm -rf /tmp/$d; mkdir -p /tmp/$d; cp -r CMakeLists.txt cmake src cuda include benchmarks tools testing tests /tmp/$d/; done
(cd /tmp/il && git apply $REPO/benchmarks/pending/int4-interleave.patch) && echo "interleave patch ok"
(cd /tmp/main && git apply -R $REPO/.gpu-host/int4.patch) && echo "main patch ok"
cfg() { cmake -S $1 -B $2 -G Ninja -DCMAKE_BUILD_TYPE=Release -DEAGLE3_BUILD_EXAMPLES=OFF "${@:3}" > /dev/null; }
cfg . build/i; cfg /tmp/il /tmp/il/b -DEAGLE3_BUILD_TESTS=OFF; cfg /tmp/main /tmp/main/b -DEAGLE3_BUILD_TESTS=OFF
cmake --build build/i -j10 > $R/b_branch.log 2>&1 & P1=$!
(cmake --build /tmp/il/b -j3 --target quant_moe_benchmark quant_gemv_benchmark && cmake --build /tmp/main/b -j3 --target quant_moe_benchmark quant_gemv_benchmark) > $R/b_other.log 2>&1 & P2=$!
wait $P1; echo "branch build rc=$? $(( $(date +%s) - start )) s"; wait $P2; echo "other builds rc=$? $(( $(date +%s) - start )) s"
moe() {
  timeout 60 $2/benchmarks/quant_moe_benchmark --benchmark_filter='BM_QuantMoe/model:[01]/tokens:(1|4|8|16|64)/' --benchmark_repetitions=3 \
    --benchmark_report_aggregates_only=true > $R/moe_$1.txt 2>&1
  echo "moe $1 rc=$? $(( $(date +%s) - start )) s"; grep median $R/moe_$1.txt | awk '{print $1, $2}' | sed 's/BM_QuantMoe\/model://; s/\/iterations.*manual_time_median//' | tr '\n' ';'; echo; pack
}
moe main /tmp/main/b; moe branch build/i; moe interleave /tmp/il/b; moe main2 /tmp/main/b
gemv() {
  EAGLE3_BENCH_QUANT_TILED=1 timeout 60 $2/benchmarks/quant_gemv_benchmark --benchmark_filter='BM_QuantGemv/shape:(12|13|17|19|22|24|26)/m:(1|8)/' \
    --benchmark_repetitions=3 --benchmark_report_aggregates_only=true > $R/gemv_$1.txt 2>&1
  echo "gemv $1 rc=$? $(( $(date +%s) - start )) s"; grep median $R/gemv_$1.txt | awk '{print $1, $2}' | sed 's/BM_QuantGemv\/shape://; s/\/iterations.*manual_time_median//' | tr '\n' ';'; echo; pack
}
gemv main /tmp/main/b; gemv branch build/i; gemv interleave /tmp/il/b
scripts/gpu_suite.sh build/i/tests $R/suite --sanitize none --jobs 4 --test-seconds 200 > $R/suite.log 2>&1
echo "suite rc=$? $(( $(date +%s) - start )) s"; tail -5 $R/suite.log; pack
echo "done $(( $(date +%s) - start )) s"
