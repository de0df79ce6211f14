"""Trains the tiny DeepSeek-V2 code model and its EAGLE-3 draft, end to end, in one wall-clock window.

  python3 tools/train_tiny/train.py OUT_DIR [--seed 0] [--device cuda|cpu] [--budget-seconds N]

Phases: corpus scan -> tokenizer -> encode -> target training -> export + reload check -> draft
semantic check against make_golden.DraftReference -> draft training (TTT) -> export -> held-out
evaluation -> OUT_DIR/train_log.json. --budget-seconds is the training time of both models together,
split 240:150 between target and draft (the default, 390 s, fits the whole run in 9 minutes on one
H200).
"""

import argparse
import json
import math
import os
import platform
import sys
import time

import numpy as np
import tokenizers
import torch
import transformers

import data
import draft as draft_lib
import evaluate
import export
import target as target_lib
import tokenizer as tokenizer_lib
from progress import elapsed, log, seed_everything

TARGET_SHARE = 240 / 390
AFTER_TRAINING = 60.0  # seconds planned for export and evaluation after the training phases


def add_shared_arguments(p):
    """The flags train_mla_draft.py shares: seed, device, data and the draft's recipe."""
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", choices=["cuda", "cpu"], default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--seq-len", type=int, default=None, help="window length (default 512; 128 on cpu)")
    p.add_argument("--draft-batch-size", type=int, default=None, help="draft windows per step (32 cuda, 2 cpu)")
    p.add_argument("--draft-lr", type=float, default=1e-3)
    p.add_argument("--warmup", type=int, default=None, help="warmup steps (100 cuda, 5 cpu)")
    p.add_argument("--draft-steps", type=int, default=None, help="cap on draft steps")
    p.add_argument("--ttt-steps", type=int, default=5, help="unrolled draft steps (training-time test)")
    p.add_argument("--ttt-decay", type=float, default=0.8, help="loss weight of step j is decay^j")
    p.add_argument("--draft-vocab", type=int, default=2048)
    p.add_argument("--max-train-mb", type=float, default=None,
                   help="training-split cap in MB, whole files in seeded order (150 cuda, 12 cpu)")
    p.add_argument("--eval-windows", type=int, default=None, help="held-out windows evaluated (256 cuda, 8 cpu)")
    p.add_argument("--prompt-tokens", type=int, default=64, help="length of the held-out prompt recorded")


def apply_device_defaults(p, args, deadline_seconds, extra=None):
    """Fills the flags left unset with the device's defaults; refuses --device cuda without CUDA."""
    cuda = args.device == "cuda"
    defaults = {"seq_len": 512 if cuda else 128, "draft_batch_size": 32 if cuda else 2,
                "warmup": 100 if cuda else 5, "max_train_mb": 150.0 if cuda else 12.0,
                "eval_windows": 256 if cuda else 8, "deadline_seconds": deadline_seconds if cuda else None}
    defaults.update((extra or {}).get(cuda, {}))
    for key, value in defaults.items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    if cuda and not torch.cuda.is_available():
        p.error("--device cuda but torch sees no CUDA device")
    return args


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[1])
    p.add_argument("out_dir")
    add_shared_arguments(p)
    p.add_argument("--budget-seconds", type=float, default=390.0,
                   help="training seconds for target + draft (split 240:150)")
    p.add_argument("--batch-size", type=int, default=None, help="target windows per step (64 cuda, 4 cpu)")
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--target-steps", type=int, default=None, help="cap on target steps (reproducible runs)")
    p.add_argument("--tokenizer-mb", type=float, default=40.0, help="bytes the tokenizer trains on")
    p.add_argument("--deadline-seconds", type=float, default=None,
                   help="wall-clock limit of the whole run (540 cuda, none cpu): the training budgets shrink "
                        "when the steps before training took longer than planned")
    return apply_device_defaults(p, p.parse_args(argv), 540.0, {True: {"batch_size": 64}, False: {"batch_size": 4}})


def start_run(args):
    """Output directory, seeds, TF32 and quiet transformers; returns (device, versions for the log)."""
    os.makedirs(args.out_dir, exist_ok=True)
    seed_everything(args.seed)
    device = torch.device(args.device)
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    transformers.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    versions = {"python": platform.python_version(), "torch": torch.__version__,
                "transformers": transformers.__version__, "tokenizers": tokenizers.__version__,
                "numpy": np.__version__,
                "device": torch.cuda.get_device_name(0) if device.type == "cuda" else platform.processor() or "cpu",
                "cpu_threads": torch.get_num_threads()}
    return device, versions


def encode_splits(tok, corpus):
    """(eot id, training stream, held-out stream): each split's documents joined by <|endoftext|>."""
    eot = tok.token_to_id(data.EOT)
    train_stream = data.pack(tokenizer_lib.encode_documents(tok, corpus.train), eot)
    heldout_stream = data.pack(tokenizer_lib.encode_documents(tok, corpus.heldout), eot)
    log(f"encode: train {len(train_stream) / 1e6:.2f}M tokens, held-out {len(heldout_stream) / 1e6:.3f}M tokens "
        f"({corpus.stats['train_bytes'] / len(train_stream):.2f} bytes/token)")
    return eot, train_stream, heldout_stream


def training_budget(asked, deadline_seconds, after_training):
    """(training seconds, deadline): what is left once the rest of the run (measured so far, estimated
    after) is accounted for."""
    deadline = math.inf if deadline_seconds is None else deadline_seconds
    budget = min(asked, deadline - elapsed() - after_training)
    if budget < asked:
        log(f"budget: {budget:.0f} s of training left before the {deadline:.0f} s deadline (asked {asked:.0f} s)")
    if budget <= 0:
        raise SystemExit(f"no training time left: preprocessing took {elapsed():.0f} s of the "
                         f"{deadline:.0f} s deadline")
    return budget, deadline


def main(argv):
    args = parse_args(argv)
    device, versions = start_run(args)
    log(f"train_tiny: out {args.out_dir}, seed {args.seed}, device {versions['device']}, "
        f"budget {args.budget_seconds:.0f} s; torch {torch.__version__}, transformers {transformers.__version__}")
    phases = {}

    def phase(name, t0):
        phases[name] = time.monotonic() - t0

    t0 = time.monotonic()
    corpus = data.load_corpus(args.seed, int(args.max_train_mb * 1e6))
    data.write_heldout_list(corpus, os.path.join(args.out_dir, "heldout_files.txt"))
    phase("corpus_seconds", t0)

    t0 = time.monotonic()
    tok, tok_info = tokenizer_lib.train_tokenizer(corpus.train, int(args.tokenizer_mb * 1e6))
    phase("tokenizer_seconds", t0)
    t0 = time.monotonic()
    eot, train_stream, heldout_stream = encode_splits(tok, corpus)
    phase("encode_seconds", t0)
    heldout_windows = data.fixed_windows(heldout_stream, args.seq_len, args.eval_windows)
    train_windows = data.fixed_windows(train_stream, args.seq_len, args.eval_windows)

    budget, deadline = training_budget(args.budget_seconds, args.deadline_seconds, AFTER_TRAINING)

    # Target.
    t0 = time.monotonic()
    hub = target_lib.target_hub_config(tok.get_vocab_size(), eot)
    model = target_lib.build_model(hub, device)
    target_params = target_lib.count_parameters(model)
    log(f"target: {target_params / 1e6:.2f}M parameters")
    sampler = data.WindowSampler(train_stream, args.seq_len, args.seed)
    target_stats, target_curve = target_lib.train_target(
        model, sampler, device, budget * TARGET_SHARE, args.batch_size, args.lr, args.warmup,
        args.target_steps)
    phase("target_train_seconds", t0)
    t0 = time.monotonic()
    target_lib.round_to_bf16(model)
    target_lib.set_implementation(model, attn="eager", experts="eager")
    target_dir = export.export_target(args.out_dir, model, hub, tok)
    export.verify_target(target_dir, model.cpu(), heldout_windows)
    model.to(device)
    target_lib.set_implementation(model, attn="sdpa", experts=target_stats["implementation"])
    model.requires_grad_(False)
    phase("target_export_seconds", t0)

    # Draft.
    t0 = time.monotonic()
    d2t, _, coverage = draft_lib.vocab_map(train_stream, hub["vocab_size"], args.draft_vocab)
    dc = draft_lib.draft_hub_config(hub, args.draft_vocab)
    reference_diff = draft_lib.check_against_reference(dc, args.seed, num_steps=args.ttt_steps)
    draft = draft_lib.Eagle3Draft(dc, model.model.embed_tokens.weight, d2t).to(device)
    draft_ids = torch.arange(args.draft_vocab, device=device) + draft.d2t
    draft_lib.init_from_target(draft, model, draft_ids)
    draft_params = sum(p.numel() for p in draft.parameters())
    log(f"draft: {draft_params / 1e6:.2f}M parameters; draft vocab {args.draft_vocab} covers {coverage:.3f} of the "
        f"training tokens")
    tap = draft_lib.TargetTap(model)
    draft_sampler = data.WindowSampler(train_stream, args.seq_len, args.seed + 1)
    draft_budget = min(budget * (1 - TARGET_SHARE), deadline - elapsed() - AFTER_TRAINING)
    draft_stats, draft_curve = draft_lib.train_draft(
        draft, tap, draft_sampler, device, draft_budget, args.draft_batch_size,
        args.draft_lr, args.warmup, args.ttt_steps, args.ttt_decay, args.draft_steps)
    phase("draft_train_seconds", t0)
    t0 = time.monotonic()
    target_lib.round_to_bf16(draft)
    draft_dir = export.export_draft(args.out_dir, draft, dc)
    export.verify_draft(draft_dir, draft)
    sizes = export.sizes(args.out_dir)
    phase("draft_export_seconds", t0)

    # Held-out evaluation of what was written (bf16 values), and a sample.
    t0 = time.monotonic()
    results = evaluate.evaluate_pair(model, draft, tap, heldout_windows, train_windows, device,
                                     max(1, args.draft_batch_size), args.ttt_steps, args.ttt_decay)
    prompt_path, prompt = evaluate.heldout_prompt(tok, corpus.heldout, args.prompt_tokens)
    continuation = evaluate.greedy_sample(model, prompt, 48, device)
    log(f"sample from {prompt_path}:\n{tok.decode(prompt)}\u2588{tok.decode(continuation)}")
    phase("eval_seconds", t0)

    target_stats["curve_every_10_steps"] = target_curve
    draft_stats["curve_every_10_steps"] = draft_curve
    train_log = {
        "command": "tools/train_tiny/train.sh " + " ".join(argv),
        "seed": args.seed,
        "args": vars(args),
        "versions": versions,
        "corpus": corpus.stats,
        "tokenizer": {"vocab_size": tok.get_vocab_size(), "pattern": tokenizer_lib.PATTERN, "trained_on": tok_info,
                      "eot_id": eot},
        "tokens": {"train": int(len(train_stream)), "heldout": int(len(heldout_stream))},
        "target": {"parameters": target_params, "config": hub, "train": target_stats,
                   "eval": results["target"]},
        "draft": {"parameters": draft_params, "config": dc, "draft_vocab_coverage_train": coverage,
                  "reference_check_max_rel_diff": reference_diff, "train": draft_stats, "eval": results["draft"],
                  "aux_boundaries": [i + 1 for i in draft_lib.AUX_LAYER_IDS]},
        "sizes": sizes,
        "heldout_prompt": {"path": prompt_path, "tokens": prompt, "greedy_continuation": continuation,
                           "text": tok.decode(prompt), "continuation_text": tok.decode(continuation)},
        "training_budget_seconds": {"asked": args.budget_seconds, "used_plan": budget,
                                    "target": budget * TARGET_SHARE, "draft": draft_budget},
        "phases_seconds": phases,
        "total_seconds": elapsed(),
    }
    with open(os.path.join(args.out_dir, "train_log.json"), "w") as f:
        json.dump(train_log, f, indent=1)
        f.write("\n")
    log(f"done in {elapsed():.0f} s: target held-out loss {results['target']['heldout_loss']:.3f}; draft agreement "
        + ", ".join(f"{a:.3f}" for a in results["draft"]["top1_agreement_per_depth"]))


if __name__ == "__main__":
    main(sys.argv[1:])
