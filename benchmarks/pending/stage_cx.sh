#!/bin/bash
# Builds call CX's binaries here: HEAD with chain-prologue.patch (quant_moe_benchmark,
# quant_gemv_test) and HEAD's own quant_moe_benchmark (the baseline), stripped, with Debian's
# libbenchmark, packed as .gpu-host/cx.txz (~7 MB). About 6 minutes on 2 cores. The call needs
# `bash benchmarks/pending/slim_index.sh on` first (and `off` after).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
root=$(pwd)
stage=/tmp/cx-stage w=/tmp/cxw
rm -rf $stage $w && mkdir -p $stage/cx/cp $stage/cx/main $stage/cx/lib $w
git archive HEAD | tar xf - -C $w
cd $w
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DEAGLE3_BUILD_EXAMPLES=OFF > /dev/null
cmake --build build -j"$(nproc)" --target quant_moe_benchmark > /dev/null
strip -o $stage/cx/main/quant_moe_benchmark build/benchmarks/quant_moe_benchmark
patch -p1 -s < "$root/benchmarks/pending/chain-prologue.patch"
cmake --build build -j"$(nproc)" --target quant_moe_benchmark quant_gemv_test > /dev/null
strip -o $stage/cx/cp/quant_moe_benchmark build/benchmarks/quant_moe_benchmark
strip -o $stage/cx/cp/quant_gemv_test build/tests/quant_gemv_test
cp -L /usr/lib/x86_64-linux-gnu/libbenchmark.so.1debian $stage/cx/lib/
cd "$root" && tar cJf .gpu-host/cx.txz -C $stage cx && ls -la .gpu-host/cx.txz
