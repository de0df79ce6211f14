#!/bin/bash
# Call V (twenty-ninth session), after call U on the same H200 (needs_h200: the K2.5 and V3 ranks
# take 87 / 97 GB): RESULTS' quantized rows from call U's build: BM_QuantGemv (tiled) with 3
# repetitions, JSON; the K2.5 INT4 and V3 FP8 TP 8 ranks' decode (batch 1, 1K) and 8-token verify
# (batch 1, 4K) steps with bf16 caches; K2.5's decode step again with the chain off. Logs under $OUT/v.
set -u
source .gpu-host/env.sh
R=$OUT/v; mkdir -p $R; start=$(date +%s)
pack() { tar czf $OUT/v.tgz -C $OUT v; }
log() { echo "$* $(( $(date +%s) - start )) s" >> $R/log.txt; pack; }
REPO=$(pwd)
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader > $R/gpu.txt
B=build/u/benchmarks
EAGLE3_BENCH_QUANT_TILED=1 timeout 100 $B/quant_gemv_benchmark --benchmark_filter='BM_QuantGemv/' --benchmark_repetitions=3 \
  --benchmark_report_aggregates_only=true --benchmark_out=$R/quant_gemv_benchmark.json > $R/gemv.txt 2>&1; log "gemv rc=$?"
export EAGLE3_BENCH_CKPT_DIR=$REPO/build/ckpt
for m in 3 2; do
  env EAGLE3_BENCH_MODELS=$m EAGLE3_BENCH_KV_CACHE=bf16 timeout 150 $B/decode_step_benchmark \
    --benchmark_filter="BM_(Decode|Verify)Step/model:$m/batch:1/(context:1024|tokens:8/context:4096)/graph:1" \
    --benchmark_repetitions=3 --benchmark_report_aggregates_only=true --benchmark_out=$R/decode_step_benchmark.m$m.json > $R/step_m$m.txt 2>&1
  log "step m$m rc=$? $(grep median $R/step_m$m.txt | awk '{print $1, $2}' | tr '\n' ' ')"
done
env EAGLE3_BENCH_MODELS=3 EAGLE3_BENCH_KV_CACHE=bf16 EAGLE3_BENCH_QUANT_MOE_CHAIN=0 timeout 60 $B/decode_step_benchmark \
  --benchmark_filter="BM_DecodeStep/model:3/batch:1/context:1024/graph:1" \
  --benchmark_repetitions=3 --benchmark_report_aggregates_only=true > $R/step_m3_chain0.txt 2>&1
log "step m3 chain=0 rc=$? $(grep median $R/step_m3_chain0.txt | awk '{print $1, $2}' | tr '\n' ' ')"
log done
