#!/bin/bash
# Call I (twentieth session): MoE down slots in flight together (A/B against the base tree), the
# latent split cap sweep at small batches, and the V2-Lite step under the best caps.
set -u
source .gpu-host/env.sh
R=$OUT/i; mkdir -p $R
start=$(date +%s)
pack() { tar czf $OUT/i.tgz --exclude="*.ncu-rep" -C $OUT i; }
cmake -S . -B build/gpu -G Ninja -DCMAKE_BUILD_TYPE=Release > $R/build.log 2>&1 && cmake --build build/gpu -j16 >> $R/build.log 2>&1
echo "build rc=$? $(( $(date +%s) - start )) s"; tail -1 $R/build.log
mkdir -p /tmp/base && cp -r CMakeLists.txt cmake src cuda include benchmarks tools testing /tmp/base/ && (REPO=$(pwd); cd /tmp/base && (git apply -R $REPO/.gpu-host/base.patch || patch -R -p1 < $REPO/.gpu-host/base.patch); grep -c WarpDotsEach cuda/moe_kernels.cu) > $R/patch.log 2>&1
(cmake -S /tmp/base -B /tmp/base/b -G Ninja -DCMAKE_BUILD_TYPE=Release -DEAGLE3_BUILD_TESTS=OFF -DEAGLE3_BUILD_EXAMPLES=OFF && cmake --build /tmp/base/b -j16 --target decode_ops_benchmark decode_step_benchmark) > $R/base_build.log 2>&1
echo "base build rc=$? $(( $(date +%s) - start )) s"; tail -1 $R/base_build.log
T=build/gpu/tests; B=build/gpu/benchmarks; BB=/tmp/base/b/benchmarks
$T/latent_plan_test 2>&1 | tail -1
timeout 240 scripts/gpu_suite.sh build/gpu/tests $R/suite --sanitize none --jobs 4 --test-seconds 180 > $R/suite_stdout.txt 2>&1
echo "suite rc=$? $(( $(date +%s) - start )) s"; cut -c1-150 $R/suite/summary.txt | grep -v "^ok" | head -20; grep -c "^ok" $R/suite/summary.txt
pack
MF='BM_MoeDecode/model:[0-3]/tokens:(1|4|16)/join'
for side in base new; do
  bin=$B; [ $side = base ] && bin=$BB
  timeout 90 $bin/decode_ops_benchmark --benchmark_filter="$MF" --benchmark_repetitions=5 --benchmark_report_aggregates_only=true \
    --benchmark_out=$R/moe_$side.json > $R/moe_$side.txt 2>&1
  echo "moe $side rc=$? $(( $(date +%s) - start )) s"
  grep median $R/moe_$side.txt | awk '{print $1, $2, $3}' | sed 's/\/iterations.*manual_time_median//'
done
pack
F='BM_BatchedLatentAttention/heads:16/context:(1024|4096)/batch:(1|8)/qtokens:1/cache_bits:16/|BM_BatchedLatentAttention/heads:16/context:4096/batch:1/qtokens:8/cache_bits:16/'
for fold in def max; do
  caps="0 4 8 16"; [ $fold = max ] && caps="4 8"
  for cap in $caps; do
    fb=; [ $fold = max ] && fb=9223372036854775807
    envs="EAGLE3_LATENT_MAX_SPLITS=$cap"; [ $cap = 0 ] && envs="EAGLE3_LATENT_NONE=1"
    [ -n "$fb" ] && envs="$envs EAGLE3_BENCH_LATENT_FOLD_BYTES=$fb"
    env -u EAGLE3_LATENT_MAX_SPLITS $envs timeout 60 $B/mla_decode_benchmark --benchmark_filter="$F" --benchmark_repetitions=3 \
      --benchmark_report_aggregates_only=true --benchmark_out=$R/mla_${fold}_$cap.json > $R/mla_${fold}_$cap.txt 2>&1
    echo "mla fold $fold cap $cap rc=$? $(( $(date +%s) - start )) s"
    grep median $R/mla_${fold}_$cap.txt | awk '{print $1, $2}' | sed 's/BM_BatchedLatentAttention\///; s/\/iterations.*manual_time_median//; s/cache_bits:16\///'
  done
  pack
done
echo "done $(( $(date +%s) - start )) s"
