"""Peer of BM_LatentAttentionDecode: absorbed MLA decode with PyTorch SDPA.

Per sequence, `qtokens` query rows of `heads` heads attend the sequence's latent cache (keys = the
576-wide rows, values = their first 512 columns, shared by every head), as an engine would write it
in torch: q [B, H, T, 576] against k [B, 1, S, 576] expanded over heads, SDPA with a bool mask
(qtokens > 1: the chain-shaped tree mask of the C++ benchmark). f32 and bf16.
"""
import torch
import torch.nn.functional as F

from _common import QUICK, copies_to_defeat_l2, emit, require_gpu, time_median_us

W, R = 576, 512


def shapes():
    if QUICK:
        return [(h, c, b, 1) for h in (16, 8) for c in (4096, 65536) for b in (1, 8)] + [(16, 4096, 1, 16)]
    out = [(h, c, b, 1) for h in (16, 8) for c in (1024, 4096, 16384, 65536) for b in (1, 8, 32)]
    out += [(h, c, b, t) for h in (16, 8) for c in (4096, 16384) for b in (1, 8) for t in (8, 32, 64)]
    return out


def main():
    require_gpu("mla_peer.py")
    dev = torch.device("cuda")
    for dtype, name in ((torch.float32, "torch SDPA f32"), (torch.bfloat16, "torch SDPA bf16")):
        for heads, context, batch, qtok in shapes():
            cache_bytes = batch * context * W * dtype.itemsize
            caches = [torch.randn(batch, 1, context, W, device=dev, dtype=dtype)
                      for _ in range(copies_to_defeat_l2(cache_bytes, max_copies=16))]
            q = torch.randn(batch, heads, qtok, W, device=dev, dtype=dtype)
            mask = torch.ones(qtok, context, dtype=torch.bool, device=dev)
            for i in range(qtok):
                mask[i, context - qtok + i + 1:] = False

            def step(i):
                k = caches[i % len(caches)].expand(batch, heads, context, W)
                v = k[..., :R]
                return F.scaled_dot_product_attention(q, k, v, attn_mask=mask if qtok > 1 else None, scale=0.1)

            with torch.no_grad():
                us = time_median_us(step)
            emit("BM_LatentAttentionDecode", {"heads": heads, "context": context, "batch": batch, "qtokens": qtok},
                 name, us)
            del caches, q, mask
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
