"""The fixtures make_golden.py writes, as specs, and the config.json each spec becomes.

MODELS are the target fixtures (built by target.build), DRAFTS the Llama-style EAGLE-3 draft heads on a
target fixture (llama_draft.build_draft), MLA_DRAFTS the MLA EAGLE-3 drafts (mla_draft.build_mla_draft).
A spec names the fixture and holds its weight seed (for a target or an MLA draft, the first of a search for
weights without near-ties), its prompt length or fixed draft tokens, a `what` line for the README and its
hub config keys; a target spec with "quant" is stored in a quantized hub form (quantized.py), one with "mtp"
carries DeepSeek-V3's MTP module (mtp.py), and a spec with "trees" also gets EAGLE-2 tree fixtures
(tree.py). hub_config, draft_hub_config and mla_draft_hub_config add the keys common to every fixture of a
kind.
"""

import transformers


# ---------------------------------------------------------------------------------------------------
# Target models (target.py). Every dim shards 8 ways (heads, intermediate_size, moe_intermediate_size);
# rms_norm_eps is 1e-6 as in every real config (DeepSeek's reference and transformers use a fixed 1e-6
# for q_a_layernorm / kv_a_layernorm, SGLang/vLLM/eagle3 use rms_norm_eps: identical only at 1e-6).

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
    # on the weights it dequantizes to (see quantized.py).
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
# EAGLE-3 draft fixtures (llama_draft.py): a random draft head (SpecForge's LlamaForCausalLMEagle3 layout)
# on top of a target fixture, whose aux hidden states come from that fixture's boundaries.

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


def draft_hub_config(spec, target_config):
    c = dict(DRAFT_COMMON_KEYS)
    c.update(spec["config"])
    c["vocab_size"] = target_config["vocab_size"]
    c["target_hidden_size"] = target_config["hidden_size"]
    c["transformers_version"] = transformers.__version__
    return dict(sorted(c.items()))


# ---------------------------------------------------------------------------------------------------
# MLA EAGLE-3 draft fixtures (mla_draft.py): one DeepSeek MLA layer on the `k25_int4` target.

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


def mla_draft_hub_config(spec, target_config):
    c = dict(MLA_DRAFT_COMMON_KEYS)
    c.update(spec["config"])
    c["vocab_size"] = target_config["vocab_size"]
    c["target_hidden_size"] = target_config["hidden_size"]
    c["transformers_version"] = transformers.__version__
    return dict(sorted(c.items()))
