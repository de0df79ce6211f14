#!/bin/bash
# Call V (twenty-second session): the routed-only expert table past the join (a604dbf): its tests,
# the model / bf16 / speculative gpu tests, and the V2-Lite many-row steps against 4063469's library.
set -u
source .gpu-host/env.sh
R=$OUT/v; mkdir -p $R
start=$(date +%s)
pack() { tar czf $OUT/v.tgz -C $OUT v; }
REPO=$(pwd)
rm -rf /tmp/base && mkdir -p /tmp/base && cp -r CMakeLists.txt cmake src cuda include benchmarks tools testing /tmp/base/ && (cd /tmp/base && git apply -R $REPO/.gpu-host/base.patch) > $R/patch.log 2>&1; echo "patch rc=$?"
(cmake -S /tmp/base -B /tmp/base/b -G Ninja -DCMAKE_BUILD_TYPE=Release -DEAGLE3_BUILD_TESTS=OFF -DEAGLE3_BUILD_EXAMPLES=OFF && cmake --build /tmp/base/b -j4 --target decode_step_benchmark) > $R/base_build.log 2>&1 &
BP=$!
cmake -S . -B build/gpu -G Ninja -DCMAKE_BUILD_TYPE=Release > $R/build.log 2>&1 && cmake --build build/gpu -j12 --target cuda_backend_moe_test model_gpu_test cuda_bf16_weights_test speculative_step_gpu_test target_graph_test decode_step_benchmark >> $R/build.log 2>&1
echo "build rc=$? $(( $(date +%s) - start )) s"; tail -1 $R/build.log
T=build/gpu/tests; B=build/gpu/benchmarks
nvidia-smi --query-gpu=name --format=csv,noheader | tee $R/gpu.txt
export EAGLE3_BENCH_CKPT_DIR=$REPO/build/ckpt
SF='BM_DecodeStep/model:0/batch:(1|32)/context:1024/graph:1|BM_VerifyStep/model:0/batch:8/tokens:8/context:4096/graph:1'
step() {
  env EAGLE3_BENCH_MODELS=0 EAGLE3_BENCH_KV_CACHE=bf16 timeout 100 $2/decode_step_benchmark --benchmark_filter="$SF" \
    --benchmark_repetitions=3 --benchmark_report_aggregates_only=true --benchmark_out=$R/step_$1.json > $R/step_$1.txt 2>&1
  echo "step $1 rc=$? $(( $(date +%s) - start )) s"; grep median $R/step_$1.txt | awk '{print $1, $2}' | sed 's/\/iterations.*manual_time_median//'
  pack
}
step new $B
wait $BP; echo "base build rc=$? $(( $(date +%s) - start )) s"
step base /tmp/base/b/benchmarks
step new2 $B
for t in cuda_backend_moe_test model_gpu_test cuda_bf16_weights_test speculative_step_gpu_test target_graph_test; do
  timeout 120 $T/$t > $R/test_$t.txt 2>&1
  echo "$t rc=$? $(grep -E '^\[  (PASSED|FAILED) ' $R/test_$t.txt | tr '\n' ' ') $(( $(date +%s) - start )) s"
  grep -A8 "Failure" $R/test_$t.txt | head -20
done
pack
echo "done $(( $(date +%s) - start )) s"
