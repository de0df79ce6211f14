#!/bin/bash
# Call A: build, the wgmma kernel's tests, the latent kernel A/B.
set -u
source .gpu-host/env.sh
R=$OUT/a; mkdir -p $R
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,clocks.mem --format=csv > $R/gpu.txt 2>&1
start=$(date +%s)
cmake -S . -B build/gpu -G Ninja -DCMAKE_BUILD_TYPE=Release > $R/build.log 2>&1 && cmake --build build/gpu -j16 >> $R/build.log 2>&1
echo "build rc=$? $(( $(date +%s) - start )) s"; tail -3 $R/build.log
T=build/gpu/tests; B=build/gpu/benchmarks
$T/latent_wgmma_layout_test 2>&1 | tail -1; $T/latent_plan_test 2>&1 | tail -1
timeout 200 $T/cuda_latent_bf16_test > $R/latent_test.txt 2>&1; echo "latent_test rc=$? $(( $(date +%s) - start )) s"
grep -E "^\[  (FAILED|PASSED|SKIPPED) |^\[       OK|Failure|error" $R/latent_test.txt | head -40
F='BM_BatchedLatentAttention/heads:16/context:4096/batch:(1|8|32)/qtokens:(1|4|8|16|64)/cache_bits:16/|BM_BatchedLatentAttention/heads:128/context:4096/batch:(1|32)/'
for v in mma wgmma wgmma-all; do
  EAGLE3_LATENT_TREE_KERNEL=$v timeout 110 $B/mla_decode_benchmark --benchmark_filter="$F" --benchmark_repetitions=3 \
    --benchmark_report_aggregates_only=true --benchmark_out=$R/mla_$v.json > $R/mla_$v.txt 2>&1
  echo "mla $v rc=$? $(( $(date +%s) - start )) s"
  grep median $R/mla_$v.txt | awk '{print $1, $2, $3}' | sed 's/BM_BatchedLatentAttention\///; s/\/iterations.*manual_time_median//'
done
tar czf $OUT/a.tgz -C $OUT a; echo "done $(( $(date +%s) - start )) s"
