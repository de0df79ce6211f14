#!/bin/bash
# Call SR (thirty-second session; branch smem-ring, its diff as smem-ring.patch beside this
# script), in two parts on one warm machine: `bash call_sr.sh 1`, then `bash call_sr.sh 2` (each
# under 10 minutes; part 2 reuses part 1's build in /tmp/sr where the machine kept it, else builds
# again). Main's tree with the patch. The rings of the quantized GEMV in shared memory:
# EAGLE3_QUANT_GEMV_SMEM_RING=1 (one-operand K-split and row-looped kernels, both formats, at 3 / 4
# blocks a multiprocessor, planned for them; =2 the same kernels with the old plans) and
# EAGLE3_QUANT_CHAIN_SMEM_RING=1 (the one-token INT4 chain, both rings 4 steps deep).
# Part 1: the build, quant_gemv_test and cuda_quantized_moe_test with both on, BM_QuantMoe K2.5
# (model 0) at 1 / 4 / 16 / 64 tokens and V3 (model 1) at 1 / 4 / 16 off / on. Part 2: the same
# off / on again, mode 2, and BM_QuantGemv's K2.5 and V3 expert rows at 1 and 8 rows off / on.
# .gpu-host carried. Logs: $OUT/sr (sr.tgz).
set -u
part=${1:-1}
source .gpu-host/env.sh
R=$OUT/sr; mkdir -p $R; start=$(date +%s)
pack() { tar czf $OUT/sr.tgz -C $OUT sr; }
log() { echo "part $part: $* $(( $(date +%s) - start )) s" >> $R/log.txt; pack; }
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader > $R/gpu$part.txt
P=$(pwd)/benchmarks/pending
B=/tmp/sr/build
if [ "$part" = 1 ] || [ ! -x $B/benchmarks/quant_moe_benchmark ]; then
  rm -rf /tmp/sr && mkdir -p /tmp/sr && tar cf - --exclude=./build . | tar xf - -C /tmp/sr &&
    (cd /tmp/sr && patch -p1 < $P/smem-ring.patch > $R/patch.log 2>&1 &&
     cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DEAGLE3_BUILD_EXAMPLES=OFF > $R/build.log 2>&1 &&
     cmake --build build -j16 --target quant_gemv_test cuda_quantized_moe_test quant_moe_benchmark quant_gemv_benchmark \
       >> $R/build.log 2>&1)
  log "build rc=$?"; tail -20 $R/build.log > $R/build_tail$part.txt; rm -f $R/build.log
fi
moe() {  # mode rep
  local chain=$([ "$1" = 0 ] && echo 0 || echo 1)
  EAGLE3_QUANT_CHAIN_SMEM_RING=$chain EAGLE3_QUANT_GEMV_SMEM_RING=$1 timeout 100 $B/benchmarks/quant_moe_benchmark \
    --benchmark_filter='BM_QuantMoe/model:(0/tokens:(1|4|16|64)|1/tokens:(1|4|16))/' --benchmark_repetitions=3 \
    --benchmark_report_aggregates_only=true > $R/moe_mode$1.$2.txt 2>&1
  log "moe mode=$1 rep $2 rc=$? $(grep median $R/moe_mode$1.$2.txt | awk '{print $2}' | tr '\n' ' ')"
}
if [ "$part" = 1 ]; then
  EAGLE3_QUANT_CHAIN_SMEM_RING=1 EAGLE3_QUANT_GEMV_SMEM_RING=1 timeout 90 $B/tests/quant_gemv_test > $R/t_gemv.txt 2>&1
  log "gemv test rings=1 rc=$? $(grep -E '^\[  (PASSED|FAILED) ' $R/t_gemv.txt | tr '\n' ' ')"
  moe 0 1; moe 1 1  # before the longer test: a call cut short keeps the A/B
  EAGLE3_QUANT_CHAIN_SMEM_RING=1 EAGLE3_QUANT_GEMV_SMEM_RING=1 timeout 150 $B/tests/cuda_quantized_moe_test \
    > $R/t_moe.txt 2>&1
  log "moe test rings=1 rc=$? $(grep -E '^\[  (PASSED|FAILED) ' $R/t_moe.txt | tr '\n' ' ')"
else
  moe 1 2; moe 0 2; moe 2 1
  for ring in 0 1; do
    EAGLE3_QUANT_GEMV_SMEM_RING=$ring EAGLE3_BENCH_QUANT_TILED=1 timeout 80 $B/benchmarks/quant_gemv_benchmark \
      --benchmark_filter='BM_QuantGemv/shape:(8|10|12|14|21|22|23|24)/m:(1|8)/' --benchmark_repetitions=3 \
      --benchmark_report_aggregates_only=true > $R/gemv_ring$ring.txt 2>&1
    log "gemv ring=$ring rc=$? $(grep median $R/gemv_ring$ring.txt | awk '{print $1, $2}' | tr '\n' ' ')"
  done
fi
log done
