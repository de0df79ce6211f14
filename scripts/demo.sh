#!/usr/bin/env bash
# Builds eagle3-decode (with CUDA only when nvidia-smi -L sees a GPU; --help answers without
# building) and runs the decode demo: plain vs speculative (EAGLE-3) decoding of the committed
# trained pair (models/tiny-v2-code + models/tiny-v2-code-eagle3) on a default Python prompt, on the
# GPU when one is visible and the build has CUDA (with CUDA graphs), else on the CPU reference
# backend; prints both continuations, the mean accepted length, the acceptance per depth, tokens/s
# of both runs and the speculative speedup. (Measured: ~1.8-2.3x on an H200; on a small CPU this
# 9M-parameter model is compute-bound, so a verify pass of several tokens costs more than the
# accepted tokens save and speculation is slower — models/README.md has both tables.)
# Usage: scripts/demo.sh [eagle3-decode flags, e.g. --prompt 'def f(' or --device cuda]
# EAGLE3_BUILD_DIR overrides the build directory (default: build/ in the repository).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"

# --help / -h answers at once, without installing or building anything.
for arg in "$@"; do
  if [[ "$arg" == "--help" || "$arg" == "-h" ]]; then
    sed -n '2,/^# EAGLE3_BUILD_DIR/s/^# \{0,1\}//p' "${BASH_SOURCE[0]}"
    decode="${EAGLE3_BUILD_DIR:-$here/../build}/examples/eagle3-decode"
    if [[ -x "$decode" ]]; then
      echo
      "$decode" --help
    else
      echo "(eagle3-decode is not built yet; its flags are listed by eagle3-decode --help once built)"
    fi
    exit 0
  fi
done

source "$here/common.sh"
eagle3_install_packages "${EAGLE3_BUILD_PACKAGES[@]}"

# CUDA only when a GPU is visible; only the demo's program is built.
gpu=0
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then gpu=1; fi
cuda=OFF
if ((gpu)); then cuda=ON; fi
build="${EAGLE3_BUILD_DIR:-$EAGLE3_ROOT/build}"
cmake -S "$EAGLE3_ROOT" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DEAGLE3_BUILD_TESTS=OFF \
  -DEAGLE3_BUILD_BENCHMARKS=OFF -DEAGLE3_ENABLE_CUDA="$cuda" >/dev/null
cmake --build "$build" -j "$EAGLE3_JOBS" --target eagle3-decode
device=()
if [[ " $* " != *" --device "* ]] && ((gpu)) && compgen -G "$build/libeagle3_cuda.*" >/dev/null; then
  device=(--device cuda)
fi
"$build/examples/eagle3-decode" "${device[@]}" "$@"
