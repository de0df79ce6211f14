#!/bin/bash
# Next call for issue 20 (written in the thirty-eighth session, not yet run): (1) call V3's tests on
# main as merged (quant_gemv_test, cuda_quantized_moe_test, cuda_backend_core_test; the direct rounds'
# per-format bounds and two test fixes); (2) where an FP8 direct round of several tokens loses to the
# grouped path (V3 model 1 at 4 and 8 tokens: 76.6 / 127 us grouped against 77.6 / 139 direct on an
# H100): Nsight Compute's duration, occupancy and launch statistics of every kernel of one call, both
# paths (EAGLE3_BENCH_QUANT_MOE_DIRECT_TOKENS=1 / 16), K2.5 beside it at 4 tokens; (3) the whole gpu
# suite. From the repository root on any one GPU, .gpu-host carried; ~7 min with the start. Logs
# under $OUT/v4 (v4.tgz).
set -u
source .gpu-host/env.sh
R=$OUT/v4; mkdir -p $R; start=$(date +%s)
pack() { tar czf $OUT/v4.tgz -C $OUT v4; }
log() { echo "$* $(( $(date +%s) - start )) s" >> $R/log.txt; pack; }
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv,noheader > $R/gpu.txt
cmake -S . -B /tmp/b -G Ninja -DCMAKE_BUILD_TYPE=Release -DEAGLE3_ENABLE_CUDA=ON -DEAGLE3_BUILD_EXAMPLES=OFF > $R/build.log 2>&1
cmake --build /tmp/b -j16 --target quant_gemv_test cuda_quantized_moe_test cuda_backend_core_test quant_moe_benchmark \
  >> $R/build.log 2>&1
log "build rc=$?"
for t in quant_gemv_test cuda_quantized_moe_test cuda_backend_core_test; do
  (timeout 200 /tmp/b/tests/$t > $R/t_$t.txt 2>&1
   log "$t rc=$? $(grep -E '^\[  (PASSED|FAILED) ' $R/t_$t.txt | tr '\n' ' ')") &
done
wait
B=/tmp/b/benchmarks/quant_moe_benchmark
prof() {  # tag model tokens direct_tokens
  EAGLE3_BENCH_QUANT_MOE_DIRECT_TOKENS=$4 timeout 120 ncu --section SpeedOfLight --section LaunchStats \
    --section Occupancy --launch-skip 40 --launch-count 12 $B \
    --benchmark_filter="BM_QuantMoe/model:$2/tokens:$3/" --benchmark_min_time=0.01 > $R/ncu_$1.txt 2>&1
  log "ncu $1 rc=$? $(grep -E '^  [A-Za-z_].*\(|Duration' $R/ncu_$1.txt | tr -s ' ' | cut -c1-70 | tr '\n' ';')"
}
prof m1t4_grouped 1 4 1
prof m1t4_direct 1 4 16
prof m1t8_grouped 1 8 1
prof m1t8_direct 1 8 16
prof m0t4_grouped 0 4 1
prof m0t4_direct 0 4 16
cmake --build /tmp/b -j16 >> $R/build.log 2>&1
log "full build rc=$?"
scripts/gpu_suite.sh /tmp/b/tests $R/suite --sanitize none --jobs 4 --test-seconds 200 > $R/suite.log 2>&1
log "suite rc=$? $(grep -c ' rc=0 ' $R/suite/summary.txt) binaries rc=0 of $(grep -c ' rc=' $R/suite/summary.txt)"
grep -v ' rc=0 ' $R/suite/summary.txt > $R/suite_not_ok.txt
log done
