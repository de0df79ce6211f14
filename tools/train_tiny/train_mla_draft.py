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
import os
import sys
import time

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
import train
from progress import elapsed, log

AFTER_TRAINING = 30.0  # seconds planned for export and the evaluation of both drafts


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("out_dir")
    p.add_argument("--target", required=True, help="the trained target (hub DeepSeek-V2 form + tokenizer.json)")
    p.add_argument("--llama-draft", default=None,
                   help="the Llama-style draft to compare with (default: TARGET-eagle3 when it exists)")
    train.add_shared_arguments(p)  # --seed must be the target run's: it picks the training files
    p.add_argument("--budget-seconds", type=float, default=130.0, help="draft training seconds")
    p.add_argument("--deadline-seconds", type=float, default=None,
                   help="wall-clock limit of the whole run (280 cuda, none cpu): the training budget shrinks "
                        "when preprocessing took longer than planned")
    args = train.apply_device_defaults(p, p.parse_args(argv), 280.0)
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
    device, versions = train.start_run(args)
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
    _, train_stream, heldout_stream = train.encode_splits(tok, corpus)
    phase("encode_seconds", t0)
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
    budget, _ = train.training_budget(args.budget_seconds, args.deadline_seconds, AFTER_TRAINING)
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
