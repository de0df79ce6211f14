#!/bin/bash
# Call G (nineteenth session's plan): the paired-chunk wgmma kernel's first run (tests first, with a
# short timeout in case it hangs), the whole gpu suite, then the latent A/B: default (single wgmma
# kernel) vs EAGLE3_LATENT_WGMMA=pair, tree rows and decode rows (wgmma-all), and the mma baseline.
set -u
source .gpu-host/env.sh
R=$OUT/g; mkdir -p $R
start=$(date +%s)
pack() { tar czf $OUT/g.tgz --exclude="*.ncu-rep" -C $OUT g; }
cmake -S . -B build/gpu -G Ninja -DCMAKE_BUILD_TYPE=Release > $R/build.log 2>&1 && cmake --build build/gpu -j16 >> $R/build.log 2>&1
echo "build rc=$? $(( $(date +%s) - start )) s"; tail -1 $R/build.log
T=build/gpu/tests; B=build/gpu/benchmarks
$T/latent_plan_test 2>&1 | tail -1
timeout 120 $T/cuda_latent_bf16_test --gtest_filter='*Wgmma*' > $R/wgmma_test.txt 2>&1
echo "wgmma tests rc=$? $(( $(date +%s) - start )) s"; grep -E "^\[  (FAILED|PASSED) |Failure|paired|Expected|Which is|rc=" $R/wgmma_test.txt | head -30
pack
timeout 240 scripts/gpu_suite.sh build/gpu/tests $R/suite --sanitize none --jobs 4 --test-seconds 180 > $R/suite_stdout.txt 2>&1
echo "suite rc=$? $(( $(date +%s) - start )) s"; cut -c1-150 $R/suite/summary.txt
pack
F='BM_BatchedLatentAttention/heads:16/context:4096/batch:(1|8|32)/qtokens:(1|8|16|64)/cache_bits:16/|BM_BatchedLatentAttention/heads:16/context:16384/batch:(32|64)/qtokens:1/cache_bits:16/'
run_mla() {  # name, then environment assignments
  local name=$1; shift
  env "$@" timeout 75 $B/mla_decode_benchmark --benchmark_filter="$F" --benchmark_repetitions=3 \
    --benchmark_report_aggregates_only=true --benchmark_out=$R/mla_$name.json > $R/mla_$name.txt 2>&1
  echo "mla $name rc=$? $(( $(date +%s) - start )) s"
  grep median $R/mla_$name.txt | awk '{print $1, $2, $3}' | sed 's/BM_BatchedLatentAttention\///; s/\/iterations.*manual_time_median//'
  pack
}
run_mla single EAGLE3_LATENT_TREE_KERNEL=wgmma-all EAGLE3_LATENT_WGMMA=single
run_mla pair EAGLE3_LATENT_TREE_KERNEL=wgmma-all EAGLE3_LATENT_WGMMA=pair
run_mla default EAGLE3_LATENT_TREE_KERNEL=
echo "done $(( $(date +%s) - start )) s"
