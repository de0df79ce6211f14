#!/usr/bin/env bash
# Packs what the GPU host runs, built here (CUDA ON, sm_90), into one tarball to carry: every gpu
# test binary, eagle3-decode / eagle3-inspect and the GPU benchmarks, stripped, with Debian's
# libbenchmark (the host's Google Benchmark has another soname) and an env.sh that points the loader
# at it and at the host's cuBLAS / cudart. A device call then spends no time building.
#
#   scripts/pack_gpu_binaries.sh BUILD_DIR OUT.tar.xz
#   (on the host, from the repository root, with the .gpu-host kit carried:)
#   source .gpu-host/env.sh && mkdir -p /tmp/bin && tar xJf OUT.tar.xz -C /tmp/bin && source /tmp/bin/env.sh
#   scripts/gpu_suite.sh /tmp/bin $OUT/suite
set -eu
[ $# = 2 ] || { sed -n '2,11p' "$0"; exit 2; }
build=$(cd "$1" && pwd)
out=$2
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
mkdir -p "$stage/lib"
n=0
for src in "$root"/tests/gpu/*_test.cc; do
  name=$(basename "$src" .cc)
  [ -x "$build/tests/$name" ] || { echo "pack: $name not built in $build" >&2; exit 1; }
  strip -o "$stage/$name" "$build/tests/$name"
  n=$((n + 1))
done
for bin in "$build"/examples/eagle3-decode "$build"/examples/eagle3-inspect "$build"/benchmarks/*_benchmark; do
  [ -x "$bin" ] || continue
  case "$(basename "$bin")" in cpu_*) continue ;; esac
  strip -o "$stage/$(basename "$bin")" "$bin"
  n=$((n + 1))
done
lib=$(ldd "$build"/benchmarks/*_benchmark 2>/dev/null | awk '/libbenchmark\.so/ {print $3; exit}')
[ -n "$lib" ] && cp -L "$lib" "$stage/lib/"
cat > "$stage/env.sh" <<'EOF'
# source this: the carried libraries, then the host's cuBLAS / cudart (found once, wherever installed)
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
cublas=$(dirname "$(find / -name 'libcublasLt.so.13*' -not -path '/proc/*' 2>/dev/null | head -1)")
cudart=$(dirname "$(find / -name 'libcudart.so.13*' -not -path '/proc/*' 2>/dev/null | head -1)")
export LD_LIBRARY_PATH=$here/lib:$cublas:$cudart${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
EOF
tar cJf "$out" -C "$stage" .
echo "pack: $n binaries, $(du -h "$out" | cut -f1) in $out"
