#!/usr/bin/env bash
# Stages the FlashMLA peer's sources into .gpu-host/flashmla/flashmla-src.tar.gz (git-ignored; carry
# .gpu-host to the GPU host, then run build_and_bench.sh there): FlashMLA's sm90 dense decode, its
# scheduling-metadata and combine sources and the headers they include, and the include/ tree (cutlass
# + cute) of the CUTLASS commit FlashMLA pins as its csrc/cutlass submodule. Never committed: the
# repository holds only our binding (dense_api.cpp), the benchmark and these scripts.
#
#   benchmarks/peers/flashmla/stage.sh FLASHMLA_GIT_DIR CUTLASS_GIT_DIR [FLASHMLA_COMMIT]
#
# The git directories are clones (or the bare mirrors the workplace's fetch tool brings) of
# github.com/deepseek-ai/FlashMLA and github.com/NVIDIA/cutlass; the default commit is the one the
# recorded runs used.
set -euo pipefail
FM_GIT=${1:?usage: stage.sh FLASHMLA_GIT_DIR CUTLASS_GIT_DIR [FLASHMLA_COMMIT]}
CUTLASS_GIT=${2:?usage: stage.sh FLASHMLA_GIT_DIR CUTLASS_GIT_DIR [FLASHMLA_COMMIT]}
FM_COMMIT=${3:-9241ae3ef9bac614dd25e45e507e089f888280e0}
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../../.." && pwd)
OUT_DIR=$ROOT/.gpu-host/flashmla
fm() { git --git-dir="$FM_GIT" "$@"; }
CUTLASS_COMMIT=$(fm ls-tree "$FM_COMMIT" csrc/cutlass | awk '{print $3}')
[ -n "$CUTLASS_COMMIT" ] || { echo "FlashMLA $FM_COMMIT pins no csrc/cutlass submodule" >&2; exit 1; }
git --git-dir="$CUTLASS_GIT" cat-file -e "$CUTLASS_COMMIT^{commit}" ||
  { echo "CUTLASS commit $CUTLASS_COMMIT (pinned by FlashMLA) is not in $CUTLASS_GIT" >&2; exit 1; }

TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
# The files the dense decode's three translation units and our binding include (FlashMLA's README,
# LICENSE, setup.py, Python interface and dense test ride along for reference).
fm archive --prefix=FlashMLA/ "$FM_COMMIT" README.md LICENSE setup.py flash_mla/flash_mla_interface.py \
  tests/test_flash_mla_dense_decoding.py csrc/defines.h csrc/params.h csrc/utils.h csrc/api/dense_decode.h \
  csrc/api/common.h csrc/sm90/decode/dense csrc/kerutils/include csrc/smxx/decode/get_decoding_sched_meta \
  csrc/smxx/decode/combine | tar -x -C "$TMP"
echo "$FM_COMMIT" > "$TMP/FlashMLA/COMMIT"
git --git-dir="$CUTLASS_GIT" archive --prefix=cutlass/ "$CUTLASS_COMMIT" include/cutlass include/cute LICENSE.txt |
  tar -x -C "$TMP"
echo "$CUTLASS_COMMIT" > "$TMP/cutlass/COMMIT"
mkdir -p "$OUT_DIR"
tar -czf "$OUT_DIR/flashmla-src.tar.gz" -C "$TMP" FlashMLA cutlass
echo "staged FlashMLA $FM_COMMIT + CUTLASS $CUTLASS_COMMIT in $OUT_DIR/flashmla-src.tar.gz ($(du -h "$OUT_DIR/flashmla-src.tar.gz" | cut -f1))"
