#!/usr/bin/env bash
# Builds eagle3 and runs every check CI runs:
#   1. Release build (CUDA code compiled whenever nvcc exists), `ctest -L cpu`, and `-L gpu` with a GPU;
#   2. `cmake --install`, then an outside project (tests/consumer) built against the installed package
#      with find_package(eagle3) and run: with the cuda component when the install has it; CPU-only
#      with the CUDA toolkit hidden; and against a shared-library install (BUILD_SHARED_LIBS=ON, the
#      library and example programs only, CPU-only), whose installed eagle3-decode also runs;
#   3. an AddressSanitizer + UndefinedBehaviorSanitizer build of the cpu tests;
#   4. every libFuzzer target for EAGLE3_FUZZ_SECONDS (default 30) each, starting from its seed corpus.
# Steps 3-4 can be skipped with EAGLE3_QUICK=1. Build trees go under build/ (or EAGLE3_BUILD_ROOT).
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
eagle3_install_packages "${EAGLE3_BUILD_PACKAGES[@]}"
[ "${EAGLE3_QUICK:-0}" = 1 ] || eagle3_install_packages "${EAGLE3_CHECK_PACKAGES[@]}"

root=${EAGLE3_BUILD_ROOT:-$EAGLE3_ROOT/build}
fuzz_seconds=${EAGLE3_FUZZ_SECONDS:-30}
summary=()
total_passed=0
total_failed=0

# Runs ctest with the given arguments in directory $1 and adds its counts to the totals.
run_ctest() {
  local dir=$1; shift
  local log
  log=$(mktemp)
  set +e
  (cd "$dir" && ctest --output-on-failure --timeout 900 "$@") 2>&1 | tee "$log"
  local rc=${PIPESTATUS[0]}
  set -e
  # "100% tests passed, 0 tests failed out of 132" (CMake 3) or "100% tests passed out of 132" (CMake 4)
  local line total failed passed
  line=$(grep -E '[0-9]+% tests passed.* out of [0-9]+' "$log" | tail -1)
  total=$(sed -nE 's/.* out of ([0-9]+).*/\1/p' <<<"$line")
  failed=$(sed -nE 's/.* ([0-9]+) tests? failed.*/\1/p' <<<"$line")
  total=${total:-0}
  failed=${failed:-0}
  [ -n "$line" ] || failed=1  # no summary line at all: ctest itself failed
  passed=$((total - failed))
  total_passed=$((total_passed + passed))
  total_failed=$((total_failed + failed))
  summary+=("ctest $* in ${dir#$root/}: $passed passed, $failed failed")
  rm -f "$log"
  return "$rc"
}

echo "==> [1/4] release build"
cmake -S "$EAGLE3_ROOT" -B "$root/release" -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_INSTALL_PREFIX="$root/install"
cmake --build "$root/release" -j "$EAGLE3_JOBS"
run_ctest "$root/release" -L cpu -j "$EAGLE3_JOBS"
if eagle3_has_gpu; then
  run_ctest "$root/release" -L gpu
else
  summary+=("gpu tests: no GPU here, not run")
fi

echo "==> [2/4] install + consumer project (static, CPU-only view, shared)"
# Builds tests/consumer in $root/$1 against the install prefix $2 (more cmake arguments after) and runs it.
consumer() {
  local name=$1 prefix=$2; shift 2
  rm -rf "$root/$name"
  cmake -S "$EAGLE3_ROOT/tests/consumer" -B "$root/$name" -G Ninja -DCMAKE_BUILD_TYPE=Release \
    -DCMAKE_PREFIX_PATH="$prefix" "$@"
  cmake --build "$root/$name" -j "$EAGLE3_JOBS"
  "$root/$name/eagle3_consumer" "$root/$name/work"
}
step_start=$SECONDS
rm -rf "$root/install"
cmake --install "$root/release" --prefix "$root/install" >/dev/null
components=()
if compgen -G "$root/install/lib*/cmake/eagle3/eagle3-cuda-targets.cmake" >/dev/null; then
  components=(-DEAGLE3_CONSUMER_COMPONENTS=cuda)
fi
consumer consumer "$root/install" -DEAGLE3_CONSUMER_EXPECT=STATIC_LIBRARY "${components[@]}"
summary+=("consumer against the static install${components:+ (with the cuda component)}: ok")
# A CPU-only consumer needs no CUDA toolkit, even from an install made with CUDA.
consumer consumer-cpu "$root/install" --no-warn-unused-cli -DCMAKE_DISABLE_FIND_PACKAGE_CUDAToolkit=ON \
  -DCMAKE_DISABLE_FIND_PACKAGE_NCCL=ON
summary+=("consumer without the cuda component, CUDA toolkit hidden: ok")
# Shared libraries: libeagle3.so exports the EAGLE3_API (tests and benchmarks need the static build).
rm -rf "$root/install-shared"
cmake -S "$EAGLE3_ROOT" -B "$root/shared" -G Ninja -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=ON \
  -DEAGLE3_ENABLE_CUDA=OFF -DEAGLE3_BUILD_TESTS=OFF -DEAGLE3_BUILD_BENCHMARKS=OFF \
  -DCMAKE_INSTALL_PREFIX="$root/install-shared"
cmake --build "$root/shared" -j "$EAGLE3_JOBS"
cmake --install "$root/shared" --prefix "$root/install-shared" >/dev/null
consumer consumer-shared "$root/install-shared" -DEAGLE3_CONSUMER_EXPECT=SHARED_LIBRARY
"$root/install-shared/bin/eagle3-decode" --device cpu --max-new-tokens 8 >"$root/shared/decode.log" ||
  { cat "$root/shared/decode.log" >&2; exit 1; }
summary+=("consumer and installed eagle3-decode against the shared install: ok")
summary+=("install + consumer projects: $((SECONDS - step_start)) s")

if [ "${EAGLE3_QUICK:-0}" != 1 ]; then
  echo "==> [3/4] AddressSanitizer + UBSan build of the cpu tests"
  cmake -S "$EAGLE3_ROOT" -B "$root/asan" -G Ninja -DCMAKE_BUILD_TYPE=Debug \
    -DEAGLE3_SANITIZE=address,undefined -DEAGLE3_ENABLE_CUDA=OFF -DEAGLE3_BUILD_BENCHMARKS=OFF \
    -DEAGLE3_BUILD_EXAMPLES=OFF -DCMAKE_CXX_FLAGS="-O1"
  cmake --build "$root/asan" -j "$EAGLE3_JOBS"
  # allocator_may_return_null: the tests ask for impossible sizes and expect a Status, not an abort.
  ASAN_OPTIONS=detect_leaks=1:abort_on_error=1:allocator_may_return_null=1 \
    UBSAN_OPTIONS=print_stacktrace=1 \
    run_ctest "$root/asan" -L cpu -j "$EAGLE3_JOBS"

  echo "==> [4/4] libFuzzer targets, ${fuzz_seconds}s each"
  CC=clang CXX=clang++ cmake -S "$EAGLE3_ROOT" -B "$root/fuzz" -G Ninja -DCMAKE_BUILD_TYPE=Release \
    -DEAGLE3_BUILD_FUZZERS=ON -DEAGLE3_BUILD_TESTS=OFF -DEAGLE3_BUILD_BENCHMARKS=OFF \
    -DEAGLE3_BUILD_EXAMPLES=OFF -DEAGLE3_ENABLE_CUDA=OFF
  cmake --build "$root/fuzz" -j "$EAGLE3_JOBS"
  for fuzzer in "$root"/fuzz/tests/fuzz/*_fuzzer; do
    name=$(basename "$fuzzer" _fuzzer)
    corpus=$(mktemp -d)
    cp -r "$EAGLE3_ROOT/tests/fuzz/corpus/$name/." "$corpus/" 2>/dev/null || true
    echo "--- $name"
    log="$root/fuzz/$name.log"
    rc=0
    "$fuzzer" -max_total_time="$fuzz_seconds" -timeout=10 -rss_limit_mb=4096 -print_final_stats=1 \
      "$corpus" >"$log" 2>&1 || rc=$?
    grep -E '^stat::number_of_executed_units|^#[0-9]+ +DONE' "$log" || true
    if [ "$rc" != 0 ]; then
      tail -n 60 "$log" >&2
      echo "fuzzer $name failed (exit $rc); full log: $log" >&2
      exit 1
    fi
    rm -rf "$corpus"
    summary+=("fuzzer $name: ${fuzz_seconds}s, no crash")
  done
fi

echo
echo "==> summary"
printf '  %s\n' "${summary[@]}"
echo "$total_passed passed, $total_failed failed"
[ "$total_failed" = 0 ]
