#!/usr/bin/env bash
# Runs every GPU benchmark and every PyTorch peer on the GPU host and regenerates RESULTS.md and
# roofline.png. From the repository root, after `source .gpu-host/env.sh`:
#
#   benchmarks/run_all.sh [--quick] [--out DIR] [--build DIR | --bin DIR] [--timeout SECONDS] [--no-build]
#                         [--only NAME,NAME...] [--filter REGEX] [--tag TAG] [--no-peers] [--no-report]
#
#   --quick     fewer shapes, repetitions and iterations (EAGLE3_BENCH_QUICK=1)
#   --out       where the JSON goes (default /tmp/eagle3-bench-results; $OUT/bench when $OUT is set)
#   --build     the CMake build directory (default /tmp/b-bench-gpu)
#   --bin       run carried binaries DIR/<name>_benchmark (scripts/pack_gpu_binaries.sh) instead
#               of building: no build, no CMake on the host
#   --timeout   per-binary / per-peer limit in seconds (default 600, 180 with --quick)
#   --only      run only these benchmark binaries (names without _benchmark, e.g. verify,mla_decode):
#               a device call is limited to 10 minutes, so a full run is split over several calls
#               into the same --out DIR (JSON of earlier calls stays; status.txt is appended to)
#   --filter    --benchmark_filter for every binary run (with --only one binary: split its shapes
#               over calls); --tag TAG names the outputs DIR/<name>.TAG.json, so the parts of one
#               binary do not overwrite each other (make_results.py merges every *.json of DIR)
#   --no-peers  skip the PyTorch peers; --no-report skips make_results.py
#
# A binary stopped at its time limit writes no --benchmark_out file; its streamed JSON
# (DIR/logs/<name>.stream.json) keeps every finished row, and recover_json.py turns it into
# DIR/<name>.json, so a cut run still reports what it measured (status.txt says "partial").
#
# Each benchmarks/cuda/*_benchmark binary writes DIR/<name>.json (Google Benchmark JSON); every
# benchmarks/peers/*.py (helpers starting with '_' excepted) appends JSON lines to DIR/peers.jsonl;
# DIR/env.json records the card, driver, CUDA and the commit; DIR/logs/ keeps each program's
# stderr. A failing or timed-out program is recorded in DIR/status.txt and the run goes on.
set -u
cd "$(dirname "$0")/.."
ROOT=$(pwd)
QUICK=0
OUT_DIR=${OUT:+$OUT/bench}
OUT_DIR=${OUT_DIR:-/tmp/eagle3-bench-results}
BUILD=/tmp/b-bench-gpu
TIMEOUT=
DO_BUILD=1
BIN_DIR=
ONLY=
FILTER=
TAG=
PEERS=1
REPORT=1
while [ $# -gt 0 ]; do
  case "$1" in
    --quick) QUICK=1 ;;
    --out) OUT_DIR=$2; shift ;;
    --build) BUILD=$2; shift ;;
    --timeout) TIMEOUT=$2; shift ;;
    --no-build) DO_BUILD=0 ;;
    --bin) BIN_DIR=$2; DO_BUILD=0; shift ;;
    --only) ONLY=",$2,"; shift ;;
    --filter) FILTER=$2; shift ;;
    --tag) TAG=".$2"; shift ;;
    --no-peers) PEERS=0 ;;
    --no-report) REPORT=0 ;;
    *) echo "run_all.sh: unknown argument '$1'" >&2; exit 1 ;;
  esac
  shift
done
if [ -z "$TIMEOUT" ]; then
  if [ $QUICK = 1 ]; then TIMEOUT=180; else TIMEOUT=600; fi
fi
export EAGLE3_BENCH_QUICK=$QUICK
mkdir -p "$OUT_DIR/logs"
# A partial call (--only) adds to an earlier call's directory instead of starting over.
if [ -z "$ONLY" ]; then
  : > "$OUT_DIR/status.txt"
fi
touch "$OUT_DIR/status.txt"
[ $PEERS = 0 ] || : > "$OUT_DIR/peers.jsonl"
START=$(date +%s)
note() { echo "[run_all $(( $(date +%s) - START ))s] $*" >&2; }

if [ $DO_BUILD = 1 ]; then
  note "configuring and building the benchmarks in $BUILD"
  if ! cmake -S "$ROOT" -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DEAGLE3_BUILD_TESTS=OFF \
      -DEAGLE3_BUILD_EXAMPLES=OFF > "$OUT_DIR/logs/cmake.log" 2>&1; then
    note "cmake failed (see $OUT_DIR/logs/cmake.log)"; tail -20 "$OUT_DIR/logs/cmake.log" >&2
    echo "cmake failed" >> "$OUT_DIR/status.txt"
  fi
  # Build every GPU benchmark target; one that fails to compile does not stop the others (-k 0).
  targets=$(cd "$ROOT/benchmarks/cuda" && ls *_benchmark.cc 2>/dev/null | sed 's/\.cc$//' |
    while read -r t; do case "$ONLY" in ""|*",${t%_benchmark},"*) echo "$t" ;; esac; done)
  if ! cmake --build "$BUILD" -j16 --target $targets -- -k 0 > "$OUT_DIR/logs/build.log" 2>&1; then
    note "some benchmark failed to build (see $OUT_DIR/logs/build.log)"; grep -E "error|FAILED" "$OUT_DIR/logs/build.log" | head -20 >&2
    echo "build: some targets failed" >> "$OUT_DIR/status.txt"
  fi
fi

# Environment: card, driver, CUDA, commit, command.
python3 - "$OUT_DIR/env.json" "$QUICK" "$*" <<'PY'
import json, subprocess, sys
def run(cmd):
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=60).stdout.strip()
    except Exception as e:  # no nvidia-smi or no git: record why
        return f"unavailable ({e})"
env = {
    "gpus": run(["nvidia-smi", "--query-gpu=index,name,memory.total,clocks.max.sm,clocks.max.mem,power.limit",
                 "--format=csv,noheader"]).splitlines(),
    "driver": run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"]).splitlines()[:1],
    "smi_header": "\n".join(run(["nvidia-smi", "-q"]).splitlines()[:12]),
    "nvcc": run(["nvcc", "--version"]).splitlines()[-1:] ,
    "commit": run(["git", "rev-parse", "--short", "HEAD"]),
    "dirty": bool(run(["git", "status", "--porcelain", "--untracked-files=no"])),
    "quick": sys.argv[2] == "1",
    "command": "source .gpu-host/env.sh && benchmarks/run_all.sh" + (" --quick" if sys.argv[2] == "1" else ""),
}
json.dump(env, open(sys.argv[1], "w"), indent=1)
PY

for src in "$ROOT"/benchmarks/cuda/*_benchmark.cc; do
  name=$(basename "$src" .cc)
  case "$ONLY" in ""|*",${name%_benchmark},"*) ;; *) continue ;; esac
  bin=${BIN_DIR:+$BIN_DIR/$name}
  bin=${bin:-$BUILD/benchmarks/$name}
  if [ ! -x "$bin" ]; then
    note "$name: not built, skipped"; echo "$name: not built" >> "$OUT_DIR/status.txt"; continue
  fi
  note "$name${FILTER:+ (filter $FILTER)}"
  out="$OUT_DIR/$name$TAG.json"
  stream="$OUT_DIR/logs/$name$TAG.stream.json"
  rm -f "$out"
  timeout --kill-after=10 "$TIMEOUT" "$bin" --benchmark_format=json --benchmark_out="$out" \
    --benchmark_out_format=json ${FILTER:+--benchmark_filter="$FILTER"} > "$stream" \
    2> "$OUT_DIR/logs/$name$TAG.log"
  rc=$?
  partial=
  if [ $rc != 0 ] && python3 "$ROOT/benchmarks/recover_json.py" "$stream" "$out"; then partial=", partial"; fi
  echo "$name$TAG: rc=$rc$([ $rc = 124 ] && echo ' (timed out)')$partial${FILTER:+, filter $FILTER}" \
    >> "$OUT_DIR/status.txt"
  [ $rc = 0 ] || { note "$name exited $rc"; tail -5 "$OUT_DIR/logs/$name$TAG.log" >&2; }
done

PY_PEER=${PYTHON:-python3}
for peer in "$ROOT"/benchmarks/peers/*.py; do
  [ $PEERS = 1 ] || break
  name=$(basename "$peer" .py)
  case "$name" in _*) continue ;; esac
  note "peer $name"
  (cd "$ROOT/benchmarks/peers" && timeout --kill-after=10 "$TIMEOUT" "$PY_PEER" "$peer") \
    >> "$OUT_DIR/peers.jsonl" 2> "$OUT_DIR/logs/peer_$name.log"
  rc=$?
  echo "peer $name: rc=$rc$([ $rc = 124 ] && echo ' (timed out)')" >> "$OUT_DIR/status.txt"
  [ $rc = 0 ] || { note "peer $name exited $rc"; tail -5 "$OUT_DIR/logs/peer_$name.log" >&2; }
done

if [ $REPORT = 1 ]; then
note "make_results.py"
python3 "$ROOT/benchmarks/make_results.py" --in "$OUT_DIR" --out-md "$ROOT/benchmarks/RESULTS.md" \
  --out-png "$ROOT/benchmarks/roofline.png" --notes "$ROOT/benchmarks/NOTES.md"
cp "$ROOT/benchmarks/RESULTS.md" "$ROOT/benchmarks/roofline.png" "$OUT_DIR/" 2>/dev/null
fi
note "done; status:"; cat "$OUT_DIR/status.txt" >&2
