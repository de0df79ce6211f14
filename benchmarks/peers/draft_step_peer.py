"""Peer of BM_DraftStep: the EAGLE-3 draft step (SpecForge's DeepSeek-V3 head) written with
torch.nn modules (nn.Linear, nn.Embedding, nn.RMSNorm, SDPA) at one rank's shapes, everything on the
GPU (no host transfers, no collectives): tp 1 = the whole head, tp 8 = rank 0 of 8 (7 heads, 1 kv
head, intermediate 5120, lm_head 4000 rows, embedding 1/8 of the vocab; fc replicated), one sequence
of `tokens` rows after 1024 cached rows, logits of the last row. f32 and bf16.

Also the peer of BM_FcProjection: the fc nn.Linear alone (replicated or one of 8 column shards).
"""
import torch
import torch.nn.functional as F
from torch import nn

from _common import QUICK, copies_to_defeat_l2, emit, require_gpu, time_median_us

H, HEADS, KV, D, INTER, DRAFT_VOCAB, VOCAB, AUX = 7168, 56, 8, 128, 40960, 32000, 129280, 3
CONTEXT = 1024


class DraftRank(nn.Module):
    def __init__(self, tp):
        super().__init__()
        self.heads, self.kv, self.inter = HEADS // tp, KV // tp, INTER // tp
        self.fc = nn.Linear(AUX * H, H, bias=False)
        self.embed = nn.Embedding(VOCAB // tp + 1, H)
        self.input_layernorm = nn.RMSNorm(H, eps=1e-6)
        self.hidden_norm = nn.RMSNorm(H, eps=1e-6)
        self.qkv = nn.Linear(2 * H, (self.heads + 2 * self.kv) * D, bias=False)
        self.o_proj = nn.Linear(self.heads * D, H, bias=False)
        self.post_attention_layernorm = nn.RMSNorm(H, eps=1e-6)
        self.gate_up = nn.Linear(H, 2 * self.inter, bias=False)
        self.down = nn.Linear(self.inter, H, bias=False)
        self.norm = nn.RMSNorm(H, eps=1e-6)
        self.lm_head = nn.Linear(H, DRAFT_VOCAB // tp, bias=False)
        inv = 1.0 / (10000 ** (torch.arange(0, D, 2, dtype=torch.float32) / D))
        freqs = torch.outer(torch.arange(CONTEXT + 256, dtype=torch.float32), inv)
        self.register_buffer("cos", torch.cat([freqs.cos(), freqs.cos()], -1))
        self.register_buffer("sin", torch.cat([freqs.sin(), freqs.sin()], -1))
        self.register_buffer("k_cache", torch.randn(1, self.kv, CONTEXT + 256, D))
        self.register_buffer("v_cache", torch.randn(1, self.kv, CONTEXT + 256, D))

    @staticmethod
    def rope(x, cos, sin):  # NeoX rotate-half
        a, b = x.chunk(2, dim=-1)
        return x * cos + torch.cat([-b, a], -1) * sin

    def forward(self, tokens, hidden, from_target, mask):
        t = tokens.shape[0]
        g = self.fc(hidden) if from_target else hidden
        x = torch.cat([self.input_layernorm(self.embed(tokens)), self.hidden_norm(g)], -1)
        q, k, v = self.qkv(x).split([self.heads * D, self.kv * D, self.kv * D], -1)
        cos, sin = self.cos[CONTEXT:CONTEXT + t, None], self.sin[CONTEXT:CONTEXT + t, None]
        q = self.rope(q.view(t, self.heads, D), cos, sin).transpose(0, 1)[None]
        k = self.rope(k.view(t, self.kv, D), cos, sin).transpose(0, 1)
        self.k_cache[0, :, CONTEXT:CONTEXT + t] = k
        self.v_cache[0, :, CONTEXT:CONTEXT + t] = v.view(t, self.kv, D).transpose(0, 1)
        s = CONTEXT + t
        attn = F.scaled_dot_product_attention(q, self.k_cache[:, :, :s], self.v_cache[:, :, :s], attn_mask=mask,
                                              enable_gqa=True)
        r = g + self.o_proj(attn[0].transpose(0, 1).reshape(t, self.heads * D))
        gu = self.gate_up(self.post_attention_layernorm(r))
        r = r + self.down(F.silu(gu[:, :self.inter]) * gu[:, self.inter:])
        return self.lm_head(self.norm(r[-1:])), r


def draft_steps(dev):
    tokens_list = (1, 16, 64) if QUICK else (1, 4, 16, 64)
    from_list = (1,) if QUICK else (1, 0)
    for dtype, name in ((torch.float32, "torch nn f32"), (torch.bfloat16, "torch nn bf16")):
        for tp in (1, 8):
            with torch.device(dev):
                model = DraftRank(tp).to(dtype).eval()
            for tokens in tokens_list:
                for from_target in from_list:
                    ids = torch.randint(0, VOCAB // tp, (tokens,), device=dev)
                    hidden = torch.randn(tokens, AUX * H if from_target else H, device=dev, dtype=dtype)
                    mask = torch.ones(tokens, CONTEXT + tokens, dtype=torch.bool, device=dev).tril(CONTEXT)
                    with torch.no_grad():
                        us = time_median_us(lambda _: model(ids, hidden, from_target, mask))
                    emit("BM_DraftStep", {"tp": tp, "tokens": tokens, "from_target": from_target}, name, us)
            del model
            torch.cuda.empty_cache()


def fc_projection(dev):
    tokens_list = (1, 16, 64) if QUICK else (1, 4, 16, 64)
    for bf16, dtype in ((0, torch.float32), (1, torch.bfloat16)):
        for shards in (1, 8):
            out = H // shards
            n = copies_to_defeat_l2(out * AUX * H * dtype.itemsize)
            weights = [torch.randn(out, AUX * H, device=dev, dtype=dtype) * (AUX * H) ** -0.5 for _ in range(n)]
            for tokens in tokens_list:
                aux = torch.randn(tokens, AUX * H, device=dev, dtype=dtype)
                with torch.no_grad():
                    us = time_median_us(lambda i: F.linear(aux, weights[i % n]))
                emit("BM_FcProjection", {"tokens": tokens, "shards": shards, "bf16": bf16},
                     "torch F.linear " + ("bf16" if bf16 else "f32"), us)
            del weights
            torch.cuda.empty_cache()


def main():
    require_gpu("draft_step_peer.py")
    dev = torch.device("cuda")
    fc_projection(dev)
    draft_steps(dev)


if __name__ == "__main__":
    main()
