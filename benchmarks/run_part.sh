#!/usr/bin/env bash
# One part of a complete (not quick) benchmark run, sized for a device call of at most 10 minutes:
# the full shape lists of every binary split into five parts, each under ~9.5 minutes by the costs
# measured on one H200 on 2026-12-01 (benchmarks/NOTES.md, fourth session), and a sixth with the V2
# rank's steps on a bf16 latent cache. From the repository
# root of the GPU host, with carried binaries (scripts/pack_gpu_binaries.sh):
#
#   benchmarks/run_part.sh PART BIN_DIR OUT_DIR
#
#   PART 1  verify, mla_decode, tree_build, gemm, draft_step (every row)                 ~8 min
#   PART 2  decode_ops (every row) and the PyTorch peers                                 ~4 min
#   PART 3  decode_step, DeepSeek-V2 TP8 rank: decode rows (eager and graph), verify at
#           batch 1 and 8                                                                ~3 min
#   PART 4  decode_step, DeepSeek-V2 TP8 rank: verify at batch 32                        ~5 min
#   PART 5  decode_step, DeepSeek-V2-Lite TP1: every row                                 ~4 min
#   (2026-12-01g on one H200: 487 s with a 150 s draft_step limit, 223, 165, 275, 218 s)
#   PART 6  decode_step, DeepSeek-V2 TP8 rank with a bf16 latent cache (what an engine runs): graph
#           decode rows and every verify row (make_results.py's end-to-end model then uses these)
#                                                                                        ~6 min
#
# Every part writes into OUT_DIR (run_all.sh --out, with a tag per decode_step part); copy the parts'
# OUT_DIRs into one benchmarks/runs/<date>-h200/ and regenerate RESULTS.md with make_results.py.
# Collectives need two GPUs: `benchmarks/run_all.sh --bin BIN_DIR --only collectives --no-peers
# --no-report` on an nvidia-h200-x2 machine. A binary stopped at its limit keeps its finished rows
# (run_all.sh recovers them) and says so in OUT_DIR/status.txt.
set -u
[ $# -eq 3 ] || { awk 'NR > 1 && /^set -u/ { exit } NR > 1' "$0"; exit 2; }
PART=$1
BIN=$2
OUT_DIR=$3
ROOT=$(cd "$(dirname "$0")/.." && pwd)
mkdir -p "$OUT_DIR"
export EAGLE3_BENCH_CKPT_DIR=${EAGLE3_BENCH_CKPT_DIR:-/tmp/eagle3-bench-ckpt}
run() { "$ROOT/benchmarks/run_all.sh" --bin "$BIN" --out "$OUT_DIR" --no-report "$@"; }
case "$PART" in
  1)
    run --no-peers --only verify --timeout 100
    run --no-peers --only mla_decode --timeout 100
    run --no-peers --only tree_build --timeout 90
    run --no-peers --only gemm --timeout 80
    run --no-peers --only draft_step --timeout 210  # 150 s cut its last 9 rows on 2026-12-01g
    ;;
  2)
    run --no-peers --only decode_ops --timeout 300
    run --only none --timeout 50  # the peers alone (no binary is called "none")
    ;;
  3)
    EAGLE3_BENCH_MODELS=1 run --no-peers --only decode_step --tag m1a \
      --filter 'BM_DecodeStep/model:1/|BM_VerifyStep/model:1/batch:(1|8)/' --timeout 540
    ;;
  4)
    EAGLE3_BENCH_MODELS=1 run --no-peers --only decode_step --tag m1b \
      --filter 'BM_VerifyStep/model:1/batch:32/' --timeout 540
    ;;
  5)
    EAGLE3_BENCH_MODELS=0 run --no-peers --only decode_step --tag m0 --timeout 540
    ;;
  6)
    EAGLE3_BENCH_MODELS=1 EAGLE3_BENCH_KV_CACHE=bf16 run --no-peers --only decode_step --tag m1bf16 \
      --filter 'BM_DecodeStep/model:1/.*/graph:1/|BM_VerifyStep/model:1/' --timeout 540
    ;;
  *)
    echo "run_part.sh: PART must be 1..6, got '$PART'" >&2
    exit 2
    ;;
esac
