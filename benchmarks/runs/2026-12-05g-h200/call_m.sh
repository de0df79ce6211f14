#!/bin/bash
# Call M (twenty-first session): the MoE decode kernels (MoeDown a slot a warp, MoeAct x staged)
# against e774756 (base.patch reversed): their tests, BM_MoeDecode, the V2-Lite step, an ncu map.
set -u
source .gpu-host/env.sh
R=$OUT/m; mkdir -p $R
start=$(date +%s)
pack() { tar czf $OUT/m.tgz --exclude="*.ncu-rep" -C $OUT m; }
mkdir -p /tmp/base && cp -r CMakeLists.txt cmake src cuda include benchmarks tools testing /tmp/base/ && (REPO=$(pwd); cd /tmp/base && git apply -R $REPO/.gpu-host/base.patch) > $R/patch.log 2>&1
(cmake -S /tmp/base -B /tmp/base/b -G Ninja -DCMAKE_BUILD_TYPE=Release -DEAGLE3_BUILD_TESTS=OFF -DEAGLE3_BUILD_EXAMPLES=OFF && cmake --build /tmp/base/b -j4 --target decode_ops_benchmark decode_step_benchmark) > $R/base_build.log 2>&1 &
BP=$!
cmake -S . -B build/gpu -G Ninja -DCMAKE_BUILD_TYPE=Release > $R/build.log 2>&1 && cmake --build build/gpu -j12 >> $R/build.log 2>&1
echo "build rc=$? $(( $(date +%s) - start )) s"; tail -1 $R/build.log
T=build/gpu/tests; B=build/gpu/benchmarks; BB=/tmp/base/b/benchmarks
timeout 200 scripts/gpu_suite.sh $T $R/suite --sanitize none --jobs 4 --test-seconds 180 \
  --only cuda_backend_moe_test,cuda_moe_grouped_test,cuda_bf16_weights_test,draft_kinds_gpu_test,model_gpu_test,speculative_step_gpu_test,target_graph_test,cuda_quantized_moe_test,draft_graph_test > $R/suite_stdout.txt 2>&1
echo "suite rc=$? $(( $(date +%s) - start )) s"; cut -c1-160 $R/suite/summary.txt
grep -h "near-tie\|differs from plain" $R/suite/logs/*.log | head -8
pack
wait $BP; echo "base build rc=$? $(( $(date +%s) - start )) s"
MF='BM_MoeDecode/model:[0-3]/tokens:(1|4|16)/join'
for side in new base; do
  bin=$B; [ $side = base ] && bin=$BB
  timeout 100 $bin/decode_ops_benchmark --benchmark_filter="$MF" --benchmark_repetitions=5 --benchmark_report_aggregates_only=true \
    --benchmark_out=$R/moe_$side.json > $R/moe_$side.txt 2>&1
  echo "moe $side rc=$? $(( $(date +%s) - start )) s"
  grep median $R/moe_$side.txt | awk '{print $1, $2, $3}' | sed 's/\/iterations.*manual_time_median//'
done
pack
SF='BM_DecodeStep/model:0/batch:1/context:1024/graph:1|BM_VerifyStep/model:0/batch:1/tokens:8/context:4096/graph:1'
for side in new base; do
  bin=$B; [ $side = base ] && bin=$BB
  env EAGLE3_BENCH_MODELS=0 EAGLE3_BENCH_KV_CACHE=bf16 timeout 100 $bin/decode_step_benchmark --benchmark_filter="$SF" \
    --benchmark_repetitions=3 --benchmark_report_aggregates_only=true --benchmark_out=$R/step_$side.json > $R/step_$side.txt 2>&1
  echo "step $side rc=$? $(( $(date +%s) - start )) s $(grep -E 'median' $R/step_$side.txt | awk '{print $1, $2, $3}' | tr '\n' ' ')"
done
pack
env EAGLE3_BENCH_MODELS=0 EAGLE3_BENCH_KV_CACHE=bf16 timeout 100 ncu --nvtx --nvtx-include "eagle3_step/" --metrics gpu__time_duration.sum \
  --launch-count 600 --csv --print-units base $B/decode_step_benchmark --benchmark_filter='BM_DecodeStep/model:0/batch:1/context:1024/graph:0' \
  --benchmark_repetitions=1 > $R/ncu_step.csv 2> $R/ncu_step.err
echo "ncu rc=$? $(( $(date +%s) - start )) s"; grep -E "Moe(Act|Down)Kernel" $R/ncu_step.csv | head -4 | awk -F'","' '{print $11, $NF}'; gzip -f $R/ncu_step.csv
pack
for tool in memcheck racecheck; do
  timeout 100 compute-sanitizer --tool $tool $T/cuda_backend_moe_test --gtest_filter='*Experts*' > $R/san_$tool.txt 2>&1
  echo "$tool rc=$? $(( $(date +%s) - start )) s $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY|PASSED|FAILED' $R/san_$tool.txt | tr '\n' ' ')"
done
pack
echo "done $(( $(date +%s) - start )) s"
