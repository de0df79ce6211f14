#!/bin/bash
# Builds call_slim.sh's two variants here (as stage_sr.sh does for call SR), so that the call runs
# without a build: the chain's trace (chain-trace.patch: quant_moe_benchmark, trace.py, fine.py)
# and main with down-cache.patch and warp-staging.patch (quant_moe_benchmark, quant_gemv_test,
# cuda_quantized_moe_test), stripped, with Debian's libbenchmark, packed as .gpu-host/slim.txz in
# the layout call_slim.sh builds in /tmp (it unpacks it there). About 6 minutes on 2 cores; the
# call needs `bash benchmarks/pending/slim_index.sh on` first (and `off` after).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
root=$(pwd)
stage=/tmp/slim-stage
rm -rf $stage && mkdir -p $stage/lib
build() {  # variant "patches" targets...
  local v=$1 patches=$2; shift 2
  rm -rf /tmp/slimw-$v && mkdir -p /tmp/slimw-$v
  git archive HEAD | tar xf - -C /tmp/slimw-$v
  (cd /tmp/slimw-$v && for q in $patches; do patch -p1 -s < "$root/benchmarks/pending/$q"; done &&
   cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DEAGLE3_BUILD_EXAMPLES=OFF > /dev/null &&
   cmake --build build -j"$(nproc)" --target "$@" > /dev/null)
  for t in "$@"; do
    local f; f=$(cd /tmp/slimw-$v/build && find benchmarks tests -maxdepth 1 -name "$t" -type f)
    mkdir -p "$stage/$v/build/$(dirname "$f")"
    strip -o "$stage/$v/build/$f" "/tmp/slimw-$v/build/$f"
  done
}
build trace chain-trace.patch quant_moe_benchmark
mkdir -p $stage/trace/benchmarks/pending
cp /tmp/slimw-trace/benchmarks/pending/{trace,fine}.py $stage/trace/benchmarks/pending/
build dcws "down-cache.patch warp-staging.patch" quant_moe_benchmark quant_gemv_test cuda_quantized_moe_test
cp -L /usr/lib/x86_64-linux-gnu/libbenchmark.so.1debian $stage/lib/
tar cJf .gpu-host/slim.txz -C $stage .
du -sh .gpu-host .gpu-host/slim.txz
