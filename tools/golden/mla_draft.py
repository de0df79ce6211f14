"""The MLA EAGLE-3 draft fixtures (issue 21, fixtures.MLA_DRAFTS, docs/mla_drafts.md).

For each draft, OUT/<name>/ holds a random MLA EAGLE-3 draft (Kimi-K2.5 style: one MLA layer with a 2H input
and a dense MLP, Eagle3DeepseekV2ForCausalLM config, model.safetensors under `midlayer.` or `layers.0.`) on
the `k25_int4` target, with expected.safetensors in the Llama-style draft's layout (and tree.safetensors).
The expected outputs come from an independent fp32 implementation (MlaDraftReference, explicit latent
cache), cross-checked in fp64 and against the same drafter assembled from transformers' DeepSeek-V3
modules. Source ids S1-S9: docs/mla_drafts.md "Sources".
"""

import copy
import json
import math
import os
import shutil

import torch
import transformers

from .checkpoint import save_safetensors
from .deepseek_layers import MlaBlockReference
from .deepseek_reference import rms_norm, silu_mlp, yarn_get_mscale
from .fixtures import mla_draft_hub_config
from .llama_draft import DraftReference
from .oracle import max_rel
from .target import read_target_fixture
from .tree import DraftTreeDrafter, build_tree_fixture, tree_margin_ok
from .weights import mla_attention_shapes, mlp_shapes


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
