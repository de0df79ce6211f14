"""The MLA EAGLE-3 draft head (Kimi-K2.5 style, docs/mla_drafts.md) for the tiny target: draft.py's
EAGLE-3 head with its Llama layer's GQA attention replaced by DeepSeek MLA over the 2H-wide
[input_layernorm(embed) | hidden_norm(g)] row, and a dense SiLU MLP. Everything else (fc over the taps,
the residual g, the fed-back r, norm, lm_head over the draft vocab with d2t, the TTT loop, its loss and
training) is draft.py's, so the two heads train and evaluate identically.

Semantics (make_golden.py's MlaDraftReference, the implementation the C++ golden tests match; guarded by
check_against_reference):
  q      = q_b(q_a_layernorm(q_a(x)))                        [heads, nope + rope]   (q_lora_rank null: q_proj(x))
  c, kpe = split(kv_a_proj_with_mqa(x), [kv_lora_rank, rope])      kpe shared by the heads
  k_nope, v = split(kv_b(kv_a_layernorm(c)), [nope, v]) per head
  RoPE on q's rope dims and kpe: adjacent pairs (DeepSeek), the draft's own theta; scale (nope + rope)^-0.5
The TTT attention runs on k = [k_nope | kpe] per head, which is the latent attention expanded.
"""

import torch
from torch import nn

import draft as draft_lib
from draft import Eagle3Draft, RMSNorm, linear

ARCHITECTURE = "Eagle3DeepseekV2ForCausalLM"
# Kimi's drafts keep the target's MLA dims; the tiny target's are kept too, so the draft's latent cache
# row (kv_lora_rank + rope = 80) equals the target's and every per-head dim divides by TP 8.
MLA_KEYS = ("q_lora_rank", "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim")


def mla_draft_hub_config(target_hub, draft_vocab_size):
    """The hub config.json of the MLA head, keys as TorchSpec / SGLang write them (the set of
    tests/data/golden/mla_draft_k25/config.json) and model_type deepseek_v3 (TorchSpec's; eagle3 accepts
    deepseek_v2 / deepseek_v3 / kimi_k2). No rope scaling: the tiny target has none either."""
    c = draft_lib.head_hub_config(target_hub, draft_vocab_size)
    c.update({
        "architectures": [ARCHITECTURE],
        "model_type": "deepseek_v3",
        "num_attention_heads": target_hub["num_attention_heads"],  # 8: eagle3 shards them over TP 8
        "num_key_value_heads": target_hub["num_attention_heads"],
        "intermediate_size": 768,
    })
    c.update({k: target_hub[k] for k in MLA_KEYS})
    return dict(sorted(c.items()))


class MlaAttention(nn.Module):
    """Parameter names of the hub layout (self_attn.q_a_proj, ..., o_proj); q and kv_a read 2H."""

    def __init__(self, c):
        super().__init__()
        h, eps, heads = c["hidden_size"], c["rms_norm_eps"], c["num_attention_heads"]
        dn, dr, dv, r, qr = (c["qk_nope_head_dim"], c["qk_rope_head_dim"], c["v_head_dim"], c["kv_lora_rank"],
                             c["q_lora_rank"])
        self.heads, self.dn, self.dr, self.dv, self.r = heads, dn, dr, dv, r
        if qr is None:
            self.q_proj = linear(2 * h, heads * (dn + dr))
        else:
            self.q_a_proj, self.q_a_layernorm = linear(2 * h, qr), RMSNorm(qr, eps)
            self.q_b_proj = linear(qr, heads * (dn + dr))
        self.kv_a_proj_with_mqa = linear(2 * h, r + dr)
        self.kv_a_layernorm = RMSNorm(r, eps)
        self.kv_b_proj = linear(r, heads * (dn + dv))
        self.o_proj = linear(heads * dv, h)

    def q(self, x):
        if hasattr(self, "q_proj"):
            return self.q_proj(x)
        return self.q_b_proj(self.q_a_layernorm(self.q_a_proj(x)))


def rotate_adjacent(x, cos, sin):
    """x [..., T, d]: pairs (2i, 2i + 1) rotate by angle i (DeepSeek's RoPE); cos/sin [T, d/2]."""
    x1, x2 = x[..., 0::2], x[..., 1::2]
    return torch.stack([x1 * cos - x2 * sin, x2 * cos + x1 * sin], -1).flatten(-2)


class MlaEagle3Draft(Eagle3Draft):
    """State dict: fc.weight, midlayer.{input_layernorm, hidden_norm, self_attn.*, post_attention_layernorm,
    mlp.*}, norm.weight, lm_head.weight: the names eagle3's MlaDraftWeights reads with the midlayer. prefix."""

    ATTENTION = MlaAttention
    ROPE_DIM_KEY = "qk_rope_head_dim"

    def __init__(self, c, embed, d2t=None):
        if c.get("rope_scaling") is not None:
            raise ValueError("draft_mla: rope_scaling is not implemented here (the tiny draft uses plain RoPE)")
        super().__init__(c, embed, d2t)

    def softmax_scale(self):
        return (self.c["qk_nope_head_dim"] + self.c["qk_rope_head_dim"]) ** -0.5

    def qkv(self, x, positions):
        attn = self.midlayer.self_attn
        b, t = x.shape[:2]
        heads, dn, dr, dv, r = attn.heads, attn.dn, attn.dr, attn.dv, attn.r
        cos, sin = self.rope(positions)
        q = attn.q(x).view(b, t, heads, dn + dr).transpose(1, 2).float()
        q = torch.cat([q[..., :dn], rotate_adjacent(q[..., dn:], cos, sin)], -1)
        kv_a = attn.kv_a_proj_with_mqa(x).float()
        latent = attn.kv_a_layernorm(kv_a[..., :r])
        k_pe = rotate_adjacent(kv_a[..., r:], cos, sin)[:, None].expand(b, heads, t, dr)
        kv = attn.kv_b_proj(latent).view(b, t, heads, dn + dv).transpose(1, 2).float()
        return q, torch.cat([kv[..., :dn], k_pe], -1), kv[..., dn:]


def check_against_reference(c, seed, num_steps=3, rows=12, batch=2):
    """draft.check_against_reference for this head, against make_golden.MlaDraftReference."""
    return draft_lib.check_against_reference(c, seed, num_steps, rows, batch, model_class=MlaEagle3Draft,
                                             reference="MlaDraftReference")
