#!/bin/bash
# Call FP2 (thirty-sixth session): fp8-round after call FP, built here from the carried tree: the
# FP8 chain's gate-up ring at 2 units (4 steps), the MoE launcher taking a call of more pairs a token
# than its workspace's top_k (BM_QuantMoe model 2 failed so in call FP). Tests: quant_gemv_test,
# cuda_quantized_moe_test, model_gpu_test. BM_QuantMoe 1 / 4 tokens, models 0-2: the branch's binary
# by default, with EAGLE3_BENCH_QUANT_MOE_CHAIN=0 and with EAGLE3_BENCH_QUANT_MOE_IN_BLOCK=0,
# alternated twice, then main's carried binary once (models 0, 1). ~5 min with the start.
# Logs: $OUT/fp2 (fp2.tgz).
set -u
source .gpu-host/env.sh
R=$OUT/fp2; mkdir -p $R; start=$(date +%s)
pack() { tar czf $OUT/fp2.tgz -C $OUT fp2; }
log() { echo "$* $(( $(date +%s) - start )) s" >> $R/log.txt; pack; }
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv,noheader > $R/gpu.txt
rm -rf /tmp/cl && tar xJf .gpu-host/cl.txz -C /tmp && export LD_LIBRARY_PATH=/tmp/cl/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
cmake -S . -B /tmp/b -G Ninja -DCMAKE_BUILD_TYPE=Release -DEAGLE3_ENABLE_CUDA=ON -DEAGLE3_BUILD_EXAMPLES=OFF > $R/build.log 2>&1
cmake --build /tmp/b -j16 --target quant_gemv_test cuda_quantized_moe_test model_gpu_test quant_moe_benchmark \
  >> $R/build.log 2>&1; log "build rc=$?"
moe() {  # tag binary filter [env...]
  local tag=$1 bin=$2 filter=$3; shift 3
  env "$@" timeout 60 $bin --benchmark_filter="$filter" --benchmark_repetitions=3 \
    --benchmark_report_aggregates_only=true > $R/moe_$tag.txt 2>&1
  log "moe $tag rc=$? $(grep median $R/moe_$tag.txt | awk '{print $1, $2}' | sed 's/BM_QuantMoe.model://; s/.iterations.*manual_time_median//' | tr '\n' ' ')"
}
F='BM_QuantMoe/model:[0-2]/tokens:(1|4)/'
B=/tmp/b/benchmarks/quant_moe_benchmark
for rep in 1 2; do
  moe new.$rep $B "$F"
  moe nch.$rep $B 'BM_QuantMoe/model:[0-2]/tokens:1/' EAGLE3_BENCH_QUANT_MOE_CHAIN=0
  moe nib.$rep $B 'BM_QuantMoe/model:[0-2]/tokens:1/' EAGLE3_BENCH_QUANT_MOE_IN_BLOCK=0
done
moe main.1 /tmp/cl/main/quant_moe_benchmark 'BM_QuantMoe/model:[0-1]/tokens:(1|4)/'
for t in quant_gemv_test cuda_quantized_moe_test model_gpu_test; do
  timeout 150 /tmp/b/tests/$t > $R/t_$t.txt 2>&1
  log "$t rc=$? $(grep -E '^\[  (PASSED|FAILED) ' $R/t_$t.txt | tr '\n' ' ')"
done
log done
