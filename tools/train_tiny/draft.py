"""The EAGLE-3 draft head (SpecForge's LlamaForCausalLMEagle3 layout), its training-time test (TTT)
forward, and its training on the frozen target.

Semantics (include/eagle3/draft_model.h; guarded by check_against_reference, which compares this
forward with tools/make_golden.py's DraftReference, the implementation the C++ golden tests match):
  g = fc(aux)   aux = target boundaries {2, 4, 5} = output-of-layer ids [1, 3, 4], concatenated
  x = concat(input_layernorm(embed(token)), hidden_norm(g))          embeddings first, [., 2H]
  r = g + o_proj(attn(rope(q), rope(k), v from x)); r = r + mlp(post_attention_layernorm(r))
  logits = lm_head(norm(r)) over the draft vocab; r is fed back as the next step's g.
Llama attention: rotate-half RoPE on the whole head, softmax scale head_dim^-0.5.

TTT, the layout of one training window x[0..N-1] with K unrolled steps and T = N - K rows:
  step j, row p: hidden g = fc(aux[p]) (j = 0) or the fed-back r of step j-1, row p; token x[p+1+j];
  RoPE position p + j; attends the step-0 rows 0..p and its own rows of steps 1..j (row p of each);
  predicts x[p+2+j], whose target distribution is the target's at position p+1+j.
This is the chain the library decodes: after an extend whose last row is p, the depth-d node sits at
position p + d and attends the extend rows and its ancestors (make_golden.py's tree fixtures).
"""

import importlib
import os
import sys

import numpy as np
import torch
import transformers
from torch import nn

from progress import log
from schedule import cosine_lr, run_budgeted
from target import autocast

# Output-of-layer ids of the target layers tapped: boundaries {2, 4, 5} = eagle3's default
# {2, L/2, L-3} for the 8-layer target (HiddenStateTap::DefaultBoundaries).
AUX_LAYER_IDS = [1, 3, 4]
LAYER_PREFIX = "midlayer."


def head_hub_config(target_hub, draft_vocab_size):
    """The config keys both EAGLE-3 heads (this one and draft_mla's) write alike."""
    h = target_hub["hidden_size"]
    return {
        "hidden_size": h,
        "target_hidden_size": h,
        "vocab_size": target_hub["vocab_size"],
        "draft_vocab_size": draft_vocab_size,
        "rms_norm_eps": 1e-6,
        "max_position_embeddings": target_hub["max_position_embeddings"],
        "rope_theta": 10000.0,
        "rope_scaling": None,
        "num_hidden_layers": 1,
        "hidden_act": "silu",
        "tie_word_embeddings": False,
        "attention_bias": False,
        "attention_dropout": 0.0,
        "bos_token_id": target_hub["bos_token_id"],
        "eos_token_id": target_hub["eos_token_id"],
        "eagle_config": {"eagle_aux_hidden_state_layer_ids": list(AUX_LAYER_IDS), "use_aux_hidden_state": True},
        "initializer_range": 0.02,
        "torch_dtype": "bfloat16",
        "use_cache": True,
        "transformers_version": transformers.__version__,
    }


def draft_hub_config(target_hub, draft_vocab_size):
    h = target_hub["hidden_size"]
    c = head_hub_config(target_hub, draft_vocab_size)
    c.update({
        "architectures": ["LlamaForCausalLMEagle3"],
        "model_type": "llama",
        "num_attention_heads": 8,
        "num_key_value_heads": 8,  # eagle3 shards the draft's kv heads over TP 8
        "head_dim": h // 8,
        "intermediate_size": 768,
        "mlp_bias": False,
        "pretraining_tp": 1,
    })
    return dict(sorted(c.items()))


def vocab_map(train_stream, vocab_size, draft_vocab_size):
    """The draft vocabulary: the draft_vocab_size most frequent target ids of the training split (ties:
    lower id), in ascending id order. Returns d2t (i64 [Vd], offsets: target = draft + d2t[draft]),
    t2d (bool [V]) and the fraction of training tokens the draft vocab covers."""
    counts = np.bincount(train_stream, minlength=vocab_size)
    order = sorted(range(vocab_size), key=lambda i: (-counts[i], i))[:draft_vocab_size]
    ids = torch.tensor(sorted(order), dtype=torch.int64)
    d2t = ids - torch.arange(draft_vocab_size)
    t2d = torch.zeros(vocab_size, dtype=torch.bool)
    t2d[ids] = True
    coverage = float(counts[ids.numpy()].sum() / counts.sum())
    return d2t, t2d, coverage


class RMSNorm(nn.Module):
    def __init__(self, width, eps):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(width))
        self.eps = eps

    def forward(self, x):
        x = x.float()
        return self.weight * (x / torch.sqrt((x * x).mean(-1, keepdim=True) + self.eps))


def linear(n_in, n_out):
    return nn.Linear(n_in, n_out, bias=False)


class Attention(nn.Module):
    def __init__(self, c):
        super().__init__()
        h, heads, kv, hd = c["hidden_size"], c["num_attention_heads"], c["num_key_value_heads"], c["head_dim"]
        self.heads, self.kv_heads, self.head_dim = heads, kv, hd
        self.q_proj, self.k_proj, self.v_proj = linear(2 * h, heads * hd), linear(2 * h, kv * hd), linear(2 * h, kv * hd)
        self.o_proj = linear(heads * hd, h)


class Mlp(nn.Module):
    def __init__(self, c):
        super().__init__()
        h, inter = c["hidden_size"], c["intermediate_size"]
        self.gate_proj, self.up_proj, self.down_proj = linear(h, inter), linear(h, inter), linear(inter, h)

    def forward(self, x):
        return self.down_proj(nn.functional.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nn.Module):
    """The draft's one layer; `attention` builds its self_attn (the Llama head's GQA or draft_mla's MLA)."""

    def __init__(self, c, attention=Attention):
        super().__init__()
        h, eps = c["hidden_size"], c["rms_norm_eps"]
        self.input_layernorm, self.hidden_norm = RMSNorm(h, eps), RMSNorm(h, eps)
        self.self_attn = attention(c)
        self.post_attention_layernorm = RMSNorm(h, eps)
        self.mlp = Mlp(c)


def rotate_half(x, cos, sin):
    """x [..., T, d]: pairs (i, i + d/2) rotate by angle i; cos/sin [T, d/2]."""
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], -1)


class Eagle3Draft(nn.Module):
    """Parameter names equal the checkpoint's tensor names (fc.weight, midlayer.*, norm.weight,
    lm_head.weight). The embedding is the target's, frozen, and not part of the state dict. Subclasses
    change the attention (ATTENTION, qkv, softmax_scale) and the RoPE width (ROPE_DIM_KEY)."""

    ATTENTION = Attention
    ROPE_DIM_KEY = "head_dim"

    def __init__(self, c, embed, d2t=None):
        super().__init__()
        self.c = c
        h = c["hidden_size"]
        self.fc = linear(len(AUX_LAYER_IDS) * c["target_hidden_size"], h)
        self.midlayer = DecoderLayer(c, self.ATTENTION)
        self.norm = RMSNorm(h, c["rms_norm_eps"])
        self.lm_head = linear(h, c["draft_vocab_size"])
        self.register_buffer("embed", embed.detach().clone().float(), persistent=False)
        hd = c[self.ROPE_DIM_KEY]
        inv_freq = 1.0 / c["rope_theta"] ** (torch.arange(0, hd, 2, dtype=torch.float64) / hd)
        self.register_buffer("inv_freq", inv_freq, persistent=False)
        if d2t is None:
            d2t = torch.zeros(c["draft_vocab_size"], dtype=torch.int64)
        self.register_buffer("d2t", d2t.clone(), persistent=False)

    def rope(self, positions):
        angles = positions.to(torch.float64)[:, None] * self.inv_freq[None, :]
        return angles.cos().float(), angles.sin().float()

    def softmax_scale(self):
        return self.c["head_dim"] ** -0.5

    def qkv(self, x, positions):
        """x [B, T, 2H] at RoPE positions [T] -> q, k, v [B, heads, T, d] fp32 (kv heads repeated)."""
        attn = self.midlayer.self_attn
        b, t = x.shape[:2]
        heads, kv_heads, hd = attn.heads, attn.kv_heads, attn.head_dim
        cos, sin = self.rope(positions)
        q = rotate_half(attn.q_proj(x).view(b, t, heads, hd).transpose(1, 2).float(), cos, sin)
        k = rotate_half(attn.k_proj(x).view(b, t, kv_heads, hd).transpose(1, 2).float(), cos, sin)
        v = attn.v_proj(x).view(b, t, kv_heads, hd).transpose(1, 2).float()
        rep = heads // kv_heads
        return q, k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1)

    def forward_ttt(self, aux, step_tokens, num_steps):
        """aux [B, T, k·Ht]; step_tokens [B, T + num_steps - 1] (step j reads step_tokens[:, j:j+T]).
        Returns per step (logits [B, T, Vd] fp32, fed-back hidden [B, T, H])."""
        layer, attn = self.midlayer, self.midlayer.self_attn
        b, t = aux.shape[:2]
        causal = torch.ones(t, t, dtype=torch.bool, device=aux.device).tril()
        g = self.fc(aux).float()  # the residual stream stays fp32 under autocast
        keys, values, outputs = [], [], []
        for j in range(num_steps):
            tokens = step_tokens[:, j:j + t]
            x = torch.cat([layer.input_layernorm(self.embed[tokens]), layer.hidden_norm(g)], -1)
            q, k, v = self.qkv(x, torch.arange(t, device=aux.device) + j)
            heads = q.shape[1]
            scale = self.softmax_scale()
            keys.append(k)
            values.append(v)
            # Scores against the step-0 rows (causal) and the same row of steps 1..j.
            s0 = (q @ keys[0].transpose(-1, -2)) * scale
            s0 = s0.masked_fill(~causal, float("-inf"))
            diag = [(q * keys[i]).sum(-1, keepdim=True) * scale for i in range(1, j + 1)]
            probs = torch.cat([s0] + diag, -1).softmax(-1)
            out = probs[..., :t] @ values[0]
            for i in range(1, j + 1):
                out = out + probs[..., t + i - 1:t + i] * values[i]
            out = out.transpose(1, 2).reshape(b, t, heads * out.shape[-1])
            r = g + attn.o_proj(out).float()
            r = r + layer.mlp(layer.post_attention_layernorm(r)).float()
            logits = self.lm_head(self.norm(r)).float()
            outputs.append((logits, r))
            g = r
        return outputs


class TargetTap:
    """Frozen-target forward that returns (logits, aux): forward hooks on the tapped layers capture
    their outputs, the full residual stream after the layer (boundary id + 1), as HiddenStateTap does."""

    def __init__(self, model):
        self.model = model
        self.captured = {}
        self.handles = [model.model.layers[i].register_forward_hook(self._hook(i)) for i in AUX_LAYER_IDS]

    def _hook(self, i):
        def hook(module, args, output):
            self.captured[i] = output[0] if isinstance(output, tuple) else output
        return hook

    @torch.no_grad()
    def __call__(self, tokens, device):
        with autocast(device):
            logits = self.model(input_ids=tokens, use_cache=False).logits
        aux = torch.cat([self.captured[i].float() for i in AUX_LAYER_IDS], -1)
        self.captured = {}
        return logits.float(), aux

    def remove(self):
        for h in self.handles:
            h.remove()


def ttt_targets(target_logits, num_steps, t, draft_ids):
    """Per step j: (soft labels [B, T, Vd] = softmax of the target logits at positions 1+j..j+T
    restricted to the draft vocab, mask [B, T] = the target's argmax there is in the draft vocab,
    target argmax [B, T] over the full vocab)."""
    in_draft = torch.zeros(target_logits.shape[-1], dtype=torch.bool, device=target_logits.device)
    in_draft[draft_ids] = True
    out = []
    for j in range(num_steps):
        logits = target_logits[:, 1 + j:1 + j + t]
        argmax = logits.argmax(-1)
        out.append((logits[..., draft_ids].softmax(-1), in_draft[argmax], argmax))
    return out


def ttt_loss(outputs, targets, decay):
    """sum_j decay^j * mean over masked rows of CE(soft labels, draft distribution)."""
    total, per_step = 0.0, []
    for j, ((logits, _), (labels, mask, _)) in enumerate(zip(outputs, targets)):
        ce = -(labels * logits.log_softmax(-1)).sum(-1)
        step = (ce * mask).sum() / mask.sum().clamp(min=1)
        per_step.append(step.detach())
        total = total + decay ** j * step
    return total, per_step


def agreement(outputs, targets, draft_ids):
    """Per step: fraction of rows whose draft argmax (mapped to a target id) equals the target's argmax."""
    return [(draft_ids[logits.argmax(-1)] == argmax).float().mean() for (logits, _), (_, _, argmax) in
            zip(outputs, targets)]


def init_from_target(draft, target_model, draft_ids):
    """Warm start: the draft's lm_head rows and final norm from the target's (the draft's logits are over
    a subset of the target's vocab, read from a residual stream of the same width)."""
    with torch.no_grad():
        draft.lm_head.weight.copy_(target_model.lm_head.weight[draft_ids])
        draft.norm.weight.copy_(target_model.model.norm.weight)


def train_draft(draft, tap, sampler, device, budget_s, batch_size, peak_lr, warmup, num_steps, decay,
                max_steps=None):
    draft_ids = torch.arange(draft.c["draft_vocab_size"], device=device) + draft.d2t
    params = [p for p in draft.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW([{"params": [p for p in params if p.dim() >= 2], "weight_decay": 0.01},
                                   {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}],
                                  lr=peak_lr, betas=(0.9, 0.95), fused=device.type == "cuda")
    draft.train()
    n = sampler.length
    t = n - num_steps
    step_losses = []

    def step_fn(step, total):
        lr = cosine_lr(step, warmup, total, peak_lr)
        for group in optimizer.param_groups:
            group["lr"] = lr
        x = sampler.batch(batch_size).to(device, non_blocking=True)
        target_logits, aux = tap(x, device)
        targets = ttt_targets(target_logits, num_steps, t, draft_ids)
        with autocast(device):
            outputs = draft.forward_ttt(aux[:, :t], x[:, 1:], num_steps)
        loss, per_step = ttt_loss(outputs, targets, decay)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if step % 10 == 0:
            step_losses.append(torch.stack(per_step))
        return loss.detach()

    stats, losses = run_budgeted("draft", step_fn, device, budget_s, warmup, batch_size * n, max_steps=max_steps)
    tail = torch.stack(step_losses[-5:]).mean(0).tolist()
    stats.update({"batch_size": batch_size, "seq_len": n, "rows_per_window": t, "ttt_steps": num_steps,
                  "loss_decay": decay, "peak_lr": peak_lr, "final_train_loss_per_step_running": tail,
                  "tokens_seen_note": "tokens_seen counts target tokens per window; every window trains "
                                      f"{t} rows x {num_steps} draft steps"})
    return stats, losses


@torch.no_grad()
def evaluate_draft(draft, tap, windows, device, batch_size, num_steps, decay):
    """Held-out TTT loss per step and top-1 agreement with the target's greedy token at depth 1..K
    (teacher-forced: text tokens in, chained through the fed-back hidden)."""
    draft_ids = torch.arange(draft.c["draft_vocab_size"], device=device) + draft.d2t
    draft.eval()
    n = windows.shape[1]
    t = n - num_steps
    sums = torch.zeros(3, num_steps, dtype=torch.float64)
    batches = 0
    for i in range(0, len(windows), batch_size):
        x = windows[i:i + batch_size].to(device)
        target_logits, aux = tap(x, device)
        targets = ttt_targets(target_logits, num_steps, t, draft_ids)
        with autocast(device):
            outputs = draft.forward_ttt(aux[:, :t], x[:, 1:], num_steps)
        _, per_step = ttt_loss(outputs, targets, decay)
        sums[0] += torch.stack(per_step).double().cpu()
        sums[1] += torch.stack(agreement(outputs, targets, draft_ids)).double().cpu()
        sums[2] += torch.stack([m.float().mean() for _, m, _ in targets]).double().cpu()
        batches += 1
    draft.train()
    sums /= max(batches, 1)
    return {"loss_per_step": sums[0].tolist(), "top1_agreement_per_depth": sums[1].tolist(),
            "target_argmax_in_draft_vocab": sums[2].tolist(), "windows": len(windows), "rows_per_window": t}


def import_make_golden():
    """tools/make_golden.py, imported without keeping its global torch settings (one thread,
    deterministic algorithms), which would slow down or break training."""
    threads, deterministic = torch.get_num_threads(), torch.are_deterministic_algorithms_enabled()
    tools = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    if tools not in sys.path:
        sys.path.insert(0, tools)
    try:
        return importlib.import_module("make_golden")
    finally:
        torch.set_num_threads(threads)
        torch.use_deterministic_algorithms(deterministic)


def check_against_reference(c, seed, num_steps=3, rows=12, batch=2, model_class=None, reference="DraftReference"):
    """This forward (fp32, random weights) must equal make_golden.py's DraftReference on every TTT step
    (model_class, default Eagle3Draft, against make_golden's class named `reference`):
    step 0 a causal pass from fc(aux); step j a pass of T rows at positions p + j fed the previous step's
    hidden, each row attending the step-0 rows up to itself and its own rows of steps 1..j. Returns the
    largest max |diff| / max |value|; raises above 1e-4."""
    golden = import_make_golden()
    g = torch.Generator().manual_seed(seed)
    vocab, h = c["vocab_size"], c["hidden_size"]
    embed = torch.randn(vocab, h, generator=g)
    model = (model_class or Eagle3Draft)(c, embed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_(1.0 + 0.1 * torch.randn(p.shape, generator=g) if p.dim() == 1
                    else torch.randn(p.shape, generator=g) / p.shape[1] ** 0.5)
    weights = {n: p.detach().clone() for n, p in model.state_dict().items()}
    aux = torch.randn(batch, rows, len(AUX_LAYER_IDS) * c["target_hidden_size"], generator=g)
    tokens = torch.randint(0, vocab, (batch, rows + num_steps - 1), generator=g)
    with torch.no_grad():
        outputs = model.forward_ttt(aux, tokens, num_steps)
    worst = 0.0
    for b in range(batch):
        ref = getattr(golden, reference)(c, LAYER_PREFIX, weights, embed, torch.float32)
        hidden = ref.fc(aux[b])
        for j in range(num_steps):
            allowed = torch.zeros(rows, rows * (j + 1), dtype=torch.bool)
            allowed[:, :rows] = torch.ones(rows, rows, dtype=torch.bool).tril()
            for i in range(1, j + 1):
                allowed[:, i * rows:(i + 1) * rows] = torch.eye(rows, dtype=torch.bool)
            logits, hidden = ref.step(tokens[b, j:j + rows], hidden, torch.arange(rows) + j, allowed)
            got_logits, got_hidden = outputs[j]
            worst = max(worst, golden.max_rel(got_logits[b], logits), golden.max_rel(got_hidden[b], hidden))
    if worst > 1e-4:
        raise SystemExit(f"draft forward differs from make_golden.{reference}: max rel diff {worst:.2e}")
    log(f"draft: TTT forward equals make_golden.{reference} over {num_steps} steps (max rel diff {worst:.1e})")
    return worst
