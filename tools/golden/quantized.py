"""Quantized targets (issue 20): the hub's FP8 and INT4 checkpoint forms, written, read back and measured.

Two target fixtures are quantized as the published checkpoints are: `v3_fp8` in DeepSeek-V3's FP8 form
(quantization_config quant_method "fp8", e4m3 `X.weight` with f32 `X.weight_scale_inv` per 128 x 128 block,
every Linear but lm_head) and `k25_int4` in Kimi-K2.5's form (model_type kimi_k25, the text model as
text_config, tensors under `language_model.`, compressed-tensors pack-quantized int4 with group 32 and the
hub's ignore list, so only the routed experts are quantized: `X.weight_packed`, `X.weight_scale`,
`X.weight_shape`). Their config.json carries the quantization_config and their shards the quantized tensors.

The checkpoint holds the hub's quantized form; what the references run is the weights it means, dequantized
as eagle3's CPU reference documents it (include/eagle3/detail/quantized_weights.h): fp8: w = float(code) *
scale_inv of its 128 x 128 block, one f32 multiply; int4: w = q * scale of its group of 32 input columns
(exact in f32). transformers reads neither form without extra packages, so its oracle loads an unquantized
f32 checkpoint of those dequantized weights written to a temporary directory. The written shards are
decoded again from the files (read_quantized_checkpoint) and must equal those weights bit for bit.
QUANT_SENSITIVITY lists the dequantization mistakes a loader could make, measured on each fixture.
"""

import json
import math
import os
import re

import torch
import transformers
from safetensors.torch import load_file

from .checkpoint import save_safetensors, write_two_shards
from .weights import weight_shapes


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


# Dequantization mistakes a loader could make, measured like target.SENSITIVITY (fp64 reference on weights
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
