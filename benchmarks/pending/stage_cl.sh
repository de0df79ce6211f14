#!/bin/bash
# Builds call CL's binaries here: HEAD's quant_moe_benchmark (the baseline), then HEAD with
# chain-cluster-x.patch (quant_moe_benchmark, quant_gemv_test, cuda_quantized_moe_test), then, in a
# second tree, HEAD with chain-cluster.patch (l1: quant_moe_benchmark) and with chain-fence.patch on
# top (fa: the three), stripped, with Debian's libbenchmark, packed as .gpu-host/cl.txz (~19 MB).
# About 15 minutes on 2 cores. The call needs `bash benchmarks/pending/slim_index.sh on` first (and
# `off` after).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
root=$(pwd)
stage=/tmp/cl-stage w=/tmp/clw w2=/tmp/ccw2
rm -rf $stage $w $w2 && mkdir -p $stage/cl/main $stage/cl/cl $stage/cl/l1 $stage/cl/fa $stage/cl/lib $w $w2
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
cd "$root" && git archive HEAD | tar xf - -C $w2 && cd $w2
patch -p1 -s < "$root/benchmarks/pending/chain-cluster.patch"
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DEAGLE3_BUILD_EXAMPLES=OFF > /dev/null
cmake --build build -j"$(nproc)" --target quant_moe_benchmark > /dev/null
strip -o $stage/cl/l1/quant_moe_benchmark build/benchmarks/quant_moe_benchmark
patch -p1 -s < "$root/benchmarks/pending/chain-fence.patch"
cmake --build build -j"$(nproc)" --target quant_moe_benchmark quant_gemv_test cuda_quantized_moe_test > /dev/null
strip -o $stage/cl/fa/quant_moe_benchmark build/benchmarks/quant_moe_benchmark
strip -o $stage/cl/fa/quant_gemv_test build/tests/quant_gemv_test
strip -o $stage/cl/fa/cuda_quantized_moe_test build/tests/cuda_quantized_moe_test
cp -L /usr/lib/x86_64-linux-gnu/libbenchmark.so.1debian $stage/cl/lib/
cd "$root" && tar cJf .gpu-host/cl.txz -C $stage cl && ls -la .gpu-host/cl.txz
