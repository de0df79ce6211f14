#!/bin/bash
# Builds the chain's trace (chain-trace.patch on HEAD: quant_moe_benchmark with the trace's stores,
# trace.py, fine.py) here, so that call_trace.sh runs it without a build: stripped, with Debian's
# libbenchmark, packed as .gpu-host/trace.txz (~3 MB). About 3 minutes on 2 cores. The call needs
# `bash benchmarks/pending/slim_index.sh on` first (and `off` after): the device copies the tracked
# tree and the carry under one 64 MiB limit. EXTRA_PATCHES (names in benchmarks/pending, applied
# after the trace's) traces a change instead of HEAD.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
root=$(pwd)
stage=/tmp/trace-stage w=/tmp/tracew
rm -rf $stage $w && mkdir -p $stage/trace/build/benchmarks $stage/trace/benchmarks/pending $stage/lib $w
git archive HEAD | tar xf - -C $w
(cd $w && for q in chain-trace.patch ${EXTRA_PATCHES:-}; do patch -p1 -s < "$root/benchmarks/pending/$q"; done &&
 cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DEAGLE3_BUILD_EXAMPLES=OFF > /dev/null &&
 cmake --build build -j"$(nproc)" --target quant_moe_benchmark > /dev/null)
strip -o $stage/trace/build/benchmarks/quant_moe_benchmark $w/build/benchmarks/quant_moe_benchmark
cp $w/benchmarks/pending/{trace,fine}.py $stage/trace/benchmarks/pending/
cp -L /usr/lib/x86_64-linux-gnu/libbenchmark.so.1debian $stage/lib/
tar cJf .gpu-host/trace.txz -C $stage .
ls -la .gpu-host/trace.txz
