#!/bin/bash
# Call G2 (same warm machine as call_g.sh, whose builds it reuses): quant_gemv_benchmark on main,
# int4-rowloop-sums and int4-rowloop-mma, the plan sweep of the 160-224-item gate-up shapes on main
# (the K-split kernels are the same in all four trees), BM_QuantMoe on all four trees, each twice. Logs under $OUT/g2.
set -u
source .gpu-host/env.sh
R=$OUT/g2; mkdir -p $R; start=$(date +%s)
pack() { tar czf $OUT/g2.tgz -C $OUT g2; }
gemv() {
  EAGLE3_BENCH_QUANT_TILED=1 timeout 60 $2/benchmarks/quant_gemv_benchmark --benchmark_filter='BM_QuantGemv/shape:(12|13|17|19|22|24|26)/m:(1|8)/' \
    --benchmark_repetitions=3 --benchmark_report_aggregates_only=true > $R/gemv_$1.txt 2>&1
  echo "gemv $1 rc=$? $(( $(date +%s) - start )) s"; grep median $R/gemv_$1.txt | awk '{print $1, $2}' | sed 's/BM_QuantGemv\/shape://; s/\/iterations.*manual_time_median//' | tr '\n' ';'; echo; pack
}
moe() {
  timeout 60 $2/benchmarks/quant_moe_benchmark --benchmark_filter='BM_QuantMoe/' --benchmark_repetitions=3 \
    --benchmark_report_aggregates_only=true > $R/moe_$1.txt 2>&1
  echo "moe $1 rc=$? $(( $(date +%s) - start )) s"; grep median $R/moe_$1.txt | awk '{print $1, $2}' | sed 's/BM_QuantMoe\/model://; s/\/iterations.*manual_time_median//' | tr '\n' ';'; echo; pack
}
gemv main build/m; gemv g /tmp/g/b; gemv mma /tmp/mma/b
EAGLE3_BENCH_QUANT_TILED=1 timeout 120 build/m/benchmarks/quant_gemv_benchmark --benchmark_filter='BM_QuantGemvPlan/shape:(31|32|33|34|35)/' \
  --benchmark_repetitions=3 --benchmark_report_aggregates_only=true > $R/plans.txt 2>&1
echo "plans rc=$? $(( $(date +%s) - start )) s"; pack
moe main build/m; moe g /tmp/g/b; moe mma /tmp/mma/b; moe tail /tmp/tail/b
moe main2 build/m; moe g2 /tmp/g/b; moe mma2 /tmp/mma/b; moe tail2 /tmp/tail/b
echo "done $(( $(date +%s) - start )) s"
