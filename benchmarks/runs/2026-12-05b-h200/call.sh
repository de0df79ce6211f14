#!/bin/bash
# Call B: the whole gpu suite under the kAuto default, ncu of the wgmma kernel, memcheck of its cases.
set -u
source .gpu-host/env.sh
R=$OUT/b; mkdir -p $R
start=$(date +%s)
cmake -S . -B build/gpu -G Ninja -DCMAKE_BUILD_TYPE=Release > $R/build.log 2>&1 && cmake --build build/gpu -j16 >> $R/build.log 2>&1
echo "build rc=$? $(( $(date +%s) - start )) s"
T=build/gpu/tests; B=build/gpu/benchmarks
timeout 280 scripts/gpu_suite.sh build/gpu/tests $R/suite --sanitize none --jobs 4 > $R/suite_stdout.txt 2>&1
echo "suite rc=$? $(( $(date +%s) - start )) s"; cut -c1-140 $R/suite/summary.txt
timeout 120 $B/mla_decode_benchmark --benchmark_filter='BM_BatchedLatentAttention/heads:16/context:4096/batch:(1|8|32)/qtokens:(4|8|16|32|64)/|BM_BatchedLatentAttention/heads:128/context:(1024|4096|16384)/' \
  --benchmark_repetitions=3 --benchmark_out=$R/mla_decode_benchmark.json > $R/mla_default.txt 2>&1
echo "mla default rc=$? $(( $(date +%s) - start )) s"; grep median $R/mla_default.txt | awk '{print $1, $2}' | sed 's/BM_BatchedLatentAttention\///; s/\/iterations.*//' | head -40
F='BM_BatchedLatentAttention/heads:16/context:4096/batch:(1|32)/qtokens:8/cache_bits:16/'
for v in wgmma mma; do
  EAGLE3_LATENT_TREE_KERNEL=$v timeout 60 ncu --metrics gpu__time_duration.sum --launch-skip 20 --launch-count 8 \
    $B/mla_decode_benchmark --benchmark_filter="$F" --benchmark_repetitions=1 > $R/ncu_time_$v.txt 2>&1
  echo "ncu time $v rc=$?"; grep -E "^  [A-Za-z].*\(|gpu__time_duration" $R/ncu_time_$v.txt | paste - - | awk '{print $1, $(NF)}' | head -16
done
EAGLE3_LATENT_TREE_KERNEL=wgmma timeout 90 ncu --kernel-name regex:LatentWgmmaKernel --launch-skip 2 --launch-count 1 \
  --section SpeedOfLight --section WarpStateStats --section SchedulerStats --section MemoryWorkloadAnalysis \
  $B/mla_decode_benchmark --benchmark_filter='BM_BatchedLatentAttention/heads:16/context:4096/batch:32/qtokens:8/cache_bits:16/' \
  --benchmark_repetitions=1 > $R/ncu_wgmma.txt 2>&1
echo "ncu sections rc=$? $(( $(date +%s) - start )) s"
grep -E "Duration|Throughput|Stall|Issued Warp|Eligible|No Eligible|Warp Cycles Per|L2 Hit|Mem Busy" $R/ncu_wgmma.txt | head -40
tar czf $OUT/b.tgz -C $OUT b; echo "done $(( $(date +%s) - start )) s"
