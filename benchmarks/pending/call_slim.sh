#!/bin/bash
# The thirty-first session's pending measurements (none ran: no device time was left in it or in
# the thirty-second), most telling first, each step packing its logs so that a call cut short keeps
# the most. Two builds: the chain's trace (chain-trace.patch), and main with down-cache.patch and
# warp-staging.patch both applied, each switched by its own variable
# (EAGLE3_QUANT_CHAIN_DOWN_CACHE, EAGLE3_QUANT_GEMV_WARP_STAGING). Then the trace twice (trace.py,
# fine.py), the A/Bs of BM_QuantMoe K2.5 one token over both switches twice, warp staging at 1 / 4 /
# 16 tokens of both models once, and the chain's tests with both on as time allows (~4-5 min).
# `call_slim.sh trace`: the trace alone (one build, ~2 min), what a session's last device minutes
# can hold. On any one GPU, from a checkout of main with .gpu-host carried. Logs under $OUT/x (x.tgz).
# Where stage_slim.sh left .gpu-host/slim.txz, no build: the whole call takes ~2-3 min.
set -u
source .gpu-host/env.sh
R=$OUT/x; mkdir -p $R; start=$(date +%s)
pack() { tar czf $OUT/x.tgz -C $OUT x; }
log() { echo "$* $(( $(date +%s) - start )) s" >> $R/log.txt; pack; }
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader > $R/gpu.txt
P=$(pwd)/benchmarks/pending
what=${1:-all}
jobs=$([ "$what" = trace ] && echo 16 || echo 8)  # one build or two side by side
build() {  # variant targets... (patches: $PATCHES)
  local v=$1; shift
  rm -rf /tmp/$v && mkdir -p /tmp/$v && tar cf - --exclude=./build . | tar xf - -C /tmp/$v &&
    (cd /tmp/$v && for q in $PATCHES; do patch -p1 < $P/$q >> $R/patch_$v.log 2>&1 || exit 1; done &&
     cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DEAGLE3_BUILD_EXAMPLES=OFF > $R/build_$v.log 2>&1 &&
     cmake --build build -j$jobs --target "$@" >> $R/build_$v.log 2>&1)
  echo "build $v rc=$?" >> $R/builds.txt
}
if [ -f .gpu-host/slim.txz ]; then  # built off the device by stage_slim.sh
  rm -rf /tmp/trace /tmp/dcws /tmp/lib && tar xJf .gpu-host/slim.txz -C /tmp &&
    export LD_LIBRARY_PATH=/tmp/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
  log "staged rc=$?"
else
  PATCHES=chain-trace.patch build trace quant_moe_benchmark &
  if [ "$what" != trace ]; then
    PATCHES="down-cache.patch warp-staging.patch" build dcws quant_moe_benchmark quant_gemv_test cuda_quantized_moe_test &
  fi
  wait; log "$(tr '\n' ' ' < $R/builds.txt)"
fi
[ -f $R/build_dcws.log ] && tail -30 $R/build_dcws.log > $R/build_dcws_tail.txt; rm -f $R/build_*.log
for i in 1 2; do
  EAGLE3_BENCH_CHAIN_TRACE=$R/trace$i timeout 40 /tmp/trace/build/benchmarks/quant_moe_benchmark \
    --benchmark_filter='BM_QuantMoe/model:0/tokens:1/' --benchmark_repetitions=3 --benchmark_report_aggregates_only=true \
    > $R/trace_moe$i.txt 2>&1
  log "trace moe $i rc=$? $(grep median $R/trace_moe$i.txt | awk '{print $2}')"
  python3 /tmp/trace/benchmarks/pending/trace.py $R/trace$i.0.1 > $R/trace_summary$i.txt 2>&1
  python3 /tmp/trace/benchmarks/pending/fine.py $R/trace$i.0.1 $R/trace$i.fine.0.1 >> $R/trace_summary$i.txt 2>&1
  pack
done
if [ "$what" = trace ]; then log done; exit 0; fi
B=/tmp/dcws/build
for rep in 1 2; do
  for dc in 0 1; do
    for ws in 0 1; do
      EAGLE3_QUANT_CHAIN_DOWN_CACHE=$dc EAGLE3_QUANT_GEMV_WARP_STAGING=$ws timeout 30 $B/benchmarks/quant_moe_benchmark \
        --benchmark_filter='BM_QuantMoe/model:0/tokens:1/' --benchmark_repetitions=3 \
        --benchmark_report_aggregates_only=true > $R/ab_dc$dc.ws$ws.$rep.txt 2>&1
      log "ab dc=$dc ws=$ws rep $rep rc=$? $(grep median $R/ab_dc$dc.ws$ws.$rep.txt | awk '{print $2}')"
    done
  done
done
for ws in 0 1; do
  EAGLE3_QUANT_GEMV_WARP_STAGING=$ws timeout 50 $B/benchmarks/quant_moe_benchmark \
    --benchmark_filter='BM_QuantMoe/model:[01]/tokens:(1|4|16)/' --benchmark_repetitions=3 \
    --benchmark_report_aggregates_only=true > $R/ws_moe$ws.txt 2>&1
  log "ws moe ws=$ws rc=$? $(grep median $R/ws_moe$ws.txt | awk '{print $2}' | tr '\n' ' ')"
done
timeout 60 $B/tests/quant_gemv_test --gtest_filter='*Chain*:*Int4*' > $R/t_gemv.txt 2>&1
log "gemv chain+int4 rc=$? $(grep -E '^\[  (PASSED|FAILED) ' $R/t_gemv.txt | tr '\n' ' ')"
timeout 90 $B/tests/cuda_quantized_moe_test --gtest_filter='*Chain*:*KimiK25*' > $R/t_moe.txt 2>&1
log "moe chain rc=$? $(grep -E '^\[  (PASSED|FAILED) ' $R/t_moe.txt | tr '\n' ' ')"
log done
