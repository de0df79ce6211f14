"""The transformers oracle: transformers' DeepseekV2ForCausalLM / DeepseekV3ForCausalLM (fp32, eager
attention, eager experts), the properties of the installed version the fixtures rely on
(check_oracle_semantics), hooks that capture the residual stream at every layer boundary and the routing
(BoundaryTap, run_transformers), a model loaded through the script's own hub -> transformers mapping
(load_direct), and max_rel, the max |diff| / max |value| measure every comparison uses.
"""

import torch
import transformers

from .deepseek_reference import yarn_get_mscale
from .weights import hub_to_transformers


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
