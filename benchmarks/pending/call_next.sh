#!/bin/bash
# The thirty-first session's three pending calls in one (none ran: no device time was left). On any
# one GPU, from a checkout of main with .gpu-host carried; each variant is main's tree with one
# patch beside this script applied, in /tmp/<variant>, built in parallel:
#   trace (chain-trace.patch): call W, the chain's per-block trace and thread 0's times inside its
#     units, BM_QuantMoe K2.5 one token, two runs, each summarized (trace.py, fine.py);
#   ws (warp-staging.patch): call WS, BM_QuantMoe both models at 1 / 4 / 16 tokens with
#     EAGLE3_QUANT_GEMV_WARP_STAGING=0 / 1, twice, then quant_gemv_test and cuda_quantized_moe_test;
#   dc (down-cache.patch): call DC, BM_QuantMoe K2.5 one token with EAGLE3_QUANT_CHAIN_DOWN_CACHE=0 / 1,
#     twice, then the chain's tests with the copy on (off is main's path).
# Reordered (most telling first; each step packs its logs) so that a call cut short keeps the
# most: ~5 minutes with the builds. Logs under $OUT/x (x.tgz).
set -u
source .gpu-host/env.sh
R=$OUT/x; mkdir -p $R; start=$(date +%s)
pack() { tar czf $OUT/x.tgz -C $OUT x; }
log() { echo "$* $(( $(date +%s) - start )) s" >> $R/log.txt; pack; }
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader > $R/gpu.txt
P=$(pwd)/benchmarks/pending
build() {  # variant patch targets...
  local v=$1 patch=$2; shift 2
  rm -rf /tmp/$v && mkdir -p /tmp/$v && tar cf - --exclude=./build . | tar xf - -C /tmp/$v &&
    (cd /tmp/$v && patch -p1 < $P/$patch > $R/patch_$v.log 2>&1 &&
     cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DEAGLE3_BUILD_EXAMPLES=OFF > $R/build_$v.log 2>&1 &&
     cmake --build build -j6 --target "$@" >> $R/build_$v.log 2>&1)
  echo "build $v rc=$?" >> $R/builds.txt
}
build trace chain-trace.patch quant_moe_benchmark &
build ws warp-staging.patch quant_gemv_test cuda_quantized_moe_test quant_moe_benchmark &
build dc down-cache.patch quant_gemv_test cuda_quantized_moe_test quant_moe_benchmark &
wait; log "$(tr '\n' ' ' < $R/builds.txt)"
# trace
for i in 1 2; do
  EAGLE3_BENCH_CHAIN_TRACE=$R/trace$i timeout 40 /tmp/trace/build/benchmarks/quant_moe_benchmark \
    --benchmark_filter='BM_QuantMoe/model:0/tokens:1/' --benchmark_repetitions=3 --benchmark_report_aggregates_only=true \
    > $R/trace_moe$i.txt 2>&1
  log "trace moe $i rc=$? $(grep median $R/trace_moe$i.txt | awk '{print $2}')"
  python3 /tmp/trace/benchmarks/pending/trace.py $R/trace$i.0.1 > $R/trace_summary$i.txt 2>&1
  python3 /tmp/trace/benchmarks/pending/fine.py $R/trace$i.0.1 $R/trace$i.fine.0.1 >> $R/trace_summary$i.txt 2>&1
  pack
done
# dc: the A/B, then the chain's tests with the copy on (off is main's path)
B=/tmp/dc/build
for rep in 1 2; do
  for dc in 0 1; do
    EAGLE3_QUANT_CHAIN_DOWN_CACHE=$dc timeout 40 $B/benchmarks/quant_moe_benchmark \
      --benchmark_filter='BM_QuantMoe/model:0/tokens:1/' --benchmark_repetitions=3 \
      --benchmark_report_aggregates_only=true > $R/dc_moe$dc.$rep.txt 2>&1
    log "dc moe dc=$dc rep $rep rc=$? $(grep median $R/dc_moe$dc.$rep.txt | awk '{print $2}')"
  done
done
timeout 60 $B/tests/quant_gemv_test --gtest_filter='*Chain*' > $R/dc_gemv_chain.txt 2>&1
log "dc gemv chain rc=$? $(grep -E '^\[  (PASSED|FAILED) ' $R/dc_gemv_chain.txt | tr '\n' ' ')"
timeout 90 $B/tests/cuda_quantized_moe_test --gtest_filter='*Chain*:*KimiK25*' > $R/dc_moe_chain.txt 2>&1
log "dc moe chain rc=$? $(grep -E '^\[  (PASSED|FAILED) ' $R/dc_moe_chain.txt | tr '\n' ' ')"
# ws: the A/B, then the tests
B=/tmp/ws/build
for rep in 1 2; do
  for ws in 0 1; do
    EAGLE3_QUANT_GEMV_WARP_STAGING=$ws timeout 60 $B/benchmarks/quant_moe_benchmark \
      --benchmark_filter='BM_QuantMoe/model:[01]/tokens:(1|4|16)/' --benchmark_repetitions=3 \
      --benchmark_report_aggregates_only=true > $R/ws_moe$ws.$rep.txt 2>&1
    log "ws moe ws=$ws rep $rep rc=$? $(grep median $R/ws_moe$ws.$rep.txt | awk '{print $2}' | tr '\n' ' ')"
  done
done
timeout 90 $B/tests/quant_gemv_test > $R/ws_quant_gemv_test.txt 2>&1
log "ws quant_gemv_test rc=$? $(grep -E '^\[  (PASSED|FAILED) ' $R/ws_quant_gemv_test.txt | tr '\n' ' ')"
timeout 150 $B/tests/cuda_quantized_moe_test > $R/ws_cuda_quantized_moe_test.txt 2>&1
log "ws cuda_quantized_moe_test rc=$? $(grep -E '^\[  (PASSED|FAILED) ' $R/ws_cuda_quantized_moe_test.txt | tr '\n' ' ')"
rm -f $R/build_*.log; log done
