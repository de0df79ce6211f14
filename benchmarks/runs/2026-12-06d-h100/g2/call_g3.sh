#!/bin/bash
# Call G2 trimmed (same warm machine as call_g.sh): timings first, then the tail branch's tests.
set -u
source .gpu-host/env.sh
R=$OUT/g2; mkdir -p $R; start=$(date +%s)
pack() { tar czf $OUT/g2.tgz -C $OUT g2; }
gemv() {
  EAGLE3_BENCH_QUANT_TILED=1 timeout 60 $2/benchmarks/quant_gemv_benchmark --benchmark_filter='BM_QuantGemv/shape:(12|13|17|19|22|24|26)/m:(1|8)/' \
    --benchmark_repetitions=3 --benchmark_report_aggregates_only=true > $R/gemv_$1.txt 2>&1
  echo "gemv $1 rc=$? $(( $(date +%s) - start )) s" >> $R/log.txt; pack
}
moe() {
  timeout 90 $2/benchmarks/quant_moe_benchmark --benchmark_filter='BM_QuantMoe/model:[01]/tokens:(1|4|8|10|12|14|16|64)/' --benchmark_repetitions=3 \
    --benchmark_report_aggregates_only=true > $R/moe_$1.txt 2>&1
  echo "moe $1 rc=$? $(( $(date +%s) - start )) s" >> $R/log.txt; pack
}
gemv main build/m; gemv g /tmp/g/b; gemv mma /tmp/mma/b
moe main build/m; moe g /tmp/g/b; moe mma /tmp/mma/b; moe tail /tmp/tail/b
moe main2 build/m; moe g2 /tmp/g/b; moe mma2 /tmp/mma/b; moe tail2 /tmp/tail/b
timeout 100 /tmp/tail/b/tests/quant_gemv_test > $R/tail_quant_gemv_test.txt 2>&1; echo "tail gemv test rc=$?" >> $R/log.txt; pack
timeout 150 /tmp/tail/b/tests/cuda_quantized_moe_test > $R/tail_moe_test.txt 2>&1; echo "tail moe test rc=$?" >> $R/log.txt; pack
echo "done $(( $(date +%s) - start )) s" >> $R/log.txt; pack
