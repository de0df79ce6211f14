#!/bin/bash
# Call W1 (twenty-third session): build main (all), fbbe3f8's library (base.patch reversed;
# decode_step_benchmark for W2) and a copy of main with MoeActKernel's x staging off
# (decode_ops_benchmark); the whole gpu suite at main; BM_MoeDecode at 24-64 tokens per-pair vs
# grouped-from-8; the 1-token BM_MoeDecode rows main vs staging off.
set -u
source .gpu-host/env.sh
R=$OUT/w; mkdir -p $R
start=$(date +%s)
pack() { tar czf $OUT/w1.tgz -C $OUT w; }
REPO=$(pwd)
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee $R/gpu.txt
rm -rf /tmp/base /tmp/nostage; mkdir -p /tmp/base /tmp/nostage
cp -r CMakeLists.txt cmake src cuda include benchmarks tools testing /tmp/base/
cp -r CMakeLists.txt cmake src cuda include benchmarks tools testing /tmp/nostage/
(cd /tmp/base && git apply -R $REPO/.gpu-host/base.patch) > $R/patch.log 2>&1; echo "patch rc=$?"
sed -i 's/const bool stage_x = hidden % 4 == 0/const bool stage_x = false \&\& hidden % 4 == 0/' /tmp/nostage/cuda/moe_experts_kernels.cu
grep -c "stage_x = false &&" /tmp/nostage/cuda/moe_experts_kernels.cu
(cmake -S /tmp/base -B /tmp/base/b -G Ninja -DCMAKE_BUILD_TYPE=Release -DEAGLE3_BUILD_TESTS=OFF -DEAGLE3_BUILD_EXAMPLES=OFF && cmake --build /tmp/base/b -j2 --target decode_step_benchmark) > $R/base_build.log 2>&1 &
BP=$!
(cmake -S /tmp/nostage -B /tmp/nostage/b -G Ninja -DCMAKE_BUILD_TYPE=Release -DEAGLE3_BUILD_TESTS=OFF -DEAGLE3_BUILD_EXAMPLES=OFF && cmake --build /tmp/nostage/b -j2 --target decode_ops_benchmark) > $R/nostage_build.log 2>&1 &
NP=$!
cmake -S . -B build/gpu -G Ninja -DCMAKE_BUILD_TYPE=Release > $R/build.log 2>&1 && cmake --build build/gpu -j12 >> $R/build.log 2>&1
echo "build rc=$? $(( $(date +%s) - start )) s"; tail -1 $R/build.log
T=build/gpu/tests; B=build/gpu/benchmarks
timeout 260 scripts/gpu_suite.sh $T $R/suite --sanitize none --jobs 4 --test-seconds 240 > $R/suite_stdout.txt 2>&1
echo "suite rc=$? $(( $(date +%s) - start )) s"; cut -c1-150 $R/suite/summary.txt | grep -v "rc=0" | head -20; echo "rc=0 binaries: $(grep -c 'rc=0' $R/suite/summary.txt)"
mkdir -p $R/fail; for f in $R/suite/logs/*.log; do grep -q "FAILED\|Failure" $f && grep -B3 -A15 "Failure" $f | head -60 > $R/fail/$(basename $f); done
rm -rf $R/suite/logs
pack
moe() {  # name, binary dir, filter, extra env
  env $4 timeout 100 $2/decode_ops_benchmark --benchmark_filter="$3" --benchmark_repetitions=5 \
    --benchmark_report_aggregates_only=true --benchmark_out=$R/moe_$1.json > $R/moe_$1.txt 2>&1
  echo "moe $1 rc=$? $(( $(date +%s) - start )) s"
  grep median $R/moe_$1.txt | awk '{print $1, $2}' | sed 's/\/iterations.*manual_time_median//' | tr '\n' ';'; echo
  pack
}
MF='BM_MoeDecode/model:[0-3]/tokens:(16|24|32|40|48|64)/join:0'
moe perpair $B "$MF" EAGLE3_BENCH_MOE_GROUPED=0
moe grouped8 $B "$MF" EAGLE3_BENCH_MOE_GROUPED_MIN_TOKENS=8
wait $NP; echo "nostage build rc=$? $(( $(date +%s) - start )) s"
OF='BM_MoeDecode/model:[0-3]/tokens:(1|4)/'
moe stage $B "$OF" X=1
moe nostage /tmp/nostage/b/benchmarks "$OF" X=1
moe stage2 $B "$OF" X=1
wait $BP; echo "base build rc=$? $(( $(date +%s) - start )) s"
pack
echo "done $(( $(date +%s) - start )) s"
