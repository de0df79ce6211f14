#!/bin/bash
# Call O (twenty-first session): where the per-pair MoE kernels' time goes at 1, 4 and 16 tokens
# (V2-Lite TP 1): DRAM bytes, L2 hit rate, throughput, under ncu.
set -u
source .gpu-host/env.sh
R=$OUT/o; mkdir -p $R
start=$(date +%s)
cmake -S . -B build/gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DEAGLE3_BUILD_TESTS=OFF -DEAGLE3_BUILD_EXAMPLES=OFF > $R/build.log 2>&1 && cmake --build build/gpu -j16 --target decode_ops_benchmark >> $R/build.log 2>&1
echo "build rc=$? $(( $(date +%s) - start )) s"
M='gpu__time_duration.sum,dram__bytes_read.sum,lts__t_sector_hit_rate.pct,dram__throughput.avg.pct_of_peak_sustained_elapsed,sm__warps_active.avg.pct_of_peak_sustained_active,launch__grid_size,launch__registers_per_thread'
for c in "1/join:1" "4/join:1" "16/join:0"; do
  n=$(echo $c | tr '/:' '__')
  timeout 60 ncu --metrics $M --kernel-name regex:'Moe(Act|Down)Kernel' --launch-skip 10 --launch-count 2 --csv --print-units base \
    build/gpu/benchmarks/decode_ops_benchmark --benchmark_filter="BM_MoeDecode/model:2/tokens:$c/" --benchmark_repetitions=1 > $R/ncu_$n.csv 2> $R/ncu_$n.err
  echo "ncu $c rc=$? $(( $(date +%s) - start )) s"
  grep -E "MoeActKernel|MoeDownKernel" $R/ncu_$n.csv | awk -F'","' '{print substr($5,1,12), $(NF-2), $NF}' | sed 's/"//g' | head -14
done
tar czf $OUT/o.tgz -C $OUT o
echo "done $(( $(date +%s) - start )) s"
