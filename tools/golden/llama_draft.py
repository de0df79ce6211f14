"""The EAGLE-3 draft fixtures (fixtures.DRAFTS): a random draft head (SpecForge's LlamaForCausalLMEagle3
layout) on top of a target fixture, whose aux hidden states come from that fixture's boundaries.

For each draft, OUT/<name>/ holds config.json in SpecForge's LlamaForCausalLMEagle3 form, model.safetensors
with fc, the decoder layer, norm, lm_head, d2t and t2d, and expected.safetensors: the aux input taken from
the target's boundaries, the draft tokens, and the logits and fed-back hidden of a causal pass over every
row plus one more row decoded from the last row's fed-back hidden. A draft with "trees" also gets
tree.safetensors (tree.py) over the same draft reference.

The expected outputs are computed by an independent implementation of the draft step (DraftReference,
written from the semantics in include/eagle3/draft_model.h, not from any engine), in fp32; the same
implementation in fp64 and the draft assembled from transformers' Llama building blocks (LlamaAttention
with 2H-wide q/k/v, LlamaRotaryEmbedding from the written config.json, LlamaMLP, LlamaRMSNorm) must agree
with it. tools/train_tiny checks its draft's forward against DraftReference.
"""

import json
import math
import os
import shutil

import torch
import transformers

from .checkpoint import save_safetensors
from .deepseek_reference import apply_rope, rms_norm, silu_mlp, yarn_get_mscale, yarn_inv_freq
from .fixtures import draft_hub_config
from .oracle import max_rel
from .target import read_target_fixture
from .tree import DraftTreeDrafter, build_tree_fixture


DRAFT_SENSITIVITY = {
    "no_yarn": "plain RoPE frequencies instead of the scaled ones (YaRN or llama3)",
    "no_attn_factor": "cos/sin without YaRN's attention factor",
    "softmax_m2": "YaRN's factor squared into the softmax scale as well (DeepSeek-style)",
    "adjacent_pairs": "rotate adjacent pairs (2i, 2i+1) instead of (i, i + d/2)",
    "hidden_first": "concat(hidden_norm(g), input_layernorm(embed)) instead of embeddings first",
    "flip_norm_before_residual": "the opposite norm_before_residual",
    "aux_reversed": "aux states concatenated in reverse order",
}


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


def llama_tree_drafter(dc, prefix, weights, embed, aux):
    """make_drafter(ext_tokens, dtype, variant) for build_tree_fixture: the Llama-style head's tree rows."""
    def make(ext_tokens, dtype, variant=()):
        ref = DraftReference(dc, prefix, weights, embed, dtype)
        return DraftTreeDrafter(ref, ref.fc(aux), ext_tokens, variant)
    return make


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
