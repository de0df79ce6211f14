#!/bin/bash
# Call B: the branch's whole gpu suite from call A's build/i (same warm machine), rebuilt if absent.
set -u
source .gpu-host/env.sh
R=$OUT/b; mkdir -p $R; start=$(date +%s)
[ -x build/i/tests/quant_gemv_test ] || { cmake -S . -B build/i -G Ninja -DCMAKE_BUILD_TYPE=Release -DEAGLE3_BUILD_EXAMPLES=OFF > /dev/null && cmake --build build/i -j16 > $R/b.log 2>&1; echo "rebuilt rc=$? $(( $(date +%s) - start )) s"; }
for t in quant_moe_jobs_test quant_gemv_plan_test latent_plan_test; do timeout 60 build/i/tests/$t > $R/$t.txt 2>&1; echo "$t rc=$? $(grep -E '^\[  (PASSED|FAILED) ' $R/$t.txt | tr '\n' ' ')"; done
scripts/gpu_suite.sh build/i/tests $R/suite --sanitize none --jobs 4 --test-seconds 200 > $R/suite.log 2>&1
echo "suite rc=$? $(( $(date +%s) - start )) s"; tail -5 $R/suite.log; cat $R/suite/summary.txt
tar czf $OUT/b.tgz -C $OUT b
