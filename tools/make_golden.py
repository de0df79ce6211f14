#!/usr/bin/env python3
"""Golden fixtures for eagle3's DeepSeek-V2-family target forward and its EAGLE-3 draft step.

For each tiny model below this script writes, under OUT/<name>/:
  config.json                        hub form (rope_theta + rope_scaling, model_type, architectures)
  model-0000{1,2}-of-00002.safetensors + model.safetensors.index.json
                                     hub tensor names and layouts, bf16 (V3's
                                     e_score_correction_bias in f32, as real V3/K2 checkpoints store it)
  expected.safetensors               tokens i64 [T]; logits f32 [T, V]; boundary.<b> f32 [T, H] for
                                     b = 0..L (b = 0 embedding output, b = i input of layer i, b = L output
                                     of the last layer before the final norm); router.<l>.topk_ids i64 [T, K]
                                     and router.<l>.topk_weights f32 [T, K] for every MoE layer l (sorted
                                     by expert id; weights as multiplied into the expert outputs)
and OUT/README.md describing them.

The oracle is transformers' DeepseekV2ForCausalLM / DeepseekV3ForCausalLM (fp32, eager attention, eager
experts) loaded with from_pretrained from the written checkpoint. The same weights are also loaded by
a direct hub->transformers mapping, and run through an independent fp64 implementation of DeepSeek's
reference math (written from DeepSeek's modeling_deepseek.py, not from transformers); all three must
agree or the script fails. The fp64 implementation also measures how much each semantic detail the
fixtures are meant to pin down (YaRN m^2, YaRN frequencies, adjacent-pair RoPE, routing details) moves
the logits, so a reader can see that a fixture would catch that mistake.

Two target fixtures are quantized as the published checkpoints are (issue 20): `v3_fp8` in DeepSeek-V3's
FP8 form (quantization_config quant_method "fp8", e4m3 `X.weight` with f32 `X.weight_scale_inv` per
128 x 128 block, every Linear but lm_head) and `k25_int4` in Kimi-K2.5's form (model_type kimi_k25, the
text model as text_config, tensors under `language_model.`, compressed-tensors pack-quantized int4 with
group 32 and the hub's ignore list, so only the routed experts are quantized: `X.weight_packed`,
`X.weight_scale`, `X.weight_shape`). Their config.json carries the quantization_config and their shards
the quantized tensors; the references run on the weights those dequantize to, as eagle3's CPU reference
documents it (include/eagle3/detail/quantized_weights.h: fp8 code x scale_inv in f32, int4 q x scale),
and the transformers oracle loads an unquantized f32 checkpoint of those weights from a temporary
directory (transformers loads neither quantized form here). The written shards are decoded again from
the files and must equal those weights bit for bit.

Then, for each draft in DRAFTS, OUT/<name>/ holds a random EAGLE-3 draft head on top of one target
fixture (config.json in SpecForge's LlamaForCausalLMEagle3 form, model.safetensors with fc, the decoder
layer, norm, lm_head, d2t and t2d) and expected.safetensors: the aux input taken from the target's
boundaries, the draft tokens, and the logits and fed-back hidden of a causal pass over every row plus
one more row decoded from the last row's fed-back hidden. Those come from an independent fp32
implementation of the draft step, cross-checked against itself in fp64 and against the same draft
assembled from transformers' Llama modules. A draft with "trees" also gets tree.safetensors: the
EAGLE-2 dynamic trees (include/eagle3/draft_tree.h) that the decode loop builds after the target's
prompt, from an independent implementation of the build over the same draft reference.

The drafters made of DeepSeek layers (issue 21, docs/mla_drafts.md) get the same treatment. For each draft
in MLA_DRAFTS, OUT/<name>/ holds a random MLA EAGLE-3 draft (Kimi-K2.5 style: one MLA layer with a 2H
input and a dense MLP, Eagle3DeepseekV2ForCausalLM config, model.safetensors under `midlayer.` or
`layers.0.`) on the `k25_int4` target, with expected.safetensors in the Llama-style draft's layout (and
tree.safetensors); the target fixture `v3_mtp` carries DeepSeek-V3's MTP module in its checkpoint (layer
L = num_hidden_layers) and gets mtp_expected.safetensors (the module fed the target's final hidden after
model.norm, two steps, and a CONTROL fed the pre-norm boundary L) and mtp_tree.safetensors. Their
expected outputs come from independent fp32 implementations (explicit latent cache), cross-checked in
fp64 and against the same drafters assembled from transformers' DeepSeek-V3 modules.

Usage: python3 tools/make_golden.py --out tests/data/golden [--only NAME ...]
The fixtures of issue 21 alone: --only v3_mtp mla_draft_k25 mla_draft_k25_eagle31 (the MLA drafts read
k25_int4 from --out).
--only builds just the named fixtures (e.g. `--only v3_fp8 k25_int4`), rewriting nothing else: not the
other fixtures, not README.md (it prints the README sections of what it built, to merge by hand).
Deterministic (one CPU thread, deterministic kernels, fixed seeds): a rerun reproduces every file byte
for byte on the generating host; across hosts configs, checkpoints and integer outputs are identical
and float outputs may differ by ~1e-6 relative (CPU kernel differences).
Needs torch, transformers, safetensors and numpy (versions used: see OUT/README.md).
"""

import argparse
import copy
import json
import math
import os
import re
import shutil
import struct
import sys
import tempfile

import torch
import transformers
from safetensors import safe_open
from safetensors.torch import load_file

# One thread and deterministic kernels: reruns on one host reproduce the files byte for byte (float
# outputs may differ by ~1e-6 relative across hosts).
torch.set_num_threads(1)
torch.use_deterministic_algorithms(True)

# Smallest routing gap (fp64 reference) accepted: a near-tie could flip an expert choice between
# implementations that round differently, which would make a fixture flaky rather than wrong.
MIN_ROUTING_MARGIN = 2e-3

# ---------------------------------------------------------------------------------------------------
# Models. Every dim shards 8 ways (heads, intermediate_size, moe_intermediate_size); rms_norm_eps is
# 1e-6 as in every real config (DeepSeek's reference and transformers use a fixed 1e-6 for
# q_a_layernorm / kv_a_layernorm, SGLang/vLLM/eagle3 use rms_norm_eps: identical only at 1e-6).

COMMON_HUB_KEYS = {
    "attention_bias": False,
    "attention_dropout": 0.0,
    "aux_loss_alpha": 0.001,
    "bos_token_id": 0,
    "eos_token_id": 1,
    "ep_size": 1,
    "hidden_act": "silu",
    "initializer_range": 0.02,
    "moe_layer_freq": 1,
    "num_key_value_heads": None,  # filled with num_attention_heads
    "pretraining_tp": 1,
    "rms_norm_eps": 1e-6,
    "rope_theta": 10000.0,
    "seq_aux": True,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "use_cache": True,
}

MODELS = [
    {
        "name": "v2_qlora_yarn",
        "seed": 1001,
        "num_tokens": 16,
        "router_std": 2.0,
        "what": "DeepSeek-V2 shape: q_lora_rank (q_a_proj -> q_a_layernorm -> q_b_proj); YaRN x4 with "
        "mscale = mscale_all_dim = 0.707 (softmax scale m^2 = {m2:.6f}, cos/sin factor 1); "
        "softmax routing with group_limited_greedy (group max), n_group 4 / topk_group 2, top-3 of 16; "
        "norm_topk_prob false with routed_scaling_factor 3.0; 2 shared experts; first_k_dense_replace 1; "
        "vocab 1000 (padded to 1024 at TP 8: the last rank holds 104 real rows).",
        "config": {
            "architectures": ["DeepseekV2ForCausalLM"],
            "model_type": "deepseek_v2",
            "vocab_size": 1000,
            "hidden_size": 64,
            "intermediate_size": 128,
            "moe_intermediate_size": 16,
            "num_hidden_layers": 4,
            "num_attention_heads": 8,
            "n_routed_experts": 16,
            "n_shared_experts": 2,
            "num_experts_per_tok": 3,
            "routed_scaling_factor": 3.0,
            "scoring_func": "softmax",
            "topk_method": "group_limited_greedy",
            "n_group": 4,
            "topk_group": 2,
            "norm_topk_prob": False,
            "first_k_dense_replace": 1,
            "q_lora_rank": 32,
            "kv_lora_rank": 32,
            "qk_nope_head_dim": 16,
            "qk_rope_head_dim": 16,
            "v_head_dim": 16,
            "max_position_embeddings": 256,
            "rope_scaling": {
                "type": "yarn",
                "factor": 4.0,
                "original_max_position_embeddings": 64,
                "beta_fast": 32,
                "beta_slow": 1,
                "mscale": 0.707,
                "mscale_all_dim": 0.707,
            },
        },
    },
    {
        "name": "v2lite_greedy",
        "seed": 2002,
        "num_tokens": 12,
        "router_std": 2.0,
        "what": "DeepSeek-V2-Lite shape: q_lora_rank null (plain q_proj); no rope scaling "
        "(`rope_scaling: null`, softmax scale qk_head_dim^-0.5); 16 heads (2 per rank at TP 8); "
        "softmax routing, greedy top-2 of 8; norm_topk_prob false, routed_scaling_factor 1.0; "
        "1 shared expert; first_k_dense_replace 1; vocab 512 (no padding at TP 8).",
        "config": {
            "architectures": ["DeepseekV2ForCausalLM"],
            "model_type": "deepseek_v2",
            "vocab_size": 512,
            "hidden_size": 64,
            "intermediate_size": 128,
            "moe_intermediate_size": 16,
            "num_hidden_layers": 3,
            "num_attention_heads": 16,
            "n_routed_experts": 8,
            "n_shared_experts": 1,
            "num_experts_per_tok": 2,
            "routed_scaling_factor": 1.0,
            "scoring_func": "softmax",
            "topk_method": "greedy",
            "n_group": 1,
            "topk_group": 1,
            "norm_topk_prob": False,
            "first_k_dense_replace": 1,
            "q_lora_rank": None,
            "kv_lora_rank": 32,
            "qk_nope_head_dim": 16,
            "qk_rope_head_dim": 8,
            "v_head_dim": 16,
            "max_position_embeddings": 256,
            "rope_scaling": None,
        },
    },
    {
        "name": "v3_noaux",
        "seed": 3003,
        "num_tokens": 13,
        "router_std": 1.5,
        "what": "DeepSeek-V3 shape: q_lora_rank; YaRN x8 with mscale 1.0 and mscale_all_dim 0.8 (softmax "
        "scale m^2 = {m2:.6f}; cos/sin factor mscale ratio {af:.6f} != 1, unlike the real V3 where "
        "both are 1.0); sigmoid routing, noaux_tc with a random positive e_score_correction_bias "
        "(selection only), n_group 4 / topk_group 2 (group score = sum of top-2), top-4 of 16; "
        "norm_topk_prob true then routed_scaling_factor 2.5; 1 shared expert; first_k_dense_replace 1; "
        "hidden 96; vocab 515 (padded to 1024 at TP 8: ranks 5..7 hold only padding, rank 4 holds 3 "
        "real rows); num_nextn_predict_layers 0.",
        "config": {
            "architectures": ["DeepseekV3ForCausalLM"],
            "model_type": "deepseek_v3",
            "vocab_size": 515,
            "hidden_size": 96,
            "intermediate_size": 192,
            "moe_intermediate_size": 16,
            "num_hidden_layers": 4,
            "num_attention_heads": 8,
            "n_routed_experts": 16,
            "n_shared_experts": 1,
            "num_experts_per_tok": 4,
            "routed_scaling_factor": 2.5,
            "scoring_func": "sigmoid",
            "topk_method": "noaux_tc",
            "n_group": 4,
            "topk_group": 2,
            "norm_topk_prob": True,
            "first_k_dense_replace": 1,
            "q_lora_rank": 48,
            "kv_lora_rank": 32,
            "qk_nope_head_dim": 16,
            "qk_rope_head_dim": 16,
            "v_head_dim": 16,
            "max_position_embeddings": 256,
            "num_nextn_predict_layers": 0,
            "rope_scaling": {
                "type": "yarn",
                "factor": 8.0,
                "original_max_position_embeddings": 32,
                "beta_fast": 32,
                "beta_slow": 1,
                "mscale": 1.0,
                "mscale_all_dim": 0.8,
            },
        },
    },
    # Quantized targets (issue 20): the checkpoint holds the quantized hub form; the references run
    # on the weights it dequantizes to (see QUANT_FORMATS).
    {
        "name": "v3_fp8",
        "seed": 6006,
        "num_tokens": 13,
        "router_std": 1.5,
        "quant": "fp8",
        "what": "DeepSeek-V3 FP8 hub form (quantization_config {{\"quant_method\": \"fp8\", \"fmt\": \"e4m3\", "
        "\"activation_scheme\": \"dynamic\", \"weight_block_size\": [128, 128]}}): every Linear but lm_head "
        "stored as F8_E4M3 `X.weight` with f32 `X.weight_scale_inv` [ceil(out/128), ceil(in/128)] (attention, "
        "dense MLP, routed and shared experts); embedding, norms, router, correction bias and lm_head bf16 "
        "(the bias f32). Dims are not multiples of 128, so blocks are partial in both directions: hidden 144 "
        "(2 column blocks: 128 + 16), q_b_proj [192, 48], kv_b_proj [320, 32], o_proj [144, 192], dense "
        "gate/up [200, 144] and down [144, 200]; at TP 8 the row slices of q_b (24), kv_b (40) and "
        "gate/up (25) and the column slices of o_proj (24) and down (25) start inside a 128-block. "
        "Otherwise a sibling of `v3_noaux`: YaRN x4 with mscale = mscale_all_dim = 1.0 as in the real V3 "
        "(softmax scale m^2 = {m2:.6f}, cos/sin factor {af:.6f}); sigmoid noaux_tc routing with a positive "
        "correction bias, n_group 4 / topk_group 2, top-2 of 8; norm_topk_prob true, routed_scaling_factor "
        "2.5; 1 shared expert; first_k_dense_replace 1; vocab 300 (padded at TP 8).",
        "config": {
            "architectures": ["DeepseekV3ForCausalLM"],
            "model_type": "deepseek_v3",
            "vocab_size": 300,
            "hidden_size": 144,
            "intermediate_size": 200,
            "moe_intermediate_size": 24,
            "num_hidden_layers": 3,
            "num_attention_heads": 8,
            "n_routed_experts": 8,
            "n_shared_experts": 1,
            "num_experts_per_tok": 2,
            "routed_scaling_factor": 2.5,
            "scoring_func": "sigmoid",
            "topk_method": "noaux_tc",
            "n_group": 4,
            "topk_group": 2,
            "norm_topk_prob": True,
            "first_k_dense_replace": 1,
            "q_lora_rank": 48,
            "kv_lora_rank": 32,
            "qk_nope_head_dim": 16,
            "qk_rope_head_dim": 8,
            "v_head_dim": 24,
            "max_position_embeddings": 256,
            "num_nextn_predict_layers": 0,
            "rope_scaling": {
                "type": "yarn",
                "factor": 4.0,
                "original_max_position_embeddings": 64,
                "beta_fast": 32,
                "beta_slow": 1,
                "mscale": 1.0,
                "mscale_all_dim": 1.0,
            },
        },
    },
    {
        "name": "k25_int4",
        "seed": 7007,
        "num_tokens": 12,
        "router_std": 1.5,
        "quant": "int4",
        "what": "Kimi-K2.5 hub form: config.json with `model_type` kimi_k25, the text model (a DeepSeek-V3 "
        "config) as `text_config`, a tiny `vision_config`, and the compressed-tensors quantization_config "
        "(pack-quantized, num_bits 4, group_size 32, symmetric, strategy group) in text_config and at the "
        "top level, with the hub's ignore list [\"lm_head\", \"re:.*self_attn.*\", \"re:.*shared_experts.*\", "
        "\"re:.*mlp\\\\.(gate|up|gate_up|down)_proj.*\"], so only the routed experts are quantized: "
        "`X.weight_packed` I32 [out, in/8], `X.weight_scale` bf16 [out, in/32], `X.weight_shape` I32 [2]; every "
        "language-model tensor under `language_model.`, next to four tiny bf16 vision tower / projector "
        "tensors (not part of the text model). Experts [96, 64] (gate/up) and [64, 96] (down): at TP 8 the "
        "down_proj column slices of 12 start inside an int32 word and inside a group. Text model as in "
        "K2.5: sigmoid noaux_tc with n_group 1 / topk_group 1 (plain top-k over biased scores), top-3 of 8, "
        "norm_topk_prob true, routed_scaling_factor 2.827, 1 shared expert, first_k_dense_replace 1, "
        "rope_theta 50000, YaRN x4 with mscale = mscale_all_dim = 1.0 (softmax scale m^2 = {m2:.6f}, "
        "cos/sin factor {af:.6f}); rms_norm_eps 1e-6 (K2.5: 1e-5; see \"Latent norms\"); vocab 400.",
        "config": {
            "architectures": ["DeepseekV3ForCausalLM"],
            "model_type": "deepseek_v3",
            "vocab_size": 400,
            "hidden_size": 64,
            "intermediate_size": 128,
            "moe_intermediate_size": 96,
            "num_hidden_layers": 3,
            "num_attention_heads": 8,
            "n_routed_experts": 8,
            "n_shared_experts": 1,
            "num_experts_per_tok": 3,
            "routed_scaling_factor": 2.827,
            "scoring_func": "sigmoid",
            "topk_method": "noaux_tc",
            "n_group": 1,
            "topk_group": 1,
            "norm_topk_prob": True,
            "first_k_dense_replace": 1,
            "q_lora_rank": 32,
            "kv_lora_rank": 32,
            "qk_nope_head_dim": 16,
            "qk_rope_head_dim": 16,
            "v_head_dim": 16,
            "max_position_embeddings": 256,
            "num_nextn_predict_layers": 0,
            "rope_theta": 50000.0,
            "rope_scaling": {
                "type": "yarn",
                "factor": 4.0,
                "original_max_position_embeddings": 64,
                "beta_fast": 32,
                "beta_slow": 1,
                "mscale": 1.0,
                "mscale_all_dim": 1.0,
            },
        },
    },
    # A V3 target with its MTP module (issue 21): the checkpoint carries layer L = num_hidden_layers as
    # DeepSeek-V3 carries layer 61; "mtp" describes the MTP fixtures written beside the target's.
    {
        "name": "v3_mtp",
        "seed": 8008,
        "num_tokens": 12,
        "router_std": 1.5,
        "mtp": {
            "seed": 8101,
            "last_token": 77,
            "step1_token": 5,
            # As draft_v2's trees: name, topk, num_steps, num_draft_tokens.
            "trees": [("k3_s3_n8", 3, 3, 8), ("k1_s4_n5", 1, 4, 5), ("k2_s5_n10", 2, 5, 10), ("k4_s4_n16", 4, 4, 16)],
        },
        "what": "DeepSeek-V3 shape with one MTP module (`num_nextn_predict_layers` 1): 2 main layers (layer 0 "
        "dense, layer 1 MoE) and the module at layer 2 (`model.layers.2.*`: enorm, hnorm, eh_proj [32, 64], a "
        "full MoE decoder layer, shared_head.norm, and the copies `embed_tokens` / `shared_head.head` that "
        "DeepSeek-V3 stores with the module). YaRN x4 with mscale = mscale_all_dim = 1.0 as in the real V3 "
        "(softmax scale m^2 = {m2:.6f}, cos/sin factor {af:.6f}); sigmoid noaux_tc routing with a positive "
        "correction bias, n_group 4 / topk_group 2, top-2 of 8; norm_topk_prob true, routed_scaling_factor 2.5; "
        "1 shared expert; first_k_dense_replace 1; hidden 32 (the narrowest fixture, which keeps its three layers "
        "and four [V, H] tables small); qk_rope_head_dim 8; vocab 130 (padded to 136 at TP 8: the "
        "last rank holds 11 real rows). The target files are those of every target fixture; the MTP fixtures "
        "are described in \"MTP fixtures\".",
        "config": {
            "architectures": ["DeepseekV3ForCausalLM"],
            "model_type": "deepseek_v3",
            "vocab_size": 130,
            "hidden_size": 32,
            "intermediate_size": 64,
            "moe_intermediate_size": 16,
            "num_hidden_layers": 2,
            "num_attention_heads": 8,
            "n_routed_experts": 8,
            "n_shared_experts": 1,
            "num_experts_per_tok": 2,
            "routed_scaling_factor": 2.5,
            "scoring_func": "sigmoid",
            "topk_method": "noaux_tc",
            "n_group": 4,
            "topk_group": 2,
            "norm_topk_prob": True,
            "first_k_dense_replace": 1,
            "q_lora_rank": 32,
            "kv_lora_rank": 32,
            "qk_nope_head_dim": 16,
            "qk_rope_head_dim": 8,
            "v_head_dim": 16,
            "max_position_embeddings": 256,
            "num_nextn_predict_layers": 1,
            "rope_scaling": {
                "type": "yarn",
                "factor": 4.0,
                "original_max_position_embeddings": 64,
                "beta_fast": 32,
                "beta_slow": 1,
                "mscale": 1.0,
                "mscale_all_dim": 1.0,
            },
        },
    },
]


def hub_config(spec):
    c = dict(COMMON_HUB_KEYS)
    c.update(spec["config"])
    c["num_key_value_heads"] = c["num_attention_heads"]
    c["transformers_version"] = transformers.__version__
    return dict(sorted(c.items()))


# ---------------------------------------------------------------------------------------------------
# Weights, by hub name, in the order eagle3's schema lists them (src/deepseek_v2_weights.cc).


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


SAFETENSORS_DTYPES = {torch.bfloat16: "BF16", torch.float32: "F32", torch.int64: "I64", torch.int32: "I32",
                      torch.bool: "BOOL", torch.float8_e4m3fn: "F8_E4M3"}


def bits(t):
    """A tensor to compare with torch.equal: fp8 as its bytes (torch has no fp8 comparison)."""
    return t.view(torch.uint8) if t.dtype == torch.float8_e4m3fn else t


def save_safetensors(path, tensors, metadata):
    """A safetensors file with its tensors in the given order and a fixed header layout (the official
    writer emits __metadata__ in hash order, so its bytes change from run to run)."""
    header = {"__metadata__": dict(sorted(metadata.items()))}
    blobs, offset = [], 0
    # Wider dtypes first (a stable sort), so that every tensor's offset is a multiple of its element size.
    for name, t in sorted(tensors.items(), key=lambda item: -item[1].element_size()):
        data = t.contiguous().view(torch.uint8).numpy().tobytes() if t.numel() else b""
        header[name] = {"dtype": SAFETENSORS_DTYPES[t.dtype], "shape": list(t.shape),
                        "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + b"".join(blobs))
    read = load_file(path)
    assert sorted(read) == sorted(tensors)
    assert all(torch.equal(bits(read[n]), bits(t)) for n, t in tensors.items()), path
    with safe_open(path, "pt") as f:
        assert f.metadata() == metadata


def write_checkpoint(c, hub, directory, mtp=None):
    """Two shards split by bytes in schema order (the MTP module's tensors, when given, after the target's,
    in mtp_weight_shapes order, as DeepSeek-V3 stores layer 61 last), plus the hub index."""
    names = [name for name, _ in weight_shapes(c)] + ([name for name, _ in mtp_weight_shapes(c)] if mtp else [])
    weights = dict(hub, **(mtp or {}))
    stored = {}
    for name in names:
        w = weights[name]
        stored[name] = w.contiguous() if name.endswith("e_score_correction_bias") else w.to(torch.bfloat16)
    return write_two_shards(stored, directory)


def write_two_shards(tensors, directory):
    """`tensors` (name -> tensor, in order) as two safetensors shards split by bytes, plus the hub
    index; returns the total bytes."""
    total = sum(t.numel() * t.element_size() for t in tensors.values())
    shards, current, size = [[], []], 0, 0
    for name, t in tensors.items():
        shards[current].append(name)
        size += t.numel() * t.element_size()
        if current == 0 and size >= total // 2:
            current = 1
    weight_map = {}
    for i, names in enumerate(shards):
        file = f"model-{i + 1:05d}-of-00002.safetensors"
        save_safetensors(os.path.join(directory, file), {n: tensors[n] for n in names}, {"format": "pt"})
        weight_map.update({n: file for n in names})
    with open(os.path.join(directory, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f, indent=2)
        f.write("\n")
    return total


# ---------------------------------------------------------------------------------------------------
# Quantized targets (issue 20). The checkpoint holds the hub's quantized form; what the references run
# is the weights it means, dequantized as eagle3's CPU reference documents it
# (include/eagle3/detail/quantized_weights.h): fp8: w = float(code) * scale_inv of its 128 x 128 block,
# one f32 multiply; int4: w = q * scale of its group of 32 input columns (exact in f32). transformers
# reads neither form without extra packages, so its oracle loads an unquantized f32 checkpoint of those
# dequantized weights written to a temporary directory.

FP8_BLOCK = 128
FP8_MAX = 448.0  # largest finite e4m3fn value
INT4_GROUP = 32
# Kimi-K2-Thinking / K2.5's compressed-tensors ignore list: only the routed experts are quantized.
INT4_IGNORE = ["lm_head", "re:.*self_attn.*", "re:.*shared_experts.*", "re:.*mlp\\.(gate|up|gate_up|down)_proj.*"]
K25_PREFIX = "language_model."
# Tiny stand-ins for K2.5's vision tower and projector tensors (names as published); not read.
K25_VISION_SHAPES = [("vision_tower.patch_embed.proj.weight", (8, 3, 2, 2)),
                     ("vision_tower.encoder.blocks.0.wqkv.weight", (24, 8)),
                     ("mm_projector.pre_norm.weight", (8,)),
                     ("mm_projector.proj.0.weight", (32, 32))]


def quantization_config(quant):
    if quant == "fp8":
        # deepseek-ai/DeepSeek-V3 config.json.
        return {"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8",
                "weight_block_size": [FP8_BLOCK, FP8_BLOCK]}
    # moonshotai/Kimi-K2.5 config.json (tests/data/configs/moonshotai_Kimi-K2.5.json).
    weights = {"actorder": None, "block_structure": None, "dynamic": False, "group_size": INT4_GROUP,
               "num_bits": 4, "observer": "minmax", "observer_kwargs": {}, "strategy": "group",
               "symmetric": True, "type": "int"}
    return {"config_groups": {"group_0": {"input_activations": None, "output_activations": None,
                                          "targets": ["Linear"], "weights": weights}},
            "format": "pack-quantized", "ignore": list(INT4_IGNORE), "kv_cache_scheme": None,
            "quant_method": "compressed-tensors", "quantization_status": "compressed"}


def stored_config(spec, c):
    """The config.json of the quantized fixture: the hub config with its quantization_config, or for int4
    Kimi-K2.5's multimodal wrapper around it (quantization_config in text_config and at the top level, as
    published)."""
    text = dict(c)
    text["quantization_config"] = quantization_config(spec["quant"])
    text = dict(sorted(text.items()))
    if spec["quant"] == "fp8":
        return text
    v = c["vocab_size"]
    return {
        "architectures": ["KimiK25ForConditionalGeneration"],
        "bos_token_id": c["bos_token_id"],
        "dtype": "bfloat16",
        "eos_token_id": c["eos_token_id"],
        "ignore_index": -100,
        "media_placeholder_token_id": v - 2,
        "model_type": "kimi_k25",
        "pad_token_id": v - 1,
        "quantization_config": quantization_config(spec["quant"]),
        "text_config": text,
        "tie_word_embeddings": False,
        "transformers_version": transformers.__version__,
        "use_unified_vision_chunk": True,
        "video_placeholder": "<|kimi_k25_video_placeholder|>",
        "vision_config": {"patch_size": 2, "vt_hidden_size": 8, "vt_num_hidden_layers": 1,
                          "vt_num_attention_heads": 2, "vt_intermediate_size": 16, "merge_kernel_size": [2, 2],
                          "mm_projector_type": "patchmerger", "mm_hidden_size": 8,
                          "text_hidden_size": c["hidden_size"]},
    }


def is_quantized(name, quant):
    """Whether the hub weight `name` is stored quantized. fp8: every nn.Linear of DeepSeek's reference
    model but its head (inference/model.py); int4: every Linear no ignore entry matches
    (compressed-tensors: a plain entry is a module name, "re:" a regex matched at the name's start)."""
    linear = name.endswith(("_proj.weight", "_proj_with_mqa.weight")) or name == "lm_head.weight"
    if not linear:
        return False
    if quant == "fp8":
        return name != "lm_head.weight"
    module = name[:-len(".weight")]
    return not any(re.match(e[3:], module) if e.startswith("re:") else e == module for e in INT4_IGNORE)


def expand_blocks(scales, rows, cols, block_rows, block_cols):
    return scales.repeat_interleave(block_rows, 0)[:rows].repeat_interleave(block_cols, 1)[:, :cols]


def quantize_fp8(w):
    """DeepSeek-style block quantization: scale_inv = amax / 448 per 128 x 128 block (partial blocks at
    the edges), codes = e4m3(w / scale_inv) rounded to nearest. Returns (codes, scale_inv f32)."""
    rows, cols = w.shape
    br, bc = -(-rows // FP8_BLOCK), -(-cols // FP8_BLOCK)
    scale = torch.zeros(br, bc, dtype=torch.float32)
    for i in range(br):
        for j in range(bc):
            block = w[i * FP8_BLOCK:(i + 1) * FP8_BLOCK, j * FP8_BLOCK:(j + 1) * FP8_BLOCK]
            scale[i, j] = block.abs().max() / FP8_MAX
    x = (w / expand_blocks(scale, rows, cols, FP8_BLOCK, FP8_BLOCK)).clamp(-FP8_MAX, FP8_MAX)
    return x.to(torch.float8_e4m3fn), scale


def dequantize_fp8(codes, scale_inv):
    rows, cols = codes.shape
    return codes.to(torch.float32) * expand_blocks(scale_inv.float(), rows, cols, FP8_BLOCK, FP8_BLOCK)


def quantize_int4(w):
    """Symmetric group quantization: scale = amax / 7 per group of 32 columns, rounded to bf16 (stored
    bf16, as compressed-tensors does for a bf16 model); q = clamp(round(w / scale), -8, 7)."""
    out, cols = w.shape
    groups = w.view(out, cols // INT4_GROUP, INT4_GROUP)
    scale = (groups.abs().amax(-1) / 7.0).to(torch.bfloat16)
    q = (groups / scale.float()[..., None]).round().clamp(-8, 7).to(torch.int64).view(out, cols)
    return q, scale


def pack_int4(q):
    """compressed-tensors pack_to_int32 (packed_dim 1), as include/eagle3/detail/int4_packing.h describes
    it: value j of a row in word j / 8 at bits 4 (j % 8), stored as q + 8; rows padded with zero nibbles."""
    out, cols = q.shape
    words = -(-cols // 8)
    u = torch.zeros(out, words * 8, dtype=torch.int64)
    u[:, :cols] = q + 8
    packed = torch.zeros(out, words, dtype=torch.int64)
    for k in range(8):
        packed |= u[:, k::8] << (4 * k)
    return torch.where(packed >= 2**31, packed - 2**32, packed).to(torch.int32)


def unpack_int4(packed, cols):
    """The inverse, written separately (per value, not per nibble plane) so that it checks pack_int4."""
    words = packed.to(torch.int64) & 0xFFFFFFFF
    j = torch.arange(cols)
    return ((words[:, j // 8] >> (4 * (j % 8))) & 0xF) - 8


def dequantize_int4(packed, scale, shape):
    out, cols = shape
    q = unpack_int4(packed, cols)
    return q.to(torch.float32) * scale.float().repeat_interleave(INT4_GROUP, 1)


def check_int4_packing():
    """pack_int4 / unpack_int4 against a row packed by hand: -8..-1 -> nibbles 0..7 (word 0x76543210),
    0..7 -> nibbles 8..15 (word 0xFEDCBA98, negative as i32), then 3 -> nibble 0xB in a zero-padded word."""
    q = torch.tensor([list(range(-8, 8)) + [3]])
    want = torch.tensor([[0x76543210, 0xFEDCBA98 - 2**32, 0xB]], dtype=torch.int32)
    assert torch.equal(pack_int4(q), want) and torch.equal(unpack_int4(want, 17), q)


def quantize_checkpoint(c, hub, quant):
    """(stored, dequantized): the quantized checkpoint's tensors by hub name (text-model names, in schema
    order), and the hub weights with each quantized one replaced by what it dequantizes to."""
    if quant == "int4":
        check_int4_packing()
    stored, dequantized = {}, {}
    for name, _ in weight_shapes(c):
        w = hub[name]
        if not is_quantized(name, quant):
            stored[name] = w.contiguous() if name.endswith("e_score_correction_bias") else w.to(torch.bfloat16)
            dequantized[name] = w
            continue
        base = name[:-len(".weight")]
        if quant == "fp8":
            codes, scale_inv = quantize_fp8(w)
            stored[name] = codes
            stored[base + ".weight_scale_inv"] = scale_inv
            dequantized[name] = dequantize_fp8(codes, scale_inv)
        else:
            q, scale = quantize_int4(w)
            stored[base + ".weight_packed"] = pack_int4(q)
            stored[base + ".weight_scale"] = scale
            stored[base + ".weight_shape"] = torch.tensor(list(w.shape), dtype=torch.int32)
            dequantized[name] = q.to(torch.float32) * scale.float().repeat_interleave(INT4_GROUP, 1)
    return stored, dequantized


def vision_tensors(seed):
    g = torch.Generator().manual_seed(seed + 11)
    return {name: (0.1 * torch.randn(shape, generator=g, dtype=torch.float64)).to(torch.bfloat16)
            for name, shape in K25_VISION_SHAPES}


def write_quantized_checkpoint(spec, stored, seed, directory):
    """Two shards split by bytes in schema order (the vision tensors last), plus the hub index; K2.5's
    language-model tensors under its prefix."""
    prefix = K25_PREFIX if spec["quant"] == "int4" else ""
    tensors = {prefix + n: t for n, t in stored.items()}
    if spec["quant"] == "int4":
        tensors.update(vision_tensors(seed))
    return write_two_shards(tensors, directory)


def read_quantized_checkpoint(spec, c, directory):
    """The written shards read back and dequantized from the files alone (through unpack_int4, not the
    packing code): the hub weights by text-model name."""
    prefix = K25_PREFIX if spec["quant"] == "int4" else ""
    with open(os.path.join(directory, "model.safetensors.index.json")) as f:
        files = sorted(set(json.load(f)["weight_map"].values()))
    raw = {}
    for file in files:
        raw.update(load_file(os.path.join(directory, file)))
    out = {}
    for name, shape in weight_shapes(c):
        base = prefix + name[:-len(".weight")]
        if not is_quantized(name, spec["quant"]):
            out[name] = raw.pop(prefix + name).float()
        elif spec["quant"] == "fp8":
            codes = raw.pop(prefix + name)
            assert codes.dtype == torch.float8_e4m3fn and tuple(codes.shape) == shape
            scale_inv = raw.pop(base + ".weight_scale_inv")
            assert scale_inv.dtype == torch.float32
            assert tuple(scale_inv.shape) == (-(-shape[0] // FP8_BLOCK), -(-shape[1] // FP8_BLOCK))
            out[name] = dequantize_fp8(codes, scale_inv)
        else:
            packed, scale = raw.pop(base + ".weight_packed"), raw.pop(base + ".weight_scale")
            stored_shape = raw.pop(base + ".weight_shape")
            assert stored_shape.dtype == torch.int32 and stored_shape.tolist() == list(shape)
            assert packed.dtype == torch.int32 and tuple(packed.shape) == (shape[0], -(-shape[1] // 8))
            assert scale.dtype == torch.bfloat16 and tuple(scale.shape) == (shape[0], shape[1] // INT4_GROUP)
            out[name] = dequantize_int4(packed, scale, shape)
    assert sorted(raw) == sorted(n for n, _ in K25_VISION_SHAPES if spec["quant"] == "int4"), sorted(raw)
    return out


# Dequantization mistakes a loader could make, measured like SENSITIVITY (fp64 reference on weights
# dequantized with the mistake).
QUANT_SENSITIVITY = {
    "fp8_scale_divides": "w = code / weight_scale_inv instead of code * weight_scale_inv",
    "fp8_local_scales": "block scales indexed by the TP-8 slice's local row / column instead of the global one",
    "int4_high_nibble_first": "the first value of a word in its most significant nibble",
    "int4_twos_complement": "nibbles read as two's-complement int4 instead of q + 8",
    "int4_local_groups": "group scales indexed by the TP-8 slice's local column instead of the global one",
}


def tp_split_dim(name):
    """The dim eagle3's schema splits a Linear along at TP > 1 (src/deepseek_v2_weights.cc,
    src/mla_attention_weights.cc): rows for q_b / q / kv_b and the MLPs' gate / up, columns for o_proj and
    down; None for the replicated q_a / kv_a."""
    if name.endswith(("q_b_proj.weight", "q_proj.weight", "kv_b_proj.weight", "gate_proj.weight", "up_proj.weight")):
        return 0
    if name.endswith(("o_proj.weight", "down_proj.weight")):
        return 1
    return None


def mistaken_weights(c, stored, hub, quant, variant, tp=8):
    """`hub` with every quantized weight dequantized from `stored` with the mistake `variant`."""
    out = dict(hub)
    for name, shape in weight_shapes(c):
        if not is_quantized(name, quant):
            continue
        base = name[:-len(".weight")]
        split = tp_split_dim(name)
        index = [torch.arange(shape[0]), torch.arange(shape[1])]
        if variant in ("fp8_local_scales", "int4_local_groups") and split is not None:
            index[split] = index[split] % (shape[split] // tp)
        if quant == "fp8":
            codes, scale_inv = stored[name].to(torch.float32), stored[base + ".weight_scale_inv"]
            full = scale_inv[index[0] // FP8_BLOCK][:, index[1] // FP8_BLOCK]
            out[name] = codes / full if variant == "fp8_scale_divides" else codes * full
        else:
            words = stored[base + ".weight_packed"].to(torch.int64) & 0xFFFFFFFF
            j = torch.arange(shape[1])
            position = 7 - j % 8 if variant == "int4_high_nibble_first" else j % 8
            nibble = (words[:, j // 8] >> (4 * position)) & 0xF
            q = torch.where(nibble >= 8, nibble - 16, nibble) if variant == "int4_twos_complement" else nibble - 8
            scale = stored[base + ".weight_scale"].float()
            out[name] = q.to(torch.float32) * scale[:, index[1] // INT4_GROUP]
    return out


def write_oracle_checkpoint(c, hub, directory):
    """The unquantized f32 checkpoint of `hub` (the dequantized weights) that transformers loads."""
    with open(os.path.join(directory, "config.json"), "w") as f:
        json.dump(c, f, indent=2)
    save_safetensors(os.path.join(directory, "model.safetensors"),
                     {n: hub[n].float().contiguous() for n, _ in weight_shapes(c)}, {"format": "pt"})


def quant_summary(spec, c, stored):
    quantized = [n for n, _ in weight_shapes(c) if is_quantized(n, spec["quant"])]
    total = sum(t.numel() * t.element_size() for t in stored.values())
    bf16 = sum(2 * math.prod(shape) for _, shape in weight_shapes(c))
    fmt = "F8_E4M3 + f32 weight_scale_inv" if spec["quant"] == "fp8" else \
        "I32 weight_packed + bf16 weight_scale + I32 weight_shape"
    return {"quantized": len(quantized), "plain": len(weight_shapes(c)) - len(quantized), "stored_bytes": total,
            "bf16_bytes": bf16, "format": fmt}


# ---------------------------------------------------------------------------------------------------
# Independent fp64 implementation of DeepSeek's reference math (modeling_deepseek.py of
# deepseek-ai/DeepSeek-V2 and -V3). `variant` switches one detail to a plausible mistake, to measure
# how strongly each fixture pins that detail down.


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


# ---------------------------------------------------------------------------------------------------
# The transformers oracle.


def transformers_class(c):
    return {"deepseek_v2": transformers.DeepseekV2ForCausalLM,
            "deepseek_v3": transformers.DeepseekV3ForCausalLM}[c["model_type"]]


def check_oracle_semantics(model, c):
    """Assert the properties of the installed transformers that the fixtures rely on (see README)."""
    rs = c.get("rope_scaling")
    m = yarn_get_mscale(rs["factor"], rs["mscale_all_dim"]) if rs and rs["type"] == "yarn" else 1.0
    want = (c["qk_nope_head_dim"] + c["qk_rope_head_dim"]) ** -0.5 * m * m
    for layer in model.model.layers:
        got = layer.self_attn.scaling
        if abs(got - want) > 1e-12 * want:
            raise SystemExit(f"{c['model_type']}: attention scaling {got} != reference {want}: the installed "
                             "transformers omits (or changes) the YaRN m^2 factor; patch it here and say so")
    if c["model_type"] == "deepseek_v3" and not model.config.rope_interleave:
        raise SystemExit("deepseek_v3 config has rope_interleave false; DeepSeek rotates adjacent pairs")


class BoundaryTap:
    """Residual stream at every boundary: a forward pre-hook on each decoder layer captures its input
    (b = i), and a forward hook on the last layer its output (b = L, before model.norm).
    output_hidden_states is not used: transformers replaces its last entry with the normed state."""

    def __init__(self, model):
        self.captured = {}
        self.handles = []
        layers = model.model.layers
        for i, layer in enumerate(layers):
            self.handles.append(layer.register_forward_pre_hook(self._pre(i), with_kwargs=True))
        self.handles.append(layers[-1].register_forward_hook(self._post(len(layers))))
        self.routing = {}
        for i, layer in enumerate(layers):
            gate = getattr(layer.mlp, "gate", None)
            if isinstance(gate, torch.nn.Module):
                self.handles.append(gate.register_forward_hook(self._route(i)))

    def _route(self, i):
        def hook(module, args, output):
            _, weights, ids = output  # (router_logits, topk_weights, topk_indices)
            order = ids.argsort(-1)
            self.routing[i] = (ids.gather(1, order).detach().clone(), weights.gather(1, order).detach().clone())
        return hook

    def _pre(self, i):
        def hook(module, args, kwargs):
            hidden = args[0] if args else kwargs["hidden_states"]
            self.captured[i] = hidden.detach().clone()
        return hook

    def _post(self, i):
        def hook(module, args, output):
            hidden = output[0] if isinstance(output, tuple) else output
            self.captured[i] = hidden.detach().clone()
        return hook

    def remove(self):
        for h in self.handles:
            h.remove()


def run_transformers(model, tokens):
    tap = BoundaryTap(model)
    with torch.no_grad():
        out = model(input_ids=tokens[None], output_hidden_states=True, use_cache=False)
    tap.remove()
    layers = len(model.model.layers)
    boundaries = [tap.captured[b][0] for b in range(layers + 1)]
    hidden_states = out.hidden_states
    # What output_hidden_states means in this version (recorded in the README).
    assert torch.equal(hidden_states[0][0], boundaries[0])
    for b in range(1, layers):
        assert torch.equal(hidden_states[b][0], boundaries[b]), b
    normed = model.model.norm(boundaries[layers][None])[0]
    assert torch.equal(hidden_states[layers][0], normed), "output_hidden_states[-1] is expected to be normed"
    assert not torch.equal(hidden_states[layers][0], boundaries[layers])
    return out.logits[0].detach().clone(), boundaries, tap.routing


def load_direct(c, hub, config):
    model = transformers_class(c)._from_config(config, attn_implementation="eager",
                                               experts_implementation="eager", dtype=torch.float32)
    state = hub_to_transformers(c, hub)
    missing, unexpected = model.load_state_dict(state, strict=False)
    if missing or unexpected:
        raise SystemExit(f"direct mapping: missing {missing}, unexpected {unexpected}")
    return model.eval()


def max_rel(a, b):
    return ((a.double() - b.double()).abs().max() / b.double().abs().max()).item()


# ---------------------------------------------------------------------------------------------------


def make_prompt(c, seed, num_tokens):
    """Ids spread over the vocab: the last id (last vocab shard at TP 8), id 0, and one repeated id
    (same token at two positions: only RoPE tells them apart)."""
    g = torch.Generator().manual_seed(seed + 7)
    tokens = torch.randint(0, c["vocab_size"], (num_tokens,), generator=g)
    tokens[2] = c["vocab_size"] - 1
    tokens[5] = 0
    tokens[num_tokens - 3] = tokens[3]
    return tokens


SENSITIVITY = {
    "no_m2": "softmax scale without the YaRN m^2 factor",
    "no_yarn_freq": "plain RoPE frequencies instead of YaRN's",
    "no_attn_factor": "cos/sin without the mscale/mscale_all_dim factor",
    "neox_rope": "rotate (i, i + d/2) pairs instead of adjacent pairs",
    "no_groups": "ignore n_group/topk_group (plain top-k)",
    "no_bias": "select without e_score_correction_bias",
    "flip_norm_topk_prob": "the opposite norm_topk_prob",
    "rsf_twice": "routed_scaling_factor applied twice",
}


def applicable(c, variant):
    rs = c.get("rope_scaling")
    yarn = bool(rs) and rs["type"] == "yarn"
    if variant in ("no_m2", "no_yarn_freq"):
        return yarn
    if variant == "no_attn_factor":
        return yarn and rs["mscale"] != rs["mscale_all_dim"]
    if variant == "no_groups":
        return c["topk_method"] != "greedy" and c["topk_group"] < c["n_group"]
    if variant == "no_bias":
        return c["topk_method"] == "noaux_tc"
    if variant == "rsf_twice":
        return c["routed_scaling_factor"] != 1.0
    return True


def build(spec, out_dir, log):
    c = hub_config(spec)
    directory = os.path.join(out_dir, spec["name"])
    if os.path.isdir(directory):
        shutil.rmtree(directory)
    os.makedirs(directory)
    quant = spec.get("quant")
    with open(os.path.join(directory, "config.json"), "w") as f:
        json.dump(stored_config(spec, c) if quant else c, f, indent=2)
        f.write("\n")

    # Weights: the first seed (counting up from the model's) whose routing has no near-ties. A quantized
    # fixture's references run on the weights its checkpoint dequantizes to.
    tokens = make_prompt(c, spec["seed"], spec["num_tokens"])
    for seed in range(spec["seed"], spec["seed"] + 200):
        hub = random_weights(c, seed, spec["router_std"])
        if quant:
            stored, hub = quantize_checkpoint(c, hub, quant)
        ref_logits, ref_boundaries, ref_routing, margin = reference_forward(c, hub, tokens)
        if margin >= MIN_ROUTING_MARGIN:
            break
    else:
        raise SystemExit(f"{spec['name']}: no seed gave routing margins >= {MIN_ROUTING_MARGIN}")
    # The MTP module's weights (stored in the same checkpoint): the first seed whose MTP rows (step
    # fixture, control and trees) have no routing or tree-selection near-ties.
    mtp, mtp_seed = choose_mtp_weights(spec, c, hub, tokens, ref_logits, ref_boundaries, log) \
        if spec.get("mtp") else (None, None)
    if quant:
        checkpoint_bytes = write_quantized_checkpoint(spec, stored, seed, directory)
        oracle_dir = tempfile.mkdtemp(prefix=f"golden_{spec['name']}_")
        write_oracle_checkpoint(c, hub, oracle_dir)
    else:
        checkpoint_bytes = write_checkpoint(c, hub, directory, mtp)
        oracle_dir = directory

    # Oracle: from_pretrained of the written checkpoint (transformers' own hub->fused conversion); for a
    # quantized fixture, of the f32 checkpoint of its dequantized weights.
    model, loading = transformers_class(c).from_pretrained(
        oracle_dir, dtype=torch.float32, attn_implementation="eager", experts_implementation="eager",
        output_loading_info=True)
    if quant:
        shutil.rmtree(oracle_dir)
    model.eval()
    if mtp:
        # transformers builds no MTP layer and skips only layer 61's tensors
        # (`_keys_to_ignore_on_load_unexpected`): the module's tensors must be reported unexpected, and
        # nothing else.
        unexpected = set(loading.get("unexpected_keys") or ())
        layer_prefix = f"model.layers.{c['num_hidden_layers']}."
        if not unexpected or any(not k.startswith(layer_prefix) for k in unexpected):
            raise SystemExit(f"{spec['name']}: from_pretrained reported unexpected keys {sorted(unexpected)}")
        loading = dict(loading, unexpected_keys=[])
    if any(loading.get(k) for k in ("missing_keys", "unexpected_keys", "mismatched_keys", "error_msgs")):
        raise SystemExit(f"{spec['name']}: from_pretrained loading report: {loading}")
    check_oracle_semantics(model, c)
    logits, boundaries, hf_routing = run_transformers(model, tokens)

    # The same weights through this script's own mapping, and the written files read back.
    direct = load_direct(c, hub, model.config)
    direct_logits, direct_boundaries, _ = run_transformers(direct, tokens)
    if not torch.equal(direct_logits, logits) or any(
            not torch.equal(a, b) for a, b in zip(direct_boundaries, boundaries)):
        raise SystemExit(f"{spec['name']}: from_pretrained and the direct mapping disagree")
    if quant:
        # The quantized shards, decoded from the files alone, hold exactly the weights the references ran.
        reread = read_quantized_checkpoint(spec, c, directory)
        assert sorted(reread) == sorted(hub) and all(torch.equal(reread[n], hub[n]) for n in hub)
    else:
        reread = {}
        for file in sorted(f for f in os.listdir(directory) if f.startswith("model-")):
            reread.update(load_file(os.path.join(directory, file)))
        written = dict(hub, **(mtp or {}))
        assert sorted(reread) == sorted(written) and all(torch.equal(reread[n].float(), written[n]) for n in written)

    # transformers vs the independent fp64 reference.
    logits_err = max_rel(logits, ref_logits)
    boundary_err = max(max_rel(a, b) for a, b in zip(boundaries, ref_boundaries))
    if logits_err > 1e-5 or boundary_err > 1e-5:
        raise SystemExit(f"{spec['name']}: transformers vs fp64 reference: logits {logits_err:.2e}, "
                         f"boundaries {boundary_err:.2e} (relative to max |value|)")

    # Routing as transformers computed it must match the reference's choices.
    expected = {"tokens": tokens.to(torch.int64).contiguous(), "logits": logits.float().contiguous()}
    for b, t in enumerate(boundaries):
        expected[f"boundary.{b}"] = t.float().contiguous()
    if sorted(hf_routing) != sorted(ref_routing):
        raise SystemExit(f"{spec['name']}: MoE layers differ: {sorted(hf_routing)} vs {sorted(ref_routing)}")
    for layer, (ids, weights) in sorted(ref_routing.items()):
        hf_ids, hf_weights = hf_routing[layer]
        if not torch.equal(hf_ids, ids):
            raise SystemExit(f"{spec['name']}: layer {layer} routing differs between transformers and reference")
        assert max_rel(hf_weights, weights) < 1e-5
        expected[f"router.{layer}.topk_ids"] = hf_ids.to(torch.int64).contiguous()
        expected[f"router.{layer}.topk_weights"] = hf_weights.float().contiguous()
    metadata = {"model": spec["name"], "torch": torch.__version__, "transformers": transformers.__version__,
                "oracle": transformers_class(c).__name__ + " fp32 eager"}
    if quant:
        metadata["oracle"] += ", on the dequantized weights of " + json.dumps(quantization_config(quant)["quant_method"])
    save_safetensors(os.path.join(directory, "expected.safetensors"), expected, metadata)

    # How strongly the fixture pins each detail.
    sensitivity = {}
    for variant in SENSITIVITY:
        if applicable(c, variant):
            v_logits = reference_forward(c, hub, tokens, (variant,))[0]
            sensitivity[variant] = (max_rel(v_logits, ref_logits),
                                    int((v_logits.argmax(-1) != ref_logits.argmax(-1)).sum()))

    quant_sensitivity = {}
    for variant in QUANT_SENSITIVITY if quant else ():
        if variant.startswith(quant):
            v_logits = reference_forward(c, mistaken_weights(c, stored, hub, quant, variant), tokens)[0]
            quant_sensitivity[variant] = (max_rel(v_logits, ref_logits),
                                          int((v_logits.argmax(-1) != ref_logits.argmax(-1)).sum()))

    mtp_info = build_mtp_fixture(spec, c, directory, hub, mtp, mtp_seed, model, tokens, logits, boundaries, log) \
        if mtp else None

    rs = c.get("rope_scaling")
    m2 = yarn_get_mscale(rs["factor"], rs["mscale_all_dim"]) ** 2 if rs else 1.0
    af = yarn_get_mscale(rs["factor"], rs["mscale"]) / yarn_get_mscale(rs["factor"], rs["mscale_all_dim"]) \
        if rs else 1.0
    distinct = {layer: len({tuple(r) for r in ids.tolist()}) for layer, (ids, _) in ref_routing.items()}
    used = {layer: len(set(ids.flatten().tolist())) for layer, (ids, _) in ref_routing.items()}
    sizes = {f: os.path.getsize(os.path.join(directory, f)) for f in sorted(os.listdir(directory))}
    info = {
        "name": spec["name"],
        "what": spec["what"].format(m2=m2, af=af),
        "seed": seed,
        "tokens": tokens.tolist(),
        "num_tensors": (len(hub) + len(mtp or {})) if not quant else
        len(stored) + (len(K25_VISION_SHAPES) if quant == "int4" else 0),
        "checkpoint_bytes": checkpoint_bytes,
        "sizes": sizes,
        "logits_err": logits_err,
        "boundary_err": boundary_err,
        "margin": margin,
        "distinct": distinct,
        "used": used,
        "sensitivity": sensitivity,
        "quant_sensitivity": quant_sensitivity,
        "softmax_scale": model.model.layers[0].self_attn.scaling,
        "attention_scaling": model.model.rotary_emb.attention_scaling,
        "config": c,
        "quant": quant_summary(spec, c, stored) if quant else None,
        "mtp": mtp_info,
    }
    log(f"{spec['name']}: seed {seed}, T {len(tokens)}, {len(hub)} tensors, {sum(sizes.values())} bytes, "
        f"logits vs fp64 {logits_err:.1e}, routing margin {margin:.1e}")
    return info


# ---------------------------------------------------------------------------------------------------
# EAGLE-3 draft fixtures: a random draft head (SpecForge's LlamaForCausalLMEagle3 layout) on top of a
# target fixture, whose aux hidden states come from that fixture's boundaries. The expected outputs are
# computed by an independent implementation of the draft step (written from the semantics in
# include/eagle3/draft_model.h, not from any engine), in fp32; the same implementation in fp64 and the
# draft assembled from transformers' Llama building blocks (LlamaAttention with 2H-wide q/k/v,
# LlamaRotaryEmbedding from the written config.json, LlamaMLP, LlamaRMSNorm) must agree with it.

DRAFTS = [
    {
        "name": "draft_v2",
        "target": "v2_qlora_yarn",
        "seed": 4001,
        "prefix": "midlayer.",
        "last_token": 500,
        "step1_token": 77,
        # EAGLE-2 trees after the target's prompt (tree.safetensors): name, topk, num_steps,
        # num_draft_tokens.
        "trees": [("k3_s3_n8", 3, 3, 8), ("k1_s4_n5", 1, 4, 5), ("k2_s5_n10", 2, 5, 10), ("k4_s4_n16", 4, 4, 16)],
        "what": "Plain EAGLE-3 head (SpecForge names, `midlayer.*`) on `v2_qlora_yarn`: aux ids [0, 1, 2] "
        "(output-of-layer: boundaries 1, 2, 3); GQA 16 query heads on 8 kv heads, head_dim 16 "
        "(q width 256 != hidden 64); YaRN x4 over an original context of 64 with rope_theta 100 (the "
        "ramp spans several of the 8 frequency pairs; cos/sin factor 0.1 ln 4 + 1 = {af:.6f}); "
        "rms_norm_eps 1e-5 (the target's is 1e-6); draft vocab 300 of 1000 (padded to 512 at TP 8: "
        "rank 4 holds 44 real rows, ranks 5..7 only padding), with d2t and t2d.",
        "config": {
            "hidden_size": 64,
            "num_attention_heads": 16,
            "num_key_value_heads": 8,
            "head_dim": 16,
            "intermediate_size": 128,
            "draft_vocab_size": 300,
            "rms_norm_eps": 1e-5,
            "max_position_embeddings": 256,
            "rope_theta": 100.0,
            "rope_scaling": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64,
                             "beta_fast": 32.0, "beta_slow": 1.0},
            "eagle_config": {"eagle_aux_hidden_state_layer_ids": [0, 1, 2], "use_aux_hidden_state": True},
        },
    },
    {
        "name": "draft_v2_eagle31",
        "target": "v2_qlora_yarn",
        "seed": 5001,
        "prefix": "layers.0.",
        "last_token": 3,
        "step1_token": 999,
        "what": "EAGLE 3.1-style head (vLLM names, `layers.0.*`) on `v2_qlora_yarn`: norm_before_residual, "
        "fc_norm (one RMSNorm per aux state, `fc_norm.{{i}}.weight`) and norm_output (the fed-back "
        "hidden is norm(r)); aux ids [3, 0, 2] out of order (boundaries 4, 1, 3; 4 = the last layer's "
        "output before the final norm); 8 heads = 8 kv heads, head_dim derived (8); llama3 rope "
        "scaling (factor 8, original context 64: the three frequency bands all occur); draft vocab "
        "200.",
        "config": {
            "hidden_size": 64,
            "num_attention_heads": 8,
            "num_key_value_heads": 8,
            "intermediate_size": 192,
            "draft_vocab_size": 200,
            "rms_norm_eps": 1e-6,
            "max_position_embeddings": 256,
            "rope_theta": 10000.0,
            "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "original_max_position_embeddings": 64,
                             "low_freq_factor": 1.0, "high_freq_factor": 4.0},
            "eagle_config": {"eagle_aux_hidden_state_layer_ids": [3, 0, 2], "use_aux_hidden_state": True},
            "norm_before_residual": True,
            "fc_norm": True,
            "norm_output": True,
        },
    },
]

DRAFT_COMMON_KEYS = {
    "architectures": ["LlamaForCausalLMEagle3"],
    "model_type": "llama",
    "attention_bias": False,
    "attention_dropout": 0.0,
    "bos_token_id": 0,
    "eos_token_id": 1,
    "hidden_act": "silu",
    "initializer_range": 0.02,
    "mlp_bias": False,
    "num_hidden_layers": 1,
    "pretraining_tp": 1,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "use_cache": True,
}

DRAFT_SENSITIVITY = {
    "no_yarn": "plain RoPE frequencies instead of the scaled ones (YaRN or llama3)",
    "no_attn_factor": "cos/sin without YaRN's attention factor",
    "softmax_m2": "YaRN's factor squared into the softmax scale as well (DeepSeek-style)",
    "adjacent_pairs": "rotate adjacent pairs (2i, 2i+1) instead of (i, i + d/2)",
    "hidden_first": "concat(hidden_norm(g), input_layernorm(embed)) instead of embeddings first",
    "flip_norm_before_residual": "the opposite norm_before_residual",
    "aux_reversed": "aux states concatenated in reverse order",
}


def draft_hub_config(spec, target_config):
    c = dict(DRAFT_COMMON_KEYS)
    c.update(spec["config"])
    c["vocab_size"] = target_config["vocab_size"]
    c["target_hidden_size"] = target_config["hidden_size"]
    c["transformers_version"] = transformers.__version__
    return dict(sorted(c.items()))


def draft_dims(dc):
    h, heads = dc["hidden_size"], dc["num_attention_heads"]
    return h, heads, dc["num_key_value_heads"], dc.get("head_dim", h // heads)


def draft_weight_shapes(dc, prefix):
    """In the order of eagle3's schema (src/draft_weights.cc)."""
    h, heads, kv_heads, hd = draft_dims(dc)
    aux = len(dc["eagle_config"]["eagle_aux_hidden_state_layer_ids"])
    ht = dc["target_hidden_size"]
    shapes = [("fc.weight", (h, aux * ht))]
    if dc.get("norm_before_fc"):
        shapes.append(("input_norm.weight", (aux * ht,)))
    if dc.get("fc_norm"):
        shapes += [(f"fc_norm.{i}.weight", (ht,)) for i in range(aux)]
    p = prefix
    inter = dc["intermediate_size"]
    shapes += [(p + "input_layernorm.weight", (h,)), (p + "hidden_norm.weight", (h,)),
               (p + "self_attn.q_proj.weight", (heads * hd, 2 * h)),
               (p + "self_attn.k_proj.weight", (kv_heads * hd, 2 * h)),
               (p + "self_attn.v_proj.weight", (kv_heads * hd, 2 * h)),
               (p + "self_attn.o_proj.weight", (h, heads * hd)),
               (p + "post_attention_layernorm.weight", (h,)),
               (p + "mlp.gate_proj.weight", (inter, h)), (p + "mlp.up_proj.weight", (inter, h)),
               (p + "mlp.down_proj.weight", (h, inter)),
               ("norm.weight", (h,)), ("lm_head.weight", (dc["draft_vocab_size"], h))]
    return shapes


def random_draft_weights(dc, prefix, seed):
    """Linears N(0, 1/fan_in), RMSNorm weights N(1, 0.1^2), rounded to bf16 values (fp32 tensors); d2t
    the offsets of a random sorted subset of the target vocabulary, t2d its indicator."""
    g = torch.Generator().manual_seed(seed)
    weights = {}
    for name, shape in draft_weight_shapes(dc, prefix):
        if len(shape) == 1:
            w = 1.0 + 0.1 * torch.randn(shape, generator=g, dtype=torch.float64)
        else:
            w = torch.randn(shape, generator=g, dtype=torch.float64) / math.sqrt(shape[1])
        weights[name] = w.to(torch.bfloat16).to(torch.float32)
    vocab, draft_vocab = dc["vocab_size"], dc["draft_vocab_size"]
    ids = torch.randperm(vocab, generator=g)[:draft_vocab].sort().values
    d2t = ids - torch.arange(draft_vocab)
    t2d = torch.zeros(vocab, dtype=torch.bool)
    t2d[ids] = True
    return weights, d2t.to(torch.int64), t2d


def llama3_inv_freq(inv_freq, rs):
    """Llama 3.1's frequency bands: wavelengths above original/low_freq_factor divided by factor, below
    original/high_freq_factor kept, interpolated in between."""
    factor, orig = rs["factor"], rs["original_max_position_embeddings"]
    low, high = rs["low_freq_factor"], rs["high_freq_factor"]
    wavelen = 2 * math.pi / inv_freq
    smooth = (orig / wavelen - low) / (high - low)
    medium = (1 - smooth) * inv_freq / factor + smooth * inv_freq
    return torch.where(wavelen > orig / low, inv_freq / factor, torch.where(wavelen < orig / high, inv_freq, medium))


def draft_rope_factor(rs):
    """cos/sin factor of Llama YaRN: the explicit attention_factor, else mscale ratio when both mscale keys
    are set, else 0.1 ln(factor) + 1."""
    if not rs or rs["rope_type"] != "yarn":
        return 1.0
    if rs.get("attention_factor") is not None:
        return rs["attention_factor"]
    if rs.get("mscale") and rs.get("mscale_all_dim"):
        return yarn_get_mscale(rs["factor"], rs["mscale"]) / yarn_get_mscale(rs["factor"], rs["mscale_all_dim"])
    return yarn_get_mscale(rs["factor"], 1.0)


def draft_rope(dc, positions, variant):
    """cos, sin [T, head_dim / 2] in fp64 (attention factor folded in)."""
    _, _, _, hd = draft_dims(dc)
    base, rs = dc["rope_theta"], dc.get("rope_scaling")
    inv_freq = 1.0 / base ** (torch.arange(0, hd, 2, dtype=torch.float64) / hd)
    factor = 1.0
    if rs and rs["rope_type"] == "yarn":
        if "no_yarn" not in variant:
            inv_freq = yarn_inv_freq(inv_freq, hd, base, rs)
        if "no_attn_factor" not in variant:
            factor = draft_rope_factor(rs)
    elif rs and rs["rope_type"] == "llama3" and "no_yarn" not in variant:
        inv_freq = llama3_inv_freq(inv_freq, rs)
    angles = positions.to(torch.float64)[:, None] * inv_freq[None, :]
    return angles.cos() * factor, angles.sin() * factor


def rotate_half_rope(x, cos, sin, variant):
    """x [..., T, d]: pairs (i, i + d/2) rotate by angle i (Llama / NeoX)."""
    if "adjacent_pairs" in variant:
        return apply_rope(x, cos, sin, ())
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], -1)


class DraftReference:
    """The draft step with an explicit KV cache (rows appended in order, causal over everything cached)."""

    def __init__(self, dc, prefix, weights, embed, dtype, variant=()):
        self.dc, self.p, self.dtype, self.variant = dc, prefix, dtype, variant
        self.w = {n: t.to(dtype) for n, t in weights.items()}
        self.embed = embed.to(dtype)
        self.k = self.v = None

    def fc(self, aux):
        dc, w, eps = self.dc, self.w, self.dc["rms_norm_eps"]
        ids = dc["eagle_config"]["eagle_aux_hidden_state_layer_ids"]
        ht = dc["target_hidden_size"]
        aux = aux.to(self.dtype)
        if "aux_reversed" in self.variant:
            aux = torch.cat(list(reversed(aux.split(ht, -1))), -1)
        if dc.get("norm_before_fc"):
            aux = rms_norm(aux, w["input_norm.weight"], eps)
        if dc.get("fc_norm"):
            aux = torch.cat([rms_norm(a, w[f"fc_norm.{i}.weight"], eps) for i, a in enumerate(aux.split(ht, -1))], -1)
        assert aux.shape[-1] == len(ids) * ht
        return aux @ w["fc.weight"].T

    def step(self, tokens, g, positions, allowed=None):
        """Returns (logits [n, Vd], fed-back hidden [n, H]) for n new rows. `allowed` [n, cached + n]
        bool: which cache slots each new row attends (default: causal over everything cached)."""
        dc, w, p, variant = self.dc, self.w, self.p, self.variant
        eps = dc["rms_norm_eps"]
        h, heads, kv_heads, hd = draft_dims(dc)
        n = tokens.shape[0]
        g = g.to(self.dtype)
        e = rms_norm(self.embed[tokens], w[p + "input_layernorm.weight"], eps)
        hn = rms_norm(g, w[p + "hidden_norm.weight"], eps)
        x = torch.cat([hn, e] if "hidden_first" in variant else [e, hn], -1)
        residual = hn if dc.get("norm_before_residual", False) != ("flip_norm_before_residual" in variant) else g
        cos, sin = (t.to(self.dtype) for t in draft_rope(dc, positions, variant))
        a = p + "self_attn."
        q = rotate_half_rope((x @ w[a + "q_proj.weight"].T).view(n, heads, hd).transpose(0, 1), cos, sin, variant)
        k = rotate_half_rope((x @ w[a + "k_proj.weight"].T).view(n, kv_heads, hd).transpose(0, 1), cos, sin, variant)
        v = (x @ w[a + "v_proj.weight"].T).view(n, kv_heads, hd).transpose(0, 1)
        self.k = k if self.k is None else torch.cat([self.k, k], 1)
        self.v = v if self.v is None else torch.cat([self.v, v], 1)
        s = self.k.shape[1]
        if allowed is None:
            allowed = torch.arange(s)[None, :] <= (s - n + torch.arange(n))[:, None]  # causal over the cache
        assert allowed.shape == (n, s)
        scale = hd ** -0.5
        if "softmax_m2" in variant:
            scale *= draft_rope_factor(dc.get("rope_scaling")) ** 2
        out = torch.empty(heads, n, hd, dtype=self.dtype)
        for head in range(heads):
            kv = head // (heads // kv_heads)
            scores = (q[head] @ self.k[kv].T) * scale
            out[head] = scores.masked_fill(~allowed, float("-inf")).softmax(-1) @ self.v[kv]
        r = residual + out.transpose(0, 1).reshape(n, heads * hd) @ w[a + "o_proj.weight"].T
        r = r + silu_mlp(rms_norm(r, w[p + "post_attention_layernorm.weight"], eps), w, p + "mlp.")
        normed = rms_norm(r, w["norm.weight"], eps)
        logits = normed @ w["lm_head.weight"].T
        return logits, (normed if dc.get("norm_output") else r)

    # The cache as the tree drafter saves and restores it (DraftTreeDrafter.path_check).
    def cache_len(self):
        return self.k.shape[1]

    def snapshot(self):
        return self.k.clone(), self.v.clone()

    def restore(self, saved):
        self.k, self.v = (t.clone() for t in saved)


def run_draft_reference(dc, prefix, weights, embed, aux, tokens, step1_token, dtype, variant=()):
    """Step 0 over every row (from the aux states), step 1 from the last row's fed-back hidden."""
    ref = DraftReference(dc, prefix, weights, embed, dtype, variant)
    t = tokens.shape[0]
    logits0, fed0 = ref.step(tokens, ref.fc(aux), torch.arange(t))
    logits1, fed1 = ref.step(step1_token, fed0[-1:], torch.tensor([t]))
    return logits0, fed0, logits1, fed1


def run_draft_transformers(directory, dc, prefix, weights, embed, aux, tokens, step1_token):
    """The same two steps through transformers' Llama modules, configured from the written config.json.
    Step 1 reruns every row (causal attention: rows 0..T-1 are unchanged) plus the new one."""
    from transformers.models.llama import modeling_llama as ml
    config = transformers.LlamaConfig.from_pretrained(directory)
    config._attn_implementation = "eager"
    h, heads, kv_heads, hd = draft_dims(dc)
    eps = dc["rms_norm_eps"]
    assert config.head_dim == hd and config.rms_norm_eps == eps
    rotary = ml.LlamaRotaryEmbedding(config)
    if abs(rotary.attention_scaling - draft_rope_factor(dc.get("rope_scaling"))) > 1e-12:
        raise SystemExit(f"transformers' cos/sin factor {rotary.attention_scaling} differs from the reference's")
    attn = ml.LlamaAttention(config, 0)
    if attn.scaling != hd ** -0.5:
        raise SystemExit(f"transformers' Llama softmax scale {attn.scaling} is not head_dim^-0.5")
    attn.q_proj = torch.nn.Linear(2 * h, heads * hd, bias=False)
    attn.k_proj = torch.nn.Linear(2 * h, kv_heads * hd, bias=False)
    attn.v_proj = torch.nn.Linear(2 * h, kv_heads * hd, bias=False)
    mlp = ml.LlamaMLP(config)
    norms = {n: ml.LlamaRMSNorm(h, eps=eps) for n in ("input_layernorm", "hidden_norm", "post_attention_layernorm")}
    final = ml.LlamaRMSNorm(h, eps=eps)
    with torch.no_grad():
        for name in ("q_proj", "k_proj", "v_proj", "o_proj"):
            getattr(attn, name).weight.copy_(weights[prefix + "self_attn." + name + ".weight"])
        for name in ("gate_proj", "up_proj", "down_proj"):
            getattr(mlp, name).weight.copy_(weights[prefix + "mlp." + name + ".weight"])
        for name, module in norms.items():
            module.weight.copy_(weights[prefix + name + ".weight"])
        final.weight.copy_(weights["norm.weight"])
        ht = dc["target_hidden_size"]
        fc_in = aux
        if dc.get("norm_before_fc"):
            norm = ml.LlamaRMSNorm(aux.shape[-1], eps=eps)
            norm.weight.copy_(weights["input_norm.weight"])
            fc_in = norm(aux)
        if dc.get("fc_norm"):
            chunks = []
            for i, a in enumerate(aux.split(ht, -1)):
                norm = ml.LlamaRMSNorm(ht, eps=eps)
                norm.weight.copy_(weights[f"fc_norm.{i}.weight"])
                chunks.append(norm(a))
            fc_in = torch.cat(chunks, -1)
        g0 = fc_in @ weights["fc.weight"].T

        def forward(tok, g):
            n = tok.shape[0]
            x = torch.cat([norms["input_layernorm"](embed[tok]), norms["hidden_norm"](g)], -1)[None]
            residual = norms["hidden_norm"](g) if dc.get("norm_before_residual") else g
            cos, sin = rotary(x, torch.arange(n)[None])
            mask = torch.full((n, n), float("-inf")).triu(1)[None, None]
            out, _ = attn(x, position_embeddings=(cos, sin), attention_mask=mask)
            r = residual + out[0]
            r = r + mlp(norms["post_attention_layernorm"](r))
            normed = final(r)
            return normed @ weights["lm_head.weight"].T, (normed if dc.get("norm_output") else r)

        logits0, fed0 = forward(tokens, g0)
        logits1, fed1 = forward(torch.cat([tokens, step1_token]), torch.cat([g0, fed0[-1:]]))
    return logits0, fed0, logits1[-1:], fed1[-1:]


# ---------------------------------------------------------------------------------------------------
# EAGLE-2 dynamic draft trees (tree.safetensors of a draft fixture): the first tree the decode loop
# builds after the prompt, written from the contract in include/eagle3/draft_tree.h and the drafter's
# (include/eagle3/eagle3_drafter.h): an extend pass over the prompt rows (row p pairs the target hidden
# at p with the token at p + 1; the last row's token is the root, the target's argmax after the
# prompt), whose last row's logits give the root's children; then one masked pass per step over the
# frontier. Only DraftReference.step is shared with the draft-step fixtures above.

# Smallest gap (cumulative log-prob) accepted at every selection the tree depends on: the order of
# each expanded node's best k + 1 children, the order of each step's best k + 1 candidates (the
# frontier and its order), and the final cut between the last kept and the first dropped candidate.
# Another fp32 implementation's logits differ by ~1e-6, so a gap this size cannot flip.
MIN_TREE_MARGIN = 1e-4

TREE_SENSITIVITY = {
    "causal_tree": "tree rows attend every earlier tree row (plain causal) instead of their ancestors",
    "no_ancestors": "tree rows attend the extend rows and themselves only",
    "root_hidden": "every node fed the root's hidden instead of its parent's",
    "position_plus_one": "RoPE position T + d instead of (T - 1) + d",
    "position_flat": "every tree row at RoPE position T",
}


class DraftTreeDrafter:
    """The draft side of one build. Extend: rows 0..T-1 at positions 0..T-1 from the first-step
    hidden `g0` [T, H] (fc(aux) for an EAGLE-3 head, the target's final normed hidden for the MTP
    module), causal. A frontier node at depth d >= 1 is one new row: input hidden = its parent's
    fed-back hidden (the root's: the last extend row's), token = the node's target id, position
    (T - 1) + d; it attends every extend row, the tree rows of its ancestors (the root has none of its
    own: it is the last extend row) and itself. `ref` is any draft reference with step(tokens, g,
    positions, allowed), cache_len(), snapshot() and restore()."""

    def __init__(self, ref, g0, ext_tokens, variant=()):
        self.ref = ref
        self.t, self.variant = ext_tokens.shape[0], variant
        logits, fed = self.ref.step(ext_tokens, g0, torch.arange(self.t))
        self.root_logits = logits[-1]
        self.extend_cache = self.ref.snapshot()
        self.slot = {}              # candidate -> its tree row's cache slot
        self.hidden = {0: fed[-1]}  # candidate -> fed-back hidden
        self.expanded_logits = {}   # candidate -> its logits (for the path check)
        self.candidates = []

    def expand(self, candidates, frontier):
        self.candidates = candidates  # the build's list (grows in place)
        n, first = len(frontier), self.ref.cache_len()
        allowed = torch.zeros(n, first + n, dtype=torch.bool)
        allowed[:, :self.t] = True
        for i, c in enumerate(frontier):
            allowed[i, first + i] = True
            a = candidates[c]["parent"]
            while a > 0:
                allowed[i, self.slot[a]] = True
                a = candidates[a]["parent"]
        if "causal_tree" in self.variant:
            allowed[:, self.t:first] = True
            allowed[:, first:] = torch.ones(n, n, dtype=torch.bool).tril()
        if "no_ancestors" in self.variant:
            allowed[:, self.t:first] = False
        tokens = torch.tensor([candidates[c]["token"] for c in frontier], dtype=torch.int64)
        g = torch.stack([self.hidden[0 if "root_hidden" in self.variant else candidates[c]["parent"]]
                         for c in frontier])
        positions = torch.tensor([self.t - 1 + candidates[c]["depth"] for c in frontier])
        if "position_plus_one" in self.variant:
            positions = positions + 1
        if "position_flat" in self.variant:
            positions = torch.full((n,), self.t)
        logits, fed = self.ref.step(tokens, g, positions, allowed)
        for i, c in enumerate(frontier):
            self.slot[c] = first + i
            self.hidden[c] = fed[i]
            self.expanded_logits[c] = logits[i]
        return logits

    def path_check(self):
        """Each expanded node again, as a plain causal decode of its root path (one row per ancestor,
        then itself) after the extend rows: what the tree mask must reproduce. Returns the largest
        max |diff| / max |value| over the nodes."""
        err, candidates = 0.0, self.candidates
        for c, want in self.expanded_logits.items():
            path = []
            a = c
            while a > 0:
                path.append(a)
                a = candidates[a]["parent"]
            self.ref.restore(self.extend_cache)
            g = self.hidden[0]
            for node in reversed(path):
                logits, fed = self.ref.step(torch.tensor([candidates[node]["token"]]), g[None],
                                            torch.tensor([self.t - 1 + candidates[node]["depth"]]))
                g = fed[0]
            err = max(err, max_rel(logits[0], want))
        return err


def llama_tree_drafter(dc, prefix, weights, embed, aux):
    """make_drafter(ext_tokens, dtype, variant) for build_tree_fixture: the Llama-style head's tree rows."""
    def make(ext_tokens, dtype, variant=()):
        ref = DraftReference(dc, prefix, weights, embed, dtype)
        return DraftTreeDrafter(ref, ref.fc(aux), ext_tokens, variant)
    return make


def build_reference_tree(root, root_logits, expand, topk, num_steps, num_draft_tokens, d2t):
    """EAGLE-2 build as draft_tree.h documents it. Candidate 0 is the root; each step appends, per
    frontier node in frontier order, its top-k children best first (ties: lower draft id), scored
    parent score + log_softmax(logits in double); the next frontier is the best k of the step's
    candidates (ties: lower candidate index); finally the best num_draft_tokens - 1 candidates over all
    steps, in candidate order. Returns tokens, parents, scores (float64) and the smallest gap at a
    selection the result depends on, with where it was."""
    cands = [{"token": root, "parent": -1, "depth": 0, "score": 0.0}]
    margin = (math.inf, "")

    def note(values, what):
        nonlocal margin
        for i in range(len(values) - 1):
            gap = values[i] - values[i + 1]
            if gap < margin[0]:
                margin = (gap, f"{what}, ranks {i}/{i + 1}")

    def by_score(ids):
        return sorted(ids, key=lambda c: (-cands[c]["score"], c))

    frontier = [0]
    for step in range(num_steps):
        logits = root_logits[None] if step == 0 else expand(cands, frontier)
        assert logits.shape == (len(frontier), len(d2t))
        logp = torch.log_softmax(logits.double(), -1)
        step_cands = []
        for r, parent in enumerate(frontier):
            row = logits[r].tolist()
            ranked = sorted(range(len(row)), key=lambda j: (-row[j], j))
            note([logp[r, j].item() for j in ranked[:topk + 1]], f"step {step} children of candidate {parent}")
            for j in ranked[:topk]:
                step_cands.append(len(cands))
                cands.append({"token": j + int(d2t[j]), "parent": parent, "depth": cands[parent]["depth"] + 1,
                              "score": cands[parent]["score"] + logp[r, j].item()})
        if step + 1 < num_steps:
            ranked = by_score(step_cands)
            note([cands[c]["score"] for c in ranked[:topk + 1]], f"step {step} frontier")
            frontier = ranked[:topk]
    ranked = by_score(range(1, len(cands)))
    keep = num_draft_tokens - 1
    note([cands[c]["score"] for c in ranked[keep - 1:keep + 1]], "final cut")
    kept = sorted(ranked[:keep])
    node = {0: 0}
    tokens, parents, scores = [root], [-1], [0.0]
    for c in kept:
        assert cands[c]["parent"] in node, "a kept candidate without its parent"
        node[c] = len(tokens)
        tokens.append(cands[c]["token"])
        parents.append(node[cands[c]["parent"]])
        scores.append(cands[c]["score"])
    return tokens, parents, scores, margin


def build_tree_fixture(spec, directory, make_drafter, d2t, target_expected, log, file="tree.safetensors"):
    """`file` (tree.safetensors): the trees of spec["trees"] after the target fixture's prompt, drafted by
    make_drafter(ext_tokens, dtype, variant) -> DraftTreeDrafter. A reference that routes (the MTP
    module's MoE) reports its smallest routing gap as `ref.margin`, which must be at least
    MIN_ROUTING_MARGIN. Returns the README facts."""
    prompt = target_expected["tokens"].to(torch.int64)
    last = target_expected["logits"][-1].double()
    top2 = last.topk(2).values
    root = int(last.argmax())
    root_gap = (top2[0] - top2[1]).item()
    if root_gap < MIN_TREE_MARGIN:
        raise SystemExit(f"{spec['name']}: the target's top-2 logits after the prompt are {root_gap:.1e} apart")
    ext_tokens = torch.cat([prompt[1:], torch.tensor([root])])
    expected = {"prompt": prompt, "tokens": ext_tokens, "root": torch.tensor([root], dtype=torch.int64)}
    trees, fp64_err, path_err, margin = [], 0.0, 0.0, (math.inf, "")
    for name, topk, num_steps, num_draft_tokens in spec["trees"]:
        built = {}
        for dtype in (torch.float32, torch.float64):
            drafter = make_drafter(ext_tokens, dtype)
            built[dtype] = build_reference_tree(root, drafter.root_logits, drafter.expand, topk, num_steps,
                                                num_draft_tokens, d2t)
            if dtype == torch.float32:
                root_logits = drafter.root_logits
                path_err = max(path_err, drafter.path_check())
                routing_margin = getattr(drafter.ref, "margin", math.inf)
                if routing_margin < MIN_ROUTING_MARGIN:
                    raise SystemExit(f"{spec['name']} tree {name}: routing near-tie {routing_margin:.1e}")
        tokens, parents, scores, m = built[torch.float32]
        if (tokens, parents) != built[torch.float64][:2]:
            raise SystemExit(f"{spec['name']} tree {name}: the fp32 and fp64 builds differ")
        fp64_err = max(fp64_err, max(abs(a - b) for a, b in zip(scores, built[torch.float64][2])))
        if m[0] < MIN_TREE_MARGIN:
            raise SystemExit(f"{spec['name']} tree {name}: near-tie {m[0]:.1e} at {m[1]}")
        if m[0] < margin[0]:
            margin = (m[0], f"{name}: {m[1]}")
        expected[f"{name}.params"] = torch.tensor([topk, num_steps, num_draft_tokens], dtype=torch.int64)
        expected[f"{name}.tree_tokens"] = torch.tensor(tokens, dtype=torch.int64)
        expected[f"{name}.tree_parents"] = torch.tensor(parents, dtype=torch.int32)
        expected[f"{name}.tree_scores"] = torch.tensor(scores, dtype=torch.float64).float()
        trees.append({"name": name, "params": (topk, num_steps, num_draft_tokens), "tokens": tokens,
                      "parents": parents, "scores": scores})
        log(f"{spec['name']} tree {name}: tokens {tokens}, parents {parents}, smallest gap {m[0]:.2e} ({m[1]})")
    # What a mistake in the drafter's tree rows would change (fp64): trees whose tokens or parents
    # change, and the largest score difference over the kept nodes.
    sensitivity = {}
    for variant in TREE_SENSITIVITY:
        changed, worst = 0, 0.0
        for (name, topk, num_steps, num_draft_tokens), t in zip(spec["trees"], trees):
            drafter = make_drafter(ext_tokens, torch.float64, (variant,))
            v = build_reference_tree(root, drafter.root_logits, drafter.expand, topk, num_steps, num_draft_tokens, d2t)
            changed += (v[0], v[1]) != (t["tokens"], t["parents"])
            worst = max(worst, max(abs(a - b) for a, b in zip(v[2], t["scores"])))
        sensitivity[variant] = (changed, worst)
    if fp64_err > 1e-5 or path_err > 1e-5:
        raise SystemExit(f"{spec['name']} trees: fp32 vs fp64 scores {fp64_err:.1e}, tree mask vs path decode "
                         f"{path_err:.1e}")
    expected["root_logits"] = root_logits.float().contiguous()
    metadata = {"model": spec["name"], "target": spec["target"], "torch": torch.__version__,
                "oracle": "independent EAGLE-2 tree build over the fp32 draft reference",
                "trees": " ".join(t[0] for t in spec["trees"])}
    save_safetensors(os.path.join(directory, file), expected, metadata)
    return {"root": root, "root_gap": root_gap, "trees": trees, "fp64_err": fp64_err, "path_err": path_err,
            "margin": margin, "sensitivity": sensitivity}


def read_target_fixture(out_dir, name):
    """(text-model config, embedding f32, expected outputs) of a target fixture; Kimi-K2.5's wrapper holds
    the text model as text_config and its tensors under language_model."""
    directory = os.path.join(out_dir, name)
    with open(os.path.join(directory, "config.json")) as f:
        config = json.load(f)
    prefix = K25_PREFIX if "text_config" in config else ""
    tensors = {}
    for file in sorted(f for f in os.listdir(directory) if f.startswith("model-")):
        tensors.update(load_file(os.path.join(directory, file)))
    return (config.get("text_config", config), tensors[prefix + "model.embed_tokens.weight"].float(),
            load_file(os.path.join(directory, "expected.safetensors")))


def build_draft(spec, out_dir, log):
    target_config, embed, target_expected = read_target_fixture(out_dir, spec["target"])
    dc = draft_hub_config(spec, target_config)
    directory = os.path.join(out_dir, spec["name"])
    if os.path.isdir(directory):
        shutil.rmtree(directory)
    os.makedirs(directory)
    with open(os.path.join(directory, "config.json"), "w") as f:
        json.dump(dc, f, indent=2)
        f.write("\n")
    prefix = spec["prefix"]
    weights, d2t, t2d = random_draft_weights(dc, prefix, spec["seed"])
    stored = {n: w.to(torch.bfloat16) for n, w in weights.items()}
    stored.update({"d2t": d2t, "t2d": t2d})
    save_safetensors(os.path.join(directory, "model.safetensors"), stored, {"format": "pt"})

    # Inputs: the target's boundaries for the aux ids (output-of-layer id k = boundary k + 1), and for
    # row p the target token at p + 1 (the last row: a fixed token).
    ids = dc["eagle_config"]["eagle_aux_hidden_state_layer_ids"]
    aux = torch.cat([target_expected[f"boundary.{k + 1}"] for k in ids], -1).float().contiguous()
    target_tokens = target_expected["tokens"]
    tokens = torch.cat([target_tokens[1:], torch.tensor([spec["last_token"]])]).to(torch.int64)
    step1_token = torch.tensor([spec["step1_token"]], dtype=torch.int64)

    got = run_draft_reference(dc, prefix, weights, embed, aux, tokens, step1_token, torch.float32)
    exact = run_draft_reference(dc, prefix, weights, embed, aux, tokens, step1_token, torch.float64)
    oracle = run_draft_transformers(directory, dc, prefix, weights, embed, aux, tokens, step1_token)
    names = ("logits_step0", "hidden_step0", "logits_step1", "hidden_step1")
    fp64_err = max(max_rel(a, b) for a, b in zip(got, exact))
    oracle_err = max(max_rel(a, b) for a, b in zip(oracle, got))
    if fp64_err > 1e-5 or oracle_err > 1e-5:
        raise SystemExit(f"{spec['name']}: reference fp32 vs fp64 {fp64_err:.2e}, vs transformers blocks "
                         f"{oracle_err:.2e} (relative to max |value|)")
    expected = {"aux": aux, "tokens": tokens, "token_step1": step1_token}
    expected.update({n: t.float().contiguous() for n, t in zip(names, got)})
    metadata = {"model": spec["name"], "target": spec["target"], "torch": torch.__version__,
                "transformers": transformers.__version__, "oracle": "independent EAGLE-3 draft reference, fp32"}
    save_safetensors(os.path.join(directory, "expected.safetensors"), expected, metadata)
    tree = None
    if spec.get("trees"):
        tree = build_tree_fixture(spec, directory, llama_tree_drafter(dc, prefix, weights, embed, aux), d2t,
                                  target_expected, log)

    sensitivity = {}
    for variant in DRAFT_SENSITIVITY:
        if variant in ("no_attn_factor", "softmax_m2") and dc["rope_scaling"]["rope_type"] != "yarn":
            continue  # Llama's other scalings have no attention factor
        v = run_draft_reference(dc, prefix, weights, embed, aux, tokens, step1_token, torch.float64, (variant,))
        sensitivity[variant] = (max_rel(v[0], exact[0]), int((v[0].argmax(-1) != exact[0].argmax(-1)).sum()))
    sizes = {f: os.path.getsize(os.path.join(directory, f)) for f in sorted(os.listdir(directory))}
    target_ids = (torch.arange(dc["draft_vocab_size"]) + d2t)
    info = {
        "name": spec["name"],
        "what": spec["what"].format(af=draft_rope_factor(dc["rope_scaling"])),
        "seed": spec["seed"],
        "config": dc,
        "tokens": tokens.tolist(),
        "step1_token": spec["step1_token"],
        "num_tensors": len(stored),
        "sizes": sizes,
        "fp64_err": fp64_err,
        "oracle_err": oracle_err,
        "sensitivity": sensitivity,
        "d2t_range": (int(target_ids.min()), int(target_ids.max())),
        "tree": tree,
    }
    log(f"{spec['name']}: {len(stored)} tensors, {sum(sizes.values())} bytes, fp32 vs fp64 {fp64_err:.1e}, "
        f"vs transformers blocks {oracle_err:.1e}")
    return info


# ---------------------------------------------------------------------------------------------------
# Drafters made of DeepSeek layers (issue 21, docs/mla_drafts.md): the MLA EAGLE-3 draft (Kimi-K2.5
# style) and DeepSeek-V3's MTP module. Source ids S1-S9 and M1-M8 below are those of the table in
# docs/mla_drafts.md "Sources". As for the Llama-style head, the expected outputs come from an
# independent implementation with an explicit cache (fp32), checked against itself in fp64 and against
# the same drafter assembled from transformers' DeepSeek-V3 modules (DeepseekV3Attention,
# DeepseekV3RotaryEmbedding, DeepseekV3MLP, DeepseekV3DecoderLayer with its MoE, DeepseekV3RMSNorm).


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


# --- DeepSeek-V3's MTP module ----------------------------------------------------------------------

MTP_SENSITIVITY = {
    "prenorm_hidden": "the pre-norm boundary L fed instead of model.norm's output (the CONTROL)",
    "hidden_first": "concat(hnorm(h), enorm(e)) instead of embeddings first (the report's order, M6)",
    "feed_r": "the un-normalized r fed back instead of shared_head.norm(r) (vLLM before #45895)",
    "position0_mask": "vLLM's zeroed embedding at position 0 (M2)",
    "read_copies": "the module's embed_tokens / shared_head.head copies instead of the target's",
    "no_m2": "softmax scale without the YaRN m^2 factor",
    "neox_rope": "rotate (i, i + d/2) pairs instead of adjacent pairs",
    "no_bias": "select experts without e_score_correction_bias",
}


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


class MtpReference:
    """The MTP module as a drafter (docs/mla_drafts.md "Forward"), with an explicit latent cache:
      e = enorm(embed(token))                   the TARGET's embedding (M1, M4 set_embed_and_head, M5)
      h = hnorm(h_in)                           h_in: the target's final hidden after model.norm at the
                                                first step (M3, M4, M5, M7), the fed-back o later
      x = eh_proj(concat(e, h))                 embeddings first (M2, M4, M5; the report writes the
                                                reverse, M6, but the checkpoints are trained for this)
      r = x + MLA(input_layernorm(x));  r = r + MoE(post_attention_layernorm(r))   the full layer (M1)
      o = shared_head.norm(r);  logits = lm_head(o)   the TARGET's lm_head (M4, M5)
      fed back: o (M4, M5, vLLM after #45895, M2)
    No position-0 embedding mask (SGLang and TensorRT-LLM, M4, M5; vLLM's is the variant
    position0_mask, M2). Records the smallest routing gap over every row it ran as `margin`."""

    def __init__(self, c, hub, mtp, dtype, variant=()):
        self.c, self.dtype, self.variant = c, dtype, variant
        self.p = f"model.layers.{c['num_hidden_layers']}."
        self.w = {n: t.to(dtype) for n, t in mtp.items()}
        copies = "read_copies" in variant
        self.embed = (mtp[self.p + "embed_tokens.weight"] if copies else hub["model.embed_tokens.weight"]).to(dtype)
        self.head = (mtp[self.p + "shared_head.head.weight"] if copies else hub["lm_head.weight"]).to(dtype)
        self.attn = MlaBlockReference(c, c, self.w, self.p + "self_attn.", dtype, variant)
        self.margin = math.inf
        self.routing = []  # (ids sorted, weights) of each step

    def step(self, tokens, h_in, positions, allowed=None):
        c, w, p, variant = self.c, self.w, self.p, self.variant
        eps = c["rms_norm_eps"]
        emb = self.embed[tokens]
        if "position0_mask" in variant:
            emb = emb.masked_fill((positions == 0)[:, None], 0.0)
        e = rms_norm(emb, w[p + "enorm.weight"], eps)
        h = rms_norm(h_in.to(self.dtype), w[p + "hnorm.weight"], eps)
        x = torch.cat([h, e] if "hidden_first" in variant else [e, h], -1) @ w[p + "eh_proj.weight"].T
        r = x + self.attn(rms_norm(x, w[p + "input_layernorm.weight"], eps), positions, allowed)
        out, ids, weights, margin = moe_reference(
            c, w, p + "mlp.", rms_norm(r, w[p + "post_attention_layernorm.weight"], eps), variant)
        self.margin = min(self.margin, margin)
        self.routing.append((ids, weights))
        r = r + out
        o = rms_norm(r, w[p + "shared_head.norm.weight"], eps)
        return o @ self.head.T, (r if "feed_r" in variant else o)

    def cache_len(self):
        return self.attn.cache.shape[0]

    def snapshot(self):
        return self.attn.cache.clone()

    def restore(self, saved):
        self.attn.cache = saved.clone()


def run_mtp_reference(c, hub, mtp, hidden, tokens, step1_token, dtype, variant=()):
    """Step 0 over every row (row p: target hidden at p, token p + 1, position p), then step 1: one row at
    position T from the last row's fed-back hidden. Returns (logits0, fed0, logits1, fed1, ref)."""
    ref = MtpReference(c, hub, mtp, dtype, variant)
    t = tokens.shape[0]
    logits0, fed0 = ref.step(tokens, hidden, torch.arange(t))
    logits1, fed1 = ref.step(step1_token, fed0[-1:], torch.tensor([t]))
    return logits0, fed0, logits1, fed1, ref


def mtp_tree_drafter(c, hub, mtp, hidden):
    def make(ext_tokens, dtype, variant=()):
        return DraftTreeDrafter(MtpReference(c, hub, mtp, dtype), hidden.to(dtype), ext_tokens, variant)
    return make


def mtp_inputs(spec, c, tokens, last_logits):
    """(step tokens, step-1 token, tree extend tokens, root): row p of a pass pairs the target hidden at p
    with token p + 1; the step fixture's last row a fixed token, the tree extend's the root (the target's
    argmax after the prompt)."""
    m = spec["mtp"]
    root = int(last_logits.double().argmax())
    step_tokens = torch.cat([tokens[1:], torch.tensor([m["last_token"]])]).to(torch.int64)
    ext_tokens = torch.cat([tokens[1:], torch.tensor([root])]).to(torch.int64)
    return step_tokens, torch.tensor([m["step1_token"]], dtype=torch.int64), ext_tokens, root


def choose_mtp_weights(spec, c, hub, tokens, ref_logits, ref_boundaries, log):
    """The first seed (from spec["mtp"]["seed"]) whose MTP module, run in fp64 from the fp64 target
    reference, has routing gaps >= MIN_ROUTING_MARGIN on every row of the step fixture, its control and
    the trees, and tree-selection gaps >= 2 MIN_TREE_MARGIN."""
    m = spec["mtp"]
    hidden = rms_norm(ref_boundaries[-1], hub["model.norm.weight"].double(), c["rms_norm_eps"])
    step_tokens, step1, ext_tokens, root = mtp_inputs(spec, c, tokens, ref_logits[-1])
    d2t = torch.zeros(c["vocab_size"], dtype=torch.int64)
    for seed in range(m["seed"], m["seed"] + 200):
        mtp = random_mtp_weights(c, seed, spec["router_std"])
        margin = min(run_mtp_reference(c, hub, mtp, h, step_tokens, step1, torch.float64)[4].margin
                     for h in (hidden, ref_boundaries[-1]))
        tree_margin = math.inf
        for _, topk, num_steps, num_draft_tokens in m["trees"]:
            drafter = mtp_tree_drafter(c, hub, mtp, hidden)(ext_tokens, torch.float64)
            tm = build_reference_tree(root, drafter.root_logits, drafter.expand, topk, num_steps, num_draft_tokens,
                                      d2t)[3]
            margin, tree_margin = min(margin, drafter.ref.margin), min(tree_margin, tm[0])
        if margin >= MIN_ROUTING_MARGIN and tree_margin >= 2 * MIN_TREE_MARGIN:
            log(f"{spec['name']} MTP: seed {seed}, routing margin {margin:.1e}, tree margin {tree_margin:.1e}")
            return mtp, seed
    raise SystemExit(f"{spec['name']}: no MTP seed without routing or tree near-ties")


def run_mtp_transformers(model, c, mtp, hidden, tokens, step1_token):
    """The same two steps through transformers: the target's own embed_tokens, rotary_emb and lm_head, a
    DeepseekV3DecoderLayer built at the module's layer index (MoE by transformers' rule, layer >=
    first_k_dense_replace), DeepseekV3RMSNorm for enorm / hnorm / shared_head.norm and an nn.Linear
    eh_proj. Step 1 reruns every row plus the new one (causal: rows 0..T-1 are unchanged). Returns the
    outputs and the MTP layer's routing per step (ids sorted, weights), from a hook on its router."""
    from transformers.models.deepseek_v3 import modeling_deepseek_v3 as mv3
    config, layer_index = model.config, c["num_hidden_layers"]
    p, h, eps = f"model.layers.{layer_index}.", c["hidden_size"], c["rms_norm_eps"]
    layer = mv3.DeepseekV3DecoderLayer(config, layer_index)
    state = {n[len(p):]: t for n, t in mtp.items() if ".mlp.experts." not in n}
    own = ("enorm.weight", "hnorm.weight", "eh_proj.weight", "shared_head.norm.weight", "embed_tokens.weight",
           "shared_head.head.weight")
    for name in own:
        state.pop(name)
    experts = range(c["n_routed_experts"])
    e = p + "mlp.experts."
    state["mlp.experts.gate_up_proj"] = torch.stack(
        [torch.cat([mtp[f"{e}{i}.gate_proj.weight"], mtp[f"{e}{i}.up_proj.weight"]], 0) for i in experts])
    state["mlp.experts.down_proj"] = torch.stack([mtp[f"{e}{i}.down_proj.weight"] for i in experts])
    layer.load_state_dict(state, strict=True)
    layer.eval()
    if not isinstance(layer.mlp, mv3.DeepseekV3MoE):
        raise SystemExit("transformers built the MTP layer with a dense MLP")
    norms = {}
    for name in ("enorm", "hnorm", "shared_head.norm"):
        norms[name] = mv3.DeepseekV3RMSNorm(h, eps=eps)
        norms[name].weight.data.copy_(mtp[p + name + ".weight"])
    eh_proj = torch.nn.Linear(2 * h, h, bias=False)
    eh_proj.weight.data.copy_(mtp[p + "eh_proj.weight"])
    routing = []
    hook = layer.mlp.gate.register_forward_hook(lambda module, args, output: routing.append(output))

    def forward(tok, hid):
        n = tok.shape[0]
        x = eh_proj(torch.cat([norms["enorm"](model.model.embed_tokens(tok)), norms["hnorm"](hid)], -1))[None]
        positions = torch.arange(n)[None]
        cos, sin = model.model.rotary_emb(x, positions)
        mask = torch.full((n, n), float("-inf")).triu(1)[None, None]
        r = layer(x, attention_mask=mask, position_ids=positions, position_embeddings=(cos, sin))
        o = norms["shared_head.norm"](r[0])
        return model.lm_head(o), o

    with torch.no_grad():
        logits0, fed0 = forward(tokens, hidden)
        logits1, fed1 = forward(torch.cat([tokens, step1_token]), torch.cat([hidden, fed0[-1:]]))
    hook.remove()
    sorted_routing = []
    for _, weights, ids in routing:
        order = ids.argsort(-1)
        sorted_routing.append((ids.gather(1, order), weights.gather(1, order)))
    return (logits0, fed0, logits1[-1:], fed1[-1:]), sorted_routing


def build_mtp_fixture(spec, c, directory, hub, mtp, mtp_seed, model, tokens, target_logits, boundaries, log):
    """mtp_expected.safetensors and mtp_tree.safetensors of a target fixture with an MTP module. Returns the
    README facts."""
    layer = c["num_hidden_layers"]
    prenorm = boundaries[layer].float()
    # h_p = the lm_head input: model.norm of the last boundary, as the oracle computes it (M3, M4, M5, M7).
    with torch.no_grad():
        hidden = model.model.norm(prenorm[None])[0].float().contiguous()
    step_tokens, step1, _, _ = mtp_inputs(spec, c, tokens, target_logits[-1])  # the tree build finds its own
    got = run_mtp_reference(c, hub, mtp, hidden, step_tokens, step1, torch.float32)
    exact = run_mtp_reference(c, hub, mtp, hidden.double(), step_tokens, step1, torch.float64)
    oracle, hf_routing = run_mtp_transformers(model, c, mtp, hidden, step_tokens, step1)
    control = run_mtp_reference(c, hub, mtp, prenorm, step_tokens, step1, torch.float32)
    control_exact = run_mtp_reference(c, hub, mtp, prenorm.double(), step_tokens, step1, torch.float64)
    oracle_control, _ = run_mtp_transformers(model, c, mtp, prenorm, step_tokens, step1)
    fp64_err = max(max_rel(a, b) for a, b in zip(got[:4] + control[:4], exact[:4] + control_exact[:4]))
    oracle_err = max(max_rel(a, b) for a, b in zip(oracle + oracle_control, got[:4] + control[:4]))
    if fp64_err > 1e-5 or oracle_err > 1e-5:
        raise SystemExit(f"{spec['name']} MTP: reference fp32 vs fp64 {fp64_err:.2e}, vs transformers {oracle_err:.2e}")
    if min(got[4].margin, control[4].margin) < MIN_ROUTING_MARGIN:
        raise SystemExit(f"{spec['name']} MTP: routing near-tie in the fp32 reference")
    # The MTP layer's routing as transformers chose it (step 0 rows, then the step-1 rerun's last row)
    # must be the reference's.
    ids0, weights0 = hf_routing[0]
    ids1, weights1 = hf_routing[1][0][-1:], hf_routing[1][1][-1:]
    (ref_ids0, ref_weights0), (ref_ids1, ref_weights1) = got[4].routing
    if not torch.equal(ids0, ref_ids0) or not torch.equal(ids1, ref_ids1):
        raise SystemExit(f"{spec['name']} MTP: routing differs between transformers and the reference")
    assert max(max_rel(weights0, ref_weights0), max_rel(weights1, ref_weights1)) < 1e-5
    control_diff = max_rel(control[0], got[0])
    control_rows = int((control[0].argmax(-1) != got[0].argmax(-1)).sum())
    names = ("logits_step0", "hidden_step0", "logits_step1", "hidden_step1")
    expected = {"hidden_in": hidden, "hidden_in_prenorm": prenorm.contiguous(), "tokens": step_tokens,
                "token_step1": step1}
    expected.update({n: t.float().contiguous() for n, t in zip(names, got[:4])})
    expected.update({"control_" + n: t.float().contiguous() for n, t in zip(names[:2], control[:2])})
    expected.update({"router.topk_ids_step0": ids0.to(torch.int64).contiguous(),
                     "router.topk_weights_step0": weights0.float().contiguous(),
                     "router.topk_ids_step1": ids1.to(torch.int64).contiguous(),
                     "router.topk_weights_step1": weights1.float().contiguous()})
    metadata = {"model": spec["name"] + " MTP module 0", "target": spec["name"], "torch": torch.__version__,
                "transformers": transformers.__version__, "oracle": "independent MTP reference, fp32",
                "control_vs_expected": f"{control_diff:.3e}"}
    save_safetensors(os.path.join(directory, "mtp_expected.safetensors"), expected, metadata)

    d2t = torch.zeros(c["vocab_size"], dtype=torch.int64)
    target_expected = {"tokens": tokens.to(torch.int64), "logits": target_logits.float()}
    tree_spec = {"name": spec["name"] + " MTP module 0", "target": spec["name"], "trees": spec["mtp"]["trees"]}
    tree = build_tree_fixture(tree_spec, directory, mtp_tree_drafter(c, hub, mtp, hidden), d2t, target_expected, log,
                              file="mtp_tree.safetensors")

    sensitivity = {}
    for variant in MTP_SENSITIVITY:
        if variant == "prenorm_hidden":
            v = control_exact
        else:
            v = run_mtp_reference(c, hub, mtp, hidden.double(), step_tokens, step1, torch.float64, (variant,))
        sensitivity[variant] = (max_rel(v[0], exact[0]), int((v[0].argmax(-1) != exact[0].argmax(-1)).sum()),
                                max_rel(v[2], exact[2]))
    log(f"{spec['name']} MTP: fp32 vs fp64 {fp64_err:.1e}, vs transformers {oracle_err:.1e}, control differs by "
        f"{control_diff:.2e} ({control_rows} rows change argmax)")
    return {"seed": mtp_seed, "tokens": step_tokens.tolist(), "step1_token": int(step1[0]), "fp64_err": fp64_err,
            "oracle_err": oracle_err, "control_diff": control_diff, "control_rows": control_rows,
            "margin": min(got[4].margin, control[4].margin), "sensitivity": sensitivity, "tree": tree,
            "num_tensors": len(mtp)}


# --- The MLA EAGLE-3 draft ---------------------------------------------------------------------------

MLA_DRAFTS = [
    {
        "name": "mla_draft_k25",
        "target": "k25_int4",
        "seed": 9001,
        "prefix": "midlayer.",
        "last_token": 399,
        "step1_token": 123,
        # As draft_v2's trees: name, topk, num_steps, num_draft_tokens.
        "trees": [("k3_s3_n8", 3, 3, 8), ("k1_s4_n5", 1, 4, 5), ("k2_s5_n10", 2, 5, 10), ("k4_s4_n16", 4, 4, 16)],
        "what": "Kimi-K2.5-style MLA EAGLE-3 draft in TorchSpec's native form (`midlayer.*`, S3, S4) on "
        "`k25_int4`: `Eagle3DeepseekV2ForCausalLM`, model_type kimi_k2 (S8); q_lora_rank 32 (q_a_proj [32, 2H] -> "
        "q_a_layernorm -> q_b_proj); aux ids [0, 1, 2] (output-of-layer: boundaries 1, 2, 3); the full "
        "vocabulary (draft_vocab_size 400 = vocab_size, no d2t / t2d: the identity map); rms_norm_eps 1e-5 as "
        "the Kimi drafts (S5, S6; the target's is 1e-6); the draft's own YaRN in the form of TorchSpec's K2.5 "
        "draft config (S5: theta 50000, beta_fast 1, beta_slow 1, mscale = mscale_all_dim = 1), scaled down "
        "(factor 8 over an original 32; the target's is x4 over 64 with beta_fast 32): softmax scale m^2 = "
        "{m2:.6f}, cos/sin factor {af:.6f}.",
        "config": {
            "architectures": ["Eagle3DeepseekV2ForCausalLM"],
            "model_type": "kimi_k2",
            "hidden_size": 64,
            "intermediate_size": 64,
            "num_attention_heads": 8,
            "num_key_value_heads": 8,
            "q_lora_rank": 32,
            "kv_lora_rank": 32,
            "qk_nope_head_dim": 16,
            "qk_rope_head_dim": 16,
            "v_head_dim": 16,
            "draft_vocab_size": 400,
            "rms_norm_eps": 1e-5,
            "max_position_embeddings": 256,
            "rope_theta": 50000.0,
            "rope_scaling": {"type": "yarn", "factor": 8.0, "original_max_position_embeddings": 32,
                             "beta_fast": 1.0, "beta_slow": 1.0, "mscale": 1.0, "mscale_all_dim": 1.0},
            "eagle_config": {"eagle_aux_hidden_state_layer_ids": [0, 1, 2], "use_aux_hidden_state": True},
        },
    },
    {
        "name": "mla_draft_k25_eagle31",
        "target": "k25_int4",
        "seed": 9101,
        "prefix": "layers.0.",
        "last_token": 0,
        "step1_token": 398,
        "what": "EAGLE 3.1 MLA draft in the vLLM-format export (`layers.0.*`, S4, S6, S7) on `k25_int4`: "
        "`Eagle3DeepseekV3ForCausalLM` (vLLM's alias, S2), model_type deepseek_v3 (S5); fc_norm (one RMSNorm "
        "per tap, `fc_norm.{{i}}.weight`) and norm_output (the fed-back hidden is norm(r)) at the top level "
        "(S1, S2, S7); q_lora_rank null (a plain q_proj [heads * 24, 2H], S2, S3); qk_rope_head_dim 8; aux ids "
        "[0, 1, 2] (in layer order, as the engines capture taps); draft vocab 150 of 400 with d2t and t2d (S4, S9); "
        "ModelOpt's eagle_config flags at their EAGLE-3 values and the target's MoE / MTP keys its Kimi "
        "template copies (inert, S6); rms_norm_eps 1e-6; YaRN x4 over an original 64 with rope_theta "
        "20000, beta_fast 8, beta_slow 2, mscale 1.0 and mscale_all_dim 0.8 (softmax scale m^2 = {m2:.6f}, "
        "cos/sin factor {af:.6f} != 1: both YaRN factors exercised; real drafts state 1 and 1).",
        "config": {
            "architectures": ["Eagle3DeepseekV3ForCausalLM"],
            "model_type": "deepseek_v3",
            "hidden_size": 64,
            "intermediate_size": 64,
            "num_attention_heads": 8,
            "num_key_value_heads": 8,
            "q_lora_rank": None,
            "kv_lora_rank": 32,
            "qk_nope_head_dim": 16,
            "qk_rope_head_dim": 8,
            "v_head_dim": 16,
            "draft_vocab_size": 150,
            "rms_norm_eps": 1e-6,
            "max_position_embeddings": 256,
            "rope_theta": 20000.0,
            "rope_scaling": {"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64,
                             "beta_fast": 8.0, "beta_slow": 2.0, "mscale": 1.0, "mscale_all_dim": 0.8},
            "eagle_config": {"eagle_aux_hidden_state_layer_ids": [0, 1, 2], "use_aux_hidden_state": True,
                             "use_input_layernorm_in_first_layer": True, "use_last_layernorm": True,
                             "use_mtp_layernorm": False, "next_layer_regular": True, "parallel_draft_step": 1,
                             "parallel_draft_heads_num_layers": 1},
            "fc_norm": True,
            "norm_output": True,
            "n_routed_experts": 8,
            "n_shared_experts": 1,
            "moe_intermediate_size": 96,
            "num_experts_per_tok": 3,
            "first_k_dense_replace": 1,
            "num_nextn_predict_layers": 0,
        },
    },
]

MLA_DRAFT_COMMON_KEYS = {
    "attention_bias": False,
    "attention_dropout": 0.0,
    "bos_token_id": 0,
    "eos_token_id": 1,
    "hidden_act": "silu",
    "initializer_range": 0.02,
    "num_hidden_layers": 1,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "use_cache": True,
}

MLA_DRAFT_SENSITIVITY = {
    "no_m2": "softmax scale without the YaRN m^2 factor",
    "no_yarn_freq": "plain RoPE frequencies instead of the draft's YaRN",
    "no_attn_factor": "cos/sin without the mscale/mscale_all_dim factor",
    "target_rope": "the target's rope_theta / rope_scaling instead of the draft's own",
    "neox_rope": "rotate (i, i + d/2) pairs instead of adjacent pairs",
    "hidden_first": "concat(hidden_norm(g), input_layernorm(embed)) instead of embeddings first",
    "flip_norm_before_residual": "residual hidden_norm(g) instead of g (vLLM's norm_before_residual)",
    "aux_reversed": "taps concatenated in reverse order",
    "flip_fc_norm": "the opposite fc_norm",
    "flip_norm_output": "the opposite norm_output (changes step 1 only)",
}


def mla_draft_hub_config(spec, target_config):
    c = dict(MLA_DRAFT_COMMON_KEYS)
    c.update(spec["config"])
    c["vocab_size"] = target_config["vocab_size"]
    c["target_hidden_size"] = target_config["hidden_size"]
    c["transformers_version"] = transformers.__version__
    return dict(sorted(c.items()))


def mla_draft_weight_shapes(dc, prefix):
    """In the order of eagle3's schema (MlaDraftWeights, src/mla_draft_weights.cc): the 2H input of q_a /
    q_proj and kv_a (S1: "EAGLE3 doubles MLA's QKV-down input"; S2, S3, S7)."""
    h, ht = dc["hidden_size"], dc["target_hidden_size"]
    taps = len(dc["eagle_config"]["eagle_aux_hidden_state_layer_ids"])
    shapes = [("fc.weight", (h, taps * ht))]
    if dc.get("fc_norm"):
        shapes += [(f"fc_norm.{i}.weight", (ht,)) for i in range(taps)]
    p = prefix
    shapes += [(p + "input_layernorm.weight", (h,)), (p + "hidden_norm.weight", (h,))]
    shapes += mla_attention_shapes(dc, p + "self_attn.", 2 * h)
    shapes.append((p + "post_attention_layernorm.weight", (h,)))
    shapes += mlp_shapes(p + "mlp.", h, dc["intermediate_size"])
    shapes += [("norm.weight", (h,)), ("lm_head.weight", (dc["draft_vocab_size"], h))]
    return shapes


def random_mla_draft_weights(dc, prefix, seed):
    """As random_draft_weights; d2t / t2d only with a reduced vocabulary (None otherwise: the identity,
    as TorchSpec writes no map for a full-vocabulary head and vLLM / eagle3 read none)."""
    g = torch.Generator().manual_seed(seed)
    weights = {}
    for name, shape in mla_draft_weight_shapes(dc, prefix):
        if len(shape) == 1:
            w = 1.0 + 0.1 * torch.randn(shape, generator=g, dtype=torch.float64)
        else:
            w = torch.randn(shape, generator=g, dtype=torch.float64) / math.sqrt(shape[1])
        weights[name] = w.to(torch.bfloat16).to(torch.float32)
    vocab, draft_vocab = dc["vocab_size"], dc["draft_vocab_size"]
    if draft_vocab == vocab:
        return weights, None, None
    ids = torch.randperm(vocab, generator=g)[:draft_vocab].sort().values
    t2d = torch.zeros(vocab, dtype=torch.bool)
    t2d[ids] = True
    return weights, (ids - torch.arange(draft_vocab)).to(torch.int64), t2d


class MlaDraftReference(DraftReference):
    """The MLA EAGLE-3 draft step (docs/mla_drafts.md "Forward"; S1 Eagle3MLADecoderLayer /
    Eagle3MLAModel, S2 DeepseekV2Eagle3DecoderLayer, S3 DeepSeekDecoderLayer, S7):
      g = fc(aux) at the first step (fc_norm: each tap normed first; DraftReference.fc), the parent's
          fed-back hidden later
      x = concat(input_layernorm(embed(tok)), hidden_norm(g))      [n, 2H], embeddings first (S1, S2, S3)
      r = g + MLA(x)               residual g (hidden_norm(g) with norm_before_residual, vLLM only: S2)
      r = r + MLP(post_attention_layernorm(r))                     dense SiLU MLP (S2: never MoE)
      logits = lm_head(norm(r)) over the draft vocabulary; fed back r, or norm(r) with norm_output (S1, S2)
    The MLA block runs the draft's own RoPE (adjacent pairs, its YaRN: S2 deepseek_yarn, S3, S5)."""

    def __init__(self, dc, prefix, weights, embed, dtype, variant=(), target_rope=None):
        self.dc, self.p, self.dtype, self.variant = dc, prefix, dtype, variant
        self.w = {n: t.to(dtype) for n, t in weights.items()}
        self.embed = embed.to(dtype)
        if "flip_fc_norm" in variant:
            self.dc = dict(dc, fc_norm=not dc.get("fc_norm"))
            taps = len(dc["eagle_config"]["eagle_aux_hidden_state_layer_ids"])
            self.w.update({f"fc_norm.{i}.weight": torch.ones(dc["target_hidden_size"], dtype=dtype)
                           for i in range(taps) if f"fc_norm.{i}.weight" not in self.w})
        rope = target_rope if "target_rope" in variant else dc
        self.attn = MlaBlockReference(dc, rope, self.w, prefix + "self_attn.", dtype, variant)

    def step(self, tokens, g, positions, allowed=None):
        dc, w, p, variant = self.dc, self.w, self.p, self.variant
        eps = dc["rms_norm_eps"]
        g = g.to(self.dtype)
        e = rms_norm(self.embed[tokens], w[p + "input_layernorm.weight"], eps)
        hn = rms_norm(g, w[p + "hidden_norm.weight"], eps)
        x = torch.cat([hn, e] if "hidden_first" in variant else [e, hn], -1)
        residual = hn if dc.get("norm_before_residual", False) != ("flip_norm_before_residual" in variant) else g
        r = residual + self.attn(x, positions, allowed)
        r = r + silu_mlp(rms_norm(r, w[p + "post_attention_layernorm.weight"], eps), w, p + "mlp.")
        normed = rms_norm(r, w["norm.weight"], eps)
        norm_output = dc.get("norm_output", False) != ("flip_norm_output" in variant)
        return normed @ w["lm_head.weight"].T, (normed if norm_output else r)

    def cache_len(self):
        return self.attn.cache.shape[0]

    def snapshot(self):
        return self.attn.cache.clone()

    def restore(self, saved):
        self.attn.cache = saved.clone()


def run_mla_draft_reference(dc, prefix, weights, embed, aux, tokens, step1_token, dtype, variant=(),
                            target_rope=None):
    """Step 0 over every row (from the aux states), step 1 from the last row's fed-back hidden."""
    ref = MlaDraftReference(dc, prefix, weights, embed, dtype, variant, target_rope)
    t = tokens.shape[0]
    logits0, fed0 = ref.step(tokens, ref.fc(aux), torch.arange(t))
    logits1, fed1 = ref.step(step1_token, fed0[-1:], torch.tensor([t]))
    return logits0, fed0, logits1, fed1


def mla_draft_tree_drafter(dc, prefix, weights, embed, aux):
    def make(ext_tokens, dtype, variant=()):
        ref = MlaDraftReference(dc, prefix, weights, embed, dtype)
        return DraftTreeDrafter(ref, ref.fc(aux), ext_tokens, variant)
    return make


def mla_draft_transformers_config(dc):
    """A DeepseekV3Config holding the draft layer's keys (the draft's own RoPE in DeepSeek's hub form,
    which transformers reads into rope_parameters)."""
    keys = ("vocab_size", "hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads",
            "q_lora_rank", "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim", "rms_norm_eps",
            "rope_theta", "rope_scaling", "max_position_embeddings", "hidden_act", "attention_bias")
    # A copy: the constructor adds rope_theta / rope_type to the rope_scaling dict it is handed.
    config = transformers.DeepseekV3Config(num_hidden_layers=1, **{k: copy.deepcopy(dc[k]) for k in keys})
    config._attn_implementation = "eager"
    return config


def run_mla_draft_transformers(dc, prefix, weights, embed, aux, tokens, step1_token):
    """The same two steps through transformers' DeepSeek-V3 modules: DeepseekV3Attention with
    q_a_proj / q_proj and kv_a_proj_with_mqa widened to 2H (the draft's one shape change, S1, S2) and its
    latent norms set to rms_norm_eps (transformers builds them with 1e-6; SGLang and vLLM use
    rms_norm_eps, S1, S2), DeepseekV3RotaryEmbedding of the draft's config, DeepseekV3MLP and
    DeepseekV3RMSNorm. Step 1 reruns every row plus the new one."""
    from transformers.models.deepseek_v3 import modeling_deepseek_v3 as mv3
    config = mla_draft_transformers_config(dc)
    if not config.rope_interleave:
        raise SystemExit("DeepseekV3Config has rope_interleave false; DeepSeek rotates adjacent pairs")
    h, eps = dc["hidden_size"], dc["rms_norm_eps"]
    rotary = mv3.DeepseekV3RotaryEmbedding(config)
    attn = mv3.DeepseekV3Attention(config, 0)
    ref = MlaBlockReference(dc, dc, {}, "", torch.float64)
    if abs(attn.scaling - ref.softmax_scale()) > 1e-12 * ref.softmax_scale():
        raise SystemExit(f"transformers' MLA softmax scale {attn.scaling} differs from the reference's")
    rs = dc["rope_scaling"]
    factor = yarn_get_mscale(rs["factor"], rs["mscale"]) / yarn_get_mscale(rs["factor"], rs["mscale_all_dim"])
    if abs(rotary.attention_scaling - factor) > 1e-12:
        raise SystemExit(f"transformers' cos/sin factor {rotary.attention_scaling} differs from {factor}")
    a = prefix + "self_attn."
    with torch.no_grad():
        if dc["q_lora_rank"] is not None:
            attn.q_a_proj = torch.nn.Linear(2 * h, dc["q_lora_rank"], bias=False)
            attn.q_a_layernorm.variance_epsilon = eps
            for name in ("q_a_proj", "q_a_layernorm", "q_b_proj"):
                getattr(attn, name).weight.copy_(weights[a + name + ".weight"])
        else:
            attn.q_proj = torch.nn.Linear(2 * h, attn.q_proj.out_features, bias=False)
            attn.q_proj.weight.copy_(weights[a + "q_proj.weight"])
        attn.kv_a_proj_with_mqa = torch.nn.Linear(2 * h, dc["kv_lora_rank"] + dc["qk_rope_head_dim"], bias=False)
        attn.kv_a_layernorm.variance_epsilon = eps
        for name in ("kv_a_proj_with_mqa", "kv_a_layernorm", "kv_b_proj", "o_proj"):
            getattr(attn, name).weight.copy_(weights[a + name + ".weight"])
        mlp = mv3.DeepseekV3MLP(config)
        for name in ("gate_proj", "up_proj", "down_proj"):
            getattr(mlp, name).weight.copy_(weights[prefix + "mlp." + name + ".weight"])
        norms = {}
        for name in ("input_layernorm", "hidden_norm", "post_attention_layernorm"):
            norms[name] = mv3.DeepseekV3RMSNorm(h, eps=eps)
            norms[name].weight.copy_(weights[prefix + name + ".weight"])
        final = mv3.DeepseekV3RMSNorm(h, eps=eps)
        final.weight.copy_(weights["norm.weight"])
        ht = dc["target_hidden_size"]
        fc_in = aux
        if dc.get("fc_norm"):
            chunks = []
            for i, tap in enumerate(aux.split(ht, -1)):
                norm = mv3.DeepseekV3RMSNorm(ht, eps=eps)
                norm.weight.copy_(weights[f"fc_norm.{i}.weight"])
                chunks.append(norm(tap))
            fc_in = torch.cat(chunks, -1)
        g0 = fc_in @ weights["fc.weight"].T

        def forward(tok, g):
            n = tok.shape[0]
            x = torch.cat([norms["input_layernorm"](embed[tok]), norms["hidden_norm"](g)], -1)[None]
            cos, sin = rotary(x, torch.arange(n)[None])
            mask = torch.full((n, n), float("-inf")).triu(1)[None, None]
            out, _ = attn(x, position_embeddings=(cos, sin), attention_mask=mask)
            r = g + out[0]
            r = r + mlp(norms["post_attention_layernorm"](r))
            normed = final(r)
            return normed @ weights["lm_head.weight"].T, (normed if dc.get("norm_output") else r)

        logits0, fed0 = forward(tokens, g0)
        logits1, fed1 = forward(torch.cat([tokens, step1_token]), torch.cat([g0, fed0[-1:]]))
    return logits0, fed0, logits1[-1:], fed1[-1:]


def build_mla_draft(spec, out_dir, log):
    target_config, embed, target_expected = read_target_fixture(out_dir, spec["target"])
    dc = mla_draft_hub_config(spec, target_config)
    assert not dc.get("norm_before_residual"), "the oracle runs the residual g (no MLA engine but vLLM reads it)"
    directory = os.path.join(out_dir, spec["name"])
    if os.path.isdir(directory):
        shutil.rmtree(directory)
    os.makedirs(directory)
    with open(os.path.join(directory, "config.json"), "w") as f:
        json.dump(dc, f, indent=2)
        f.write("\n")
    prefix = spec["prefix"]
    ids = dc["eagle_config"]["eagle_aux_hidden_state_layer_ids"]
    # Inputs as for the Llama-style head: the target's boundaries for the aux ids (output-of-layer id k
    # = boundary k + 1), and for row p the target token at p + 1 (the last row: a fixed token).
    aux = torch.cat([target_expected[f"boundary.{k + 1}"] for k in ids], -1).float().contiguous()
    tokens = torch.cat([target_expected["tokens"][1:], torch.tensor([spec["last_token"]])]).to(torch.int64)
    step1_token = torch.tensor([spec["step1_token"]], dtype=torch.int64)

    # Weights: the first seed (from the spec's) whose trees have no near-ties (fp64 build).
    for seed in range(spec["seed"], spec["seed"] + 100):
        weights, d2t, t2d = random_mla_draft_weights(dc, prefix, seed)
        if not spec.get("trees") or tree_margin_ok(
                spec, mla_draft_tree_drafter(dc, prefix, weights, embed, aux), target_expected,
                d2t if d2t is not None else torch.zeros(dc["vocab_size"], dtype=torch.int64)):
            break
    else:
        raise SystemExit(f"{spec['name']}: no seed without tree near-ties")
    stored = {n: w.to(torch.bfloat16) for n, w in weights.items()}
    if d2t is not None:
        stored.update({"d2t": d2t, "t2d": t2d})
    save_safetensors(os.path.join(directory, "model.safetensors"), stored, {"format": "pt"})

    # The "target_rope" mistake: the target's theta and scaling on the draft's rope dims.
    target_rope = {"qk_rope_head_dim": dc["qk_rope_head_dim"], "rope_theta": target_config["rope_theta"],
                   "rope_scaling": target_config["rope_scaling"]}
    got = run_mla_draft_reference(dc, prefix, weights, embed, aux, tokens, step1_token, torch.float32)
    exact = run_mla_draft_reference(dc, prefix, weights, embed, aux, tokens, step1_token, torch.float64)
    oracle = run_mla_draft_transformers(dc, prefix, weights, embed, aux, tokens, step1_token)
    fp64_err = max(max_rel(a, b) for a, b in zip(got, exact))
    oracle_err = max(max_rel(a, b) for a, b in zip(oracle, got))
    if fp64_err > 1e-5 or oracle_err > 1e-5:
        raise SystemExit(f"{spec['name']}: reference fp32 vs fp64 {fp64_err:.2e}, vs transformers modules "
                         f"{oracle_err:.2e} (relative to max |value|)")
    names = ("logits_step0", "hidden_step0", "logits_step1", "hidden_step1")
    expected = {"aux": aux, "tokens": tokens, "token_step1": step1_token}
    expected.update({n: t.float().contiguous() for n, t in zip(names, got)})
    metadata = {"model": spec["name"], "target": spec["target"], "torch": torch.__version__,
                "transformers": transformers.__version__, "oracle": "independent MLA EAGLE-3 draft reference, fp32"}
    save_safetensors(os.path.join(directory, "expected.safetensors"), expected, metadata)
    identity = torch.zeros(dc["vocab_size"], dtype=torch.int64)
    tree = None
    if spec.get("trees"):
        tree = build_tree_fixture(spec, directory, mla_draft_tree_drafter(dc, prefix, weights, embed, aux),
                                  d2t if d2t is not None else identity, target_expected, log)

    sensitivity = {}
    rs = dc["rope_scaling"]
    for variant in MLA_DRAFT_SENSITIVITY:
        if variant == "no_attn_factor" and rs["mscale"] == rs["mscale_all_dim"]:
            continue
        v = run_mla_draft_reference(dc, prefix, weights, embed, aux, tokens, step1_token, torch.float64, (variant,),
                                    target_rope)
        sensitivity[variant] = (max_rel(v[0], exact[0]), int((v[0].argmax(-1) != exact[0].argmax(-1)).sum()),
                                max_rel(v[2], exact[2]))
    sizes = {f: os.path.getsize(os.path.join(directory, f)) for f in sorted(os.listdir(directory))}
    target_ids = torch.arange(dc["draft_vocab_size"]) + (d2t if d2t is not None else 0)
    info = {
        "name": spec["name"],
        "what": spec["what"].format(m2=yarn_get_mscale(rs["factor"], rs["mscale_all_dim"]) ** 2,
                                    af=yarn_get_mscale(rs["factor"], rs["mscale"])
                                    / yarn_get_mscale(rs["factor"], rs["mscale_all_dim"])),
        "seed": seed,
        "config": dc,
        "prefix": prefix,
        "tokens": tokens.tolist(),
        "step1_token": spec["step1_token"],
        "num_tensors": len(stored),
        "sizes": sizes,
        "fp64_err": fp64_err,
        "oracle_err": oracle_err,
        "softmax_scale": MlaBlockReference(dc, dc, {}, "", torch.float64).softmax_scale(),
        "sensitivity": sensitivity,
        "d2t": d2t is not None,
        "d2t_range": (int(target_ids.min()), int(target_ids.max())),
        "tree": tree,
    }
    log(f"{spec['name']}: seed {seed}, {len(stored)} tensors, {sum(sizes.values())} bytes, fp32 vs fp64 "
        f"{fp64_err:.1e}, vs transformers modules {oracle_err:.1e}")
    return info


def tree_margin_ok(spec, make_drafter, target_expected, d2t):
    """Whether every tree of spec["trees"] (fp64) has selection gaps >= 2 MIN_TREE_MARGIN."""
    prompt = target_expected["tokens"].to(torch.int64)
    root = int(target_expected["logits"][-1].double().argmax())
    ext_tokens = torch.cat([prompt[1:], torch.tensor([root])])
    for _, topk, num_steps, num_draft_tokens in spec["trees"]:
        drafter = make_drafter(ext_tokens, torch.float64)
        margin = build_reference_tree(root, drafter.root_logits, drafter.expand, topk, num_steps, num_draft_tokens,
                                      d2t)[3]
        if margin[0] < 2 * MIN_TREE_MARGIN:
            return False
    return True


def fmt_err(x):
    return f"{x:.1e}"


def write_readme(out_dir, infos, draft_infos, mla_infos):
    lines = [
        "# Golden fixtures for the DeepSeek-V2-family target forward and the EAGLE-3 draft step",
        "",
        "The target fixtures `v2_qlora_yarn`, `v2lite_greedy`, `v3_noaux` and `v3_mtp` are described first, the",
        "quantized target fixtures `v3_fp8` and `k25_int4` in \"Quantized target fixtures\"; the draft fixtures",
        "`draft_v2` and `draft_v2_eagle31` in \"EAGLE-3 draft fixtures\", the MLA draft fixtures `mla_draft_k25`",
        "and `mla_draft_k25_eagle31` in \"MLA EAGLE-3 draft fixtures\", and `v3_mtp`'s MTP module in \"MTP",
        "fixtures\" at the end.",
        "",
        "Generated by `python3 tools/make_golden.py --out tests/data/golden` (deterministic: one CPU thread,",
        "`torch.use_deterministic_algorithms(True)`, fixed seeds). A rerun reproduces every file byte for byte",
        "on the generating host; across hosts configs, checkpoints and integer outputs are identical and float",
        "outputs may differ by ~1e-6 relative (CPU kernels). `--only NAME ...` regenerates the named fixtures",
        "alone and leaves every other file, this README included, untouched (it prints the README sections",
        "of the fixtures it built, to merge by hand).",
        "",
        f"Versions: torch {torch.__version__}, transformers {transformers.__version__}, "
        f"Python {sys.version.split()[0]} (CPU).",
        "",
        "## Contents of each directory",
        "",
        "- `config.json`: hub form (`model_type`, `architectures`, `rope_theta` + `rope_scaling` with `\"type\"`),",
        "  the keys DeepSeek's own configs carry; `rms_norm_eps` 1e-6 as in every real config.",
        "- `model-00001-of-00002.safetensors`, `model-00002-of-00002.safetensors`, `model.safetensors.index.json`:",
        "  hub tensor names and layouts (per-expert `mlp.experts.{e}.{gate,up,down}_proj.weight`, `mlp.gate.weight`,",
        "  `mlp.shared_experts.*`, ...), bf16; V3's `mlp.gate.e_score_correction_bias` is f32 as in real",
        "  V3/Kimi-K2 checkpoints (its values are bf16-representable).",
        "- `expected.safetensors` (metadata names the versions):",
        "  - `tokens` i64 [T]: the prompt, at positions 0..T-1, one causal prefill;",
        "  - `logits` f32 [T, V];",
        "  - `boundary.<b>` f32 [T, H], b = 0..L: b = 0 the embedding output (input of layer 0), b = i the input",
        "    of layer i (= output of layer i-1, full residual stream), b = L the output of the last layer",
        "    before `model.norm`. Captured with forward (pre-)hooks on the decoder layers;",
        "  - `router.<l>.topk_ids` i64 [T, K] and `router.<l>.topk_weights` f32 [T, K] for each MoE layer l: the",
        "    experts transformers' router chose, sorted by id, and the weights it multiplies into their outputs",
        "    (after norm_topk_prob / routed_scaling_factor). For locating a routing mismatch.",
        "",
        "The weights are random (linears N(0, 1/fan_in), router N(0, s^2/fan_in) with s = 1.5-2, embedding",
        "N(0, 1), RMSNorm weights N(1, 0.1^2), correction bias U(0.05, 0.5)), rounded to bf16 before anything is",
        "computed, so the bf16 files hold exactly the weights the references used.",
        "",
        "## How the expected outputs were validated",
        "",
        "1. The oracle is transformers' `DeepseekV2ForCausalLM` / `DeepseekV3ForCausalLM` loaded from the written",
        "   directory with `from_pretrained(dtype=float32, attn_implementation=\"eager\",",
        "   experts_implementation=\"eager\")`, i.e. through transformers' own hub-config parsing and",
        "   per-expert -> fused `gate_up_proj` conversion.",
        "2. The same weights loaded by the script's own hub -> transformers mapping give identical outputs",
        "   (bitwise), and the shards read back equal the weights.",
        "3. An independent fp64 implementation of DeepSeek's reference math (written from DeepSeek's",
        "   `modeling_deepseek.py`, in the script) agrees with transformers (max |diff| / max |value|, table",
        "   below), and chooses the same experts for every token in every MoE layer.",
        f"4. Seeds are chosen so that every routing decision has a gap of at least {MIN_ROUTING_MARGIN} between",
        "   the last kept and the first rejected score (group stage and expert stage), so a correct",
        "   implementation cannot flip an expert through rounding.",
        "5. Checked by hand when generated (not by the script): `eagle3-decode --target <dir>` parses each",
        "   config, finds every tensor with its expected shape and none extra, and loads every tensor's TP",
        "   slice at TP 1 and at TP 8 (ranks 0, 4, 7); its softmax scale agrees with transformers'.",
        "",
        "## Models",
        "",
    ]
    for info in infos:
        if not info["quant"]:
            lines += model_readme(info)
    lines += README_SEMANTICS
    lines += quant_readme([info for info in infos if info["quant"]])
    lines += draft_readme(draft_infos)
    lines += mla_draft_readme(mla_infos)
    lines += mtp_readme(infos)
    text = "\n".join(lines).rstrip() + "\n"
    while "\n\n\n" in text:  # sections that open and close with a blank line meet
        text = text.replace("\n\n\n", "\n\n")
    with open(os.path.join(out_dir, "README.md"), "w") as f:
        f.write(text)


def model_readme(info):
    c = info["config"]
    lines = [f"### `{info['name']}`", "", info["what"], ""]
    lines += [
        f"- {c['num_hidden_layers']} layers, hidden {c['hidden_size']}, {c['num_attention_heads']} heads, "
        f"q_lora_rank {c['q_lora_rank']}, kv_lora_rank {c['kv_lora_rank']}, qk nope/rope "
        f"{c['qk_nope_head_dim']}/{c['qk_rope_head_dim']}, v {c['v_head_dim']}, intermediate "
        f"{c['intermediate_size']}, moe_intermediate {c['moe_intermediate_size']}, vocab {c['vocab_size']}.",
        f"- softmax scale {info['softmax_scale']:.9f}; cos/sin attention factor {info['attention_scaling']:.9f}.",
        f"- weight seed {info['seed']}; prompt (T = {len(info['tokens'])}): {info['tokens']}.",
        f"- {info['num_tensors']} checkpoint tensors, {info['checkpoint_bytes']} bytes of weights; files: "
        + ", ".join(f"{k} {v}" for k, v in info["sizes"].items()) + ".",
    ]
    if info["quant"]:
        q = info["quant"]
        lines.append(f"- {q['quantized']} of {q['quantized'] + q['plain']} weights stored quantized ({q['format']}), "
                     f"{q['plain']} plain: {q['stored_bytes']} bytes of language-model tensors (all bf16: "
                     f"{q['bf16_bytes']}).")
    lines += [
        f"- transformers vs fp64 reference: logits {fmt_err(info['logits_err'])}, boundaries "
        f"{fmt_err(info['boundary_err'])}; smallest routing gap {info['margin']:.2e}.",
        "- routing per MoE layer (distinct expert sets over the T tokens / experts used): "
        + ", ".join(f"layer {l}: {info['distinct'][l]} / {info['used'][l]}" for l in info["distinct"]) + ".",
        "- what a mistake would change (fp64 reference with one detail altered: max |logit diff| / max "
        "|logit|, tokens whose argmax changes): "
        + "; ".join(f"{SENSITIVITY[k]}: {v[0]:.2e}, {v[1]}" for k, v in info["sensitivity"].items()) + ".",
    ]
    if info["quant"]:
        lines.append("- what a dequantization mistake would change (same measure): "
                     + "; ".join(f"{QUANT_SENSITIVITY[k]}: {v[0]:.2e}, {v[1]}"
                                 for k, v in info["quant_sensitivity"].items()) + ".")
    lines.append("")
    return lines


def quant_readme(quant_infos):
    if not quant_infos:
        return []
    lines = [
        "",
        "## Quantized target fixtures",
        "",
        "`v3_fp8` and `k25_int4` hold a target in the quantized forms its published checkpoints use",
        "(`include/eagle3/quantization_config.h`), checked by `tests/target_golden_test.cc` like the others",
        "(TP 1 and TP 8, both residual modes, 1e-4) and TP 8 against TP 1 (1e-5). Each directory holds the files",
        "listed in \"Contents of each directory\", except that `config.json` carries the `quantization_config` and",
        "the shards the quantized tensors (`k25_int4`: in Kimi-K2.5's multimodal form); `expected.safetensors`",
        "is the same.",
        "",
        "- **What the checkpoint means.** The random bf16-valued weights of every weight the format quantizes",
        "  are quantized, and every reference runs on what the stored tensors dequantize to, computed as",
        "  eagle3's CPU reference documents it (`include/eagle3/detail/quantized_weights.h`):",
        f"  - FP8: per {FP8_BLOCK} x {FP8_BLOCK} block (partial at the edges) `weight_scale_inv` = amax / {FP8_MAX:g} in",
        f"    f32, codes = e4m3fn(w / scale_inv) rounded to nearest (clamped to +-{FP8_MAX:g}); dequantized",
        "    w = float(code) * scale_inv, one f32 multiply (DeepSeek's `weight_dequant` in inference/kernel.py).",
        f"  - INT4: per row and group of {INT4_GROUP} input columns `weight_scale` = bf16(amax / 7), q = clamp(round(w /",
        "    scale), -8, 7), packed as compressed-tensors' `pack_to_int32` describes (value j of a row in",
        "    word j / 8 at bits 4 (j % 8), stored as q + 8; `include/eagle3/detail/int4_packing.h`);",
        "    `weight_shape` = [out, in] i32; dequantized w = q * scale, exact in f32.",
        "- **Which tensors.** FP8: every Linear but `lm_head` (`*_proj.weight`, `kv_a_proj_with_mqa.weight`, the",
        "  routed and shared experts); INT4: every Linear no entry of the hub's `ignore` list matches (plain",
        "  entries are module names, `re:` entries regexes matched at the start of the module name, as",
        "  compressed-tensors reads them), i.e. the routed experts. Embedding, norms, router, correction bias",
        "  and `lm_head` stay plain (bf16; the bias f32).",
        "- **Oracle.** transformers does not load either quantized form here, so `from_pretrained` loads an",
        "  unquantized f32 checkpoint of the dequantized weights in the plain `deepseek_v3` form, written to a",
        "  temporary directory and removed afterwards. The direct-mapping and fp64-reference checks, and the",
        "  routing-gap seed search, run on the same dequantized weights.",
        "- **Read-back.** The written shards are decoded again from the files alone (with an unpacking",
        "  written separately from the packing; every stored tensor checked for the hub form's dtype and",
        "  shape) and must equal the dequantized weights bit for bit.",
        "",
    ]
    for info in quant_infos:
        lines += model_readme(info)
    return lines[:-1]  # draft_readme opens with the blank line


README_SEMANTICS = [
    "## Semantics checked in the installed transformers (5.17.0) and how the fixtures handle them",
    "",
    "No patch of the oracle was needed; each point below was read in the installed source and is either",
    "asserted by the script or cross-checked by the fp64 reference.",
    "",
    "- **YaRN m^2 softmax factor.** Both `DeepseekV2Attention` and `DeepseekV3Attention` set",
    "  `self.scaling = yarn_apply_mscale(config.rope_parameters, self.qk_head_dim ** (-0.5))`, which multiplies",
    "  by `yarn_get_mscale(factor, mscale_all_dim) ** 2` when `mscale_all_dim` is set: DeepSeek's reference",
    "  value (older versions' V2 class omitted it; 5.17.0's has it). The script asserts",
    "  the value on every layer and stops if the installed version lacks it.",
    "- **RoPE pairs.** V2's `apply_rotary_emb` views the rope dims as complex numbers from adjacent pairs",
    "  (`reshape(..., -1, 2)`) and multiplies by `torch.polar(1, freqs) * attention_scaling`; V3 (with",
    "  `rope_interleave` true, its default, asserted) uses `apply_rotary_pos_emb_interleave`, which rotates",
    "  the even/odd slices and writes them de-interleaved, for q and k alike, so q.k equals the",
    "  adjacent-pair rotation. Both equal DeepSeek's de-interleave + rotate_half. Only the rope dims rotate.",
    "- **YaRN frequencies and cos/sin factor.** `_compute_yarn_parameters` uses DeepSeek's correction range",
    "  (floor/ceil, `truncate` default true, clamp to [0, dim-1]), ramp over dim/2, dim = qk_rope_head_dim",
    "  (transformers sets `head_dim = qk_rope_head_dim`), base = rope_theta, and",
    "  `attention_factor = get_mscale(factor, mscale) / get_mscale(factor, mscale_all_dim)` when both are",
    "  set: DeepSeek's `_mscale`. The hub `rope_scaling` block (with `\"type\": \"yarn\"` and an explicit",
    "  `original_max_position_embeddings`) is read into `rope_parameters` unchanged;",
    "  max_position_embeddings = factor x original, so transformers does not warn about the implied factor.",
    "- **V2 routing.** `DeepseekV2TopkRouter`: softmax; `greedy` top-k, or `group_limited_greedy` with the",
    "  group MAX, masked experts set to 0; then always `topk_weights * routed_scaling_factor`:",
    "  `norm_topk_prob` is ignored. DeepSeek's reference normalizes *instead of* scaling when",
    "  `norm_topk_prob` is true, so the V2 fixtures use `norm_topk_prob: false` (as DeepSeek-V2 and V2-Lite",
    "  do), where both agree.",
    "- **V3 routing.** `DeepseekV3TopkRouter`: sigmoid; `e_score_correction_bias` added for selection only;",
    "  group score = sum of each group's top-2; experts outside the kept groups masked with -inf (DeepSeek's",
    "  reference uses 0, the same here because the bias is positive); weights gathered from the unbiased",
    "  scores, normalized (+1e-20) when `norm_topk_prob`, then multiplied by `routed_scaling_factor`.",
    "- **Dense vs MoE layers.** transformers makes layer i MoE when i >= first_k_dense_replace and ignores",
    "  `moe_layer_freq`; the fixtures use moe_layer_freq 1, where that is DeepSeek's rule too.",
    "- **Latent norms.** `q_a_layernorm` / `kv_a_layernorm` are built with the default eps 1e-6, not",
    "  `rms_norm_eps` (as in DeepSeek's reference); the fixtures use rms_norm_eps 1e-6, so an implementation",
    "  that passes rms_norm_eps (SGLang, vLLM, eagle3) gets the same math.",
    "- **`output_hidden_states`.** Its first L entries are the decoder layers' inputs, but the last one is",
    "  replaced by `last_hidden_state` (after `model.norm`, `tie_last_hidden_states=True` in",
    "  `utils/output_capturing.py`). The boundaries come from hooks instead; the script asserts both facts.",
    "- **MTP.** transformers' V3 config defaults `num_mtp_layers` (alias `num_nextn_predict_layers`) to 1;",
    "  the V3 configs state it (0, `v3_mtp` 1), and the V3 modeling class builds no MTP layer. It skips only",
    "  layer 61's tensors on load (`_keys_to_ignore_on_load_unexpected`), so for `v3_mtp` `from_pretrained`",
    "  reports the module's tensors as unexpected: the script requires exactly those and nothing else.",
    "- **Deviations from the real models.** `v3_noaux` uses mscale 1.0 with mscale_all_dim 0.8 (real V3: 1.0",
    "  and 1.0) so that the cos/sin factor differs from 1 and is exercised.",
]


def draft_readme(draft_infos):
    lines = [
        "",
        "## EAGLE-3 draft fixtures",
        "",
        "A random EAGLE-3 draft head on top of a target fixture, in the layout SpecForge writes",
        "(`LlamaForCausalLMEagle3`), checked by `tests/draft_golden_test.cc` at TP 1 and TP 8.",
        "",
        "Each `draft_*` directory holds:",
        "",
        "- `config.json`: `architectures` [\"LlamaForCausalLMEagle3\"], `model_type` llama, `vocab_size` and",
        "  `target_hidden_size` of the target, `draft_vocab_size`, `rope_theta` + `rope_scaling` (with",
        "  `rope_type`), `eagle_config.eagle_aux_hidden_state_layer_ids` (output-of-layer ids), variant keys.",
        "- `model.safetensors`: bf16 `fc.weight` [H, 3 Ht], the decoder layer under `midlayer.` or `layers.0.`",
        "  (`input_layernorm`, `hidden_norm`, `self_attn.{q,k,v}_proj` [.., 2H], `o_proj`,",
        "  `post_attention_layernorm`, `mlp.{gate,up,down}_proj`), `norm.weight`, `lm_head.weight` [Vd, H],",
        "  `fc_norm.{i}.weight` with fc_norm; `d2t` i64 [Vd] offsets (target id = draft id + d2t[draft id]) of a",
        "  random sorted subset of the target vocabulary, `t2d` bool [V] true exactly on that subset. No",
        "  `embed_tokens.weight`: the draft shares the target's embedding (`model.embed_tokens.weight` of the",
        "  target fixture).",
        "- `expected.safetensors`:",
        "  - `aux` f32 [T, 3 Ht] (input): the target fixture's `boundary.<k+1>` for each aux id k, concatenated in",
        "    config order (output-of-layer id k = boundary k + 1);",
        "  - `tokens` i64 [T] (input): row p carries the target prompt's token p + 1 (the draft row for position",
        "    p pairs the target hidden at p with the next token); the last row a fixed token;",
        "  - `logits_step0` f32 [T, Vd], `hidden_step0` f32 [T, H]: one causal pass over all rows at positions",
        "    0..T-1 from the aux states; `hidden_step0` is the hidden fed back (r, or norm(r) with norm_output);",
        "  - `token_step1` i64 [1] (input), `logits_step1` f32 [1, Vd], `hidden_step1` f32 [1, H]: a second pass of",
        "    one row at position T from the last row's `hidden_step0`, attending the T cached rows and itself.",
        "- `tree.safetensors` (`draft_v2` only; checked by `tests/draft_tree_golden_test.cc` at TP 1, 2 and 8):",
        "  EAGLE-2 dynamic trees (`include/eagle3/draft_tree.h`, docs/semantics.md), the first tree the decode",
        "  loop builds after the target fixture's prompt:",
        "  - `prompt` i64 [T]: the target fixture's `tokens`; `root` i64 [1]: the argmax of the target fixture's",
        "    last `logits` row (the token after the prompt, the tree's root);",
        "  - `tokens` i64 [T] (input of the extend pass): `prompt[1:]` then the root, so row p pairs the target",
        "    hidden at p (`aux` of `expected.safetensors`, the same target boundaries) with token p + 1;",
        "  - `root_logits` f32 [Vd]: the draft logits of that pass's last row, whose top-k are the root's",
        "    children (for locating a mismatch: extend or tree);",
        "  - per tree shape `<name>` (metadata `trees` lists them): `<name>.params` i64 [3] = (topk, num_steps,",
        "    num_draft_tokens); `<name>.tree_tokens` i64 [N] (target ids, root first), `<name>.tree_parents` i32",
        "    [N] (-1 for the root), `<name>.tree_scores` f32 [N] (cumulative draft log-probs, 0 for the root).",
        "",
        "Weights: linears N(0, 1/fan_in), RMSNorm weights N(1, 0.1^2), rounded to bf16 before anything is",
        "computed. The expected outputs come from an independent fp32 implementation of the draft step in the",
        "script (explicit KV cache, written from the semantics in `include/eagle3/draft_model.h`, importing no",
        "engine). Two checks guard it: the same code in fp64, and the draft assembled from transformers'",
        "Llama modules (`LlamaAttention` with q/k/v widened to 2H, `LlamaRotaryEmbedding` built from the written",
        "`config.json` by `LlamaConfig.from_pretrained`, `LlamaMLP`, `LlamaRMSNorm`), must both agree within",
        "1e-5 of the largest magnitude, or the script stops.",
        "",
        "Trees: an independent implementation of the build in the script, over the same fp32 draft",
        "reference. Extend: one causal pass over the T rows at positions 0..T-1 from fc(aux). Step 0 expands",
        "the root with the extend's last-row logits; a frontier node at depth d >= 1 is one draft row with",
        "the input hidden its parent's fed-back hidden (the root's: the last extend row's), its target id",
        "as token, RoPE position (T - 1) + d, attending every extend row, the tree rows of its ancestors",
        "and itself (the rows of a step are appended to the cache in frontier order). Log-softmax in double;",
        "a node's top-k by logit (ties: lower draft id), score = parent score + log-prob; next frontier = the",
        "best k of the step's candidates (ties: lower candidate index); the best num_draft_tokens - 1",
        "candidates overall, in candidate order; draft ids to target ids by d2t. Checks, or the script",
        "stops: the fp64 run builds the same trees (scores within 1e-5); each expanded node's tree-masked",
        "logits equal a plain causal decode of its root path after the extend rows (1e-5 relative); and",
        "every selection a tree depends on (the order of each expanded node's best k + 1 children, of each",
        f"step's best k + 1 candidates, and the final cut) has a gap of at least {MIN_TREE_MARGIN} in",
        "log-prob, so that rounding cannot flip it.",
        "",
    ]
    for info in draft_infos:
        c = info["config"]
        lines += [f"### `{info['name']}`", "", info["what"], ""]
        lines += [
            f"- hidden {c['hidden_size']}, {c['num_attention_heads']} heads / {c['num_key_value_heads']} kv heads, "
            f"head_dim {c.get('head_dim', c['hidden_size'] // c['num_attention_heads'])}, intermediate "
            f"{c['intermediate_size']}, draft vocab {c['draft_vocab_size']} of {c['vocab_size']} (mapped target ids "
            f"{info['d2t_range'][0]}..{info['d2t_range'][1]}), rms_norm_eps {c['rms_norm_eps']}; rope "
            f"{json.dumps(c['rope_scaling'])}, theta {c['rope_theta']}.",
            f"- weight seed {info['seed']}; tokens (T = {len(info['tokens'])}): {info['tokens']}; step 1 token "
            f"{info['step1_token']}.",
            f"- {info['num_tensors']} checkpoint tensors; files: "
            + ", ".join(f"{k} {v}" for k, v in info["sizes"].items()) + ".",
            f"- reference fp32 vs fp64: {fmt_err(info['fp64_err'])}; vs transformers' Llama modules: "
            f"{fmt_err(info['oracle_err'])}.",
            "- what a mistake would change (fp64 reference with one detail altered: max |logit diff| / max "
            "|logit| over step 0, rows whose argmax changes): "
            + "; ".join(f"{DRAFT_SENSITIVITY[k]}: {v[0]:.2e}, {v[1]}" for k, v in info["sensitivity"].items()) + ".",
        ]
        tree = info["tree"]
        if tree:
            lines += [
                f"- trees after the prompt: root {tree['root']} (target top-2 logit gap {tree['root_gap']:.2e}); "
                f"smallest selection gap {tree['margin'][0]:.2e} ({tree['margin'][1]}); fp32 vs fp64 scores "
                f"{fmt_err(tree['fp64_err'])}; tree mask vs path decode {fmt_err(tree['path_err'])}.",
            ]
            for t in tree["trees"]:
                k, steps, n = t["params"]
                lines.append(f"  - `{t['name']}` (topk {k}, num_steps {steps}, num_draft_tokens {n}): tokens "
                             f"{t['tokens']}, parents {t['parents']}.")
            lines.append(f"- what a mistake in the tree rows would change (fp64, trees whose tokens or parents change "
                         f"out of {len(tree['trees'])}, largest score difference): "
                         + "; ".join(f"{TREE_SENSITIVITY[k]}: {v[0]}, {v[1]:.2e}"
                                     for k, v in tree["sensitivity"].items()) + ".")
        lines.append("")
    lines += DRAFT_README_SEMANTICS
    return lines


def mtp_readme(infos):
    """The MTP section of README.md, for the target fixtures with an MTP module."""
    infos = [info for info in infos if info.get("mtp")]
    if not infos:
        return []
    lines = [
        "",
        "## MTP fixtures",
        "",
        "DeepSeek-V3's MTP module run as a drafter (docs/mla_drafts.md, \"DeepSeek-V3's MTP module\"), on a target",
        "fixture whose checkpoint carries it. Checked by `tests/mtp_golden_test.cc`, which",
        "runs the drafter at TP 1 and TP 8 like `tests/draft_golden_test.cc` (1e-4 of the largest",
        "magnitude), and `tests/draft_tree_golden_test.cc`'s build on `mtp_tree.safetensors`.",
        "",
        "- **Checkpoint.** The target directory's shards hold, after the target's tensors, module 0 under",
        "  `model.layers.L.` with L = `num_hidden_layers` (`MtpConfig::LayerPrefix(0)`), in the order of",
        "  `MtpModuleWeights` then `MtpSharedCopyWeights`: `enorm.weight` [H], `hnorm.weight` [H], `eh_proj.weight`",
        "  [H, 2H], the decoder layer exactly as a main layer (`input_layernorm`, `post_attention_layernorm`,",
        "  `self_attn.{q_a_proj, q_a_layernorm, q_b_proj, kv_a_proj_with_mqa, kv_a_layernorm, kv_b_proj, o_proj}`,",
        "  `mlp.gate.weight`, `mlp.gate.e_score_correction_bias` (f32), `mlp.experts.{e}.{gate,up,down}_proj`,",
        "  `mlp.shared_experts.*`), `shared_head.norm.weight` [H], and the copies `embed_tokens.weight` and",
        "  `shared_head.head.weight` [V, H]. bf16 (the bias f32). **The copies hold values of their own**, not",
        "  the target's (in the published V3 they are equal): the drafter must run the target's",
        "  `model.embed_tokens.weight` and `lm_head.weight` (docs/mla_drafts.md, open question 4, decided), and",
        "  reading the copies changes the logits (\"read_copies\" below).",
        "- `mtp_expected.safetensors`:",
        "  - `hidden_in` f32 [T, H] (input): row p = the target's final hidden at position p **after**",
        "    `model.norm` (the lm_head input; transformers' `model.model.norm(boundary.L)` of the target",
        "    fixture's prompt) — the tensor the MTP module is fed (M3, M4, M5, M7);",
        "  - `hidden_in_prenorm` f32 [T, H] (input of the control): the pre-norm boundary L, equal to the target",
        "    fixture's `boundary.<L>`;",
        "  - `tokens` i64 [T] (input): row p carries the target prompt's token p + 1 (target `tokens[1:]`), the",
        "    last row a fixed token;",
        "  - `logits_step0` f32 [T, V] (full target vocabulary, the target's lm_head), `hidden_step0` f32 [T, H]:",
        "    one causal pass over all rows at RoPE positions 0..T-1 from `hidden_in`; `hidden_step0` is the",
        "    hidden fed back, `o = shared_head.norm(r)` (M4, M5, vLLM after #45895);",
        "  - `token_step1` i64 [1] (input), `logits_step1` f32 [1, V], `hidden_step1` f32 [1, H]: a second pass of",
        "    one row at position T from the last row's `hidden_step0` (hnorm'ed like a target hidden),",
        "    attending the T cached latent rows and itself (pins the feedback path);",
        "  - `control_logits_step0` f32 [T, V], `control_hidden_step0` f32 [T, H]: the same step 0 fed",
        "    `hidden_in_prenorm` instead: **the CONTROL**. A drafter fed the pre-norm boundary matches these and",
        "    misses `logits_step0` by the margin below (metadata `control_vs_expected`), so a test can assert",
        "    both that it matches `logits_step0` and that `logits_step0` is far from the control. hnorm is",
        "    scale-invariant, so the two inputs differ through `model.norm.weight` alone (random N(1, 0.1^2) here,",
        "    far from uniform in real checkpoints); a drafter that feeds the pre-norm tensor is what it detects;",
        "  - `router.topk_ids_step0` i64 [T, K], `router.topk_weights_step0` f32 [T, K], `router.topk_ids_step1`",
        "    i64 [1, K], `router.topk_weights_step1` f32 [1, K]: the MTP layer's routed experts (sorted by id) and",
        "    weights as transformers chose them (equal to the reference's), for locating a routing mismatch.",
        "- `mtp_tree.safetensors`: as `draft_v2/tree.safetensors` (same keys, same four tree shapes), drafted",
        "  by the MTP module: `prompt` (the target's `tokens`), `root` (argmax of the target's last `logits`",
        "  row), `tokens` (`prompt[1:]` then the root: the extend pass, fed `hidden_in`), `root_logits` f32 [V],",
        "  `<name>.params` / `.tree_tokens` / `.tree_parents` / `.tree_scores`. The vocabulary is the target's",
        "  (no d2t: draft id = target id). Tree rows as for the EAGLE-3 head: a node at depth d is one row fed",
        "  its parent's `o`, its token, RoPE position (T - 1) + d, attending the extend rows, its ancestors and",
        "  itself.",
        "",
        "Oracle and checks: the expected outputs come from an independent fp32 implementation of the module",
        "in the script (explicit latent cache; MLA and MoE as DeepSeek's reference; written from",
        "docs/mla_drafts.md, importing no engine). It must agree within 1e-5 of the largest magnitude with",
        "itself in fp64 and with the module assembled from transformers (the target's `embed_tokens`,",
        "`rotary_emb` and `lm_head`, a `DeepseekV3DecoderLayer` built at layer index L with its",
        "`DeepseekV3MoE`, `DeepseekV3RMSNorm` for enorm / hnorm / shared_head.norm, an `nn.Linear` eh_proj),",
        "for the expected outputs and the control, and transformers' MTP routing must equal the reference's.",
        "The module's weight seed is the first whose rows (steps, control, trees) have routing gaps >=",
        f"{MIN_ROUTING_MARGIN} and tree-selection gaps >= {2 * MIN_TREE_MARGIN} (fp64). transformers builds no MTP layer,",
        "so `from_pretrained` reports the module's tensors as unexpected; the script requires that and nothing",
        "else.",
        "",
        "Semantics (docs/mla_drafts.md \"Forward\"; source ids as there): `e = enorm(embed(token))` with the",
        "target's embedding; `x = eh_proj(concat(e, hnorm(h)))`, embeddings first (M2, M4, M5; the report's",
        "eq. 21 writes the reverse, M6); `r = x + MLA(input_layernorm(x))`, `r = r + MoE(post_attention_layernorm(r))`",
        "(the MLP by the layer-index rule: MoE); `o = shared_head.norm(r)`; `logits = lm_head(o)`; `o` fed back.",
        "No embedding mask at position 0 (SGLang, TensorRT-LLM; vLLM's mask is \"position0_mask\" below, open",
        "question 3). The MTP layer's MLA uses the target's RoPE and softmax scale.",
        "",
    ]
    for info in infos:
        m = info["mtp"]
        tree = m["tree"]
        lines += [
            f"### `{info['name']}` (MTP module at layer {info['config']['num_hidden_layers']})",
            "",
            f"- module weight seed {m['seed']}; {m['num_tensors']} module tensors (copies included); tokens (T = "
            f"{len(m['tokens'])}): {m['tokens']}; step 1 token {m['step1_token']}.",
            f"- reference fp32 vs fp64: {fmt_err(m['fp64_err'])}; vs transformers: {fmt_err(m['oracle_err'])}; "
            f"smallest MTP routing gap {m['margin']:.2e}.",
            f"- **control** (fed the pre-norm boundary): `control_logits_step0` differs from `logits_step0` by "
            f"{m['control_diff']:.2e} of max |logit|; {m['control_rows']} of {len(m['tokens'])} rows change argmax.",
            "- what a mistake would change (fp64 reference with one detail altered: max |logit diff| / max |logit| "
            "over step 0, rows whose argmax changes, the same measure over step 1): "
            + "; ".join(f"{MTP_SENSITIVITY[k]}: {v[0]:.2e}, {v[1]}, {v[2]:.2e}" for k, v in m["sensitivity"].items())
            + ".",
        ]
        lines += tree_readme_lines(tree)
        lines.append("")
    return lines


def tree_readme_lines(tree):
    lines = [
        f"- trees after the prompt: root {tree['root']} (target top-2 logit gap {tree['root_gap']:.2e}); "
        f"smallest selection gap {tree['margin'][0]:.2e} ({tree['margin'][1]}); fp32 vs fp64 scores "
        f"{fmt_err(tree['fp64_err'])}; tree mask vs path decode {fmt_err(tree['path_err'])}.",
    ]
    for t in tree["trees"]:
        k, steps, n = t["params"]
        lines.append(f"  - `{t['name']}` (topk {k}, num_steps {steps}, num_draft_tokens {n}): tokens "
                     f"{t['tokens']}, parents {t['parents']}.")
    lines.append(f"- what a mistake in the tree rows would change (fp64, trees whose tokens or parents change "
                 f"out of {len(tree['trees'])}, largest score difference): "
                 + "; ".join(f"{TREE_SENSITIVITY[k]}: {v[0]}, {v[1]:.2e}" for k, v in tree["sensitivity"].items())
                 + ".")
    return lines


def mla_draft_readme(infos):
    if not infos:
        return []
    lines = [
        "",
        "## MLA EAGLE-3 draft fixtures",
        "",
        "Random MLA EAGLE-3 draft heads (one DeepSeek-V3 MLA layer with a dense SiLU MLP over the fused taps,",
        "the Kimi-K2.5 / K2.6 drafts; docs/mla_drafts.md \"The MLA EAGLE-3 draft\") on the `k25_int4` target,",
        "checked by `tests/mla_draft_golden_test.cc`, which runs the draft at TP 1 and",
        "TP 8 as `tests/draft_golden_test.cc` runs the Llama-style head (`DraftModel::Create(draft_dir,",
        "target_dir, ...)` with the default output-of-layer convention; the draft shares the target's",
        "embedding `language_model.model.embed_tokens.weight`), 1e-4 of the largest magnitude, and",
        "`tests/draft_tree_golden_test.cc`'s build on `mla_draft_k25/tree.safetensors`. No target model needs",
        "to run: the taps are stored.",
        "",
        "Each `mla_draft_*` directory holds:",
        "",
        "- `config.json`: `architectures` (`Eagle3DeepseekV2ForCausalLM` or vLLM's alias",
        "  `Eagle3DeepseekV3ForCausalLM`), `model_type` (kimi_k2 or deepseek_v3), `hidden_size` = `target_hidden_size`",
        "  = the target's, the MLA keys (`q_lora_rank` possibly null, `kv_lora_rank`, `qk_nope_head_dim`,",
        "  `qk_rope_head_dim`, `v_head_dim`), `intermediate_size`, `vocab_size` (the target's), `draft_vocab_size`,",
        "  `rms_norm_eps`, `rope_theta` + `rope_scaling` in DeepSeek's form (`\"type\": \"yarn\"` with beta_fast,",
        "  beta_slow, mscale, mscale_all_dim, original_max_position_embeddings): the draft's own RoPE;",
        "  `eagle_config.eagle_aux_hidden_state_layer_ids` (output-of-layer ids), variant keys.",
        "- `model.safetensors` (bf16; names and shapes of `MlaDraftWeights`): `fc.weight` [H, 3 Ht];",
        "  `fc_norm.{i}.weight` [Ht] with fc_norm; under the layer prefix P (`midlayer.` or `layers.0.`):",
        "  `input_layernorm.weight`, `hidden_norm.weight` [H], `self_attn.q_a_proj.weight` [q_lora_rank, **2H**],",
        "  `self_attn.q_a_layernorm.weight`, `self_attn.q_b_proj.weight` [heads (nope + rope), q_lora_rank] (or",
        "  `self_attn.q_proj.weight` [heads (nope + rope), **2H**] when q_lora_rank is null),",
        "  `self_attn.kv_a_proj_with_mqa.weight` [kv_lora_rank + rope, **2H**], `self_attn.kv_a_layernorm.weight`,",
        "  `self_attn.kv_b_proj.weight` [heads (nope + v), kv_lora_rank], `self_attn.o_proj.weight` [H, heads v],",
        "  `post_attention_layernorm.weight`, `mlp.{gate,up,down}_proj.weight`; then `norm.weight` [H],",
        "  `lm_head.weight` [Vd, H]; with a reduced vocabulary `d2t` i64 [Vd] offsets (target id = draft id +",
        "  d2t[draft id]) and `t2d` bool [V]; none with the full vocabulary (identity). No `embed_tokens.weight`.",
        "- `expected.safetensors` (same keys as the Llama-style draft fixtures):",
        "  - `aux` f32 [T, 3 Ht] (input): the target fixture's `boundary.<k+1>` for each aux id k, in config order;",
        "  - `tokens` i64 [T] (input): row p carries the target prompt's token p + 1, the last row a fixed token;",
        "  - `logits_step0` f32 [T, Vd], `hidden_step0` f32 [T, H]: one causal pass over all rows at RoPE",
        "    positions 0..T-1 from fc(aux); `hidden_step0` is the hidden fed back (r, or norm(r) with",
        "    norm_output);",
        "  - `token_step1` i64 [1] (input), `logits_step1` f32 [1, Vd], `hidden_step1` f32 [1, H]: one row at",
        "    position T fed the last row's `hidden_step0` (not fc: the feedback path), attending the T cached",
        "    latent rows and itself.",
        "- `tree.safetensors` (`mla_draft_k25` only): as `draft_v2/tree.safetensors` (same keys and tree shapes),",
        "  the trees the decode loop builds after `k25_int4`'s prompt; no d2t, so draft ids are target ids.",
        "",
        "Weights: linears N(0, 1/fan_in), RMSNorm weights N(1, 0.1^2), rounded to bf16 before anything is",
        "computed; the seed is the first from the spec's whose trees have selection gaps >= "
        f"{2 * MIN_TREE_MARGIN} (fp64).",
        "The expected outputs come from an independent fp32 implementation of the draft step in the script",
        "(explicit latent cache: each row caches [kv_a_layernorm(c) | RoPE(k_pe)], kv_lora_rank + rope wide, as",
        "eagle3's latent cache; k_nope and v re-expanded by kv_b_proj; written from docs/mla_drafts.md, importing",
        "no engine). It must agree within 1e-5 of the largest magnitude with itself in fp64 and with the draft",
        "assembled from transformers' DeepSeek-V3 modules: `DeepseekV3Attention` with q_a_proj / q_proj and",
        "kv_a_proj_with_mqa widened to 2H, `DeepseekV3RotaryEmbedding` of a `DeepseekV3Config` holding the",
        "draft's keys (its softmax scale and cos/sin factor asserted equal to the reference's),",
        "`DeepseekV3MLP`, `DeepseekV3RMSNorm`.",
        "",
        "Semantics (docs/mla_drafts.md \"Forward\"; source ids as there): `g = fc(aux)` (fc_norm: each tap",
        "RMS-normed first); `x = concat(input_layernorm(embed(tok)), hidden_norm(g))` [T, 2H], embeddings first",
        "(S1, S2, S3); q = q_b(q_a_layernorm(q_a(x))) or q_proj(x); [c | k_pe] = kv_a_proj_with_mqa(x);",
        "[k_nope | v] = kv_b(kv_a_layernorm(c)) per head; adjacent-pair RoPE on q's rope dims and k_pe with the",
        "draft's own rope_theta / YaRN (S2 deepseek_yarn, S3, S5), cos/sin times",
        "mscale(factor, mscale) / mscale(factor, mscale_all_dim); softmax scale (nope + rope)^-0.5 m^2 with",
        "m = mscale(factor, mscale_all_dim); `r = g + o_proj(attention)` (residual g: norm_before_residual is",
        "not set in these fixtures, SGLang and ATOM do not read it); `r = r + down(silu(gate(h)) up(h))`,",
        "h = post_attention_layernorm(r); logits = lm_head(norm(r)); fed back r, or norm(r) with norm_output.",
        "Every RMSNorm, q_a_layernorm and kv_a_layernorm included, uses rms_norm_eps (SGLang and vLLM;",
        "transformers' latent norms default to 1e-6 and are set to rms_norm_eps in the oracle).",
        "",
    ]
    for info in infos:
        c = info["config"]
        lines += [f"### `{info['name']}`", "", info["what"], ""]
        vocab = (f"draft vocab {c['draft_vocab_size']} of {c['vocab_size']} (mapped target ids {info['d2t_range'][0]}.."
                 f"{info['d2t_range'][1]})" if info["d2t"] else f"full vocabulary {c['vocab_size']} (no d2t)")
        lines += [
            f"- layer prefix `{info['prefix']}`; hidden {c['hidden_size']}, {c['num_attention_heads']} heads, "
            f"q_lora_rank {'null (q_proj)' if c['q_lora_rank'] is None else c['q_lora_rank']}, kv_lora_rank "
            f"{c['kv_lora_rank']}, qk nope/rope "
            f"{c['qk_nope_head_dim']}/{c['qk_rope_head_dim']}, v {c['v_head_dim']}, intermediate "
            f"{c['intermediate_size']}, {vocab}, rms_norm_eps {c['rms_norm_eps']}; rope theta {c['rope_theta']}, "
            f"{json.dumps(c['rope_scaling'])}; softmax scale {info['softmax_scale']:.9f}.",
            f"- weight seed {info['seed']}; tokens (T = {len(info['tokens'])}): {info['tokens']}; step 1 token "
            f"{info['step1_token']}.",
            f"- {info['num_tensors']} checkpoint tensors; files: "
            + ", ".join(f"{k} {v}" for k, v in info["sizes"].items()) + ".",
            f"- reference fp32 vs fp64: {fmt_err(info['fp64_err'])}; vs transformers' DeepSeek-V3 modules: "
            f"{fmt_err(info['oracle_err'])}.",
            "- what a mistake would change (fp64 reference with one detail altered: max |logit diff| / max "
            "|logit| over step 0, rows whose argmax changes, the same measure over step 1): "
            + "; ".join(f"{MLA_DRAFT_SENSITIVITY[k]}: {v[0]:.2e}, {v[1]}, {v[2]:.2e}"
                        for k, v in info["sensitivity"].items()) + ".",
        ]
        if info["tree"]:
            lines += tree_readme_lines(info["tree"])
        lines.append("")
    return lines


DRAFT_README_SEMANTICS = [
    "### Draft semantics and where they were checked",
    "",
    "Read in the engines' sources for semantics only (no code taken): SGLang `models/llama_eagle3.py`,",
    "vLLM `model_executor/models/llama_eagle3.py`, SpecForge `modeling/draft/llama3_eagle.py`, vLLM",
    "speculators `models/eagle3/core.py`, and transformers 5.17 `models/llama/modeling_llama.py` /",
    "`modeling_rope_utils.py` (installed).",
    "",
    "- **Step.** `x = concat(input_layernorm(embed(token)), hidden_norm(g))`, embeddings first, into q/k/v of",
    "  input width 2H; residual g (`hidden_norm(g)` with `norm_before_residual`: vLLM's",
    "  `_norm_before_residual`); `post_attention_layernorm` fused with the residual add; SiLU MLP; logits =",
    "  `lm_head(norm(r))` and the un-normalized r is fed back (SGLang returns `hidden_states_to_aux` from",
    "  `norm(hidden, residual)`, vLLM `hidden_prenorm`).",
    "- **Attention.** Llama's: GQA by `num_key_value_heads`, `head_dim` from the config, rotate-half RoPE on the",
    "  whole head, softmax scale `head_dim^-0.5` (transformers `LlamaAttention.scaling`, asserted). YaRN's",
    "  attention factor is folded into cos/sin (`LlamaRotaryEmbedding.attention_scaling`, asserted equal to the",
    "  reference's 0.1 ln(factor) + 1 when the config states no mscale), never into the softmax scale.",
    "- **Variant keys.** `norm_before_fc`: one RMSNorm `input_norm.weight` [k Ht] over the concatenated aux",
    "  states before fc (speculators); `fc_norm`: one RMSNorm `fc_norm.{i}.weight` [Ht] per aux state",
    "  (EAGLE 3.1, vLLM #42764); `norm_output`: the fed-back hidden is norm(r), the logits unchanged",
    "  (EAGLE 3.1). The two fc norms are mutually exclusive (speculators #670).",
    "- **Vocabulary.** `d2t` holds offsets, target id = draft id + d2t[draft id] (SGLang's `hot_token_id =",
    "  d2t + arange`, vLLM's `draft_id_to_target_id`); `t2d` is the indicator of the mapped target ids.",
]


def main():
    usage = __doc__[__doc__.index("Usage:"):]
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0], epilog=usage,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True, help="output directory, e.g. tests/data/golden")
    parser.add_argument("--only", nargs="*",
                        help="fixture names to (re)generate, e.g. v3_fp8 k25_int4; nothing else is written, "
                        "README.md included (its sections are printed). Default: all")
    args = parser.parse_args()
    os.makedirs(args.out, exist_ok=True)
    transformers.logging.set_verbosity_error()
    known = {spec["name"] for spec in MODELS + DRAFTS + MLA_DRAFTS}
    if args.only and set(args.only) - known:
        raise SystemExit(f"--only: unknown fixtures {sorted(set(args.only) - known)}; known: {sorted(known)}")
    infos, draft_infos, mla_infos = [], [], []
    for spec in MODELS:
        if args.only and spec["name"] not in args.only:
            continue
        infos.append(build(spec, args.out, print))
    # Drafts read their target fixture from --out, so they run after the targets.
    for spec in DRAFTS:
        if args.only and spec["name"] not in args.only:
            continue
        draft_infos.append(build_draft(spec, args.out, print))
    for spec in MLA_DRAFTS:
        if args.only and spec["name"] not in args.only:
            continue
        mla_infos.append(build_mla_draft(spec, args.out, print))
    if not args.only:
        write_readme(args.out, infos, draft_infos, mla_infos)
    else:
        # A partial run leaves README.md alone: its sections for what it built, to merge by hand.
        sections = [line for info in infos if not info["quant"] for line in model_readme(info)]
        sections += quant_readme([info for info in infos if info["quant"]])
        sections += draft_readme(draft_infos) if draft_infos else []
        sections += mla_draft_readme(mla_infos)
        sections += mtp_readme(infos)
        print("----- README.md sections of the fixtures built (merge by hand) -----")
        print("\n".join(sections).rstrip())
        print("----- end -----")
    for info, budget in [(i, 1_500_000) for i in infos] + [(i, 1_000_000) for i in draft_infos + mla_infos]:
        total = sum(info["sizes"].values())
        if total > budget:
            raise SystemExit(f"{info['name']}: {total} bytes exceeds the {budget / 1e6:.1f} MB budget")


if __name__ == "__main__":
    main()
