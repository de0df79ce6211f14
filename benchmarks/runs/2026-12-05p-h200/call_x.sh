#!/bin/bash
# Call X (twenty-third session): MoeActKernel's x staging off against main at 1-32 tokens (kernel
# and V2-Lite / V2 rank steps); the grouped path from E pairs instead of 2 E (a copy of main) at
# 16-64 tokens against per-pair, all in one call.
set -u
source .gpu-host/env.sh
R=$OUT/x; mkdir -p $R
start=$(date +%s)
pack() { tar czf $OUT/x.tgz -C $OUT x; }
REPO=$(pwd)
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee $R/gpu.txt
rm -rf /tmp/nostage /tmp/pairs1; mkdir -p /tmp/nostage /tmp/pairs1
cp -r CMakeLists.txt cmake src cuda include benchmarks tools testing /tmp/nostage/
cp -r CMakeLists.txt cmake src cuda include benchmarks tools testing /tmp/pairs1/
sed -i 's/const bool stage_x = hidden % 4 == 0/const bool stage_x = false \&\& hidden % 4 == 0/' /tmp/nostage/cuda/moe_experts_kernels.cu
sed -i 's/tokens \* top_k >= 2 \* num_experts;/tokens * top_k >= num_experts;/' /tmp/pairs1/cuda/moe_ops.h
echo "edits: $(grep -c 'stage_x = false &&' /tmp/nostage/cuda/moe_experts_kernels.cu) $(grep -c 'tokens \* top_k >= num_experts;' /tmp/pairs1/cuda/moe_ops.h)"
bld() {  # src dir, build dir, jobs, targets...
  local s=$1 b=$2 j=$3; shift 3
  cmake -S $s -B $b -G Ninja -DCMAKE_BUILD_TYPE=Release -DEAGLE3_BUILD_TESTS=OFF -DEAGLE3_BUILD_EXAMPLES=OFF > /dev/null && cmake --build $b -j$j --target "$@" > /dev/null 2>&1
}
bld . build/xmain 6 decode_ops_benchmark decode_step_benchmark > $R/b_main.log 2>&1 & P1=$!
bld /tmp/nostage /tmp/nostage/b 6 decode_ops_benchmark decode_step_benchmark > $R/b_nostage.log 2>&1 & P2=$!
bld /tmp/pairs1 /tmp/pairs1/b 4 decode_ops_benchmark > $R/b_pairs1.log 2>&1 & P3=$!
wait $P1; echo "main build rc=$? $(( $(date +%s) - start )) s"
wait $P2; echo "nostage build rc=$? $(( $(date +%s) - start )) s"
wait $P3; echo "pairs1 build rc=$? $(( $(date +%s) - start )) s"
M=build/xmain/benchmarks; N=/tmp/nostage/b/benchmarks; P=/tmp/pairs1/b/benchmarks
moe() {  # name, binary dir, filter, env
  env $4 timeout 100 $2/decode_ops_benchmark --benchmark_filter="$3" --benchmark_repetitions=5 \
    --benchmark_report_aggregates_only=true > $R/moe_$1.txt 2>&1
  echo "moe $1 rc=$? $(( $(date +%s) - start )) s"
  grep median $R/moe_$1.txt | awk '{print $1, $2}' | sed 's/BM_MoeDecode\/model://; s/\/iterations.*manual_time_median//' | tr '\n' ';'; echo
  pack
}
SF='BM_MoeDecode/model:[0-3]/tokens:(1|8|16|24|32)/'
moe stage $M "$SF" X=1
moe nostage $N "$SF" X=1
moe stage2 $M "$SF" X=1
GF='BM_MoeDecode/model:[013]/tokens:(16|24|32|40|48|64)/join:0'
moe perpair $M "$GF" EAGLE3_BENCH_MOE_GROUPED=0
moe pairs1 $P "$GF" EAGLE3_BENCH_MOE_GROUPED_MIN_TOKENS=8
export EAGLE3_BENCH_CKPT_DIR=$REPO/build/ckpt
step() {  # name, binary dir, models, filter
  env EAGLE3_BENCH_MODELS=$3 EAGLE3_BENCH_KV_CACHE=bf16 timeout 150 $2/decode_step_benchmark --benchmark_filter="$4" \
    --benchmark_repetitions=3 --benchmark_report_aggregates_only=true > $R/step_$1.txt 2>&1
  echo "step $1 rc=$? $(( $(date +%s) - start )) s"; grep median $R/step_$1.txt | awk '{print $1, $2}' | sed 's/\/iterations.*manual_time_median//' | tr '\n' ';'; echo
  pack
}
S0='BM_DecodeStep/model:0/batch:(1|8)/context:1024/graph:1|BM_VerifyStep/model:0/batch:1/tokens:8/context:4096/graph:1'
step v2l_main $M 0 "$S0"
step v2l_nostage $N 0 "$S0"
step v2l_main2 $M 0 "$S0"
S1='BM_DecodeStep/model:1/batch:1/context:1024/graph:1|BM_VerifyStep/model:1/batch:1/tokens:8/context:4096/graph:1'
step v2_main $M 1 "$S1"
step v2_nostage $N 1 "$S1"
echo "done $(( $(date +%s) - start )) s"
