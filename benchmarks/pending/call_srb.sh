#!/bin/bash
# Call SR from binaries built off the device by stage_sr.sh (branch smem-ring, Release, sm_90, on the CPU
# machine with CUDA 13.0 and carried in .gpu-host/sr with Debian's libbenchmark): for a call too short
# for a build. Most telling first; each step packs $OUT/sr.tgz, so a call cut short keeps what ran.
set -u
source .gpu-host/env.sh
S=$(pwd)/.gpu-host/sr; export LD_LIBRARY_PATH=$S:/usr/local/cuda/lib64:$LD_LIBRARY_PATH
R=$OUT/sr; mkdir -p $R; start=$(date +%s)
pack() { tar czf $OUT/sr.tgz -C $OUT sr; }
log() { echo "$* $(( $(date +%s) - start )) s" >> $R/log.txt; pack; }
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv,noheader > $R/gpu.txt
moe() {  # gemv-ring chain-ring tag
  EAGLE3_QUANT_GEMV_SMEM_RING=$1 EAGLE3_QUANT_CHAIN_SMEM_RING=$2 timeout 60 $S/quant_moe_benchmark \
    --benchmark_filter='BM_QuantMoe/model:(0/tokens:(1|4|8|16|64)|1/tokens:(1|4|16))/' --benchmark_repetitions=3 \
    --benchmark_report_aggregates_only=true > $R/moe_$3.txt 2>&1
  log "moe gemv=$1 chain=$2 $3 rc=$? $(grep median $R/moe_$3.txt | awk '{print $2}' | tr '\n' ' ')"
}
moe 0 0 off1; moe 1 1 on1
EAGLE3_QUANT_CHAIN_SMEM_RING=1 EAGLE3_QUANT_GEMV_SMEM_RING=1 timeout 60 $S/quant_gemv_test > $R/t_gemv.txt 2>&1
log "gemv test rings=1 rc=$? $(grep -E '^\[  (PASSED|FAILED) ' $R/t_gemv.txt | tr '\n' ' ')"
moe 0 1 chain1; moe 2 1 mode2; moe 1 1 on2; moe 0 0 off2
EAGLE3_QUANT_CHAIN_SMEM_RING=1 EAGLE3_QUANT_GEMV_SMEM_RING=1 timeout 120 $S/cuda_quantized_moe_test > $R/t_moe.txt 2>&1
log "moe test rings=1 rc=$? $(grep -E '^\[  (PASSED|FAILED) ' $R/t_moe.txt | tr '\n' ' ')"
for ring in 0 1; do
  EAGLE3_QUANT_GEMV_SMEM_RING=$ring EAGLE3_BENCH_QUANT_TILED=1 timeout 60 $S/quant_gemv_benchmark \
    --benchmark_filter='BM_QuantGemv/shape:(8|10|12|14|21|22|23|24)/m:(1|8)/' --benchmark_repetitions=3 \
    --benchmark_report_aggregates_only=true > $R/gemv_ring$ring.txt 2>&1
  log "gemv ring=$ring rc=$? $(grep median $R/gemv_ring$ring.txt | awk '{print $1, $2}' | tr '\n' ' ')"
done
log done
