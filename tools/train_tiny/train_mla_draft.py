"""Trains only the MLA EAGLE-3 draft (draft_mla.py) against an already-trained tiny target.

  python3 tools/train_tiny/train_mla_draft.py OUT_DIR --target models/tiny-v2-code [--device cuda|cpu]
      [--budget-seconds 130] [--seed 0]

The target directory is only read (its model.safetensors sha256 is recorded before and after). The data
are train.py's: the same corpus scan, seeded split and training cap (data.py), encoded with the target's
own tokenizer.json, so the training stream, the draft vocabulary (d2t) and the held-out windows are the
ones the shipped Llama-style draft was trained and evaluated on (the d2t is compared with that draft's
when --llama-draft is found). The recipe is draft.py's (TTT, loss, optimizer, schedule, evaluation).

Writes OUT_DIR/tiny-v2-code-eagle3-mla/{config.json, model.safetensors} and OUT_DIR/train_log_mla.json
(the draft fields of train.py's train_log.json, plus the Llama-style draft evaluated on the same
held-out windows in the same run).
"""

import argparse
import hashlib
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
from safetensors.torch import load_file

import data
import draft as draft_lib
import draft_mla
import evaluate
import export
import target as target_lib
import tokenizer as tokenizer_lib
from progress import elapsed, log, seed_everything


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("out_dir")
    p.add_argument("--target", required=True, help="the trained target (hub DeepSeek-V2 form + tokenizer.json)")
    p.add_argument("--llama-draft", default=None,
                   help="the Llama-style draft to compare with (default: TARGET-eagle3 when it exists)")
    p.add_argument("--seed", type=int, default=0, help="the target run's seed (it picks the training files)")
    p.add_argument("--device", choices=["cuda", "cpu"], default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--budget-seconds", type=float, default=130.0, help="draft training seconds")
    p.add_argument("--seq-len", type=int, default=None, help="window length (default 512; 128 on cpu)")
    p.add_argument("--draft-batch-size", type=int, default=None, help="draft windows per step (32 cuda, 2 cpu)")
    p.add_argument("--draft-lr", type=float, default=1e-3)
    p.add_argument("--warmup", type=int, default=None, help="warmup steps (100 cuda, 5 cpu)")
    p.add_argument("--draft-steps", type=int, default=None, help="cap on draft steps")
    p.add_argument("--ttt-steps", type=int, default=5, help="unrolled draft steps (training-time test)")
    p.add_argument("--ttt-decay", type=float, default=0.8, help="loss weight of step j is decay^j")
    p.add_argument("--draft-vocab", type=int, default=2048)
    p.add_argument("--max-train-mb", type=float, default=None,
                   help="training-split cap in MB, as the target run's (150 cuda, 12 cpu)")
    p.add_argument("--eval-windows", type=int, default=None, help="held-out windows evaluated (256 cuda, 8 cpu)")
    p.add_argument("--prompt-tokens", type=int, default=64, help="length of the held-out prompt recorded")
    p.add_argument("--deadline-seconds", type=float, default=None,
                   help="wall-clock limit of the whole run (280 cuda, none cpu): the training budget shrinks "
                        "when preprocessing took longer than planned")
    args = p.parse_args(argv)
    cuda = args.device == "cuda"
    defaults = {"seq_len": 512 if cuda else 128, "draft_batch_size": 32 if cuda else 2, "warmup": 100 if cuda else 5,
                "max_train_mb": 150.0 if cuda else 12.0, "eval_windows": 256 if cuda else 8,
                "deadline_seconds": 280.0 if cuda else None}
    for key, value in defaults.items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    if cuda and not torch.cuda.is_available():
        p.error("--device cuda but torch sees no CUDA device")
    for name in ("config.json", "model.safetensors", "tokenizer.json"):
        if not os.path.isfile(os.path.join(args.target, name)):
            p.error(f"--target {args.target}: no {name}")
    if args.llama_draft is None:
        candidate = os.path.normpath(args.target) + "-eagle3"
        args.llama_draft = candidate if os.path.isdir(candidate) else None
    return args


def sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def load_target(directory, device):
    """The shipped target as train.py held it after export: fp32 holding bf16 values, frozen."""
    model = transformers.DeepseekV2ForCausalLM.from_pretrained(
        directory, dtype=torch.float32, attn_implementation="sdpa",
        experts_implementation="grouped_mm" if device.type == "cuda" else "eager").to(device)
    model.requires_grad_(False)
    return model.eval()


def load_llama_draft(directory, embed, device):
    with open(os.path.join(directory, "config.json")) as f:
        dc = json.load(f)
    stored = load_file(os.path.join(directory, "model.safetensors"))
    d2t = stored.pop("d2t")
    stored.pop("t2d", None)
    model = draft_lib.Eagle3Draft(dc, embed, d2t)
    model.load_state_dict({n: w.float() for n, w in stored.items()})
    return model.to(device), dc


def main(argv):
    args = parse_args(argv)
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
    weights_path = os.path.join(args.target, "model.safetensors")
    target_sha = sha256(weights_path)
    log(f"train_mla_draft: out {args.out_dir}, target {args.target}, seed {args.seed}, device {versions['device']}, "
        f"budget {args.budget_seconds:.0f} s")
    phases = {}

    def phase(name, t0):
        phases[name] = time.monotonic() - t0

    t0 = time.monotonic()
    corpus = data.load_corpus(args.seed, int(args.max_train_mb * 1e6))
    phase("corpus_seconds", t0)
    t0 = time.monotonic()
    with open(os.path.join(args.target, "config.json")) as f:
        hub = json.load(f)
    tok = tokenizers.Tokenizer.from_file(os.path.join(args.target, "tokenizer.json"))
    tokenizer_lib.check_spec(tok, hub["vocab_size"])
    eot = tok.token_to_id(data.EOT)
    train_stream = data.pack(tokenizer_lib.encode_documents(tok, corpus.train), eot)
    heldout_stream = data.pack(tokenizer_lib.encode_documents(tok, corpus.heldout), eot)
    phase("encode_seconds", t0)
    log(f"encode: train {len(train_stream) / 1e6:.2f}M tokens, held-out {len(heldout_stream) / 1e6:.3f}M tokens")
    heldout_windows = data.fixed_windows(heldout_stream, args.seq_len, args.eval_windows)

    t0 = time.monotonic()
    model = load_target(args.target, device)
    phase("target_load_seconds", t0)

    t0 = time.monotonic()
    d2t, _, coverage = draft_lib.vocab_map(train_stream, hub["vocab_size"], args.draft_vocab)
    same_vocab = None
    if args.llama_draft:
        llama_d2t = load_file(os.path.join(args.llama_draft, "model.safetensors"))["d2t"]
        same_vocab = bool(torch.equal(llama_d2t, d2t))
        log(f"draft vocab {'equals' if same_vocab else 'DIFFERS from'} {args.llama_draft}'s (d2t)")
    dc = draft_mla.mla_draft_hub_config(hub, args.draft_vocab)
    reference_diff = draft_mla.check_against_reference(dc, args.seed, num_steps=args.ttt_steps)
    draft = draft_mla.MlaEagle3Draft(dc, model.model.embed_tokens.weight, d2t).to(device)
    draft_ids = torch.arange(args.draft_vocab, device=device) + draft.d2t
    draft_lib.init_from_target(draft, model, draft_ids)
    draft_params = sum(p.numel() for p in draft.parameters())
    log(f"MLA draft: {draft_params / 1e6:.2f}M parameters; draft vocab {args.draft_vocab} covers {coverage:.3f} of "
        f"the training tokens")
    tap = draft_lib.TargetTap(model)
    draft_sampler = data.WindowSampler(train_stream, args.seq_len, args.seed + 1)  # train.py's draft sampler
    after_training = 30.0
    deadline = math.inf if args.deadline_seconds is None else args.deadline_seconds
    budget = min(args.budget_seconds, deadline - elapsed() - after_training)
    if budget < args.budget_seconds:
        log(f"budget: {budget:.0f} s of training left before the {deadline:.0f} s deadline "
            f"(asked {args.budget_seconds:.0f} s)")
    if budget <= 0:
        raise SystemExit(f"no training time left: preprocessing took {elapsed():.0f} s of the {deadline:.0f} s "
                         "deadline")
    draft_stats, draft_curve = draft_lib.train_draft(
        draft, tap, draft_sampler, device, budget, args.draft_batch_size, args.draft_lr, args.warmup,
        args.ttt_steps, args.ttt_decay, args.draft_steps)
    phase("draft_train_seconds", t0)

    t0 = time.monotonic()
    target_lib.round_to_bf16(draft)
    draft_dir = export.export_draft(args.out_dir, draft, dc, export.MLA_DRAFT_DIR)
    export.verify_draft(draft_dir, draft)
    with open(os.path.join(draft_dir, "config.json")) as f:
        reloaded = draft_mla.MlaEagle3Draft(json.load(f), model.model.embed_tokens.weight, d2t)
    reloaded.load_state_dict({n: w.float() for n, w in load_file(os.path.join(draft_dir, "model.safetensors")).items()
                              if n not in ("d2t", "t2d")})
    sizes = export.mla_draft_size(args.out_dir)
    phase("draft_export_seconds", t0)

    # Held-out evaluation of what was written, and of the Llama-style draft on the same windows.
    t0 = time.monotonic()
    batch = max(1, args.draft_batch_size)
    mla_eval = draft_lib.evaluate_draft(reloaded.to(device), tap, heldout_windows, device, batch, args.ttt_steps,
                                        args.ttt_decay)
    log("eval: MLA draft top-1 agreement by depth " + ", ".join(f"{a:.3f}" for a in mla_eval["top1_agreement_per_depth"]))
    llama_eval = None
    if args.llama_draft:
        llama, _ = load_llama_draft(args.llama_draft, model.model.embed_tokens.weight, device)
        llama_eval = draft_lib.evaluate_draft(llama, tap, heldout_windows, device, batch, args.ttt_steps,
                                              args.ttt_decay)
        log("eval: Llama-style draft top-1 agreement by depth "
            + ", ".join(f"{a:.3f}" for a in llama_eval["top1_agreement_per_depth"]))
    prompt_path, prompt = evaluate.heldout_prompt(tok, corpus.heldout, args.prompt_tokens)
    phase("eval_seconds", t0)
    if sha256(weights_path) != target_sha:
        raise SystemExit(f"{weights_path} changed during the run")

    draft_stats["curve_every_10_steps"] = draft_curve
    train_log = {
        "command": "tools/train_tiny/train_mla_draft.sh " + " ".join(argv),
        "seed": args.seed,
        "args": vars(args),
        "versions": versions,
        "target": {"directory": args.target, "model_safetensors_sha256": target_sha, "config": hub},
        "corpus": corpus.stats,
        "tokens": {"train": int(len(train_stream)), "heldout": int(len(heldout_stream))},
        "draft": {"parameters": draft_params, "config": dc, "draft_vocab_coverage_train": coverage,
                  "draft_vocab_equals_llama_draft": same_vocab,
                  "reference_check_max_rel_diff": reference_diff, "train": draft_stats, "eval": mla_eval,
                  "aux_boundaries": [i + 1 for i in draft_lib.AUX_LAYER_IDS]},
        "llama_draft": None if llama_eval is None else {"directory": args.llama_draft, "eval": llama_eval},
        "sizes": sizes,
        "heldout_prompt": {"path": prompt_path, "tokens": prompt, "text": tok.decode(prompt)},
        "training_budget_seconds": {"asked": args.budget_seconds, "draft": budget},
        "phases_seconds": phases,
        "total_seconds": elapsed(),
    }
    with open(os.path.join(args.out_dir, "train_log_mla.json"), "w") as f:
        json.dump(train_log, f, indent=1)
        f.write("\n")
    log(f"done in {elapsed():.0f} s: MLA draft agreement "
        + ", ".join(f"{a:.3f}" for a in mla_eval["top1_agreement_per_depth"]))


if __name__ == "__main__":
    main(sys.argv[1:])
