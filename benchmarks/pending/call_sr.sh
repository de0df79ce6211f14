#!/bin/bash
# Call SR (thirty-second session; branch smem-ring, its diff as smem-ring.patch beside this
# script). Main's tree with the patch. The rings of the quantized GEMV in shared memory:
# EAGLE3_QUANT_GEMV_SMEM_RING=1 (one-operand K-split and row-looped kernels, both formats, at 3 / 4
# blocks a multiprocessor, planned for them; =2 the same kernels with the old plans) and
# EAGLE3_QUANT_CHAIN_SMEM_RING=1 (the one-token INT4 chain, both rings 4 steps deep).
# Where stage_sr.sh put the binaries in .gpu-host/sr.txz (built off the device), one call runs both
# parts without a build (~3-4 min): `bash call_sr.sh`. Otherwise two calls on one warm machine,
# `bash call_sr.sh 1` then `bash call_sr.sh 2` (each under 10 minutes; part 2 reuses part 1's build
# in /tmp/sr where the machine kept it, else builds again).
# Part 1: BM_QuantMoe K2.5 (model 0) at 1 / 4 / 8 / 16 / 64 tokens and V3 (model 1) at 1 / 4 / 16,
# rings off / on, quant_gemv_test with both on, the chain's ring alone, mode 2. Part 2: on / off
# again, cuda_quantized_moe_test with both on, BM_QuantGemv's K2.5 and V3 expert rows at 1 and 8
# rows off / on. Most telling first; each step packs $OUT/sr.tgz, so a call cut short keeps what
# ran. .gpu-host carried. Logs: $OUT/sr (sr.tgz).
set -u
source .gpu-host/env.sh
R=$OUT/sr; mkdir -p $R; start=$(date +%s)
pack() { tar czf $OUT/sr.tgz -C $OUT sr; }
log() { echo "$* $(( $(date +%s) - start )) s" >> $R/log.txt; pack; }
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv,noheader > $R/gpu.txt
P=$(pwd)/benchmarks/pending
[ -f .gpu-host/sr.txz ] && [ ! -d .gpu-host/sr ] && tar xJf .gpu-host/sr.txz -C .gpu-host
if [ -x .gpu-host/sr/benchmarks/quant_moe_benchmark ]; then
  B=$(pwd)/.gpu-host/sr; export LD_LIBRARY_PATH=$B:/usr/local/cuda/lib64:$LD_LIBRARY_PATH
  parts="1 2"; [ $# -gt 0 ] && parts=$1
else
  B=/tmp/sr/build; parts=${1:-1}
  if [ "$parts" = 1 ] || [ ! -x $B/benchmarks/quant_moe_benchmark ]; then
    rm -rf /tmp/sr && mkdir -p /tmp/sr && tar cf - --exclude=./build . | tar xf - -C /tmp/sr &&
      (cd /tmp/sr && patch -p1 < $P/smem-ring.patch > $R/patch.log 2>&1 &&
       cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DEAGLE3_BUILD_EXAMPLES=OFF > $R/build.log 2>&1 &&
       cmake --build build -j16 --target quant_gemv_test cuda_quantized_moe_test quant_moe_benchmark \
         quant_gemv_benchmark >> $R/build.log 2>&1)
    log "build rc=$?"; tail -20 $R/build.log > $R/build_tail.txt; rm -f $R/build.log
  fi
fi
moe() {  # gemv-ring chain-ring tag
  EAGLE3_QUANT_GEMV_SMEM_RING=$1 EAGLE3_QUANT_CHAIN_SMEM_RING=$2 timeout 100 $B/benchmarks/quant_moe_benchmark \
    --benchmark_filter='BM_QuantMoe/model:(0/tokens:(1|4|8|16|64)|1/tokens:(1|4|16))/' --benchmark_repetitions=3 \
    --benchmark_report_aggregates_only=true > $R/moe_$3.txt 2>&1
  log "moe gemv=$1 chain=$2 $3 rc=$? $(grep median $R/moe_$3.txt | awk '{print $2}' | tr '\n' ' ')"
}
for part in $parts; do
  if [ "$part" = 1 ]; then
    moe 0 0 off1; moe 1 1 on1
    EAGLE3_QUANT_CHAIN_SMEM_RING=1 EAGLE3_QUANT_GEMV_SMEM_RING=1 timeout 90 $B/tests/quant_gemv_test > $R/t_gemv.txt 2>&1
    log "gemv test rings=1 rc=$? $(grep -E '^\[  (PASSED|FAILED) ' $R/t_gemv.txt | tr '\n' ' ')"
    moe 0 1 chain1; moe 2 1 mode2
  else
    moe 1 1 on2; moe 0 0 off2
    EAGLE3_QUANT_CHAIN_SMEM_RING=1 EAGLE3_QUANT_GEMV_SMEM_RING=1 timeout 150 $B/tests/cuda_quantized_moe_test \
      > $R/t_moe.txt 2>&1
    log "moe test rings=1 rc=$? $(grep -E '^\[  (PASSED|FAILED) ' $R/t_moe.txt | tr '\n' ' ')"
    for ring in 0 1; do
      EAGLE3_QUANT_GEMV_SMEM_RING=$ring EAGLE3_BENCH_QUANT_TILED=1 timeout 80 $B/benchmarks/quant_gemv_benchmark \
        --benchmark_filter='BM_QuantGemv/shape:(8|10|12|14|21|22|23|24)/m:(1|8)/' --benchmark_repetitions=3 \
        --benchmark_report_aggregates_only=true > $R/gemv_ring$ring.txt 2>&1
      log "gemv ring=$ring rc=$? $(grep median $R/gemv_ring$ring.txt | awk '{print $1, $2}' | tr '\n' ' ')"
    done
  fi
done
log done
