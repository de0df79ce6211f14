#!/usr/bin/env bash
# FlashMLA's Hopper dense decode as a peer of eagle3's MLA decode rows (issue 18): build it from its
# public source (staged by stage.sh into the git-ignored .gpu-host/flashmla/flashmla-src.tar.gz:
# FlashMLA's sm90 dense-decode, scheduling-metadata and combine sources + the CUTLASS include/ tree of
# the submodule commit it pins; FLASHMLA_SRC names another tarball) and time it.
#
#   bash benchmarks/peers/flashmla/build_and_bench.sh OUTDIR   (from the repository root, on the H200)
#
# Needs: one sm_90 GPU, CUDA 13 nvcc (CUDA_HOME, default /usr/local/cuda), python3 with torch 2.11
# (CUDA build) and ninja. Nothing is downloaded. Everything is built under $FLASHMLA_WORK
# (default /tmp/flashmla-kit); a second run reuses the build (ninja finds it up to date).
#
# Expected times (H200 host, 16 cores):
#   unpack            ~2 s
#   build             ~1.5-2.5 min: 4 translation units in parallel (MAX_JOBS=16); bf16.cu (the
#                     split-KV kernel, one nvcc process) dominates: 124 s on a shared 2-core box,
#                     dense_api.cpp (torch headers) 27 s, combine.cu / get_decoding_sched_meta.cu ~40 s.
#                     Stopped after 8 min (then something is wrong).
#   bench             ~1-2 min: load + 4 correctness checks (~10 s), copy ceiling (~1 s), then 41
#                     shapes of ~1-3 s each (cache fill, up to 2 x 128 + 1 graph captures, 6 x 35
#                     timed calls of at most ~2 ms). Shapes run in the order 16 heads decode, 16 heads
#                     x 4K tree rows, 128 heads decode; past a deadline (the whole script at ~5 min
#                     45 s, FLASHMLA_BUDGET_S=345) the remaining ones are written as skipped.
# Output in OUTDIR: flashmla_rows.jsonl and flashmla_rows.csv (one row per shape), env.json (device,
# commits, copy ceiling, check result), log.txt (this script's log), build.log (compiler output).
set -euo pipefail

OUT=${1:?usage: bash benchmarks/peers/flashmla/build_and_bench.sh OUTDIR}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
KIT=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# The staged sources (stage.sh); git-ignored, carried to the GPU host.
SRC_TAR=${FLASHMLA_SRC:-$KIT/../../../.gpu-host/flashmla/flashmla-src.tar.gz}
WORK=${FLASHMLA_WORK:-/tmp/flashmla-kit}
BUDGET_S=${FLASHMLA_BUDGET_S:-345}  # the whole script; the bench skips shapes past it
T0=$(date +%s)
exec > >(tee -a "$OUT/log.txt") 2>&1
say() { echo "[$(date +%H:%M:%S) +$(( $(date +%s) - T0 ))s] $*"; }

export CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
export PATH="$CUDA_HOME/bin:$PATH"
export MAX_JOBS=${MAX_JOBS:-16}
export TORCH_CUDA_ARCH_LIST=9.0a
PY=${PYTHON:-python3}

say "kit $KIT -> $WORK; output $OUT"
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv,noheader || true
nvcc --version | tail -n 2
"$PY" -c 'import torch, sys; print("python", sys.version.split()[0], "torch", torch.__version__, "cuda", torch.version.cuda, "gpu", torch.cuda.get_device_name(0) if torch.cuda.is_available() else None)'
command -v ninja >/dev/null || "$PY" -c 'import ninja' 2>/dev/null || { say "ninja not found (torch.utils.cpp_extension.load needs it)"; exit 1; }

# Phase 1: unpack (~2 s). The sources are laid anew each run; the build directory is kept.
rm -rf "$WORK/src"
mkdir -p "$WORK/src" "$WORK/build"
tar -xzf "$SRC_TAR" -C "$WORK/src"
cp -p "$KIT/dense_api.cpp" "$KIT/bench_flashmla.py" "$WORK/src/"
cat "$WORK/src/FlashMLA/COMMIT" "$WORK/src/cutlass/COMMIT"
say "unpacked"

# Phase 2: build (~1.5-2.5 min).
say "build: torch.utils.cpp_extension.load, sm_90a, MAX_JOBS=$MAX_JOBS (compiler output in $OUT/build.log)"
if ! timeout 480 "$PY" "$WORK/src/bench_flashmla.py" build --src "$WORK/src" --build "$WORK/build" >"$OUT/build.log" 2>&1; then
  say "BUILD FAILED; the end of build.log:"
  tail -n 60 "$OUT/build.log"
  exit 1
fi
grep -E "^ptxas info *: Used|spill stores" "$OUT/build.log" | sort | uniq -c | head -n 20 || true
tail -n 1 "$OUT/build.log"
say "built"

# Phase 3: check + bench (~1-2 min), cut at the budget.
LEFT=$(( BUDGET_S - ($(date +%s) - T0) ))
if (( LEFT < 60 )); then LEFT=60; fi
say "bench (deadline ${LEFT} s)"
rc=0
"$PY" "$WORK/src/bench_flashmla.py" bench --src "$WORK/src" --build "$WORK/build" --out "$OUT" --deadline-s "$LEFT" || rc=$?
say "done (bench exit $rc: 0 ok, 1 correctness check failed, 2 no usable GPU); rows: $OUT/flashmla_rows.csv"
exit $rc
