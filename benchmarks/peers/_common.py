"""Shared helpers of the PyTorch peers (imported, never run by run_all.sh: its name starts with '_').

Every peer times the same math as a C++ benchmark with PyTorch on the same GPU and prints one JSON
line per shape: {"benchmark": "BM_...", "params": {...the C++ ArgNames...}, "peer": "...", "us": median}
so make_results.py can join it to the C++ row with the same benchmark name and params.
"""
import json
import os
import sys

import torch

QUICK = os.environ.get("EAGLE3_BENCH_QUICK", "0") not in ("", "0")
REPS = 10 if QUICK else 30
WARMUP = 3


def require_gpu(script):
    if not torch.cuda.is_available():
        print(f"{script}: no CUDA device is present; nothing to measure", file=sys.stderr)
        sys.exit(2)


def copies_to_defeat_l2(nbytes, max_copies=64):
    """Input sets to rotate so that together they exceed twice the L2 (as bench_util.h does)."""
    l2 = getattr(torch.cuda.get_device_properties(0), "L2_cache_size", 50 << 20) or (50 << 20)
    if nbytes <= 0:
        return 1
    return max(1, min(max_copies, int(2 * l2 / nbytes) + 1))


def time_median_us(fn, reps=None):
    """Median of `reps` torch.cuda.Event timings of fn() after WARMUP untimed calls, in microseconds.
    fn(i) gets the repetition index (to rotate inputs)."""
    reps = reps or REPS
    for i in range(WARMUP):
        fn(i)
    torch.cuda.synchronize()
    times = []
    for i in range(reps):
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        start.record()
        fn(i)
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3)
    times.sort()
    n = len(times)
    return times[n // 2] if n % 2 else 0.5 * (times[n // 2 - 1] + times[n // 2])


def emit(benchmark, params, peer, us, **extra):
    row = {"benchmark": benchmark, "params": params, "peer": peer, "us": us}
    row.update(extra)
    print(json.dumps(row), flush=True)
