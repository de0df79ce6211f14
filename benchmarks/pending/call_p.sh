#!/bin/bash
# Call P for issue 20 (forty-first session, not yet run): where the several-token rounds' time goes,
# kernel by kernel, under Nsight Compute (durations, DRAM throughput, occupancy, launch statistics):
# K2.5 INT4 direct rounds of 2, 4 and 8 tokens, and the grouped V3 FP8 rounds of 8 tokens with and
# without the joined shared expert (the 21 us between them). From main (or a branch), any one GPU,
# .gpu-host carried; ~4 min with the start. Logs under $OUT/p (p.tgz).
set -u
source .gpu-host/env.sh
R=$OUT/p; mkdir -p $R; start=$(date +%s)
pack() { tar czf $OUT/p.tgz -C $OUT p; }
log() { echo "$* $(( $(date +%s) - start )) s" >> $R/log.txt; pack; }
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv,noheader > $R/gpu.txt
if [ ! -x /tmp/b/benchmarks/quant_moe_benchmark ]; then
  cmake -S . -B /tmp/b -G Ninja -DCMAKE_BUILD_TYPE=Release -DEAGLE3_ENABLE_CUDA=ON -DEAGLE3_BUILD_EXAMPLES=OFF > $R/build.log 2>&1
  cmake --build /tmp/b -j16 --target quant_moe_benchmark >> $R/build.log 2>&1
  log "build rc=$?"
fi
B=/tmp/b/benchmarks/quant_moe_benchmark
prof() {  # tag model tokens [env...]: one call's kernels (the graph's 16 calls are skipped past)
  local tag=$1 model=$2 tokens=$3; shift 3
  env "$@" timeout 150 ncu --section SpeedOfLight --section LaunchStats --section Occupancy --launch-skip 40 \
    --launch-count 10 $B --benchmark_filter="BM_QuantMoe/model:$model/tokens:$tokens/" --benchmark_min_time=0.01 \
    > $R/ncu_$tag.txt 2>&1
  log "ncu $tag rc=$? $(grep -E '^  [A-Za-z_].*\(|Duration' $R/ncu_$tag.txt | tr -s ' ' | cut -c1-70 | tr '\n' ';')"
}
prof k2_t2 0 2
prof k2_t4 0 4
prof k2_t8 0 8
prof v3_t8 1 8
prof v3sh_t8 2 8
log done
