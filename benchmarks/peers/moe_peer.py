"""Peer of BM_MoeDecode: the per-expert loop an engine developer would write in torch (the shape of
HF transformers' DeepseekV3MoE / DeepseekV2MoE forward): route, then for each selected expert gather
its tokens, run gate/up/SiLU/down with nn.functional.linear, scale and index_add the result; the
shared experts (V2-Lite) as one dense MLP added to the output. f32 weights, as the C++ benchmark.
"""
import torch
import torch.nn.functional as F

from _common import QUICK, emit, require_gpu, time_median_us

# model id (the C++ arg) -> experts, hidden, inter, top_k, shared_inter, routing
MODELS = {
    0: dict(name="V3-TP8", experts=256, hidden=7168, inter=256, top_k=8, shared=0,
            sigmoid=True, n_group=8, topk_group=4, norm=True, scale=2.5),
    1: dict(name="K2-TP8", experts=384, hidden=7168, inter=256, top_k=8, shared=0,
            sigmoid=True, n_group=1, topk_group=1, norm=True, scale=2.827),
    2: dict(name="V2Lite-TP1", experts=64, hidden=2048, inter=1408, top_k=6, shared=2 * 1408,
            sigmoid=False, n_group=1, topk_group=1, norm=False, scale=1.0),
}


def route(logits, bias, m):
    t, e = logits.shape
    if m["sigmoid"]:  # V3/K2 noaux_tc: select with the biased scores, weight with the unbiased ones
        scores = logits.sigmoid()
        biased = scores + bias
        groups = biased.view(t, m["n_group"], -1).topk(2, dim=-1).values.sum(-1)
        keep = groups.topk(m["topk_group"], dim=-1).indices
        gmask = torch.zeros_like(groups).scatter_(1, keep, 1.0)
        emask = gmask.unsqueeze(-1).expand(t, m["n_group"], e // m["n_group"]).reshape(t, e)
        ids = biased.masked_fill(emask == 0, float("-inf")).topk(m["top_k"], dim=-1).indices
        w = scores.gather(1, ids)
    else:  # V2 greedy softmax
        w, ids = logits.softmax(-1).topk(m["top_k"], dim=-1)
    if m["norm"]:
        w = w / (w.sum(-1, keepdim=True) + 1e-20)
    return ids, w * m["scale"]


def main():
    require_gpu("moe_peer.py")
    dev = torch.device("cuda")
    tokens_list = (1, 16, 64) if QUICK else (1, 4, 16, 64, 256)
    for model_id, m in MODELS.items():
        h, i_, e = m["hidden"], m["inter"], m["experts"]
        gate_up = [torch.randn(2 * i_, h, device=dev) * h ** -0.5 for _ in range(e)]
        down = [torch.randn(h, i_, device=dev) * i_ ** -0.5 for _ in range(e)]
        if m["shared"]:
            sgu = torch.randn(2 * m["shared"], h, device=dev) * h ** -0.5
            sdown = torch.randn(h, m["shared"], device=dev) * m["shared"] ** -0.5
        bias = torch.randn(e, device=dev) * 0.1
        for tokens in tokens_list:
            x = torch.randn(tokens, h, device=dev)
            logits = torch.randn(tokens, e, device=dev)

            def step(_):
                ids, w = route(logits, bias, m)
                out = torch.zeros_like(x)
                for expert in ids.unique().tolist():
                    rows, slot = (ids == expert).nonzero(as_tuple=True)
                    gu = F.linear(x[rows], gate_up[expert])
                    act = F.silu(gu[:, :i_]) * gu[:, i_:]
                    out.index_add_(0, rows, F.linear(act, down[expert]) * w[rows, slot, None])
                if m["shared"]:
                    gu = F.linear(x, sgu)
                    out += F.linear(F.silu(gu[:, :m["shared"]]) * gu[:, m["shared"]:], sdown)
                return out

            with torch.no_grad():
                us = time_median_us(step)
            emit("BM_MoeDecode", {"model": model_id, "tokens": tokens}, "torch per-expert loop f32", us,
                 label=m["name"])
        del gate_up, down
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
