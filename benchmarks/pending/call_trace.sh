#!/bin/bash
# The one-token chain's trace (chain-trace.patch): thread 0 of every block writes %globaltimer at
# each stage of its units (BM_QuantMoe K2.5 one token, the graph's last launch), twice, each
# summarized by trace.py and fine.py. From the binaries stage_trace.sh packed in
# .gpu-host/trace.txz (no build; ~20 s), else built here from HEAD and the patch (~2 min). On any
# one GPU, .gpu-host carried. Logs under $OUT/x (x.tgz), or $OUT/$TRACE_TAG where that is set (the
# environment passes through, so EAGLE3_EXP_CHAIN_X=1 TRACE_TAG=x1 traces call CX's mode 1).
set -u
source .gpu-host/env.sh
T=${TRACE_TAG:-x}; R=$OUT/$T; mkdir -p $R; start=$(date +%s)
pack() { tar czf $OUT/$T.tgz -C $OUT $T; }
log() { echo "$* $(( $(date +%s) - start )) s" >> $R/log.txt; pack; }
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader > $R/gpu.txt
if [ -f .gpu-host/trace.txz ]; then
  rm -rf /tmp/trace /tmp/lib && tar xJf .gpu-host/trace.txz -C /tmp &&
    export LD_LIBRARY_PATH=/tmp/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
  log "staged rc=$?"
else
  rm -rf /tmp/trace && mkdir -p /tmp/trace && tar cf - --exclude=./build . | tar xf - -C /tmp/trace &&
    (cd /tmp/trace && patch -p1 < benchmarks/pending/chain-trace.patch > $R/patch.log 2>&1 &&
     cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DEAGLE3_BUILD_EXAMPLES=OFF > $R/build.log 2>&1 &&
     cmake --build build -j16 --target quant_moe_benchmark >> $R/build.log 2>&1)
  log "build rc=$?"; tail -20 $R/build.log > $R/build_tail.txt; rm -f $R/build.log
fi
for i in 1 2; do
  EAGLE3_BENCH_CHAIN_TRACE=$R/trace$i timeout 40 /tmp/trace/build/benchmarks/quant_moe_benchmark \
    --benchmark_filter='BM_QuantMoe/model:0/tokens:1/' --benchmark_repetitions=3 --benchmark_report_aggregates_only=true \
    > $R/trace_moe$i.txt 2>&1
  log "trace moe $i rc=$? $(grep median $R/trace_moe$i.txt | awk '{print $2}')"
  python3 /tmp/trace/benchmarks/pending/trace.py $R/trace$i.0.1 > $R/trace_summary$i.txt 2>&1
  python3 /tmp/trace/benchmarks/pending/fine.py $R/trace$i.0.1 $R/trace$i.fine.0.1 >> $R/trace_summary$i.txt 2>&1
  pack
done
log done
