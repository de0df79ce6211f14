"""The target: a ~9M-parameter DeepSeek-V2 (MLA with q-LoRA, MoE with a shared expert, one dense first
layer), trained with transformers' DeepseekV2ForCausalLM, the oracle eagle3 is golden-tested against.

Hub config keys are the ones eagle3's parser accepts (src/deepseek_v2_config.cc refuses unknown keys).
Semantics pinned by the choices here: softmax routing, greedy top-2 of 8, norm_topk_prob false
(transformers 5.17's V2 router ignores it and always multiplies by routed_scaling_factor; with false
that is also DeepSeek's rule), routed_scaling_factor 1.0, no rope scaling, rms_norm_eps 1e-6 (the
latent norms use a fixed 1e-6 in transformers and rms_norm_eps in eagle3: identical only at 1e-6).
"""

import torch
import transformers

from schedule import cosine_lr, run_budgeted

AUX_LOSS_ALPHA = 0.003


def target_hub_config(vocab_size, eos_id):
    c = {
        "architectures": ["DeepseekV2ForCausalLM"],
        "model_type": "deepseek_v2",
        "vocab_size": vocab_size,
        "hidden_size": 256,
        "intermediate_size": 768,
        "moe_intermediate_size": 64,
        "num_hidden_layers": 8,
        "num_attention_heads": 8,
        "num_key_value_heads": 8,
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
        "moe_layer_freq": 1,
        "q_lora_rank": 96,
        "kv_lora_rank": 64,
        "qk_nope_head_dim": 32,
        "qk_rope_head_dim": 16,
        "v_head_dim": 32,
        "max_position_embeddings": 2048,
        "rope_theta": 10000.0,
        "rope_scaling": None,
        "rms_norm_eps": 1e-6,
        "hidden_act": "silu",
        "attention_bias": False,
        "attention_dropout": 0.0,
        "tie_word_embeddings": False,
        "bos_token_id": eos_id,
        "eos_token_id": eos_id,
        "aux_loss_alpha": AUX_LOSS_ALPHA,
        "seq_aux": False,
        "ep_size": 1,
        "initializer_range": 0.02,
        "pretraining_tp": 1,
        "torch_dtype": "bfloat16",
        "use_cache": True,
        "transformers_version": transformers.__version__,
    }
    return dict(sorted(c.items()))


def build_model(hub, device, attn="sdpa", experts="eager"):
    config = transformers.DeepseekV2Config.from_dict(hub)
    model = transformers.DeepseekV2ForCausalLM._from_config(config, attn_implementation=attn,
                                                            experts_implementation=experts, dtype=torch.float32)
    return model.to(device)


def set_implementation(model, attn=None, experts=None):
    if attn is not None:
        model.config._attn_implementation = attn
    if experts is not None:
        model.config._experts_implementation = experts


def is_moe_layer(hub, layer):
    return layer >= hub["first_k_dense_replace"] and layer % hub["moe_layer_freq"] == 0


def to_hub_state(model, hub):
    """transformers' names -> the hub's: fused experts gate_up_proj [E, 2I, H] (gate rows first) and
    down_proj [E, H, I] become experts.{e}.{gate,up,down}_proj.weight; everything else keeps its name."""
    out = {}
    inter = hub["moe_intermediate_size"]
    for name, w in model.state_dict().items():
        if name.endswith(".mlp.experts.gate_up_proj"):
            prefix = name[: -len("gate_up_proj")]
            for e in range(w.shape[0]):
                out[f"{prefix}{e}.gate_proj.weight"] = w[e, :inter]
                out[f"{prefix}{e}.up_proj.weight"] = w[e, inter:]
        elif name.endswith(".mlp.experts.down_proj"):
            prefix = name[: -len("down_proj")]
            for e in range(w.shape[0]):
                out[f"{prefix}{e}.down_proj.weight"] = w[e]
        else:
            out[name] = w
    return out


def count_parameters(model):
    return sum(p.numel() for p in model.parameters())


class RouterStats:
    """Hooks every MoE gate: keeps its outputs of the current forward for the load-balancing loss and
    counts expert use."""

    def __init__(self, model):
        self.outputs = []
        self.counts = {}
        self.count = False
        self.handles = []
        for i, layer in enumerate(model.model.layers):
            gate = getattr(layer.mlp, "gate", None)
            if isinstance(gate, torch.nn.Module):
                self.handles.append(gate.register_forward_hook(self._hook(i)))

    def _hook(self, layer):
        def hook(module, args, output):
            logits, _, ids = output
            self.outputs.append((logits, ids, module.num_experts, module.top_k))
            if self.count:
                c = torch.bincount(ids.reshape(-1), minlength=module.num_experts).cpu()
                self.counts[layer] = self.counts.get(layer, 0) + c
        return hook

    def balance_loss(self):
        """Switch/DeepSeek expert-level balance loss: E/K * sum_e f_e P_e per layer, averaged."""
        total = 0.0
        for logits, ids, experts, k in self.outputs:
            probs = logits.float().softmax(-1).mean(0)
            flat = ids.reshape(-1)
            load = torch.zeros(experts, device=flat.device).scatter_add_(0, flat, torch.ones_like(flat, dtype=torch.float))
            load = load / flat.numel()
            total = total + experts * (load * probs).sum()
        n = len(self.outputs)
        self.outputs = []
        return total / max(n, 1)

    def usage(self):
        return {layer: (c.float() / c.sum()).tolist() for layer, c in sorted(self.counts.items())}

    def remove(self):
        for h in self.handles:
            h.remove()


def lm_loss(logits, tokens):
    """Next-token cross entropy, mean over positions 0..N-2."""
    return torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]).float(),
                                             tokens[:, 1:].reshape(-1))


def autocast(device):
    return torch.autocast(device_type="cuda", dtype=torch.bfloat16, enabled=device.type == "cuda")


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize()


@torch.no_grad()
def evaluate_loss(model, windows, device, batch_size):
    """Mean next-token loss over fixed windows [n, L] (every predicted position weighs the same)."""
    model.eval()
    total, count = 0.0, 0
    for i in range(0, len(windows), batch_size):
        x = windows[i:i + batch_size].to(device)
        with autocast(device):
            logits = model(input_ids=x, use_cache=False).logits
        total += lm_loss(logits, x).item() * x[:, 1:].numel()
        count += x[:, 1:].numel()
    model.train()
    return total / max(count, 1)


def train_target(model, sampler, device, budget_s, batch_size, peak_lr, warmup, max_steps=None):
    """AdamW (betas 0.9/0.95, weight decay 0.1 on matrices), warmup + cosine to 0.1 x peak, gradient
    clipping 1.0, bf16 autocast on CUDA, plus the expert balance loss. The experts implementation
    (transformers' grouped_mm or its per-expert loop) is picked by timing real steps of each."""
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    optimizer = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
                                  lr=peak_lr, betas=(0.9, 0.95), eps=1e-8, fused=device.type == "cuda")
    router = RouterStats(model)
    model.train()

    def step_fn(step, total):
        lr = cosine_lr(step, warmup, total, peak_lr)
        for group in optimizer.param_groups:
            group["lr"] = lr
        x = sampler.batch(batch_size).to(device, non_blocking=True)
        try:
            with autocast(device):
                logits = model(input_ids=x, use_cache=False).logits
            loss = lm_loss(logits, x)
            (loss + AUX_LOSS_ALPHA * router.balance_loss()).backward()
        except (RuntimeError, NotImplementedError):
            router.outputs = []
            optimizer.zero_grad(set_to_none=True)
            raise
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return loss.detach()

    variants = [(impl, lambda impl=impl: set_implementation(model, experts=impl)) for impl in ("grouped_mm", "eager")]
    stats, losses = run_budgeted("target", step_fn, device, budget_s, warmup, batch_size * sampler.length, variants,
                                 max_steps)
    router.remove()
    stats.update({"batch_size": batch_size, "seq_len": sampler.length, "peak_lr": peak_lr})
    return stats, losses


def round_to_bf16(model):
    """The exported weights are bf16: everything evaluated and distilled afterwards uses those values."""
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(p.to(torch.bfloat16).float())


@torch.no_grad()
def expert_usage(model, windows, device, batch_size):
    router = RouterStats(model)
    router.count = True
    model.eval()
    for i in range(0, len(windows), batch_size):
        with autocast(device):
            model(input_ids=windows[i:i + batch_size].to(device), use_cache=False)
        router.outputs = []
    model.train()
    router.remove()
    return router.usage()
