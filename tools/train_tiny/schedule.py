"""A training loop bounded by wall-clock time: warmup + cosine LR over a step count fixed after timing a
few real steps, so the schedule completes inside the budget."""

import math
import time

import torch

from progress import log


def cosine_lr(step, warmup, total, peak, floor_ratio=0.1):
    if step < warmup:
        return peak * (step + 1) / warmup
    progress = min(1.0, (step - warmup) / max(1, total - warmup))
    return peak * (floor_ratio + (1 - floor_ratio) * 0.5 * (1 + math.cos(math.pi * progress)))


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize()


def run_budgeted(name, step_fn, device, budget_s, warmup, tokens_per_step, variants=(("default", None),),
                 max_steps=None):
    """step_fn(step, total) runs one optimizer step with lr cosine_lr(step, warmup, total, ...) and returns
    the loss (a tensor). `variants` are (label, apply) pairs of interchangeable implementations: each
    runs one warm step and three timed ones (real steps, inside the warmup, whose length does not
    depend on total); a variant that raises RuntimeError/NotImplementedError is skipped; the fastest is
    applied for the rest. Returns (stats, losses sampled every 10 steps)."""
    start = time.monotonic()
    provisional_total = max(warmup * 10, 1000)
    timings, losses, step = {}, [], 0
    for label, apply in variants:
        if apply is not None:
            apply()
        try:
            step_fn(step, provisional_total)
            step += 1
            sync(device)
            t = time.monotonic()
            for _ in range(3):
                losses.append(step_fn(step, provisional_total).item())
                step += 1
            sync(device)
            timings[label] = (time.monotonic() - t) / 3
        except (RuntimeError, NotImplementedError) as e:  # an implementation this host cannot run
            log(f"{name}: {label} failed here ({type(e).__name__}: {str(e)[:300]})")
    if not timings:
        raise SystemExit(f"{name}: no implementation could run a training step")
    best = min(timings, key=timings.get)
    for label, apply in variants:
        if label == best and apply is not None:
            apply()
    remaining = budget_s - (time.monotonic() - start)
    total = step + max(0, int(remaining / timings[best]))
    if max_steps is not None:
        total = min(total, max_steps)
    total = max(total, step)
    log(f"{name}: step time " + ", ".join(f"{k} {v * 1e3:.0f} ms ({tokens_per_step / v:.0f} tok/s)"
                                         for k, v in timings.items())
        + f"; using {best}; {total} steps")

    report_every = max(1, total // 20)
    deadline = start + budget_s * 1.05
    recent = []
    while step < total:
        loss = step_fn(step, total)
        step += 1
        recent = (recent + [loss])[-report_every:]
        if step % 10 == 0 or step == total:
            losses.append(loss.item())
        if step % report_every == 0 or step == total:
            log(f"{name}: step {step}/{total} loss {torch.stack(recent).mean().item():.3f} (mean of the last "
                f"{len(recent)}), lr {cosine_lr(step - 1, warmup, total, 1.0):.3f} x peak, "
                f"{step * tokens_per_step / 1e6:.1f}M tokens")
        if time.monotonic() > deadline:
            log(f"{name}: stopping at step {step}: past 1.05 x the {budget_s:.0f} s budget")
            break
    sync(device)
    seconds = time.monotonic() - start
    tail = [l.item() for l in recent] or losses[-3:]
    stats = {
        "steps": step,
        "planned_steps": total,
        "tokens_seen": step * tokens_per_step,
        "seconds": seconds,
        "tokens_per_second": step * tokens_per_step / seconds,
        "implementation": best,
        "step_seconds_by_implementation": timings,
        "warmup_steps": warmup,
        "final_train_loss_running": sum(tail) / len(tail),
    }
    return stats, losses
