#!/bin/bash
# Call CZ (thirty-sixth session): why the one-token chain in clusters (call CC, runs/2026-12-07e-h100)
# is ~5 us slower than main at clusters of 2 and of 4 alike. Carried binaries (.gpu-host/cl.txz, built
# by runs/2026-12-07e-h100/stage_cl.sh): BM_QuantMoe K2.5 1 token with programmatic launch off
# (EAGLE3_BENCH_PDL=0) and on, main and clusters of 4, alternated twice; then Nsight Compute's launch
# and occupancy sections (max active clusters) and the kernel's duration, serialized, for main and
# clusters of 2 and 4. ~2 min. Logs: $OUT/cz (cz.tgz).
set -u
source .gpu-host/env.sh
R=$OUT/cz; mkdir -p $R; start=$(date +%s)
pack() { tar czf $OUT/cz.tgz -C $OUT cz; }
log() { echo "$* $(( $(date +%s) - start )) s" >> $R/log.txt; pack; }
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv,noheader > $R/gpu.txt
rm -rf /tmp/cl && tar xJf .gpu-host/cl.txz -C /tmp && export LD_LIBRARY_PATH=/tmp/cl/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
log "staged rc=$?"
moe() {  # binary cluster pdl tag
  EAGLE3_EXP_CHAIN_CLUSTER=$2 EAGLE3_BENCH_PDL=$3 timeout 40 $1 --benchmark_filter='BM_QuantMoe/model:0/tokens:1/' \
    --benchmark_repetitions=3 --benchmark_report_aggregates_only=true > $R/moe_$4.txt 2>&1
  log "moe $4 rc=$? $(grep median $R/moe_$4.txt | awk '{print $2}' | tr '\n' ' ')"
}
for rep in ${CZ_REPS:-1 2}; do
  for pdl in 0 1; do
    moe /tmp/cl/main/quant_moe_benchmark 1 $pdl main.pdl$pdl.$rep
    moe /tmp/cl/cl/quant_moe_benchmark 4 $pdl c4.pdl$pdl.$rep
  done
done
ncu_one() {  # binary cluster tag
  EAGLE3_EXP_CHAIN_CLUSTER=$2 timeout 90 ncu --section LaunchStats --section Occupancy --section SpeedOfLight \
    --kernel-name regex:QuantGemvChain --launch-skip 20 --launch-count 3 \
    $1 --benchmark_filter='BM_QuantMoe/model:0/tokens:1/' --benchmark_min_time=0.01 > $R/ncu_$3.txt 2>&1
  log "ncu $3 rc=$? $(grep -E 'Duration|Max Active Clusters|Cluster Size' $R/ncu_$3.txt | head -4 | tr -s ' ' | tr '\n' ';')"
}
ncu_one /tmp/cl/main/quant_moe_benchmark 1 main
ncu_one /tmp/cl/cl/quant_moe_benchmark 2 c2
ncu_one /tmp/cl/cl/quant_moe_benchmark 4 c4
log done
