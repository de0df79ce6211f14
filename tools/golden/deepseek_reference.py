"""Independent fp64 implementation of DeepSeek's reference math (modeling_deepseek.py of
deepseek-ai/DeepSeek-V2 and -V3; written from DeepSeek's code, not from transformers): YaRN, adjacent-pair
RoPE, RMSNorm, the SiLU MLP, the V2 and V3 routers, and the target forward (reference_forward).

transformers must agree with it on every target fixture (target.build). `variant` switches one detail to a
plausible mistake, to measure how strongly each fixture pins that detail down (target.SENSITIVITY). The
drafters' references (deepseek_layers.py, llama_draft.py, mtp.py, mla_draft.py) are built from its pieces.
"""

import math

import torch

from .weights import is_moe_layer


# Smallest routing gap (fp64 reference) accepted: a near-tie could flip an expert choice between
# implementations that round differently, which would make a fixture flaky rather than wrong.
MIN_ROUTING_MARGIN = 2e-3


def yarn_get_mscale(scale, mscale):
    return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0


def yarn_inv_freq(inv_freq, dim, base, rs):
    """YaRN's frequencies (the YaRN paper, as DeepSeek's and transformers' code compute them): the
    low-rotation pairs divided by factor, the high-rotation ones kept, a linear ramp between."""
    factor, orig = rs["factor"], rs["original_max_position_embeddings"]

    def correction_dim(rotations):
        return dim * math.log(orig / (rotations * 2 * math.pi)) / (2 * math.log(base))

    low = max(math.floor(correction_dim(rs.get("beta_fast", 32))), 0)
    high = min(math.ceil(correction_dim(rs.get("beta_slow", 1))), dim - 1)
    if low == high:
        high += 0.001
    ramp = ((torch.arange(dim // 2, dtype=torch.float64) - low) / (high - low)).clamp(0, 1)
    extra_mask = 1.0 - ramp
    return inv_freq / factor * (1 - extra_mask) + inv_freq * extra_mask


def rope_tables(c, positions, variant):
    dim, base = c["qk_rope_head_dim"], c["rope_theta"]
    rs = c.get("rope_scaling")
    exponents = torch.arange(0, dim, 2, dtype=torch.float64) / dim
    inv_freq = 1.0 / base**exponents
    attn_factor = 1.0
    if rs and rs["type"] == "yarn" and "no_yarn_freq" not in variant:
        inv_freq = yarn_inv_freq(inv_freq, dim, base, rs)
    if rs and rs["type"] == "yarn" and "no_attn_factor" not in variant:
        attn_factor = (yarn_get_mscale(rs["factor"], rs.get("mscale", 1))
                       / yarn_get_mscale(rs["factor"], rs.get("mscale_all_dim", 0)))
    angles = positions.to(torch.float64)[:, None] * inv_freq[None, :]
    return angles.cos() * attn_factor, angles.sin() * attn_factor


def apply_rope(x, cos, sin, variant):
    """x [..., T, dim]. DeepSeek rotates adjacent pairs (2i, 2i+1) by angle i (its code de-interleaves
    and applies rotate_half, which is the same rotation); 'neox_rope' rotates (i, i + dim/2) instead."""
    if "neox_rope" in variant:
        half = x.shape[-1] // 2
        x1, x2 = x[..., :half], x[..., half:]
        return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], -1)
    x1, x2 = x[..., 0::2], x[..., 1::2]
    return torch.stack([x1 * cos - x2 * sin, x2 * cos + x1 * sin], -1).flatten(-2)


def rms_norm(x, w, eps):
    return w * (x / torch.sqrt((x * x).mean(-1, keepdim=True) + eps))


def silu_mlp(x, w, prefix):
    return (torch.nn.functional.silu(x @ w[prefix + "gate_proj.weight"].T) * (x @ w[prefix + "up_proj.weight"].T)) @ \
        w[prefix + "down_proj.weight"].T


def route(c, x, w, p, variant):
    """Returns (ids [T, K], weights [T, K], margin): margin = smallest gap, over tokens, between the last
    chosen and the first rejected score at each selection stage (groups, then experts)."""
    logits = x @ w[p + "gate.weight"].T
    experts, k = c["n_routed_experts"], c["num_experts_per_tok"]
    groups, keep = c["n_group"] or 1, c["topk_group"] or 1
    margins = []

    def top(scores, n):
        ordered = scores.sort(-1, descending=True).values
        if n < scores.shape[-1]:
            margins.append((ordered[:, n - 1] - ordered[:, n]).min().item())
        return scores.topk(n, -1).indices

    if c["scoring_func"] == "softmax":
        scores = logits.softmax(-1)
        choice = scores
    else:
        scores = logits.sigmoid()
        choice = scores if "no_bias" in variant else scores + w[p + "gate.e_score_correction_bias"]
    if c["topk_method"] != "greedy" and "no_groups" not in variant:
        grouped = choice.view(-1, groups, experts // groups)
        group_scores = grouped.max(-1).values if c["topk_method"] == "group_limited_greedy" else \
            grouped.topk(2, -1).values.sum(-1)
        mask = torch.zeros_like(group_scores).scatter_(1, top(group_scores, keep), 1.0)
        mask = mask[:, :, None].expand(-1, -1, experts // groups).reshape(-1, experts)
        # DeepSeek's code fills masked experts with 0; scores here are all positive, so this is -inf.
        choice = choice.masked_fill(mask == 0, float("-inf"))
    ids = top(choice, k)
    weights = scores.gather(1, ids)
    norm = c["norm_topk_prob"] != ("flip_norm_topk_prob" in variant)
    if c["scoring_func"] == "softmax":
        # V2 reference: normalize *or* scale.
        weights = weights / (weights.sum(-1, keepdim=True) + 1e-20) if norm and k > 1 else \
            weights * c["routed_scaling_factor"]
    else:
        # V3 reference: normalize, then scale.
        if norm and k > 1:
            weights = weights / (weights.sum(-1, keepdim=True) + 1e-20)
        weights = weights * c["routed_scaling_factor"]
    if "rsf_twice" in variant:
        weights = weights * c["routed_scaling_factor"]
    order = ids.argsort(-1)
    return ids.gather(1, order), weights.gather(1, order), min(margins)


def reference_forward(c, hub, tokens, variant=()):
    w = {n: t.to(torch.float64) for n, t in hub.items()}
    heads, dn, dr, dv = (c["num_attention_heads"], c["qk_nope_head_dim"], c["qk_rope_head_dim"],
                         c["v_head_dim"])
    eps, latent_eps = c["rms_norm_eps"], 1e-6  # reference: fixed 1e-6 for q_a/kv_a layernorm
    num_tokens = tokens.shape[0]
    rs = c.get("rope_scaling")
    scale = (dn + dr) ** -0.5
    if rs and rs["type"] == "yarn" and "no_m2" not in variant:
        scale *= yarn_get_mscale(rs["factor"], rs.get("mscale_all_dim", 0)) ** 2
    cos, sin = rope_tables(c, torch.arange(num_tokens), variant)
    causal = torch.ones(num_tokens, num_tokens, dtype=torch.bool).tril()

    x = w["model.embed_tokens.weight"][tokens]
    boundaries, routing, margin = [x], {}, float("inf")
    for layer in range(c["num_hidden_layers"]):
        p = f"model.layers.{layer}."
        a = p + "self_attn."
        h = rms_norm(x, w[p + "input_layernorm.weight"], eps)
        if c["q_lora_rank"] is not None:
            q = rms_norm(h @ w[a + "q_a_proj.weight"].T, w[a + "q_a_layernorm.weight"], latent_eps)
            q = q @ w[a + "q_b_proj.weight"].T
        else:
            q = h @ w[a + "q_proj.weight"].T
        q = q.view(num_tokens, heads, dn + dr).transpose(0, 1)  # [heads, T, dn + dr]
        q_nope, q_pe = q[..., :dn], apply_rope(q[..., dn:], cos, sin, variant)
        kv_a = h @ w[a + "kv_a_proj_with_mqa.weight"].T
        latent = rms_norm(kv_a[:, :c["kv_lora_rank"]], w[a + "kv_a_layernorm.weight"], latent_eps)
        k_pe = apply_rope(kv_a[:, c["kv_lora_rank"]:], cos, sin, variant)  # [T, dr], shared by all heads
        kv = (latent @ w[a + "kv_b_proj.weight"].T).view(num_tokens, heads, dn + dv).transpose(0, 1)
        k_nope, v = kv[..., :dn], kv[..., dn:]
        scores = (q_nope @ k_nope.transpose(1, 2) + q_pe @ k_pe.T) * scale
        probs = scores.masked_fill(~causal, float("-inf")).softmax(-1)
        attn = (probs @ v).transpose(0, 1).reshape(num_tokens, heads * dv)
        x = x + attn @ w[a + "o_proj.weight"].T

        h = rms_norm(x, w[p + "post_attention_layernorm.weight"], eps)
        m = p + "mlp."
        if is_moe_layer(c, layer):
            ids, weights, layer_margin = route(c, h, w, m, variant)
            routing[layer] = (ids, weights)
            margin = min(margin, layer_margin)
            out = torch.zeros_like(h)
            for t in range(num_tokens):
                for j in range(ids.shape[1]):
                    e = ids[t, j].item()
                    out[t] += weights[t, j] * silu_mlp(h[t:t + 1], w, f"{m}experts.{e}.")[0]
            if c["n_shared_experts"]:
                out = out + silu_mlp(h, w, m + "shared_experts.")
        else:
            out = silu_mlp(h, w, m)
        x = x + out
        boundaries.append(x)
    logits = rms_norm(x, w["model.norm.weight"], eps) @ w["lm_head.weight"].T
    return logits, boundaries, routing, margin
