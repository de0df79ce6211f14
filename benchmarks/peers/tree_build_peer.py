"""Peer of BM_TreeBuild (benchmarks/cuda/tree_build_benchmark.cc): the EAGLE-2 draft-tree build
written with torch ops on the GPU the way SGLang's EAGLE worker does it: per step log_softmax + topk
over each frontier row, cumulative scores, topk over the k*k candidates for the next frontier; then
topk(num_draft_tokens - 1) over every step's scores, sort, gather of the tokens and parents, and the
tree's depths, positions and dense ancestor mask (SGLang builds those in build_tree_kernel_efficient;
here a few gathers per depth). The draft model is not timed; the logits (one set per build, rotated
past L2) and the d2t offsets are given. f32 log-softmax (SGLang's precision), not double.

Prints one JSON line per shape: {"benchmark": "BM_TreeBuild", "params": {batch, topk, steps, tokens,
vocab}, "peer": "torch (SGLang-style)", "us": median}.
"""
import torch

from _common import QUICK, copies_to_defeat_l2, emit, require_gpu, time_median_us

VOCAB = 32000


def shapes():
    batches = (1, 32) if QUICK else (1, 8, 32)
    steps_list = (3, 5) if QUICK else (3, 4, 5, 6, 7)
    tokens_list = (8, 64) if QUICK else (8, 16, 32, 64)
    for batch in batches:
        for topk in (4, 8):
            for steps in steps_list:
                for tokens in tokens_list:
                    if tokens <= 1 + topk + (steps - 1) * topk * topk:
                        yield batch, topk, steps, tokens


def build(logits, d2t, root_pos, batch, topk, steps, tokens):
    """logits: [batch * (1 + (steps - 1) * topk), V]; step 0's rows first, then each step's."""
    k = topk
    dev = logits.device
    lp = torch.log_softmax(logits[:batch], dim=-1)                    # [B, V]
    scores, ids = lp.topk(k, dim=-1)                                  # [B, k]
    score_list, id_list = [scores], [ids]
    parent_list = [torch.zeros(batch, k, dtype=torch.long, device=dev)]  # candidate index of the parent
    frontier = torch.arange(1, k + 1, device=dev).expand(batch, k)      # candidate indices
    row = batch
    for s in range(1, steps):
        lp = torch.log_softmax(logits[row:row + batch * k], dim=-1).view(batch, k, -1)
        row += batch * k
        child_scores, child_ids = lp.topk(k, dim=-1)                 # [B, k, k]
        cum = (scores.unsqueeze(2) + child_scores).view(batch, k * k)
        score_list.append(cum)
        id_list.append(child_ids.view(batch, k * k))
        parent_list.append(frontier.unsqueeze(2).expand(batch, k, k).reshape(batch, k * k))
        scores, sel = cum.topk(k, dim=-1)                             # the next frontier
        frontier = 1 + k + (s - 1) * k * k + sel
    all_scores = torch.cat(score_list, dim=1)                         # [B, C - 1]
    all_ids = torch.cat(id_list, dim=1)
    all_parents = torch.cat(parent_list, dim=1)
    picked = all_scores.topk(tokens - 1, dim=-1).indices.sort(dim=-1).values  # candidate - 1
    draft_ids = all_ids.gather(1, picked)
    tokens_out = draft_ids + d2t[draft_ids]
    parent_cand = all_parents.gather(1, picked)                        # candidate index, 0 = root
    # Node of a candidate: its position among the picked (sorted) candidates, + 1; the root is 0.
    parent_node = torch.where(parent_cand == 0, torch.zeros_like(parent_cand),
                              torch.searchsorted(picked + 1, parent_cand) + 1)
    parents = torch.cat([torch.zeros(batch, 1, dtype=torch.long, device=dev), parent_node], dim=1)  # root -> 0
    cand = picked + 1
    depth = torch.where(cand <= k, torch.ones_like(cand), 2 + (cand - 1 - k) // (k * k))
    depths = torch.cat([torch.zeros(batch, 1, dtype=torch.long, device=dev), depth], dim=1)
    positions = root_pos.unsqueeze(1) + depths
    n = tokens
    mask = torch.eye(n, dtype=torch.bool, device=dev).expand(batch, n, n).clone()
    cur = torch.arange(n, device=dev).expand(batch, n)
    for _ in range(steps):
        cur = parents.gather(1, cur)
        mask.scatter_(2, cur.unsqueeze(2), True)
    return tokens_out, parents, depths, positions, mask


def main():
    require_gpu("tree_build_peer.py")
    dev = torch.device("cuda")
    d2t = (torch.arange(VOCAB, device=dev) * 7) % 1000
    for batch, topk, steps, tokens in shapes():
        rows = batch * (1 + (steps - 1) * topk)
        n = copies_to_defeat_l2(rows * VOCAB * 4)
        sets = [torch.randn(rows, VOCAB, device=dev) * 2 for _ in range(n)]
        root_pos = torch.zeros(batch, dtype=torch.long, device=dev)
        with torch.no_grad():
            us = time_median_us(lambda i: build(sets[i % n], d2t, root_pos, batch, topk, steps, tokens))
        emit("BM_TreeBuild", {"batch": batch, "topk": topk, "steps": steps, "tokens": tokens, "vocab": VOCAB},
             "torch (SGLang-style)", us)
        del sets
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
