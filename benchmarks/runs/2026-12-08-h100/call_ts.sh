#!/bin/bash
# Call TS for issue 20 (written in the thirty-ninth and fortieth sessions, not yet run: no machine
# started in the fortieth), from branch ts-cd: main + tile-steps (EAGLE3_EXP_TILE_STEPS=s, the
# in-block down blocks of several tokens at s steps a warp, INT4 as well as FP8; unset: main's rule)
# + chain-depth (the one-token chain's down tiles: EAGLE3_EXP_CHAIN_DOWN_DEPTH=3 ring steps, or
# EAGLE3_EXP_CHAIN_ASK=1 / 2 asking for their later steps' lines into L2 / L1 before the wait, bit 4
# the combine's inputs read into shared memory at the tile's start). In order: the build; main's
# gpu tests (quant_gemv_test, cuda_quantized_moe_test, cuda_backend_core_test), the fold tests at
# s 16 / 32 and the chain tests at each chain switch, at once; BM_QuantMoe K2.5 one token at each
# chain switch, alternated twice; BM_QuantMoe 1-16 tokens, direct rounds throughout
# (EAGLE3_BENCH_QUANT_MOE_DIRECT_TOKENS=16) at main's rule, s 16 and s 32, beside the grouped path
# (TS_ROUNDS="1 2" for two rounds); routings whose consecutive tokens share experts (p 0.35) at 8,
# 12 and 16 tokens, grouped against direct at main's rule and at s 32. TS_SHORT=1 runs the chain's
# switches once right after the build (for a short lease); TS_SUITE=1 adds the whole suite (too long
# from a cold start: run pending/call_v4.sh from main as a second call instead). From the
# repository root on any one GPU, .gpu-host carried; ~7 min with the start. Logs under $OUT/ts
# (ts.tgz).
set -u
source .gpu-host/env.sh
R=$OUT/ts; mkdir -p $R; start=$(date +%s)
pack() { tar czf $OUT/ts.tgz -C $OUT ts; }
log() { echo "$* $(( $(date +%s) - start )) s" >> $R/log.txt; pack; }
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv,noheader > $R/gpu.txt
cmake -S . -B /tmp/b -G Ninja -DCMAKE_BUILD_TYPE=Release -DEAGLE3_ENABLE_CUDA=ON -DEAGLE3_BUILD_EXAMPLES=OFF > $R/build.log 2>&1
cmake --build /tmp/b -j16 --target quant_gemv_test cuda_quantized_moe_test cuda_backend_core_test quant_moe_benchmark \
  >> $R/build.log 2>&1
log "build rc=$?"
test_run() {  # tag binary filter [env...]
  local tag=$1 bin=$2 filter=$3; shift 3
  env "$@" timeout 220 /tmp/b/tests/$bin --gtest_filter="$filter" > $R/t_$tag.txt 2>&1
  log "$tag rc=$? $(grep -E '^\[  (PASSED|FAILED) ' $R/t_$tag.txt | tr '\n' ' ')"
}
if [ -n "${TS_SHORT:-}" ]; then  # TS_SHORT=1: a last short lease: the chain's variants once, then main's tests
  B=/tmp/b/benchmarks/quant_moe_benchmark
  for v in x EAGLE3_EXP_CHAIN_ASK=1 EAGLE3_EXP_CHAIN_ASK=4 EAGLE3_EXP_CHAIN_ASK=5 y; do
    env ${v/[xy]/EAGLE3_NONE=1} timeout 60 $B --benchmark_filter='BM_QuantMoe/model:0/tokens:1/' --benchmark_repetitions=3 \
      --benchmark_report_aggregates_only=true > $R/short_$v.txt 2>&1
    log "short $v $(grep median $R/short_$v.txt | awk '{print $1, $2}' | tr '\n' ' ')"
  done
  for v in x EAGLE3_EXP_X_BF16=1 y; do
    env ${v/[xy]/EAGLE3_NONE=1} timeout 60 $B --benchmark_filter='BM_QuantMoe/model:[01]/tokens:(1|4)/' --benchmark_repetitions=3 \
      --benchmark_report_aggregates_only=true > $R/shortx_$v.txt 2>&1
    log "shortx $v $(grep median $R/shortx_$v.txt | awk '{print $1, $2}' | tr '\n' ' ') eq=$(grep median $R/shortx_$v.txt | grep -c 'x_bf16_bits_equal=1')"
  done
fi
test_run gemv quant_gemv_test '*' &
test_run moe cuda_quantized_moe_test '*' &
test_run core cuda_backend_core_test '*' &
test_run moe_s16 cuda_quantized_moe_test '*Fold*:*Rank*' EAGLE3_EXP_TILE_STEPS=16 &
test_run moe_s32 cuda_quantized_moe_test '*Fold*:*Rank*' EAGLE3_EXP_TILE_STEPS=32 &
for v in EAGLE3_EXP_CHAIN_ASK=1 EAGLE3_EXP_CHAIN_ASK=2 EAGLE3_EXP_CHAIN_ASK=5 EAGLE3_EXP_CHAIN_DOWN_DEPTH=3; do
  test_run chain_${v#EAGLE3_EXP_CHAIN_} quant_gemv_test '*Chain*' $v &
  test_run moechain_${v#EAGLE3_EXP_CHAIN_} cuda_quantized_moe_test '*Chained*' $v &
done
wait
B=/tmp/b/benchmarks/quant_moe_benchmark
sed_names() { sed 's/BM_Quant[A-Za-z]*.\(model\|shape\)://; s/.iterations.*manual_time_median//'; }
moe() {  # tag filter [env...]
  local tag=$1 filter=$2; shift 2
  env "$@" timeout 90 $B --benchmark_filter="$filter" --benchmark_repetitions=3 \
    --benchmark_report_aggregates_only=true > $R/moe_$tag.txt 2>&1
  log "moe $tag rc=$? $(grep median $R/moe_$tag.txt | awk '{print $1, $2}' | sed_names | tr '\n' ' ')"
}
# Branch x-bf16 adds: EAGLE3_EXP_X_BF16=1 (the benchmark rewrites x as bf16 rows and the direct
# rounds' gate-up stages those: half of x's bytes through L2, no conversion a block), alternated
# twice with the f32 x in the same binary; x_bf16_bits_equal=1 on every row (the same staged values).
xb() {  # tag [env...]
  local tag=$1; shift
  moe $tag 'BM_QuantMoe/model:0/tokens:(1|4|8)/|BM_QuantMoe/model:[12]/tokens:(1|4)/' "$@"
  log "  $tag bits_equal rows: $(grep median $R/moe_$tag.txt | grep -c 'x_bf16_bits_equal=1') of $(grep median $R/moe_$tag.txt | grep -c 'x_bf16_bits_equal')"
}
for r in 1 2; do xb xf.$r; xb xb.$r EAGLE3_EXP_X_BF16=1; done
# Branch ts-cd adds chain-depth: the one-token chain's down tiles at ring depth 3 / 4
# (EAGLE3_EXP_CHAIN_DOWN_DEPTH; ptxas spills 120 / 324 bytes) or asking for their later steps' lines
# before the wait (EAGLE3_EXP_CHAIN_ASK 1: L2, 2: L1; bit 4: the combine's inputs read into shared
# memory at the tile's start), K2.5 one token, alternated twice.
FC='BM_QuantMoe/model:0/tokens:1/'
for r in 1 2; do
  moe c_def.$r "$FC"
  moe c_ask1.$r "$FC" EAGLE3_EXP_CHAIN_ASK=1
  moe c_ask2.$r "$FC" EAGLE3_EXP_CHAIN_ASK=2
  moe c_ask4.$r "$FC" EAGLE3_EXP_CHAIN_ASK=4
  moe c_ask5.$r "$FC" EAGLE3_EXP_CHAIN_ASK=5
  moe c_d3.$r "$FC" EAGLE3_EXP_CHAIN_DOWN_DEPTH=3
done
F='BM_QuantMoe/model:[0-2]/tokens:(1|2|4|8|12|16)/'
D=EAGLE3_BENCH_QUANT_MOE_DIRECT_TOKENS=16
for r in ${TS_ROUNDS:-1}; do
  moe grouped.$r "$F" EAGLE3_BENCH_QUANT_MOE_DIRECT_TOKENS=1
  moe main.$r "$F" $D
  moe s16.$r "$F" $D EAGLE3_EXP_TILE_STEPS=16
  moe s32.$r "$F" $D EAGLE3_EXP_TILE_STEPS=32
done
FS='BM_QuantMoe/model:(0|1|2)/tokens:(8|12|16)/'
S=EAGLE3_BENCH_ROUTING_SHARE=0.35
moe share_grouped "$FS" $S EAGLE3_BENCH_QUANT_MOE_DIRECT_TOKENS=1
moe share_main "$FS" $S $D
moe share_s32 "$FS" $S $D EAGLE3_EXP_TILE_STEPS=32
if [ -n "${TS_SUITE:-}" ]; then  # TS_SUITE=1: ~5 min more, past one call's limit from a cold start
  cmake --build /tmp/b -j16 >> $R/build.log 2>&1
  log "full build rc=$?"
  scripts/gpu_suite.sh /tmp/b/tests $R/suite --sanitize none --jobs 4 --test-seconds 200 > $R/suite.log 2>&1
  log "suite rc=$? $(grep -c ' rc=0 ' $R/suite/summary.txt) binaries rc=0 of $(grep -c ' rc=' $R/suite/summary.txt)"
  grep -v ' rc=0 ' $R/suite/summary.txt > $R/suite_not_ok.txt
fi
log done
