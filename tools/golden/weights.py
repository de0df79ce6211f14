"""A target checkpoint's weights, by hub name, in the order eagle3's schema lists them
(src/deepseek_v2_weights.cc, src/mla_attention_weights.cc, src/mtp_weights.cc): the main layers and, for a
target that has one, DeepSeek-V3's MTP module (layer L = num_hidden_layers, stored in the same checkpoint);
their random bf16-valued values; and the hub names mapped onto transformers' fused experts.
"""

import math

import torch


def is_moe_layer(c, layer):
    return (c["n_routed_experts"] is not None and layer >= c["first_k_dense_replace"]
            and layer % c["moe_layer_freq"] == 0)


def weight_shapes(c):
    """The target forward's weights (not the MTP modules: mtp_weight_shapes)."""
    h = c["hidden_size"]
    shapes = [("model.embed_tokens.weight", (c["vocab_size"], h))]
    for layer in range(c["num_hidden_layers"]):
        shapes += layer_shapes(c, layer)
    shapes.append(("model.norm.weight", (h,)))
    shapes.append(("lm_head.weight", (c["vocab_size"], h)))
    return shapes


def mla_attention_shapes(a, prefix, input_width):
    """One MLA block's weights (src/mla_attention_weights.cc) for an input of `input_width` columns: H
    in a target or MTP layer, 2H in an MLA EAGLE-3 draft layer. `a` holds the MLA keys of a config."""
    heads, h = a["num_attention_heads"], a["hidden_size"]
    qk = a["qk_nope_head_dim"] + a["qk_rope_head_dim"]
    shapes = []
    if a["q_lora_rank"] is not None:
        shapes += [(prefix + "q_a_proj.weight", (a["q_lora_rank"], input_width)),
                   (prefix + "q_a_layernorm.weight", (a["q_lora_rank"],)),
                   (prefix + "q_b_proj.weight", (heads * qk, a["q_lora_rank"]))]
    else:
        shapes.append((prefix + "q_proj.weight", (heads * qk, input_width)))
    shapes += [(prefix + "kv_a_proj_with_mqa.weight", (a["kv_lora_rank"] + a["qk_rope_head_dim"], input_width)),
               (prefix + "kv_a_layernorm.weight", (a["kv_lora_rank"],)),
               (prefix + "kv_b_proj.weight", (heads * (a["qk_nope_head_dim"] + a["v_head_dim"]), a["kv_lora_rank"])),
               (prefix + "o_proj.weight", (h, heads * a["v_head_dim"]))]
    return shapes


def mlp_shapes(prefix, h, inter):
    return [(prefix + "gate_proj.weight", (inter, h)), (prefix + "up_proj.weight", (inter, h)),
            (prefix + "down_proj.weight", (h, inter))]


def layer_shapes(c, layer):
    """Decoder layer `layer` (DeepseekDecoderLayerWeights in src/deepseek_v2_weights.cc), main or MTP."""
    h = c["hidden_size"]
    p = f"model.layers.{layer}."
    shapes = [(p + "input_layernorm.weight", (h,)), (p + "post_attention_layernorm.weight", (h,))]
    shapes += mla_attention_shapes(c, p + "self_attn.", h)
    m = p + "mlp."
    if not is_moe_layer(c, layer):
        return shapes + mlp_shapes(m, h, c["intermediate_size"])
    shapes.append((m + "gate.weight", (c["n_routed_experts"], h)))
    if c["topk_method"] == "noaux_tc":
        shapes.append((m + "gate.e_score_correction_bias", (c["n_routed_experts"],)))
    for e in range(c["n_routed_experts"]):
        shapes += mlp_shapes(f"{m}experts.{e}.", h, c["moe_intermediate_size"])
    if c["n_shared_experts"]:
        shapes += mlp_shapes(m + "shared_experts.", h, c["moe_intermediate_size"] * c["n_shared_experts"])
    return shapes


def random_weights(c, seed, router_std):
    """Random weights with O(1) activations through the layers, rounded to bf16 values (fp32 tensors).

    Linears: N(0, 1/fan_in); the router gate N(0, router_std^2/fan_in) so routing is decisive yet varies
    by token; embedding N(0, 1); RMSNorm weights N(1, 0.1^2); correction bias U(0.05, 0.5), positive
    (as trained biases are, and so the reference's 0-fill of masked groups equals transformers' -inf).
    """
    g = torch.Generator().manual_seed(seed)
    weights = {}
    for name, shape in weight_shapes(c):
        if name.endswith("e_score_correction_bias"):
            w = 0.05 + 0.45 * torch.rand(shape, generator=g, dtype=torch.float64)
        elif len(shape) == 1:
            w = 1.0 + 0.1 * torch.randn(shape, generator=g, dtype=torch.float64)
        elif name == "model.embed_tokens.weight":
            w = torch.randn(shape, generator=g, dtype=torch.float64)
        else:
            std = (router_std if name.endswith("mlp.gate.weight") else 1.0) / math.sqrt(shape[1])
            w = std * torch.randn(shape, generator=g, dtype=torch.float64)
        weights[name] = w.to(torch.bfloat16).to(torch.float32)
    return weights


def hub_to_transformers(c, hub):
    """transformers 5 keeps each MoE layer's experts fused: gate_up_proj [E, 2I, H] (gate rows first,
    as its forward chunks them) and down_proj [E, H, I]; the correction bias is a buffer of the gate."""
    out = {}
    experts = c["n_routed_experts"] or 0
    for name, w in hub.items():
        if ".mlp.experts." not in name:
            out[name] = w
    for layer in range(c["num_hidden_layers"]):
        if not is_moe_layer(c, layer):
            continue
        p = f"model.layers.{layer}.mlp.experts."
        out[p + "gate_up_proj"] = torch.stack(
            [torch.cat([hub[f"{p}{e}.gate_proj.weight"], hub[f"{p}{e}.up_proj.weight"]], 0) for e in range(experts)])
        out[p + "down_proj"] = torch.stack([hub[f"{p}{e}.down_proj.weight"] for e in range(experts)])
    return out


def mtp_weight_shapes(c):
    """MTP module 0 in the order of eagle3's schema (MtpModuleWeights, then MtpSharedCopyWeights;
    src/mtp_weights.cc): layer L = num_hidden_layers (M1: "layer IDs appended immediately after the Main
    Model hidden layers"); a full decoder layer whose MLP follows the layer-index rule (MoE for V3, M2/M4/M5)."""
    h, v, layer = c["hidden_size"], c["vocab_size"], c["num_hidden_layers"]
    p = f"model.layers.{layer}."
    shapes = [(p + "enorm.weight", (h,)), (p + "hnorm.weight", (h,)), (p + "eh_proj.weight", (h, 2 * h))]
    shapes += layer_shapes(c, layer)
    shapes.append((p + "shared_head.norm.weight", (h,)))
    shapes += [(p + "embed_tokens.weight", (v, h)), (p + "shared_head.head.weight", (v, h))]
    return shapes


def random_mtp_weights(c, seed, router_std):
    """As random_weights. The copies of the embedding and head get values of their own (N(0, 1) and
    N(0, 1/H)), unlike the published checkpoints where they equal the target's: a drafter that reads them
    instead of the target's embedding and head fails the fixture (MTP_SENSITIVITY read_copies)."""
    g = torch.Generator().manual_seed(seed)
    weights = {}
    for name, shape in mtp_weight_shapes(c):
        if name.endswith("e_score_correction_bias"):
            w = 0.05 + 0.45 * torch.rand(shape, generator=g, dtype=torch.float64)
        elif len(shape) == 1:
            w = 1.0 + 0.1 * torch.randn(shape, generator=g, dtype=torch.float64)
        elif name.endswith(".embed_tokens.weight"):
            w = torch.randn(shape, generator=g, dtype=torch.float64)
        else:
            std = (router_std if name.endswith("mlp.gate.weight") else 1.0) / math.sqrt(shape[1])
            w = std * torch.randn(shape, generator=g, dtype=torch.float64)
        weights[name] = w.to(torch.bfloat16).to(torch.float32)
    return weights
