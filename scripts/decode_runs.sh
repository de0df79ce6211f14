#!/usr/bin/env bash
# End-to-end decode timings with eagle3-decode, warm-up excluded twice over: each eagle3-decode run
# times a second Generate after an untimed first one, and the per-token cost is taken from the
# difference between a short and a long run (prefill and other fixed costs cancel).
#
#   scripts/decode_runs.sh DECODE_BIN OUT_DIR [--reps R] [--short N] [--long N] [--loops "device host"]
#                          [-- extra eagle3-decode args]
#
# For each loop (device: SpeculativeStep; host: the reference loop), length and repetition it runs
#   DECODE_BIN --loop LOOP --max-new-tokens LEN --json OUT_DIR/LOOP-LEN-REP.json EXTRA...
# and writes OUT_DIR/summary.txt: per loop, the median over repetitions of the plain and the
# speculative cost per token (us), their ratio (the speedup), the mean accepted length, that
# ratio over the accepted length, host syncs and bytes to the host per step (device loop).
set -euo pipefail
[ $# -ge 2 ] || { sed -n '2,14p' "$0"; exit 2; }
BIN=$1
OUT=$2
shift 2
REPS=3
SHORT=64
LONG=320
LOOPS="device host"
while [ $# -gt 0 ]; do
  case "$1" in
    --reps) REPS=$2; shift 2 ;;
    --short) SHORT=$2; shift 2 ;;
    --long) LONG=$2; shift 2 ;;
    --loops) LOOPS=$2; shift 2 ;;
    --) shift; break ;;
    *) echo "unknown argument: $1" >&2; exit 2 ;;
  esac
done
mkdir -p "$OUT"
for loop in $LOOPS; do
  for len in "$SHORT" "$LONG"; do
    for rep in $(seq 1 "$REPS"); do
      "$BIN" --loop "$loop" --max-new-tokens "$len" --json "$OUT/$loop-$len-$rep.json" "$@" \
        > "$OUT/$loop-$len-$rep.log" 2>&1 || { echo "FAILED: $loop $len $rep (see $OUT/$loop-$len-$rep.log)"; exit 1; }
    done
  done
done
python3 - "$OUT" "$SHORT" "$LONG" "$REPS" "$LOOPS" <<'EOF' | tee "$OUT/summary.txt"
import json, statistics, sys
out, short, long_, reps, loops = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), sys.argv[5].split()

def seconds(doc, key):
    # Generated tokens over tokens/s: the timed Generate's wall time (prefill included), and the
    # tokens of one sequence (of prompt 0, or the mean over a batch's prompts).
    run = doc[key]
    if "prompts" in doc:
        counts = [len(p[key]) for p in doc["prompts"]]
        return sum(counts) / run["tokens_per_s"], sum(counts) / len(counts)
    return len(run["tokens"]) / run["tokens_per_s"], len(run["tokens"])

print(f"per-token cost = (t({long_}) - t({short})) / ({long_} - {short}) tokens of a sequence (a batch's step), median of {reps} repetitions")
print(f"{'loop':8} {'plain us/tok':>13} {'spec us/tok':>12} {'speedup':>8} {'accept len':>11} {'speedup/len':>12} {'syncs/step':>11} {'D2H B/step':>11}")
for loop in loops:
    plain, spec, accept, syncs, bytes_ = [], [], [], [], []
    for rep in range(1, reps + 1):
        a = json.load(open(f"{out}/{loop}-{short}-{rep}.json"))
        b = json.load(open(f"{out}/{loop}-{long_}-{rep}.json"))
        for key, into in (("plain", plain), ("speculative", spec)):
            (ta, na), (tb, nb) = seconds(a, key), seconds(b, key)
            into.append((tb - ta) / (nb - na) * 1e6)
        accept.append(b["speculative"]["mean_accepted_length"])
        syncs.append(b["speculative"].get("host_syncs_per_step", 0))
        bytes_.append(b["speculative"].get("device_to_host_bytes_per_step", 0))
    p, s, m = statistics.median(plain), statistics.median(spec), statistics.median(accept)
    # A run that drafted nothing (--speculate-up-to 0) has no accepted length.
    per_len = f"{p / s / m:12.2f}" if m > 0 else f"{'-':>12}"
    print(f"{loop:8} {p:13.1f} {s:12.1f} {p / s:8.2f} {m:11.2f} {per_len} {statistics.median(syncs):11.1f} {statistics.median(bytes_):11.1f}")
EOF
