#!/bin/bash
# Call Z (twenty-third session, not yet run): MoeActKernel asking L2 for its rows' heads before the
# staging barrier against main. Run from a tree with the patch applied (`git apply
# benchmarks/pending/moeact-prefetch.patch`); main is built beside it from the patch reversed.
set -u
source .gpu-host/env.sh
R=$OUT/z; mkdir -p $R
start=$(date +%s)
pack() { tar czf $OUT/z.tgz -C $OUT z; }
REPO=$(pwd)
nvidia-smi --query-gpu=name --format=csv,noheader | tee $R/gpu.txt
rm -rf /tmp/base; mkdir -p /tmp/base; cp -r CMakeLists.txt cmake src cuda include benchmarks tools testing /tmp/base/
(cd /tmp/base && git apply -R $REPO/benchmarks/pending/moeact-prefetch.patch) && echo "patch ok"
bld() { local s=$1 b=$2; shift 2; cmake -S $s -B $b -G Ninja -DCMAKE_BUILD_TYPE=Release -DEAGLE3_BUILD_EXAMPLES=OFF > /dev/null && cmake --build $b -j8 --target "$@" > /dev/null 2>&1; }
bld . build/zpf decode_ops_benchmark decode_step_benchmark cuda_backend_moe_test > $R/b_pf.log 2>&1 & P1=$!
bld /tmp/base /tmp/base/b decode_ops_benchmark decode_step_benchmark > $R/b_main.log 2>&1 & P2=$!
wait $P1; echo "pf build rc=$? $(( $(date +%s) - start )) s"; wait $P2; echo "main build rc=$? $(( $(date +%s) - start )) s"
N=build/zpf; M=/tmp/base/b
timeout 60 $N/tests/cuda_backend_moe_test > $R/moe_test.txt 2>&1; echo "moe test rc=$? $(grep -E '^\[  (PASSED|FAILED) ' $R/moe_test.txt | tr '\n' ' ') $(( $(date +%s) - start )) s"
moe() {
  timeout 60 $2/benchmarks/decode_ops_benchmark --benchmark_filter='BM_MoeDecode/model:[0-3]/tokens:(1|8)/' --benchmark_repetitions=5 \
    --benchmark_report_aggregates_only=true > $R/moe_$1.txt 2>&1
  echo "moe $1 rc=$? $(( $(date +%s) - start )) s"; grep median $R/moe_$1.txt | awk '{print $1, $2}' | sed 's/BM_MoeDecode\/model://; s/\/iterations.*manual_time_median//' | tr '\n' ';'; echo; pack
}
moe main $M; moe pf $N
export EAGLE3_BENCH_CKPT_DIR=$REPO/build/ckpt
step() {
  env EAGLE3_BENCH_MODELS=$3 EAGLE3_BENCH_KV_CACHE=bf16 timeout 120 $2/benchmarks/decode_step_benchmark \
    --benchmark_filter="BM_DecodeStep/model:$3/batch:1/context:1024/graph:1|BM_VerifyStep/model:$3/batch:1/tokens:8/context:4096/graph:1" \
    --benchmark_repetitions=3 --benchmark_report_aggregates_only=true > $R/step_$1.txt 2>&1
  echo "step $1 rc=$? $(( $(date +%s) - start )) s"; grep -E "median|stddev" $R/step_$1.txt | awk '{print $1, $2}' | sed 's/\/iterations.*manual_time_/ /' | tr '\n' ';'; echo; pack
}
step v2_pf $N 1; step v2_main $M 1; step v2l_pf $N 0; step v2l_main $M 0
echo "done $(( $(date +%s) - start )) s"
