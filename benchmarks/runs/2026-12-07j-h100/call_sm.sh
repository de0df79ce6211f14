#!/bin/bash
# Call SM for issue 20 (written in the thirty-eighth session, run in the thirty-ninth on an H100), from branch slot-major (main + three
# experiments behind switches, off by default): BM_QuantMoe at 1-16 tokens, defaults and
# EAGLE3_BENCH_QUANT_MOE_DIRECT_TOKENS=16 (direct rounds throughout), the latter also with
# EAGLE3_EXP_SLOT_MAJOR=1 (direct rounds of several tokens visit their items slot-major: tokens that
# share an expert, the joined shared expert above all, read it at once) and with
# EAGLE3_EXP_FP8_TILE3=1 (the fp8 in-block down product of 8 warps at 3 blocks a multiprocessor),
# each twice, and with EAGLE3_EXP_TILE_ROW_LOOPS=2 / 4 (the in-block form of several tokens at 2 or 4
# row loops: fewer, longer blocks; 2 also with the 3-block fp8 form); the same at 4, 8 and 14 tokens on routings whose tokens share experts; then
# quant_gemv_test, cuda_quantized_moe_test and cuda_backend_core_test (main's
# merged tests: call_v4.sh's first part) and the tests the switches touch with them on, at once.
# SM_SUITE=1 adds the whole gpu suite. From the repository root on any one GPU, .gpu-host carried;
# ~6 min with the start (SM_SUITE: ~10, past one call's limit from a cold start). Logs under $OUT/sm
# (sm.tgz).
set -u
source .gpu-host/env.sh
R=$OUT/sm; mkdir -p $R; start=$(date +%s)
pack() { tar czf $OUT/sm.tgz -C $OUT sm; }
log() { echo "$* $(( $(date +%s) - start )) s" >> $R/log.txt; pack; }
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv,noheader > $R/gpu.txt
cmake -S . -B /tmp/b -G Ninja -DCMAKE_BUILD_TYPE=Release -DEAGLE3_ENABLE_CUDA=ON -DEAGLE3_BUILD_EXAMPLES=OFF > $R/build.log 2>&1
cmake --build /tmp/b -j16 --target quant_gemv_test cuda_quantized_moe_test cuda_backend_core_test quant_moe_benchmark \
  >> $R/build.log 2>&1
log "build rc=$?"
B=/tmp/b/benchmarks/quant_moe_benchmark
sed_names() { sed 's/BM_Quant[A-Za-z]*.\(model\|shape\)://; s/.iterations.*manual_time_median//'; }
moe() {  # tag filter [env...]
  local tag=$1 filter=$2; shift 2
  env "$@" timeout 90 $B --benchmark_filter="$filter" --benchmark_repetitions=3 \
    --benchmark_report_aggregates_only=true > $R/moe_$tag.txt 2>&1
  log "moe $tag rc=$? $(grep median $R/moe_$tag.txt | awk '{print $1, $2}' | sed_names | tr '\n' ' ')"
}
F='BM_QuantMoe/model:[0-2]/tokens:(1|2|4|8|12|16)/'
D=EAGLE3_BENCH_QUANT_MOE_DIRECT_TOKENS=16
for r in 1 2; do
  moe def.$r "$F"
  moe d16.$r "$F" $D
  moe d16sm.$r "$F" $D EAGLE3_EXP_SLOT_MAJOR=1
  moe d16t3.$r "$F" $D EAGLE3_EXP_FP8_TILE3=1
  moe d16rl2.$r "$F" $D EAGLE3_EXP_TILE_ROW_LOOPS=2
  moe d16rl4.$r "$F" $D EAGLE3_EXP_TILE_ROW_LOOPS=4
  moe d16rl2t3.$r "$F" $D EAGLE3_EXP_TILE_ROW_LOOPS=2 EAGLE3_EXP_FP8_TILE3=1
done
# Routings whose consecutive tokens share experts (p 0.35): the grouped path against direct rounds,
# row order and slot-major, where the default bounds matter (K2.5 and V3 with its shared expert).
FS='BM_QuantMoe/model:(0|2)/tokens:(4|8|14)/'
S=EAGLE3_BENCH_ROUTING_SHARE=0.35
moe share_grouped "$FS" $S EAGLE3_BENCH_QUANT_MOE_DIRECT_TOKENS=1
moe share_d16 "$FS" $S $D
moe share_d16sm "$FS" $S $D EAGLE3_EXP_SLOT_MAJOR=1
# The tests, and those the switches touch with them on, at once.
test_run() {  # tag binary filter [env...]
  local tag=$1 bin=$2 filter=$3; shift 3
  env "$@" timeout 220 /tmp/b/tests/$bin --gtest_filter="$filter" > $R/t_$tag.txt 2>&1
  log "$tag rc=$? $(grep -E '^\[  (PASSED|FAILED) ' $R/t_$tag.txt | tr '\n' ' ')"
}
test_run gemv quant_gemv_test '*' &
test_run moe cuda_quantized_moe_test '*' &
test_run core cuda_backend_core_test '*' &
test_run gemv_tile3 quant_gemv_test '*CombineInBlock*' EAGLE3_EXP_FP8_TILE3=1 &
test_run moe_both cuda_quantized_moe_test '*Fold*:*Rank*' EAGLE3_EXP_SLOT_MAJOR=1 EAGLE3_EXP_FP8_TILE3=1 &
test_run moe_rl4 cuda_quantized_moe_test '*Fold*:*Rank*' EAGLE3_EXP_TILE_ROW_LOOPS=4 &
wait
if [ -n "${SM_SUITE:-}" ]; then  # SM_SUITE=1: the whole gpu suite after (~4 min more; the call's limit is 10)
  cmake --build /tmp/b -j16 >> $R/build.log 2>&1
  log "full build rc=$?"
  scripts/gpu_suite.sh /tmp/b/tests $R/suite --sanitize none --jobs 4 --test-seconds 200 > $R/suite.log 2>&1
  log "suite rc=$? $(grep -c ' rc=0 ' $R/suite/summary.txt) binaries rc=0 of $(grep -c ' rc=' $R/suite/summary.txt)"
  grep -v ' rc=0 ' $R/suite/summary.txt > $R/suite_not_ok.txt
fi
log done
