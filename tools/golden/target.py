"""The target fixtures: build() writes and checks one tiny model of fixtures.MODELS; read_target_fixture()
reads one back for the drafts built on it.

For each model build() writes, under OUT/<name>/:
  config.json                        hub form (rope_theta + rope_scaling, model_type, architectures)
  model-0000{1,2}-of-00002.safetensors + model.safetensors.index.json
                                     hub tensor names and layouts, bf16 (V3's
                                     e_score_correction_bias in f32, as real V3/K2 checkpoints store it)
  expected.safetensors               tokens i64 [T]; logits f32 [T, V]; boundary.<b> f32 [T, H] for
                                     b = 0..L (b = 0 embedding output, b = i input of layer i, b = L output
                                     of the last layer before the final norm); router.<l>.topk_ids i64 [T, K]
                                     and router.<l>.topk_weights f32 [T, K] for every MoE layer l (sorted
                                     by expert id; weights as multiplied into the expert outputs)
(a quantized model's config and shards in its quantized hub form, quantized.py; a model with an MTP module
also gets the MTP fixtures, mtp.py).

The oracle is transformers' DeepseekV2ForCausalLM / DeepseekV3ForCausalLM (fp32, eager attention, eager
experts) loaded with from_pretrained from the written checkpoint (oracle.py). The same weights are also
loaded by a direct hub->transformers mapping, and run through an independent fp64 implementation of
DeepSeek's reference math (deepseek_reference.py, written from DeepSeek's modeling_deepseek.py, not from
transformers); all three must agree or the script fails. The fp64 implementation also measures how much
each semantic detail the fixtures are meant to pin down (YaRN m^2, YaRN frequencies, adjacent-pair RoPE,
routing details: SENSITIVITY) moves the logits, so a reader can see that a fixture would catch that mistake.
Weight seeds count up from each model's base seed until every routing decision has a margin of at least
MIN_ROUTING_MARGIN.
"""

import json
import os
import shutil
import tempfile

import torch
import transformers
from safetensors.torch import load_file

from .checkpoint import save_safetensors, write_checkpoint
from .deepseek_reference import MIN_ROUTING_MARGIN, reference_forward, yarn_get_mscale
from .fixtures import hub_config
from .mtp import build_mtp_fixture, choose_mtp_weights
from .oracle import check_oracle_semantics, load_direct, max_rel, run_transformers, transformers_class
from .quantized import (K25_PREFIX, K25_VISION_SHAPES, QUANT_SENSITIVITY, mistaken_weights, quant_summary,
                        quantization_config, quantize_checkpoint, read_quantized_checkpoint, stored_config,
                        write_oracle_checkpoint, write_quantized_checkpoint)
from .weights import random_weights


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
