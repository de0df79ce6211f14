"""Evaluation of the trained pair on held-out text: the target's loss, the draft's TTT loss and its top-1
agreement with the target's greedy next token at depth 1..K, and a greedy sample for the model card."""

import torch

from draft import evaluate_draft
from progress import log
from target import autocast, evaluate_loss, expert_usage


def heldout_prompt(tok, documents, length):
    """The first held-out file (sorted by path) with at least `length` tokens: its first `length` ids."""
    for d in documents:
        ids = tok.encode(d.text, add_special_tokens=False).ids
        if len(ids) >= length:
            return d.path, ids[:length]
    raise SystemExit(f"no held-out file has {length} tokens")


@torch.no_grad()
def greedy_sample(model, prompt, new_tokens, device):
    """Greedy continuation by the target (transformers' generate with its MLA cache)."""
    model.eval()
    ids = torch.tensor([prompt], device=device)
    with autocast(device):
        out = model.generate(ids, max_new_tokens=new_tokens, do_sample=False, pad_token_id=model.config.eos_token_id)
    model.train()
    return out[0, len(prompt):].tolist()


def evaluate_pair(model, draft, tap, heldout_windows, train_windows, device, batch_size, num_steps, decay):
    target_heldout = evaluate_loss(model, heldout_windows, device, batch_size)
    target_train = evaluate_loss(model, train_windows, device, batch_size)
    usage = expert_usage(model, heldout_windows, device, batch_size)
    log(f"eval: target loss held-out {target_heldout:.3f}, train windows {target_train:.3f}")
    result = {"target": {"heldout_loss": target_heldout, "train_windows_loss": target_train,
                         "heldout_tokens": int(heldout_windows[:, 1:].numel()),
                         "expert_usage_heldout": {str(k): v for k, v in usage.items()}}}
    if draft is not None:
        d = evaluate_draft(draft, tap, heldout_windows, device, batch_size, num_steps, decay)
        log("eval: draft top-1 agreement by depth " + ", ".join(f"{a:.3f}" for a in d["top1_agreement_per_depth"])
            + "; TTT loss by step " + ", ".join(f"{a:.3f}" for a in d["loss_per_step"]))
        result["draft"] = d
    return result
