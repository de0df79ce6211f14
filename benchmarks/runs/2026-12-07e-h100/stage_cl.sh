#!/bin/bash
# Builds call CL's binaries here: HEAD's quant_moe_benchmark (the baseline), then HEAD with
# chain-cluster-x.patch (quant_moe_benchmark, quant_gemv_test, cuda_quantized_moe_test), then, in a
# second tree, HEAD with chain-cluster.patch (l1: quant_moe_benchmark) and with chain-fence.patch on
# top (fa: the three), stripped, with Debian's libbenchmark, packed as .gpu-host/cl.txz (~19 MB).
# About 7 minutes on 2 cores. The call needs `bash benchmarks/pending/slim_index.sh on` first (and
# `off` after).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
stage=/tmp/cl-stage w=/tmp/clw w2=/tmp/ccw2
rm -rf $stage $w $w2 && mkdir -p $stage/cl/main $stage/cl/cl $stage/cl/l1 $stage/cl/fa $stage/cl/lib $w $w2
# build TREE TARGET...: the targets in TREE's build folder (configured on first use).
build() {
  local tree=$1; shift
  [ -d $tree/build ] || cmake -S $tree -B $tree/build -G Ninja -DCMAKE_BUILD_TYPE=Release -DEAGLE3_BUILD_EXAMPLES=OFF > /dev/null
  cmake --build $tree/build -j"$(nproc)" --target "$@" > /dev/null
}
# take TREE DEST PATH...: stripped copies of the built PATHs (benchmarks/x, tests/y) into DEST.
take() {
  local tree=$1 dest=$2; shift 2
  for b in "$@"; do strip -o $stage/cl/$dest/$(basename $b) $tree/build/$b; done
}
three=(benchmarks/quant_moe_benchmark tests/quant_gemv_test tests/cuda_quantized_moe_test)
git archive HEAD | tar xf - -C $w
git archive HEAD | tar xf - -C $w2
build $w quant_moe_benchmark && take $w main benchmarks/quant_moe_benchmark
patch -d $w -p1 -s < benchmarks/pending/chain-cluster-x.patch
build $w quant_moe_benchmark quant_gemv_test cuda_quantized_moe_test && take $w cl "${three[@]}"
patch -d $w2 -p1 -s < benchmarks/pending/chain-cluster.patch
build $w2 quant_moe_benchmark && take $w2 l1 benchmarks/quant_moe_benchmark
patch -d $w2 -p1 -s < benchmarks/pending/chain-fence.patch
build $w2 quant_moe_benchmark quant_gemv_test cuda_quantized_moe_test && take $w2 fa "${three[@]}"
cp -L /usr/lib/x86_64-linux-gnu/libbenchmark.so.1debian $stage/cl/lib/
tar cJf .gpu-host/cl.txz -C $stage cl && ls -la .gpu-host/cl.txz
