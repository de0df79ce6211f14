#!/bin/bash
# Call N (written in the twenty-eighth session, not run since: no H200 came; the twenty-ninth added
# the last step). On an H200 (the K2.5 and V3 ranks take 87 / 97 GB: pass needs_h200), from a
# checkout of main with .gpu-host carried: RESULTS' quantized rows at main: quant_moe_benchmark
# BM_QuantMoe and quant_gemv_benchmark BM_QuantGemv (tiled, as 2026-12-05c), 3 repetitions, JSON;
# then the K2.5 INT4 and V3 FP8 TP 8 ranks' decode (batch 1, 1K) and 8-token verify (batch 1, 4K)
# steps with bf16 caches, and K2.5's decode step again with the chained round off
# (EAGLE3_BENCH_QUANT_MOE_CHAIN=0). ~450 s with the machine's start. Logs under $OUT/n. BM_QuantMoe
# now has model 2 (V3 with its shared expert joined: 9 pairs, a V3 decode step's call): add its
# 1-token row to benchmarks/targets.json's MoE cases when the run lands in RESULTS.
set -u
source .gpu-host/env.sh
R=$OUT/n; mkdir -p $R; start=$(date +%s)
pack() { tar czf $OUT/n.tgz -C $OUT n; }
log() { echo "$* $(( $(date +%s) - start )) s" >> $R/log.txt; pack; }
REPO=$(pwd)
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader > $R/gpu.txt
git log --oneline -1 > $R/head.txt 2>&1
cmake -S . -B build/n -G Ninja -DCMAKE_BUILD_TYPE=Release -DEAGLE3_BUILD_EXAMPLES=OFF -DEAGLE3_BUILD_TESTS=OFF > $R/build.log 2>&1
cmake --build build/n -j16 --target quant_moe_benchmark quant_gemv_benchmark decode_step_benchmark >> $R/build.log 2>&1; log "build rc=$?"
B=build/n/benchmarks
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
env EAGLE3_BENCH_MODELS=3 EAGLE3_BENCH_KV_CACHE=bf16 EAGLE3_BENCH_QUANT_MOE_CHAIN=0 timeout 60 $B/decode_step_benchmark \
  --benchmark_filter="BM_DecodeStep/model:3/batch:1/context:1024/graph:1" \
  --benchmark_repetitions=3 --benchmark_report_aggregates_only=true > $R/step_m3_chain0.txt 2>&1
log "step m3 chain=0 rc=$? $(grep median $R/step_m3_chain0.txt | awk '{print $1, $2}' | tr '\n' ' ')"
log done
