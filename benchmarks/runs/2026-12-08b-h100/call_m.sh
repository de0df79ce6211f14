#!/bin/bash
# Call M for issue 20 (forty-first session): main after the merge of call TS's two rules (the
# chain's combine inputs read at its tile's start; FP8's in-block combine at 32 steps from 4
# tokens). In order: the build; quant_gemv_test, cuda_quantized_moe_test, cuda_backend_core_test
# and quant_gemv_plan_test at once; BM_QuantMoe models 0-2 at 1-64 tokens as users get them, twice,
# and BM_StreamCeiling beside them; the full build and the whole gpu suite. From the repository root
# on any one GPU, .gpu-host carried; ~9 min with the start (the suite may be cut by the call's
# limit: every step's log is packed as it ends). Logs under $OUT/m (m.tgz).
set -u
source .gpu-host/env.sh
R=$OUT/m; mkdir -p $R; start=$(date +%s)
pack() { tar czf $OUT/m.tgz -C $OUT m; }
log() { echo "$* $(( $(date +%s) - start )) s" >> $R/log.txt; pack; }
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv,noheader > $R/gpu.txt
cmake -S . -B /tmp/b -G Ninja -DCMAKE_BUILD_TYPE=Release -DEAGLE3_ENABLE_CUDA=ON -DEAGLE3_BUILD_EXAMPLES=OFF > $R/build.log 2>&1
cmake --build /tmp/b -j16 --target quant_gemv_test cuda_quantized_moe_test cuda_backend_core_test quant_gemv_plan_test \
  quant_moe_benchmark >> $R/build.log 2>&1
log "build rc=$?"
for t in quant_gemv_test cuda_quantized_moe_test cuda_backend_core_test quant_gemv_plan_test; do
  (timeout 220 /tmp/b/tests/$t > $R/t_$t.txt 2>&1
   log "$t rc=$? $(grep -E '^\[  (PASSED|FAILED) ' $R/t_$t.txt | tr '\n' ' ')") &
done
(cmake --build /tmp/b -j8 >> $R/build_full.log 2>&1; log "full build rc=$?") &
wait
B=/tmp/b/benchmarks/quant_moe_benchmark
for r in 1 2; do
  timeout 150 $B --benchmark_filter='BM_(QuantMoe|StreamCeiling)/model:[0-2]/tokens:(1|2|4|8|12|16|64)/' \
    --benchmark_repetitions=3 --benchmark_report_aggregates_only=true --benchmark_out=$R/moe.$r.json \
    --benchmark_out_format=json > $R/moe.$r.txt 2>&1
  log "moe.$r rc=$? $(grep median $R/moe.$r.txt | awk '{print $1, $2}' | sed 's/BM_//; s/.model:/ /; s/.tokens:/\//; s/.iterations.*median//' | tr '\n' ' ')"
done
scripts/gpu_suite.sh /tmp/b/tests $R/suite --sanitize none --jobs 4 --test-seconds 200 > $R/suite.log 2>&1
log "suite rc=$? $(grep -c ' rc=0 ' $R/suite/summary.txt) binaries rc=0 of $(grep -c ' rc=' $R/suite/summary.txt)"
grep -v ' rc=0 ' $R/suite/summary.txt > $R/suite_not_ok.txt
log done
