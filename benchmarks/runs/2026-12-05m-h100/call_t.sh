#!/bin/bash
# Call T (twenty-second session): BM_MoeDecode with the joined shared slices flagged as the step
# flags them; the V2-Lite / V2 rank 8-row steps at main (dense join to 8 rows) against a copy with
# kDenseSharedJoinMaxTokens = 4; the whole gpu suite with the tiler test's fix, that test repeated.
set -u
source .gpu-host/env.sh
R=$OUT/t; mkdir -p $R
start=$(date +%s)
pack() { tar czf $OUT/t.tgz -C $OUT t; }
REPO=$(pwd)
mkdir -p /tmp/t4 && cp -r CMakeLists.txt cmake src cuda include benchmarks tools testing /tmp/t4/ && \
  sed -i 's/^constexpr int64_t kDenseSharedJoinMaxTokens = 8;/constexpr int64_t kDenseSharedJoinMaxTokens = 4;/' /tmp/t4/src/feed_forward_block.cc
grep -n "kDenseSharedJoinMaxTokens =" /tmp/t4/src/feed_forward_block.cc
(cmake -S /tmp/t4 -B /tmp/t4/b -G Ninja -DCMAKE_BUILD_TYPE=Release -DEAGLE3_BUILD_TESTS=OFF -DEAGLE3_BUILD_EXAMPLES=OFF && cmake --build /tmp/t4/b -j4 --target decode_step_benchmark) > $R/t4_build.log 2>&1 &
BP=$!
cmake -S . -B build/gpu -G Ninja -DCMAKE_BUILD_TYPE=Release > $R/build.log 2>&1 && cmake --build build/gpu -j12 >> $R/build.log 2>&1
echo "build rc=$? $(( $(date +%s) - start )) s"; tail -1 $R/build.log
T=build/gpu/tests; B=build/gpu/benchmarks
nvidia-smi --query-gpu=name --format=csv,noheader > $R/gpu.txt
timeout 80 $B/decode_ops_benchmark --benchmark_filter='BM_MoeDecode/model:[23]/tokens:(1|4|8)/' --benchmark_repetitions=5 \
  --benchmark_report_aggregates_only=true --benchmark_out=$R/decode_ops_benchmark.json > $R/moe.txt 2>&1
echo "moe rc=$? $(( $(date +%s) - start )) s"; grep median $R/moe.txt | awk '{print $1, $2}' | sed 's/\/iterations.*manual_time_median//'
pack
export EAGLE3_BENCH_CKPT_DIR=$REPO/build/ckpt
SF='BM_DecodeStep/model:0/batch:8/context:1024/graph:1|BM_VerifyStep/model:[01]/batch:1/tokens:8/context:4096/graph:1'
step() {  # name, binary dir
  env EAGLE3_BENCH_MODELS=01 EAGLE3_BENCH_KV_CACHE=bf16 timeout 150 $2/decode_step_benchmark --benchmark_filter="$SF" \
    --benchmark_repetitions=3 --benchmark_report_aggregates_only=true --benchmark_out=$R/step_$1.json > $R/step_$1.txt 2>&1
  echo "step $1 rc=$? $(( $(date +%s) - start )) s"; grep median $R/step_$1.txt | awk '{print $1, $2}' | sed 's/\/iterations.*manual_time_median//'
  pack
}
step j8 $B
wait $BP; echo "t4 build rc=$? $(( $(date +%s) - start )) s"
step j4 /tmp/t4/b/benchmarks
step j8b $B
timeout 240 scripts/gpu_suite.sh $T $R/suite --sanitize none --jobs 4 --test-seconds 200 > $R/suite_stdout.txt 2>&1 &
SP=$!
sleep 20; timeout 200 $T/cuda_quantized_gemm_test --gtest_filter='*TileQuantizedCodesMatchesTheHostTiler*' --gtest_repeat=40 > $R/tiler_repeat.txt 2>&1
echo "tiler repeat rc=$? $(grep -c '^\[       OK \]' $R/tiler_repeat.txt) ok, $(grep -c '^\[  FAILED  \] CudaQ' $R/tiler_repeat.txt) failed"
wait $SP; echo "suite rc=$? $(( $(date +%s) - start )) s"; cut -c1-150 $R/suite/summary.txt | grep -v "rc=0" | head -20; grep -c "rc=0" $R/suite/summary.txt
mkdir -p $R/fail; for f in $R/suite/logs/*.log; do grep -q "FAILED\|Failure" $f && grep -B3 -A15 "Failure" $f | head -60 > $R/fail/$(basename $f); done
rm -rf $R/suite/logs
pack
echo "done $(( $(date +%s) - start )) s"
