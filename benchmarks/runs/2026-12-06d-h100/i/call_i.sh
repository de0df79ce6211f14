#!/bin/bash
# Call I: BM_QuantMoe at 8-16 tokens on main, quant-plan-tail and quant-plan-idle (the tail rule
# with the last wave's idle slots at most a quarter of the waves' slots), each twice; then the idle
# branch's plan and MoE tests. Logs under $OUT/i.
set -u
source .gpu-host/env.sh
R=$OUT/i; mkdir -p $R; start=$(date +%s)
pack() { tar czf $OUT/i.tgz -C $OUT i; }
REPO=$(pwd)
for d in tail idle; do rm -rf /tmp/$d; mkdir -p /tmp/$d; cp -r CMakeLists.txt cmake src cuda include benchmarks tools testing tests /tmp/$d/; (cd /tmp/$d && git apply $REPO/.gpu-host/$d.patch) && echo "$d patch ok" >> $R/log.txt; done
cfg() { cmake -S $1 -B $2 -G Ninja -DCMAKE_BUILD_TYPE=Release -DEAGLE3_BUILD_EXAMPLES=OFF "${@:3}" > /dev/null; }
cfg . build/m -DEAGLE3_BUILD_TESTS=OFF; cfg /tmp/tail /tmp/tail/b -DEAGLE3_BUILD_TESTS=OFF; cfg /tmp/idle /tmp/idle/b
cmake --build build/m -j5 --target quant_moe_benchmark > $R/b_m.log 2>&1 & P1=$!
cmake --build /tmp/tail/b -j5 --target quant_moe_benchmark > $R/b_tail.log 2>&1 & P2=$!
cmake --build /tmp/idle/b -j6 --target quant_moe_benchmark quant_gemv_plan_test cuda_quantized_moe_test > $R/b_idle.log 2>&1 & P3=$!
wait $P1; echo "m rc=$?" >> $R/log.txt; wait $P2; echo "tail rc=$?" >> $R/log.txt; wait $P3; echo "idle rc=$? $(( $(date +%s) - start )) s" >> $R/log.txt
moe() {
  timeout 60 $2/benchmarks/quant_moe_benchmark --benchmark_filter='BM_QuantMoe/model:[01]/tokens:(8|10|12|14|16)/' --benchmark_repetitions=3 \
    --benchmark_report_aggregates_only=true > $R/moe_$1.txt 2>&1
  echo "moe $1 rc=$? $(( $(date +%s) - start )) s" >> $R/log.txt; pack
}
moe main build/m; moe tail /tmp/tail/b; moe idle /tmp/idle/b; moe main2 build/m; moe tail2 /tmp/tail/b; moe idle2 /tmp/idle/b
/tmp/idle/b/tests/quant_gemv_plan_test > $R/idle_plan_test.txt 2>&1; echo "idle plan test rc=$?" >> $R/log.txt
timeout 150 /tmp/idle/b/tests/cuda_quantized_moe_test > $R/idle_moe_test.txt 2>&1; echo "idle moe test rc=$? $(( $(date +%s) - start )) s" >> $R/log.txt; pack
