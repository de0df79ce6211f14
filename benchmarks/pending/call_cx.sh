#!/bin/bash
# Call CX (thirty-fourth session; branch chain-prologue, its diff as chain-prologue.patch on main).
# The one-token chain's gate-up prologue, from the fine trace (runs/2026-12-07b-h100): x staged
# 2.66 us after the ring's first loads. EAGLE3_EXP_CHAIN_X: bit 0 stages 4 pieces a thread at once
# (one round of loads), bit 1 stages x before the ring's first loads, bit 2 issues x's loads, then
# the ring's, then stores x. Binaries built off the device (stage_cx.sh: .gpu-host/cx.txz, with
# main's quant_moe_benchmark beside them as the baseline). BM_QuantMoe K2.5 1 / 4 tokens, every
# mode twice, then the chain's tests at each mode. ~2 min. Logs: $OUT/cx (cx.tgz).
set -u
source .gpu-host/env.sh
R=$OUT/cx; mkdir -p $R; start=$(date +%s)
pack() { tar czf $OUT/cx.tgz -C $OUT cx; }
log() { echo "$* $(( $(date +%s) - start )) s" >> $R/log.txt; pack; }
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv,noheader > $R/gpu.txt
rm -rf /tmp/cx && tar xJf .gpu-host/cx.txz -C /tmp && export LD_LIBRARY_PATH=/tmp/cx/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
log "staged rc=$?"
moe() {  # binary mode tag
  EAGLE3_EXP_CHAIN_X=$2 timeout 40 $1 --benchmark_filter='BM_QuantMoe/model:0/tokens:(1|4)/' --benchmark_repetitions=3 \
    --benchmark_report_aggregates_only=true > $R/moe_$3.txt 2>&1
  log "moe $3 rc=$? $(grep median $R/moe_$3.txt | awk '{print $2}' | tr '\n' ' ')"
}
for rep in 1 2; do
  moe /tmp/cx/main/quant_moe_benchmark 0 main.$rep
  for mode in 0 1 2 4 3 5; do moe /tmp/cx/cp/quant_moe_benchmark $mode m$mode.$rep; done
done
for mode in 1 2 4 3 5; do
  EAGLE3_EXP_CHAIN_X=$mode timeout 40 /tmp/cx/cp/quant_gemv_test --gtest_filter='*Chain*' > $R/t_m$mode.txt 2>&1
  log "chain tests m$mode rc=$? $(grep -E '^\[  (PASSED|FAILED) ' $R/t_m$mode.txt | tr '\n' ' ')"
done
log done
