#!/usr/bin/env bash
# The GPU host's check (run there from the repository root, with the .gpu-host kit carried):
#   source .gpu-host/env.sh && scripts/gpu_check.sh [OUT_DIR]
# Builds with CUDA, runs the gpu test binaries and compute-sanitizer over them (scripts/gpu_suite.sh),
# the cpu test label, and the decode demo on the GPU. Logs go to OUT_DIR (default build/gpu-check).
set -uo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
out=${1:-$root/build/gpu-check}
mkdir -p "$out"
build=${EAGLE3_GPU_BUILD:-/tmp/eagle3-gpu-build}
jobs=${EAGLE3_JOBS:-$(nproc)}

cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DEAGLE3_ENABLE_CUDA=ON >"$out/configure.log" 2>&1 \
  || { tail -30 "$out/configure.log"; exit 1; }
cmake --build "$build" -j "$jobs" >"$out/build.log" 2>&1 || { grep -E "error|FAILED" "$out/build.log" | head -40; exit 1; }
nvidia-smi -L | tee "$out/gpu.txt"
# The gpu test binaries, several at once, then compute-sanitizer memcheck / racecheck over them
# (scripts/gpu_suite.sh; EAGLE3_GPU_SANITIZE=0 skips the sanitizer, which multiplies run times).
"$root/scripts/gpu_suite.sh" "$build/tests" "$out/suite" --jobs "${EAGLE3_GPU_TEST_JOBS:-4}" \
  --sanitize "$([ "${EAGLE3_GPU_SANITIZE:-1}" = 0 ] && echo none || echo memcheck,racecheck)" \
  --sanitize-seconds "${EAGLE3_SANITIZE_SECONDS:-150}" >"$out/suite.log" 2>&1
suite_rc=$?
grep -E "rc=[1-9]|tests:|memcheck:|racecheck:" "$out/suite/summary.txt"
# The model test prints its measured errors; keep them.
grep -E "rel\. error" "$out/suite/logs/test_model_gpu_test.log" | head -20 || true
(cd "$build" && ctest -L cpu -j "$jobs" --timeout 600) >"$out/ctest_cpu.log" 2>&1
cpu_rc=$?
grep -E "tests passed" "$out/ctest_cpu.log"

"$build/examples/eagle3-decode" --device cuda --max-new-tokens 24 >"$out/demo.log" 2>&1
demo_rc=$?
tail -8 "$out/demo.log"
echo "gpu tests + sanitizer rc=$suite_rc cpu tests rc=$cpu_rc demo rc=$demo_rc"
[ "$suite_rc" = 0 ] && [ "$cpu_rc" = 0 ] && [ "$demo_rc" = 0 ]
