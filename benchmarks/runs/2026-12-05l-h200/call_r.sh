#!/bin/bash
# Call R (twenty-second session): main's summary step rows of the bf16 models (V2-Lite TP 1, V2 TP 8
# rank; bf16 cache, and V2-Lite batch 1 with an f32 cache), then the whole gpu suite.
set -u
source .gpu-host/env.sh
R=$OUT/r; mkdir -p $R
start=$(date +%s)
pack() { tar czf $OUT/r.tgz -C $OUT r; }
REPO=$(pwd)
cmake -S . -B build/gpu -G Ninja -DCMAKE_BUILD_TYPE=Release > $R/build.log 2>&1 && cmake --build build/gpu -j16 >> $R/build.log 2>&1
echo "build rc=$? $(( $(date +%s) - start )) s"; tail -1 $R/build.log
T=build/gpu/tests; B=build/gpu/benchmarks
export EAGLE3_BENCH_CKPT_DIR=$REPO/build/ckpt
SF='BM_DecodeStep/model:[01]/batch:1/context:1024/graph:1|BM_DecodeStep/model:0/batch:8/context:1024/graph:1|BM_VerifyStep/model:[01]/batch:1/tokens:8/context:4096/graph:1'
env EAGLE3_BENCH_MODELS=01 EAGLE3_BENCH_KV_CACHE=bf16 timeout 200 $B/decode_step_benchmark --benchmark_filter="$SF" \
  --benchmark_repetitions=3 --benchmark_report_aggregates_only=true --benchmark_out=$R/decode_step_benchmark.m01bf16.json > $R/step_m01.txt 2>&1
echo "step m01 bf16 rc=$? $(( $(date +%s) - start )) s"; grep median $R/step_m01.txt | awk '{print $1, $2}'
env EAGLE3_BENCH_MODELS=0 timeout 80 $B/decode_step_benchmark --benchmark_filter='BM_DecodeStep/model:0/batch:1/context:1024/graph:1' \
  --benchmark_repetitions=3 --benchmark_report_aggregates_only=true --benchmark_out=$R/decode_step_benchmark.m0f32.json > $R/step_m0f32.txt 2>&1
echo "step m0 f32 rc=$? $(( $(date +%s) - start )) s"; grep median $R/step_m0f32.txt | awk '{print $1, $2}'
pack
timeout 300 scripts/gpu_suite.sh $T $R/suite --sanitize none --jobs 4 --test-seconds 240 > $R/suite_stdout.txt 2>&1
echo "suite rc=$? $(( $(date +%s) - start )) s"; cut -c1-150 $R/suite/summary.txt | grep -v "^ok" | head -20; grep -c "^ok" $R/suite/summary.txt
grep -h "near-tie\|differs from plain" $R/suite/logs/*.log | head -8
pack
echo "done $(( $(date +%s) - start )) s"
