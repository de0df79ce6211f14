#!/usr/bin/env python3
"""PyTorch peer of benchmarks/cuda/verify_benchmark.cc: the verify math an engine developer would
write with torch ops on the same GPU, timed with torch.cuda.Event medians.

  verify_greedy_<dtype>:           chain verify: argmax over [B, N, V] + compare with the drafted
                                   tokens + cumprod for the accepted prefix + gather of the bonus
  verify_stochastic_<dtype>:       softmax (temperature 1) + accept test u < p(x) for the drafted
                                   tokens + torch.multinomial for the correction / bonus row
  verify_stochastic_top_p_<dtype>: the same after top-p 0.9 (sort + cumsum + mask)

Prints one JSON line per case with the C++ benchmark's name and parameters:
  {"name": "verify_greedy_bf16", "batch": 1, "tokens": 8, "vocab": 102400, "dtype": "bf16",
   "median_us": ...}
Usage: python3 benchmarks/peers/verify_peer.py [--reps 50]
"""
import argparse
import json

import torch


def time_median_us(fn, reps):
    fn()  # warm-up (allocator, kernels)
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        start = torch.cuda.Event(enable_timing=True)
        stop = torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        stop.record()
        stop.synchronize()
        times.append(start.elapsed_time(stop) * 1e3)
    times.sort()
    return times[len(times) // 2]


def greedy(logits, draft):
    # logits [B, N, V]; draft [B, N - 1]: node i + 1 continues a chain from node i.
    target = logits.argmax(dim=-1)                               # [B, N]
    match = (target[:, :-1] == draft).int()                      # [B, N - 1]
    accepted = match.cumprod(dim=-1).sum(dim=-1)                 # [B]
    bonus = target.gather(1, accepted.unsqueeze(1)).squeeze(1)   # [B]
    return accepted, bonus


def stochastic(logits, draft, top_p):
    b, n, v = logits.shape
    probs = torch.softmax(logits.float(), dim=-1)                # temperature 1
    if top_p < 1.0:
        sorted_p, order = probs.sort(dim=-1, descending=True)
        cut = sorted_p.cumsum(dim=-1) - sorted_p >= top_p
        sorted_p = sorted_p.masked_fill(cut, 0.0)
        probs = torch.zeros_like(probs).scatter(-1, order, sorted_p)
        probs = probs / probs.sum(dim=-1, keepdim=True)
    p_draft = probs[:, :-1].gather(-1, draft.unsqueeze(-1)).squeeze(-1)   # [B, N - 1]
    coins = torch.rand_like(p_draft)
    accepted = (coins < p_draft).int().cumprod(dim=-1).sum(dim=-1)       # [B]
    row = probs[torch.arange(b, device=logits.device), accepted]         # [B, V]
    final = torch.multinomial(row, 1).squeeze(1)
    return accepted, final


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--reps", type=int, default=50)
    args = parser.parse_args()
    dev = torch.device("cuda")
    gen = torch.Generator(device=dev).manual_seed(1)
    cases = []
    for dtype in ("bf16", "f32"):
        for mode in ("greedy", "stochastic"):
            for batch in (1, 8, 32):
                for tokens in (8, 32, 64):
                    for vocab in (102400, 129280, 163840):
                        cases.append((mode, dtype, batch, tokens, vocab))
        cases.append(("stochastic_top_p", dtype, 32, 64, 163840))
    for mode, dtype, batch, tokens, vocab in cases:
        torch_dtype = torch.bfloat16 if dtype == "bf16" else torch.float32
        bytes_one = batch * tokens * vocab * (2 if dtype == "bf16" else 4)
        # Rotate buffers (>= 256 MiB in all) so that L2 does not flatter the small cases.
        slots = max(2, -(-(256 << 20) // bytes_one))
        pool = [torch.randn(batch, tokens, vocab, device=dev, dtype=torch_dtype, generator=gen) * 2
                for _ in range(slots)]
        draft = torch.randint(0, vocab, (batch, tokens - 1), device=dev, generator=gen)
        state = {"i": 0}

        def step():
            logits = pool[state["i"] % slots]
            state["i"] += 1
            if mode == "greedy":
                greedy(logits, draft)
            else:
                stochastic(logits, draft, 0.9 if mode == "stochastic_top_p" else 1.0)

        median = time_median_us(step, args.reps)
        print(json.dumps({"name": f"verify_{mode}_{dtype}", "batch": batch, "tokens": tokens,
                          "vocab": vocab, "dtype": dtype, "median_us": round(median, 2)}), flush=True)
        del pool
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
