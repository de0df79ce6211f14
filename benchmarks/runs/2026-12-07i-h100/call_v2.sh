#!/bin/bash
# Call V2 (thirty-eighth session), from branch direct-tokens with the in-block tile fix (call V1 faulted:
# a token past the first wrote its tile rows by item, past the shared tile); built here; BM_QuantMoe
# models 0-2 at 1-16 tokens with EAGLE3_BENCH_QUANT_MOE_DIRECT_TOKENS=1 (main's paths) and =16
# (direct rounds up to 16 tokens), alternated, twice; then the whole gpu suite (no sanitizer), which
# covers main's merged fp8 scales-early form too; then memcheck over the in-block and indexed-item
# tests. ~7 min with the start.
# Logs: $OUT/v2 (v2.tgz).
set -u
source .gpu-host/env.sh
R=$OUT/v2; mkdir -p $R; start=$(date +%s)
pack() { tar czf $OUT/v2.tgz -C $OUT v2; }
log() { echo "$* $(( $(date +%s) - start )) s" >> $R/log.txt; pack; }
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv,noheader > $R/gpu.txt
git log --oneline -1 > $R/head.txt 2>&1
cmake -S . -B /tmp/b -G Ninja -DCMAKE_BUILD_TYPE=Release -DEAGLE3_ENABLE_CUDA=ON -DEAGLE3_BUILD_EXAMPLES=OFF > $R/build.log 2>&1
cmake --build /tmp/b -j16 >> $R/build.log 2>&1
log "build rc=$?"
B=/tmp/b/benchmarks/quant_moe_benchmark
sed_names() { sed 's/BM_Quant[A-Za-z]*.\(model\|shape\)://; s/.iterations.*manual_time_median//'; }
moe() {  # tag filter [env...]
  local tag=$1 filter=$2; shift 2
  env "$@" timeout 90 $B --benchmark_filter="$filter" --benchmark_repetitions=3 \
    --benchmark_report_aggregates_only=true > $R/moe_$tag.txt 2>&1
  log "moe $tag rc=$? $(grep median $R/moe_$tag.txt | awk '{print $1, $2}' | sed_names | tr '\n' ' ')"
}
F='BM_QuantMoe/model:[0-2]/tokens:(1|2|4|8|10|12|14|16)/'
for r in 1 2; do
  moe main.$r "$F" EAGLE3_BENCH_QUANT_MOE_DIRECT_TOKENS=1
  moe direct.$r "$F" EAGLE3_BENCH_QUANT_MOE_DIRECT_TOKENS=16
done
scripts/gpu_suite.sh /tmp/b/tests $R/suite --sanitize none --jobs 4 --test-seconds 200 > $R/suite.log 2>&1
log "suite rc=$? $(grep -c ' rc=0 ' $R/suite/summary.txt) binaries rc=0 of $(grep -c ' rc=' $R/suite/summary.txt)"
grep -v ' rc=0 ' $R/suite/summary.txt > $R/suite_not_ok.txt
timeout 150 compute-sanitizer --tool memcheck /tmp/b/tests/quant_gemv_test \
  --gtest_filter='*CombineInBlock*:*GroupedIndexedItems*' > $R/memcheck.txt 2>&1
log "memcheck rc=$? $(grep -E 'ERROR SUMMARY|PASSED|FAILED' $R/memcheck.txt | tr '\n' ' ')"
log done
