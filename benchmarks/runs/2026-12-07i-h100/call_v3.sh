#!/bin/bash
# Call V3 (thirty-eighth session), branch direct-tokens as merged (per-format direct bounds: INT4 14
# tokens, FP8 4; the fold test's accumulate comparison of the kernels' tiled call against the
# kernels' row-major one): quant_gemv_test, cuda_quantized_moe_test and cuda_backend_core_test, at
# once. ~4 min with the start. Logs: $OUT/v3 (v3.tgz).
set -u
source .gpu-host/env.sh
R=$OUT/v3; mkdir -p $R; start=$(date +%s)
pack() { tar czf $OUT/v3.tgz -C $OUT v3; }
log() { echo "$* $(( $(date +%s) - start )) s" >> $R/log.txt; pack; }
git log --oneline -1 > $R/head.txt 2>&1
cmake -S . -B /tmp/b -G Ninja -DCMAKE_BUILD_TYPE=Release -DEAGLE3_ENABLE_CUDA=ON -DEAGLE3_BUILD_EXAMPLES=OFF > $R/build.log 2>&1
cmake --build /tmp/b -j16 --target quant_gemv_test cuda_quantized_moe_test cuda_backend_core_test >> $R/build.log 2>&1
log "build rc=$?"
for t in quant_gemv_test cuda_quantized_moe_test cuda_backend_core_test; do
  (timeout 200 /tmp/b/tests/$t > $R/t_$t.txt 2>&1
   log "$t rc=$? $(grep -E '^\[  (PASSED|FAILED) ' $R/t_$t.txt | tr '\n' ' ')") &
done
wait
log done
