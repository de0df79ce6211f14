"""DeepSeek-V3's MTP module run as a drafter (issue 21, docs/mla_drafts.md "DeepSeek-V3's MTP module").

The target fixture `v3_mtp` carries the module in its checkpoint (layer L = num_hidden_layers; its weights:
weights.mtp_weight_shapes) and gets mtp_expected.safetensors (the module fed the target's final hidden after
model.norm, two steps, and a CONTROL fed the pre-norm boundary L) and mtp_tree.safetensors (tree.py). The
expected outputs come from an independent fp32 implementation (MtpReference, explicit latent cache),
cross-checked in fp64 and against the same module assembled from transformers' DeepSeek-V3 modules. Source
ids M1-M8: docs/mla_drafts.md "Sources".
"""

import math
import os

import torch
import transformers

from .checkpoint import save_safetensors
from .deepseek_layers import MlaBlockReference, moe_reference
from .deepseek_reference import MIN_ROUTING_MARGIN, rms_norm
from .oracle import max_rel
from .tree import MIN_TREE_MARGIN, DraftTreeDrafter, build_reference_tree, build_tree_fixture
from .weights import random_mtp_weights


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
