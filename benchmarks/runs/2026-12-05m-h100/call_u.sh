#!/bin/bash
# Call U (twenty-second session): the V2-Lite verify / decode steps, main against d9955a4's library
# (base.patch reversed) on the same machine, interleaved.
set -u
source .gpu-host/env.sh
R=$OUT/u; mkdir -p $R
start=$(date +%s)
REPO=$(pwd)
rm -rf /tmp/base && mkdir -p /tmp/base && cp -r CMakeLists.txt cmake src cuda include benchmarks tools testing /tmp/base/ && (cd /tmp/base && git apply -R $REPO/.gpu-host/base.patch) > $R/patch.log 2>&1; echo "patch rc=$?"
grep -n "kDenseSharedJoinMaxTokens =" /tmp/base/src/feed_forward_block.cc
(cmake -S /tmp/base -B /tmp/base/b -G Ninja -DCMAKE_BUILD_TYPE=Release -DEAGLE3_BUILD_TESTS=OFF -DEAGLE3_BUILD_EXAMPLES=OFF && cmake --build /tmp/base/b -j14 --target decode_step_benchmark) > $R/base_build.log 2>&1
echo "base build rc=$? $(( $(date +%s) - start )) s"
cmake --build build/gpu -j4 --target decode_step_benchmark > $R/build.log 2>&1; echo "main build rc=$?"
export EAGLE3_BENCH_CKPT_DIR=$REPO/build/ckpt
SF='BM_DecodeStep/model:0/batch:1/context:1024/graph:1|BM_VerifyStep/model:0/batch:1/tokens:8/context:4096/graph:1'
for side in main base main2 base2; do
  bin=build/gpu/benchmarks; case $side in base*) bin=/tmp/base/b/benchmarks;; esac
  env EAGLE3_BENCH_MODELS=0 EAGLE3_BENCH_KV_CACHE=bf16 timeout 100 $bin/decode_step_benchmark --benchmark_filter="$SF" \
    --benchmark_repetitions=3 --benchmark_report_aggregates_only=true --benchmark_out=$R/step_$side.json > $R/step_$side.txt 2>&1
  echo "step $side rc=$? $(( $(date +%s) - start )) s"; grep median $R/step_$side.txt | awk '{print $1, $2}' | sed 's/\/iterations.*manual_time_median//'
done
nvidia-smi --query-gpu=name --format=csv,noheader
echo "done $(( $(date +%s) - start )) s"
