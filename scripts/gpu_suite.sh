#!/usr/bin/env bash
# Runs the gpu test binaries (tests/gpu/*_test.cc) on the GPU host, several at once on the one
# device, then compute-sanitizer over them, from a build directory or a folder of carried binaries
# (scripts/pack_gpu_binaries.sh). From the repository root (the tests read fixtures below it):
#
#   scripts/gpu_suite.sh BIN_DIR OUT_DIR [--jobs N] [--only NAME,NAME] [--test-seconds S]
#                        [--sanitize TOOLS] [--sanitize-seconds S] [--sanitize-jobs N]
#
#   BIN_DIR            holds the test binaries (a build's tests/ folder, or an unpacked tarball)
#   --jobs             test binaries run at once (default 4)
#   --only             these binaries only (names, comma-separated)
#   --test-seconds     per test binary (default 600): a binary still running then is stopped and
#                      recorded as timed out (rc=124), a failure, so one hang costs no other result
#   --sanitize         compute-sanitizer tools after the tests, comma-separated (default
#                      memcheck,racecheck; "none" skips); racecheck instruments cuBLAS's own
#                      kernels too (excluding them with --kernel-name-exclude kns=nvjet made the
#                      sanitizer fail on a hardware exception in the bf16 GEMMs, 2026-12-01c), and
#                      does not model their TMA / mbarrier synchronization: the summary counts the
#                      hazards reported in nvjet_* kernels apart from the others
#   --sanitize-seconds per binary and tool (default 150; a timeout is recorded as such)
#   --sanitize-jobs    sanitizer runs at once (default 8)
#
# OUT_DIR/summary.txt: one line per binary (rc, gtest's PASSED/FAILED lines) and per sanitizer run
# (rc, ERROR / RACECHECK SUMMARY); OUT_DIR/logs/: every log. Exit status 0 when every test binary
# passed and no sanitizer run reported an error (timeouts excepted).
set -u
[ $# -ge 2 ] || { sed -n '2,24p' "$0"; exit 2; }
BIN=$1
OUT=$2
shift 2
JOBS=4
ONLY=
TOOLS=memcheck,racecheck
TEST_SECONDS=600
SAN_SECONDS=150
SAN_JOBS=8
while [ $# -gt 0 ]; do
  case "$1" in
    --jobs) JOBS=$2; shift ;;
    --only) ONLY=",$2," ; shift ;;
    --test-seconds) TEST_SECONDS=$2; shift ;;
    --sanitize) TOOLS=$2; shift ;;
    --sanitize-seconds) SAN_SECONDS=$2; shift ;;
    --sanitize-jobs) SAN_JOBS=$2; shift ;;
    *) echo "gpu_suite.sh: unknown argument '$1'" >&2; exit 2 ;;
  esac
  shift
done
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
mkdir -p "$OUT/logs"
: > "$OUT/summary.txt"

tests=()
for src in "$root"/tests/gpu/*_test.cc; do
  name=$(basename "$src" .cc)
  case "$ONLY" in ""|*",$name,"*) ;; *) continue ;; esac
  if [ -x "$BIN/$name" ]; then tests+=("$name"); else echo "$name: not built" >> "$OUT/summary.txt"; fi
done

# Runs "$@" for every name in tests, at most $1 at a time.
parallel() {
  local width=$1 fn=$2 name
  for name in "${tests[@]}"; do
    while [ "$(jobs -rp | wc -l)" -ge "$width" ]; do wait -n; done
    "$fn" "$name" &
  done
  wait
}

run_test() {
  local name=$1 log="$OUT/logs/test_$1.log"
  timeout "$TEST_SECONDS" "$BIN/$name" > "$log" 2>&1
  local rc=$? note=
  [ $rc -eq 124 ] && note="(timed out after $TEST_SECONDS s) "
  echo "$name rc=$rc $note$(grep -E '^\[  PASSED|^\[  FAILED|^\[  SKIPPED \] [0-9]' "$log" | tr '\n' ' ')" >> "$OUT/summary.txt"
}
start=$(date +%s)
parallel "$JOBS" run_test
echo "tests: $(( $(date +%s) - start )) s" >> "$OUT/summary.txt"
test_rc=0
grep -q "rc=[1-9]" "$OUT/summary.txt" && test_rc=1

san_rc=0
run_sanitizer() {
  local name=$1 tool=$SAN_TOOL log="$OUT/logs/${SAN_TOOL}_$1.log" extra=()
  # CUDA API errors are not memory errors, and the library turns every one into a Status already;
  # tests provoke some on purpose (a capture that must fail, NCCL's own probes).
  [ "$tool" = memcheck ] && extra=(--report-api-errors no)
  # The deliberate out-of-memory test provokes a failed cudaMalloc memcheck would report; the
  # long-context cases take minutes under instrumentation.
  timeout "$SAN_SECONDS" compute-sanitizer --tool "$tool" --error-exitcode 99 "${extra[@]}" "$BIN/$name" \
    --gtest_filter='-*OutOfMemory*:*LongContext*' > "$log" 2>&1
  local rc=$?
  local ours=0 cublas=0
  if [ "$tool" = racecheck ]; then
    # A hazard report names its kernel on the "Race reported" / "Potential" lines that follow it.
    cublas=$(grep -cE '(Race reported|Potential).*nvjet_' "$log")
    ours=$(grep -E 'Race reported|Potential' "$log" | grep -vc 'nvjet_')
  fi
  echo "$tool $name rc=$rc$([ $rc = 124 ] && echo ' (timed out)') $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY|^\[  FAILED|Internal Sanitizer Error' "$log" | tr '\n' ' ')$([ "$tool" = racecheck ] && echo " hazards: $ours outside cuBLAS, $cublas in nvjet_*")" \
    >> "$OUT/summary.txt"
  # racecheck's exit status counts cuBLAS's (unmodelled) hazards too: ours decide.
  if [ "$tool" = racecheck ] && [ $rc = 99 ] && [ "$ours" = 0 ] && ! grep -q 'Internal Sanitizer Error\|^\[  FAILED' "$log"; then rc=0; fi
  [ $rc = 0 ] || [ $rc = 124 ] || echo "$tool $name" >> "$OUT/sanitizer_failed.txt"
}
rm -f "$OUT/sanitizer_failed.txt"
if [ "$TOOLS" != none ]; then
  for SAN_TOOL in ${TOOLS//,/ }; do
    start=$(date +%s)
    parallel "$SAN_JOBS" run_sanitizer
    echo "$SAN_TOOL: $(( $(date +%s) - start )) s" >> "$OUT/summary.txt"
  done
  [ -s "$OUT/sanitizer_failed.txt" ] && san_rc=1
fi
cat "$OUT/summary.txt"
[ $test_rc = 0 ] && [ $san_rc = 0 ]
