#!/usr/bin/env bash
# Builds eagle3 and runs the demo program. Usage: scripts/demo.sh [eagle3-decode flags]
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
eagle3_install_packages "${EAGLE3_BUILD_PACKAGES[@]}"

build="$EAGLE3_ROOT/build"
cmake -S "$EAGLE3_ROOT" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DEAGLE3_BUILD_TESTS=OFF \
  -DEAGLE3_BUILD_BENCHMARKS=OFF >/dev/null
cmake --build "$build" -j "$EAGLE3_JOBS" --target eagle3-decode
"$build/examples/eagle3-decode" "$@"
