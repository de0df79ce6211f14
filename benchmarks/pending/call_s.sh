#!/bin/bash
# Call S (twenty-ninth session), the second call on the machine that ran call_r.sh, from branch
# moe-tile-combine: RESULTS' quantized rows on an H200 (needs_h200: the ranks take 87 / 97 GB),
# as call_n.sh but from call R's build: BM_QuantMoe and BM_QuantGemv (tiled) with 3 repetitions,
# JSON, the in-block combine at its default (on); then the K2.5 INT4 and V3 FP8 TP 8 ranks' decode
# (batch 1, 1K) and 8-token verify (batch 1, 4K) steps with bf16 caches, and K2.5's decode step
# again with the combine through counters (EAGLE3_BENCH_QUANT_MOE_IN_BLOCK=0). Logs under $OUT/s.
set -u
source .gpu-host/env.sh
R=$OUT/s; mkdir -p $R; start=$(date +%s)
pack() { tar czf $OUT/s.tgz -C $OUT s; }
log() { echo "$* $(( $(date +%s) - start )) s" >> $R/log.txt; pack; }
REPO=$(pwd)
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader > $R/gpu.txt
cmake --build build/r -j16 --target quant_moe_benchmark quant_gemv_benchmark decode_step_benchmark > $R/build.log 2>&1; log "build rc=$?"
B=build/r/benchmarks
timeout 90 $B/quant_moe_benchmark --benchmark_filter=BM_QuantMoe --benchmark_repetitions=3 --benchmark_report_aggregates_only=true \
  --benchmark_out=$R/quant_moe_benchmark.json > $R/moe.txt 2>&1; log "moe rc=$?"
EAGLE3_BENCH_QUANT_TILED=1 timeout 100 $B/quant_gemv_benchmark --benchmark_filter='BM_QuantGemv/' --benchmark_repetitions=3 \
  --benchmark_report_aggregates_only=true --benchmark_out=$R/quant_gemv_benchmark.json > $R/gemv.txt 2>&1; log "gemv rc=$?"
export EAGLE3_BENCH_CKPT_DIR=$REPO/build/ckpt
for m in 3 2; do
  env EAGLE3_BENCH_MODELS=$m EAGLE3_BENCH_KV_CACHE=bf16 timeout 110 $B/decode_step_benchmark \
    --benchmark_filter="BM_(Decode|Verify)Step/model:$m/batch:1/(context:1024|tokens:8/context:4096)/graph:1" \
    --benchmark_repetitions=3 --benchmark_report_aggregates_only=true --benchmark_out=$R/decode_step_benchmark.m$m.json > $R/step_m$m.txt 2>&1
  log "step m$m rc=$? $(grep median $R/step_m$m.txt | awk '{print $1, $2}' | tr '\n' ' ')"
done
env EAGLE3_BENCH_MODELS=3 EAGLE3_BENCH_KV_CACHE=bf16 EAGLE3_BENCH_QUANT_MOE_IN_BLOCK=0 timeout 60 $B/decode_step_benchmark \
  --benchmark_filter="BM_DecodeStep/model:3/batch:1/context:1024/graph:1" \
  --benchmark_repetitions=3 --benchmark_report_aggregates_only=true > $R/step_m3_inblock0.txt 2>&1
log "step m3 in_block=0 rc=$? $(grep median $R/step_m3_inblock0.txt | awk '{print $1, $2}' | tr '\n' ' ')"
log done
