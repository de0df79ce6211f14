#!/bin/bash
# Call CL (thirty-fourth session; chain-cluster-x.patch beside this script): the one-token chain's
# x staged once a cluster (EAGLE3_EXP_CHAIN_CLUSTER=2 or 4: the blocks of a cluster each convert
# 1 / n of x's pieces and store them into every block's shared memory, then a cluster barrier), so
# that L2 delivers x's lines to each cluster once instead of to each block. Binaries built off the
# device (stage_cl.sh: .gpu-host/cl.txz, main's quant_moe_benchmark beside the patched one).
# BM_QuantMoe K2.5 1 / 4 tokens: main, 1, 2, 4, chain-cluster.patch (l1), with chain-fence.patch (fa),
# twice; then the chain's tests at 2 and 4 and those of the fa binaries. ~2 min.
# Logs: $OUT/cl (cl.tgz).
set -u
source .gpu-host/env.sh
R=$OUT/cl; mkdir -p $R; start=$(date +%s)
pack() { tar czf $OUT/cl.tgz -C $OUT cl; }
log() { echo "$* $(( $(date +%s) - start )) s" >> $R/log.txt; pack; }
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv,noheader > $R/gpu.txt
rm -rf /tmp/cl && tar xJf .gpu-host/cl.txz -C /tmp && export LD_LIBRARY_PATH=/tmp/cl/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
log "staged rc=$?"
moe() {  # binary cluster tag
  EAGLE3_EXP_CHAIN_CLUSTER=$2 timeout 40 $1 --benchmark_filter='BM_QuantMoe/model:0/tokens:(1|4)/' \
    --benchmark_repetitions=3 --benchmark_report_aggregates_only=true > $R/moe_$3.txt 2>&1
  log "moe $3 rc=$? $(grep median $R/moe_$3.txt | awk '{print $2}' | tr '\n' ' ')"
}
for rep in 1 2; do
  moe /tmp/cl/main/quant_moe_benchmark 1 main.$rep
  for n in 1 2 4; do moe /tmp/cl/cl/quant_moe_benchmark $n c$n.$rep; done
  moe /tmp/cl/l1/quant_moe_benchmark 1 l1.$rep  # chain-cluster.patch: clusters of 4 and the L1 ask
  moe /tmp/cl/fa/quant_moe_benchmark 1 fa.$rep  # and chain-fence.patch: the down warps' fence acquire
done
for n in 2 4; do
  EAGLE3_EXP_CHAIN_CLUSTER=$n timeout 40 /tmp/cl/cl/quant_gemv_test --gtest_filter='*Chain*' > $R/t_gemv$n.txt 2>&1
  log "gemv chain tests c$n rc=$? $(grep -E '^\[  (PASSED|FAILED) ' $R/t_gemv$n.txt | tr '\n' ' ')"
  EAGLE3_EXP_CHAIN_CLUSTER=$n timeout 60 /tmp/cl/cl/cuda_quantized_moe_test --gtest_filter='*KimiK25*:*Chain*' \
    > $R/t_moe$n.txt 2>&1
  log "moe tests c$n rc=$? $(grep -E '^\[  (PASSED|FAILED) ' $R/t_moe$n.txt | tr '\n' ' ')"
done
for t in quant_gemv_test cuda_quantized_moe_test; do  # chain-fence.patch's binaries: the chain's tests
  timeout 60 /tmp/cl/fa/$t --gtest_filter='*Chain*:*KimiK25*' > $R/t_fa_$t.txt 2>&1
  log "fa $t rc=$? $(grep -E '^\[  (PASSED|FAILED) ' $R/t_fa_$t.txt | tr '\n' ' ')"
done
log done
