#!/bin/bash
# Builds call CL's binaries here: HEAD's quant_moe_benchmark (the baseline), then HEAD with
# chain-cluster-x.patch (quant_moe_benchmark, quant_gemv_test, cuda_quantized_moe_test), stripped,
# with Debian's libbenchmark, packed as .gpu-host/cl.txz (~10 MB). About 7 minutes on 2 cores. The
# call needs `bash benchmarks/pending/slim_index.sh on` first (and `off` after).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
root=$(pwd)
stage=/tmp/cl-stage w=/tmp/clw
rm -rf $stage $w && mkdir -p $stage/cl/main $stage/cl/cl $stage/cl/lib $w
git archive HEAD | tar xf - -C $w
cd $w
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DEAGLE3_BUILD_EXAMPLES=OFF > /dev/null
cmake --build build -j"$(nproc)" --target quant_moe_benchmark > /dev/null
strip -o $stage/cl/main/quant_moe_benchmark build/benchmarks/quant_moe_benchmark
patch -p1 -s < "$root/benchmarks/pending/chain-cluster-x.patch"
cmake --build build -j"$(nproc)" --target quant_moe_benchmark quant_gemv_test cuda_quantized_moe_test > /dev/null
strip -o $stage/cl/cl/quant_moe_benchmark build/benchmarks/quant_moe_benchmark
strip -o $stage/cl/cl/quant_gemv_test build/tests/quant_gemv_test
strip -o $stage/cl/cl/cuda_quantized_moe_test build/tests/cuda_quantized_moe_test
cp -L /usr/lib/x86_64-linux-gnu/libbenchmark.so.1debian $stage/cl/lib/
cd "$root" && tar cJf .gpu-host/cl.txz -C $stage cl && ls -la .gpu-host/cl.txz
