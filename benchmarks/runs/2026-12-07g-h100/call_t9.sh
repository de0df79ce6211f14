#!/bin/bash
# Call T9 (thirty-seventh session), from branch stage-rotate (on tile-nine):
# - tile-nine: the in-block combine for 9 items (a block of 9 warps, a warp an item: V3 / R1 /
#   K2-Instruct's top-8 with the shared expert joined);
# - stage-rotate: EAGLE3_EXP_STAGE_ROTATE=1 starts each block's activation staging at a piece chosen
#   by its multiprocessor (the same values staged: the same bits).
# Built here from the carried tree. BM_QuantMoe models 0-2 at 1 / 4 tokens, alternated with
# EAGLE3_BENCH_QUANT_MOE_IN_BLOCK=0 (the counters) and with the rotation, twice; BM_QuantGemv at one
# row (V3's q_a / kv_a / o_proj, the 18- and 16-item gate-up shapes) with and without the rotation,
# twice; Nsight Compute of model 2's kernels; BM_QuantGemvPlan of the gate-up shapes; then
# quant_gemv_test and cuda_quantized_moe_test, and the chain / in-block tests rotated. ~8 min with
# the start (T9_QUICK=1: ~5). Logs: $OUT/t9 (t9.tgz).
set -u
source .gpu-host/env.sh
R=$OUT/t9; mkdir -p $R; start=$(date +%s)
pack() { tar czf $OUT/t9.tgz -C $OUT t9; }
log() { echo "$* $(( $(date +%s) - start )) s" >> $R/log.txt; pack; }
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv,noheader > $R/gpu.txt
git log --oneline -1 > $R/head.txt 2>&1
cmake -S . -B /tmp/b -G Ninja -DCMAKE_BUILD_TYPE=Release -DEAGLE3_ENABLE_CUDA=ON -DEAGLE3_BUILD_EXAMPLES=OFF > $R/build.log 2>&1
cmake --build /tmp/b -j16 --target quant_gemv_test cuda_quantized_moe_test quant_moe_benchmark quant_gemv_benchmark \
  >> $R/build.log 2>&1
log "build rc=$?"
B=/tmp/b/benchmarks/quant_moe_benchmark
sed_names() { sed 's/BM_Quant[A-Za-z]*.\(model\|shape\)://; s/.iterations.*manual_time_median//'; }
moe() {  # tag filter [env...]
  local tag=$1 filter=$2; shift 2
  env "$@" timeout 60 $B --benchmark_filter="$filter" --benchmark_repetitions=3 \
    --benchmark_report_aggregates_only=true > $R/moe_$tag.txt 2>&1
  log "moe $tag rc=$? $(grep median $R/moe_$tag.txt | awk '{print $1, $2}' | sed_names | tr '\n' ' ')"
}
gemv() {  # tag [env...]
  local tag=$1; shift
  env EAGLE3_BENCH_QUANT_TILED=1 "$@" timeout 60 /tmp/b/benchmarks/quant_gemv_benchmark \
    --benchmark_filter='BM_QuantGemv/shape:(0|2|5|21|22)/m:1/' > $R/gemv_$tag.txt 2>&1
  log "gemv $tag rc=$? $(grep median $R/gemv_$tag.txt | awk '{print $1, $2}' | sed_names | tr '\n' ' ')"
}
prof() {  # tag model [env...]
  local tag=$1 model=$2; shift 2
  env "$@" timeout 120 ncu --section SpeedOfLight --section LaunchStats --kernel-name regex:Quant --launch-skip 8 \
    --launch-count 6 $B --benchmark_filter="BM_QuantMoe/model:$model/tokens:1/" --benchmark_min_time=0.01 \
    > $R/ncu_$tag.txt 2>&1
  log "ncu $tag rc=$? $(grep -E '^  [A-Za-z].*\(|Duration' $R/ncu_$tag.txt | tr -s ' ' | cut -c1-60 | tr '\n' ';')"
}
for r in 1 2; do
  moe new.$r 'BM_QuantMoe/model:[0-2]/tokens:(1|4)/'
  moe nib.$r 'BM_QuantMoe/model:[1-2]/tokens:1/' EAGLE3_BENCH_QUANT_MOE_IN_BLOCK=0
  moe rot.$r 'BM_QuantMoe/model:[0-2]/tokens:(1|4)/' EAGLE3_EXP_STAGE_ROTATE=1
done
if [ -z "${T9_QUICK:-}" ]; then  # T9_QUICK=1: the MoE rows and the tests only
gemv base; gemv rot EAGLE3_EXP_STAGE_ROTATE=1; gemv base2; gemv rot2 EAGLE3_EXP_STAGE_ROTATE=1
prof m2 2
# The 9-pair round's gate-up shape (18 items, 256 rows, K 7168) and K2.5's (16 items) under every
# plan of wk 1-8 and split 1-4: whether the chooser's clusters of 3 are still the fastest.
EAGLE3_BENCH_QUANT_TILED=1 timeout 100 /tmp/b/benchmarks/quant_gemv_benchmark \
  --benchmark_filter='BM_QuantGemvPlan/shape:(21|22)/m:1/' > $R/plans.txt 2>&1
log "plans rc=$? $(grep median $R/plans.txt | awk '{print $1, $2}' | sed_names | tr '\n' ' ')"
fi
for t in quant_gemv_test cuda_quantized_moe_test; do
  timeout 150 /tmp/b/tests/$t > $R/t_$t.txt 2>&1
  log "$t rc=$? $(grep -E '^\[  (PASSED|FAILED) ' $R/t_$t.txt | tr '\n' ' ')"
done
EAGLE3_EXP_STAGE_ROTATE=1 timeout 60 /tmp/b/tests/quant_gemv_test --gtest_filter='*CombineInBlock*:*Chain*' \
  > $R/t_rot.txt 2>&1
log "rotated chain / in-block tests rc=$? $(grep -E '^\[  (PASSED|FAILED) ' $R/t_rot.txt | tr '\n' ' ')"
log done
