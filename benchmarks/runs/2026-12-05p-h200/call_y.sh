#!/bin/bash
# Call Y (twenty-third session, on the machine call X left warm): BM_QuantMoe at main, then Nsight
# Compute of the grouped quantized MoE's GEMV kernels at 16 and 64 tokens (K2.5 INT4, V3 FP8 ranks):
# where the issue-20 rows below 0.8 of the copy rate lose their time.
set -u
source .gpu-host/env.sh
R=$OUT/y; mkdir -p $R
start=$(date +%s)
pack() { tar czf $OUT/y.tgz -C $OUT y; }
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee $R/gpu.txt
[ -d build/xmain ] || cmake -S . -B build/xmain -G Ninja -DCMAKE_BUILD_TYPE=Release -DEAGLE3_BUILD_TESTS=OFF -DEAGLE3_BUILD_EXAMPLES=OFF > /dev/null
cmake --build build/xmain -j16 --target quant_moe_benchmark > $R/build.log 2>&1; echo "build rc=$? $(( $(date +%s) - start )) s"
B=build/xmain/benchmarks
timeout 80 $B/quant_moe_benchmark --benchmark_filter='BM_QuantMoe' --benchmark_repetitions=3 \
  --benchmark_report_aggregates_only=true > $R/qmoe.txt 2>&1
echo "qmoe rc=$? $(( $(date +%s) - start )) s"
grep median $R/qmoe.txt | awk '{print $1, $2}' | sed 's/\/iterations.*manual_time_median//' | tr '\n' ';'; echo
grep -o "frac_of_floor=[0-9.]*" $R/qmoe.txt | tr '\n' ' '; echo
pack
S="--section SpeedOfLight --section WarpStateStats --section Occupancy --section LaunchStats --section MemoryWorkloadAnalysis --section SchedulerStats"
for c in "0 64" "0 16" "1 64" "1 16"; do
  set -- $c
  timeout 65 ncu $S --kernel-name regex:'QuantGemv|QuantMoe' --launch-skip 40 --launch-count 6 --print-units base \
    $B/quant_moe_benchmark --benchmark_filter="BM_QuantMoe/model:$1/tokens:$2/" --benchmark_min_time=0.01s \
    > $R/ncu_m$1_t$2.txt 2>&1
  echo "ncu m$1 t$2 rc=$? $(( $(date +%s) - start )) s"
  grep -E "^  [A-Za-z].*(Kernel|Quant)|Duration|DRAM Throughput|Memory Throughput|Achieved Occupancy|Issue Slots Busy|No Eligible|Registers Per|Grid Size|Block Size|Waves Per SM|Warp Cycles Per Issued" $R/ncu_m$1_t$2.txt | head -60
  pack
done
echo "done $(( $(date +%s) - start )) s"
