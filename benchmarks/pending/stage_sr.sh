#!/bin/bash
# Builds call SR's binaries here (no GPU needed: CUDA 13.0's nvcc, sm_90) so that call_sr.sh runs
# on the device without a build: branch smem-ring's tree (main with smem-ring.patch) in /tmp/srw,
# Release, the four targets, stripped into .gpu-host/sr in the build tree's layout, with Debian's
# libbenchmark (the device host has Ubuntu's). Needs the build packages of scripts/common.sh and
# ../shared/gpu-host/stage.sh done first (call_sr.sh sources .gpu-host/env.sh for abseil). About 3
# minutes on 2 cores.
# The device copies the tracked tree (58 MiB, of it benchmarks/runs 21 and models 25) with the carry
# under one 64 MiB limit, so the binaries travel as .gpu-host/sr.txz (about 10 MB; call_sr.sh
# unpacks it) and the call needs `bash benchmarks/pending/slim_index.sh on` first (and `off` after).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
root=$(pwd)
rm -rf /tmp/srw && mkdir -p /tmp/srw
git archive HEAD | tar xf - -C /tmp/srw
(cd /tmp/srw && patch -p1 -s < "$root/benchmarks/pending/smem-ring.patch" &&
 cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DEAGLE3_BUILD_EXAMPLES=OFF > /dev/null &&
 cmake --build build -j"$(nproc)" --target quant_moe_benchmark quant_gemv_benchmark quant_gemv_test \
   cuda_quantized_moe_test > /dev/null)
rm -rf .gpu-host/sr && mkdir -p .gpu-host/sr/benchmarks .gpu-host/sr/tests
for f in benchmarks/quant_moe_benchmark benchmarks/quant_gemv_benchmark tests/quant_gemv_test \
         tests/cuda_quantized_moe_test; do
  strip -o ".gpu-host/sr/$f" "/tmp/srw/build/$f"
done
cp -L /usr/lib/x86_64-linux-gnu/libbenchmark.so.1debian .gpu-host/sr/
tar cJf .gpu-host/sr.txz -C .gpu-host sr && rm -rf .gpu-host/sr
du -sh .gpu-host
