#!/bin/bash
# Call FP (thirty-sixth session): branch fp8-round (FP8 rounds combined in the block and chained,
# items past the warps, BM_QuantMoe model 2) built here from the carried tree; BM_QuantMoe 1 / 4
# tokens of K2.5, V3 and V3 with its shared expert joined: main's carried binary (models 0, 1;
# .gpu-host/cl.txz), the branch's, and the branch's with EAGLE3_BENCH_QUANT_MOE_IN_BLOCK=0 (FP8
# then takes main's path), alternated twice; then the whole gpu suite and compute-sanitizer memcheck
# over the in-block and chained tests. ~7 min with the machine's start. Logs: $OUT/fp (fp.tgz).
set -u
source .gpu-host/env.sh
R=$OUT/fp; mkdir -p $R; start=$(date +%s)
pack() { tar czf $OUT/fp.tgz -C $OUT fp; }
log() { echo "$* $(( $(date +%s) - start )) s" >> $R/log.txt; pack; }
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv,noheader > $R/gpu.txt
rm -rf /tmp/cl && tar xJf .gpu-host/cl.txz -C /tmp && export LD_LIBRARY_PATH=/tmp/cl/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
cmake -S . -B /tmp/b -G Ninja -DCMAKE_BUILD_TYPE=Release -DEAGLE3_ENABLE_CUDA=ON -DEAGLE3_BUILD_EXAMPLES=OFF > $R/build.log 2>&1
cmake --build /tmp/b -j16 >> $R/build.log 2>&1; log "build rc=$?"
moe() {  # tag binary filter [env...]
  local tag=$1 bin=$2 filter=$3; shift 3
  env "$@" timeout 60 $bin --benchmark_filter="$filter" --benchmark_repetitions=3 \
    --benchmark_report_aggregates_only=true > $R/moe_$tag.txt 2>&1
  log "moe $tag rc=$? $(grep median $R/moe_$tag.txt | awk '{print $1, $2}' | sed 's/BM_QuantMoe.model://; s/.iterations.*manual_time_median//' | tr '\n' ' ')"
}
F='BM_QuantMoe/model:[0-2]/tokens:(1|4)/'
for rep in 1 2; do
  moe main.$rep /tmp/cl/main/quant_moe_benchmark "$F"
  moe new.$rep /tmp/b/benchmarks/quant_moe_benchmark "$F"
  moe nib.$rep /tmp/b/benchmarks/quant_moe_benchmark "$F" EAGLE3_BENCH_QUANT_MOE_IN_BLOCK=0
  moe nch.$rep /tmp/b/benchmarks/quant_moe_benchmark 'BM_QuantMoe/model:[0-2]/tokens:1/' EAGLE3_BENCH_QUANT_MOE_CHAIN=0
done
scripts/gpu_suite.sh /tmp/b/tests $R/suite --sanitize none --jobs 4 --test-seconds 200 > $R/suite.log 2>&1
log "suite rc=$?"; cp $R/suite/summary.txt $R/suite_summary.txt; pack
timeout 150 compute-sanitizer --tool memcheck --error-exitcode 99 /tmp/b/tests/quant_gemv_test \
  --gtest_filter='*CombineInBlock*:*ChainedRound*' > $R/memcheck.txt 2>&1
log "memcheck rc=$? $(grep -E 'ERROR SUMMARY|PASSED|FAILED' $R/memcheck.txt | tr '\n' ' ')"
log done
