"""The DeepSeek layers of the drafters made of them (issue 21, docs/mla_drafts.md): the MLA EAGLE-3 draft
(Kimi-K2.5 style, mla_draft.py) and DeepSeek-V3's MTP module (mtp.py). MlaBlockReference is one MLA
attention block with an explicit latent cache, moe_reference DeepSeek's MoE block.

Source ids S1-S9 and M1-M8 here and in mla_draft.py and mtp.py are those of the table in docs/mla_drafts.md
"Sources". As for the Llama-style head, the drafters' expected outputs come from an independent
implementation with an explicit cache (fp32), checked against itself in fp64 and against the same drafter
assembled from transformers' DeepSeek-V3 modules (DeepseekV3Attention, DeepseekV3RotaryEmbedding,
DeepseekV3MLP, DeepseekV3DecoderLayer with its MoE, DeepseekV3RMSNorm).
"""

import torch

from .deepseek_reference import apply_rope, rms_norm, rope_tables, route, silu_mlp, yarn_get_mscale


class MlaBlockReference:
    """One MLA attention block (include/eagle3/mla_attention_config.h) with an explicit latent cache: each
    row appends [kv_a_layernorm(c) | RoPE(k_pe)] (kv_lora_rank + qk_rope_head_dim wide, the row eagle3's
    latent cache holds); k_nope and v are re-expanded from the cached latents by kv_b_proj at every call.

    `a` holds the block's MLA keys and rms_norm_eps; `rope` the RoPE keys (qk_rope_head_dim, rope_theta,
    rope_scaling in DeepSeek's form): the draft's own for an MLA draft (S2, S3, S5), the target's for the
    MTP layer. Every RMSNorm inside uses rms_norm_eps, as SGLang and vLLM build q_a_layernorm and
    kv_a_layernorm (S1, S2); transformers and DeepSeek's reference fix them at 1e-6 (the oracle is
    set to rms_norm_eps instead, see run_mla_draft_transformers)."""

    def __init__(self, a, rope, w, prefix, dtype, variant=()):
        self.a, self.rope, self.w, self.p, self.dtype, self.variant = a, rope, w, prefix, dtype, variant
        self.cache = None

    def softmax_scale(self):
        """(nope + rope)^-0.5 * m^2, m = yarn_get_mscale(factor, mscale_all_dim) under YaRN (DeepSeek's
        reference; S1, S2 for the draft; S3 trains with it)."""
        a, rs = self.a, self.rope.get("rope_scaling")
        scale = (a["qk_nope_head_dim"] + a["qk_rope_head_dim"]) ** -0.5
        if rs and rs["type"] == "yarn" and "no_m2" not in self.variant:
            scale *= yarn_get_mscale(rs["factor"], rs.get("mscale_all_dim", 0)) ** 2
        return scale

    def __call__(self, x, positions, allowed=None):
        """x [n, input_width] -> o_proj output [n, H]; appends n cache rows. `allowed` [n, cached + n] bool
        (default: causal over everything cached)."""
        a, w, p, variant = self.a, self.w, self.p, self.variant
        heads, dn, dr, dv, r = (a["num_attention_heads"], a["qk_nope_head_dim"], a["qk_rope_head_dim"],
                                a["v_head_dim"], a["kv_lora_rank"])
        eps, n = a["rms_norm_eps"], x.shape[0]
        if a["q_lora_rank"] is not None:
            q = rms_norm(x @ w[p + "q_a_proj.weight"].T, w[p + "q_a_layernorm.weight"], eps)
            q = q @ w[p + "q_b_proj.weight"].T
        else:
            q = x @ w[p + "q_proj.weight"].T  # q_lora_rank null: vLLM and TorchSpec's q_proj (S2, S3)
        q = q.view(n, heads, dn + dr).transpose(0, 1)  # [heads, n, dn + dr]
        # Angles in fp64, rounded once (as eagle3's rope table); adjacent pairs (DeepSeek; S3 trains the
        # draft with interleaved pairs).
        cos, sin = (t.to(self.dtype) for t in rope_tables(self.rope, positions, variant))
        q_nope, q_pe = q[..., :dn], apply_rope(q[..., dn:], cos, sin, variant)
        kv_a = x @ w[p + "kv_a_proj_with_mqa.weight"].T
        latent = rms_norm(kv_a[:, :r], w[p + "kv_a_layernorm.weight"], eps)
        k_pe = apply_rope(kv_a[:, r:], cos, sin, variant)
        row = torch.cat([latent, k_pe], -1)
        self.cache = row if self.cache is None else torch.cat([self.cache, row], 0)
        s = self.cache.shape[0]
        if allowed is None:
            allowed = torch.arange(s)[None, :] <= (s - n + torch.arange(n))[:, None]
        assert allowed.shape == (n, s)
        kv = (self.cache[:, :r] @ w[p + "kv_b_proj.weight"].T).view(s, heads, dn + dv).transpose(0, 1)
        k_nope, v = kv[..., :dn], kv[..., dn:]
        scores = (q_nope @ k_nope.transpose(1, 2) + q_pe @ self.cache[:, r:].T) * self.softmax_scale()
        probs = scores.masked_fill(~allowed, float("-inf")).softmax(-1)
        return (probs @ v).transpose(0, 1).reshape(n, heads * dv) @ w[p + "o_proj.weight"].T


def moe_reference(c, w, m, h, variant):
    """The MoE block of DeepSeek's reference (as reference_forward): routed experts weighted by the
    router, plus the shared experts. Returns (out, ids, weights, margin)."""
    ids, weights, margin = route(c, h, w, m, variant)
    out = torch.zeros_like(h)
    for t in range(h.shape[0]):
        for j in range(ids.shape[1]):
            out[t] += weights[t, j] * silu_mlp(h[t:t + 1], w, f"{m}experts.{ids[t, j].item()}.")[0]
    if c["n_shared_experts"]:
        out = out + silu_mlp(h, w, m + "shared_experts.")
    return out, ids, weights, margin
