#!/bin/bash
# Call L (twenty-first session): the fused latent rows test and its sanitizers, the V2-Lite TP 1
# step new against base (56646a4's library), an ncu map of the new eager step, the whole gpu suite.
set -u
source .gpu-host/env.sh
R=$OUT/l; mkdir -p $R
start=$(date +%s)
pack() { tar czf $OUT/l.tgz --exclude="*.ncu-rep" -C $OUT l; }
mkdir -p /tmp/base && cp -r CMakeLists.txt cmake src cuda include benchmarks tools testing /tmp/base/ && (REPO=$(pwd); cd /tmp/base && git apply -R $REPO/.gpu-host/base.patch) > $R/patch.log 2>&1
(cmake -S /tmp/base -B /tmp/base/b -G Ninja -DCMAKE_BUILD_TYPE=Release -DEAGLE3_BUILD_TESTS=OFF -DEAGLE3_BUILD_EXAMPLES=OFF && cmake --build /tmp/base/b -j4 --target decode_step_benchmark) > $R/base_build.log 2>&1 &
BP=$!
cmake -S . -B build/gpu -G Ninja -DCMAKE_BUILD_TYPE=Release > $R/build.log 2>&1 && cmake --build build/gpu -j12 >> $R/build.log 2>&1
echo "build rc=$? $(( $(date +%s) - start )) s"; tail -1 $R/build.log
T=build/gpu/tests; B=build/gpu/benchmarks
timeout 60 $T/cuda_backend_attention_test --gtest_filter='*LatentRows*' > $R/attn.txt 2>&1; echo "attn rc=$? $(grep -E '^\[  (PASSED|FAILED) ' $R/attn.txt | tr '\n' ' ')"
grep -B3 -A8 Failure $R/attn.txt | head -20
SF='BM_DecodeStep/model:0/batch:1/context:1024/graph:1|BM_VerifyStep/model:0/batch:1/tokens:8/context:4096/graph:1'
step() {  # name, binary dir
  env EAGLE3_BENCH_MODELS=0 EAGLE3_BENCH_KV_CACHE=bf16 timeout 100 $2/decode_step_benchmark --benchmark_filter="$SF" \
    --benchmark_repetitions=3 --benchmark_report_aggregates_only=true --benchmark_out=$R/step_$1.json > $R/step_$1.txt 2>&1
  echo "step $1 rc=$? $(( $(date +%s) - start )) s $(grep -E 'median' $R/step_$1.txt | awk '{print $1, $2, $3}' | tr '\n' ' ')"
  pack
}
step new $B
wait $BP; echo "base build rc=$? $(( $(date +%s) - start )) s"
step base /tmp/base/b/benchmarks
for tool in memcheck racecheck; do
  timeout 90 compute-sanitizer --tool $tool $T/cuda_backend_attention_test --gtest_filter='*LatentRows*' > $R/san_$tool.txt 2>&1
  echo "$tool rc=$? $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY|PASSED|FAILED' $R/san_$tool.txt | tr '\n' ' ')"
done
pack
env EAGLE3_BENCH_MODELS=0 EAGLE3_BENCH_KV_CACHE=bf16 timeout 150 ncu --nvtx --nvtx-include "eagle3_step/" --metrics gpu__time_duration.sum \
  --launch-count 600 --csv --print-units base $B/decode_step_benchmark --benchmark_filter='BM_DecodeStep/model:0/batch:1/context:1024/graph:0' \
  --benchmark_repetitions=1 > $R/ncu_step.csv 2> $R/ncu_step.err
echo "ncu rc=$? $(( $(date +%s) - start )) s"; gzip -f $R/ncu_step.csv
pack
timeout 260 scripts/gpu_suite.sh $T $R/suite --sanitize none --jobs 4 --test-seconds 200 > $R/suite_stdout.txt 2>&1
echo "suite rc=$? $(( $(date +%s) - start )) s"; cut -c1-150 $R/suite/summary.txt | grep -v "^ok" | head -20; grep -c "^ok" $R/suite/summary.txt
pack
echo "done $(( $(date +%s) - start )) s"
