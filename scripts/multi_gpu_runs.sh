#!/usr/bin/env bash
# The runs that need several GPUs of one host (tensor parallelism over NCCL), in one go, from the
# repository root of a build on that host:
#
#   scripts/multi_gpu_runs.sh BUILD_DIR OUT_DIR [--parts tests,decode,collectives,steps,e2e] [--seconds S]
#
# TP = 8 with 8+ visible GPUs, else 4, else 2 (fewer: exits 2). The parts asked for (default all;
# steps alone takes minutes: whole models load on every GPU), in order, each under a time limit
# (--seconds for each benchmark, default 240), its log in OUT_DIR, a summary line each in
# OUT_DIR/summary.txt:
#  1. the NCCL tests: nccl_communicator_test (NcclMultiGpuTest on every visible GPU) and
#     model_nccl_test (the target at TP 2 / 4 / 8 over NCCL against TP 1, ranks bitwise equal, graph
#     replays against eager);
#  2. eagle3-decode at TP 1 and at TP N (--comm nccl), with the shipped pair and with the built-in
#     random pair, batch 1 and 8, greedy: each run's --json report, and whether TP N's plain and
#     speculative tokens equal TP 1's (decode_tp_agree.txt);
#  3. collectives_benchmark (all-reduce / all-gather at a step's message sizes, every GPU);
#  4. tp_step_benchmark (decode and verify steps of whole models at TP N, collectives in the graphs);
#  5. tp_e2e_benchmark (speculative against plain decoding through SpeculativeStep at TP N, the
#     V2-Lite-shaped pair with synthetic acceptance, batch 1 and 8).
# Leaves NVLink multicast (NCCL_NVLS_ENABLE) and every other NCCL setting as the host has them.
set -u
[ $# -ge 2 ] || { sed -n '2,21p' "$0"; exit 2; }
BUILD=$1
OUT=$2
shift 2
SECONDS_EACH=240
PARTS=tests,decode,collectives,steps,e2e
while [ $# -gt 0 ]; do
  case "$1" in
    --seconds) SECONDS_EACH=$2; shift ;;
    --parts) PARTS=$2; shift ;;
    *) echo "multi_gpu_runs.sh: unknown argument '$1'" >&2; exit 2 ;;
  esac
  shift
done
mkdir -p "$OUT"
: > "$OUT/summary.txt"
gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')
if [ "$gpus" -ge 8 ]; then TP=8; elif [ "$gpus" -ge 4 ]; then TP=4; elif [ "$gpus" -ge 2 ]; then TP=2; else
  echo "multi_gpu_runs.sh: $gpus GPU(s) visible; these runs need 2 or more" | tee -a "$OUT/summary.txt"
  exit 2
fi
{ nvidia-smi -L; nvidia-smi topo -m; } > "$OUT/gpus.txt" 2>&1
echo "gpus=$gpus tp=$TP" >> "$OUT/summary.txt"
start=$(date +%s)
say() { echo "$* ($(( $(date +%s) - start )) s)" | tee -a "$OUT/summary.txt"; }
wanted() { case ",$PARTS," in *",$1,"*) return 0 ;; *) return 1 ;; esac; }

# 1. The NCCL tests.
wanted tests && for t in nccl_communicator_test model_nccl_test; do
  timeout 300 "$BUILD/tests/$t" > "$OUT/$t.txt" 2>&1
  say "$t rc=$? $(grep -E '^\[  (PASSED|FAILED|SKIPPED) \] [0-9]' "$OUT/$t.txt" | tr '\n' ' ')"
done

# 2. eagle3-decode, TP 1 against TP N.
decode=$BUILD/examples/eagle3-decode
wanted decode && for pair in shipped random; do
  pair_flags=()
  [ $pair = random ] && pair_flags=(--random-pair)
  for batch in 1 8; do
    for tp in 1 $TP; do
      name=decode_${pair}_b${batch}_tp${tp}
      comm=()
      [ $tp -gt 1 ] && comm=(--comm nccl)
      timeout 300 "$decode" "${pair_flags[@]}" --device cuda --tp $tp "${comm[@]}" --batch $batch \
        --max-new-tokens 64 --temperature 0 --json "$OUT/$name.json" > "$OUT/$name.txt" 2>&1
      say "$name rc=$? $(grep -E '^speedup' "$OUT/$name.txt")"
    done
  done
done
wanted decode && python3 - "$OUT" "$TP" > "$OUT/decode_tp_agree.txt" 2>&1 <<'EOF'
import json, sys
out, tp = sys.argv[1], sys.argv[2]
def tokens(report):
    if "prompts" in report:
        return [(p["plain"], p["speculative"]) for p in report["prompts"]]
    return [(report["plain"]["tokens"], report["speculative"]["tokens"])]
for pair in ("shipped", "random"):
    for batch in (1, 8):
        try:
            one = json.load(open(f"{out}/decode_{pair}_b{batch}_tp1.json"))
            many = json.load(open(f"{out}/decode_{pair}_b{batch}_tp{tp}.json"))
        except (OSError, ValueError) as e:
            print(f"{pair} batch {batch}: no report ({e})")
            continue
        same = tokens(one) == tokens(many)
        print(f"{pair} batch {batch}: TP {tp} tokens {'equal' if same else 'DIFFER from'} TP 1's; "
              f"speedup TP 1 {one.get('speedup', 0):.2f}x, TP {tp} {many.get('speedup', 0):.2f}x; "
              f"speculative tokens/s TP 1 {one['speculative']['tokens_per_s']:.1f}, "
              f"TP {tp} {many['speculative']['tokens_per_s']:.1f}")
EOF
wanted decode && say "decode agreement: $(tr '\n' ';' < "$OUT/decode_tp_agree.txt")"

# 3-5. The benchmarks (Google Benchmark JSON beside each log, for make_results.py).
for part in collectives steps e2e; do
  wanted $part || continue
  case $part in
    collectives) b=collectives_benchmark ;;
    steps) b=tp_step_benchmark ;;
    e2e) b=tp_e2e_benchmark ;;
  esac
  EAGLE3_BENCH_TP=$TP timeout --kill-after=10 "$SECONDS_EACH" "$BUILD/benchmarks/$b" \
    --benchmark_out="$OUT/$b.json" --benchmark_out_format=json > "$OUT/$b.txt" 2>&1
  say "$b rc=$?"
done
say "done"
