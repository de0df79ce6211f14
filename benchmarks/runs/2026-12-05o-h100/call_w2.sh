#!/bin/bash
# Call W2 (twenty-third session): V2-Lite TP 1 steps at main against fbbe3f8's library (aa464f1's
# measurement; the 40-token bound's rows), interleaved main / base / main.
set -u
source .gpu-host/env.sh
R=$OUT/w2; mkdir -p $R
start=$(date +%s)
pack() { tar czf $OUT/w2.tgz -C $OUT w2; }
REPO=$(pwd)
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee $R/gpu.txt
B=build/gpu/benchmarks
if [ ! -x /tmp/base/b/benchmarks/decode_step_benchmark ]; then echo "base missing: rebuilding"; bash .gpu-host/calls/w1base.sh; fi
if [ ! -x $B/decode_step_benchmark ]; then cmake -S . -B build/gpu -G Ninja -DCMAKE_BUILD_TYPE=Release > $R/build.log 2>&1 && cmake --build build/gpu -j12 --target decode_step_benchmark >> $R/build.log 2>&1; fi
export EAGLE3_BENCH_CKPT_DIR=$REPO/build/ckpt
SF='BM_DecodeStep/model:0/batch:(1|32)/context:1024/graph:1|BM_VerifyStep/model:0/batch:(1|8)/tokens:8/context:4096/graph:1'
step() {
  env EAGLE3_BENCH_MODELS=0 EAGLE3_BENCH_KV_CACHE=bf16 timeout 150 $2/decode_step_benchmark --benchmark_filter="$SF" \
    --benchmark_repetitions=3 --benchmark_report_aggregates_only=true --benchmark_out=$R/step_$1.json > $R/step_$1.txt 2>&1
  echo "step $1 rc=$? $(( $(date +%s) - start )) s"; grep median $R/step_$1.txt | awk '{print $1, $2}' | sed 's/\/iterations.*manual_time_median//'
  pack
}
step main $B
step base /tmp/base/b/benchmarks
step main2 $B
echo "done $(( $(date +%s) - start )) s"
