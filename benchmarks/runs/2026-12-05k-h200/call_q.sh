#!/bin/bash
# Call Q (twenty-second session): build main; BM_MoeDecode at main (the RESULTS rows) and the
# 4-warp MoeAct of wip/moe-narrow (narrow.patch) beside it; the V3 FP8 and K2 INT4 TP 8 ranks'
# graph steps (decode 1K, 8-token verify 4K, bf16 cache) at main for RESULTS.
set -u
source .gpu-host/env.sh
R=$OUT/q; mkdir -p $R
start=$(date +%s)
pack() { tar czf $OUT/q.tgz -C $OUT q; }
REPO=$(pwd)
mkdir -p /tmp/narrow && cp -r CMakeLists.txt cmake src cuda include benchmarks tools testing /tmp/narrow/ && (cd /tmp/narrow && git apply $REPO/.gpu-host/narrow.patch) > $R/patch.log 2>&1
(cmake -S /tmp/narrow -B /tmp/narrow/b -G Ninja -DCMAKE_BUILD_TYPE=Release -DEAGLE3_BUILD_TESTS=OFF -DEAGLE3_BUILD_EXAMPLES=OFF && cmake --build /tmp/narrow/b -j4 --target decode_ops_benchmark) > $R/narrow_build.log 2>&1 &
BP=$!
cmake -S . -B build/gpu -G Ninja -DCMAKE_BUILD_TYPE=Release > $R/build.log 2>&1 && cmake --build build/gpu -j12 >> $R/build.log 2>&1
echo "build rc=$? $(( $(date +%s) - start )) s"; tail -1 $R/build.log
B=build/gpu/benchmarks; NB=/tmp/narrow/b/benchmarks
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv > $R/gpu.txt
timeout 150 $B/decode_ops_benchmark --benchmark_filter='BM_MoeDecode/model:[0-3]/tokens:(1|4|8|16|64)/' --benchmark_repetitions=5 \
  --benchmark_report_aggregates_only=true --benchmark_out=$R/decode_ops_benchmark.json > $R/moe_main.txt 2>&1
echo "moe main rc=$? $(( $(date +%s) - start )) s"
pack
wait $BP; echo "narrow build rc=$? $(( $(date +%s) - start )) s"
timeout 90 $NB/decode_ops_benchmark --benchmark_filter='BM_MoeDecode/model:[0-3]/tokens:(1|4|8)/' --benchmark_repetitions=5 \
  --benchmark_report_aggregates_only=true --benchmark_out=$R/moe_narrow.json > $R/moe_narrow.txt 2>&1
echo "moe narrow rc=$? $(( $(date +%s) - start )) s"
for f in main narrow; do echo "== $f"; grep median $R/moe_$f.txt | awk '{print $1, $2}' | sed 's/\/iterations.*manual_time_median//' | grep -v "tokens:\(16\|64\)"; done
pack
export EAGLE3_BENCH_CKPT_DIR=$REPO/build/ckpt
for m in 2 3; do
  env EAGLE3_BENCH_MODELS=$m EAGLE3_BENCH_KV_CACHE=bf16 timeout 240 $B/decode_step_benchmark \
    --benchmark_filter="BM_(Decode|Verify)Step/model:$m/batch:1/(context:1024|tokens:8/context:4096)/graph:1" \
    --benchmark_repetitions=3 --benchmark_report_aggregates_only=true --benchmark_out=$R/decode_step_benchmark.m$m.json > $R/step_m$m.txt 2>&1
  echo "step m$m rc=$? $(( $(date +%s) - start )) s $(grep -E 'median' $R/step_m$m.txt | awk '{print $1, $2}' | tr '\n' ' ')"
  grep -E "weights:|loaded|GB" $R/step_m$m.txt | head -4
  pack
done
echo "done $(( $(date +%s) - start )) s"
