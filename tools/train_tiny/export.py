"""Writes the pair in the hub formats eagle3 reads and checks what was written.

OUT/tiny-v2-code/        config.json (hub DeepSeek-V2 form), model.safetensors (bf16, hub names:
                         experts stored per expert), tokenizer.json
OUT/tiny-v2-code-eagle3/ config.json (SpecForge LlamaForCausalLMEagle3 form), model.safetensors (bf16
                         fc / midlayer.* / norm / lm_head, d2t i64 [Vd] offsets, t2d bool [V]; no
                         embedding: the target's is shared)
OUT/tiny-v2-code-eagle3-mla/  the MLA head (train_mla_draft.py): config.json (TorchSpec / SGLang
                         Eagle3DeepseekV2ForCausalLM form), model.safetensors with the same layout and
                         midlayer.self_attn.{q_a_proj, q_a_layernorm, q_b_proj, kv_a_proj_with_mqa,
                         kv_a_layernorm, kv_b_proj, o_proj}
"""

import json
import os

import torch
import transformers
from safetensors.torch import load_file, save_file

from progress import log
from target import to_hub_state

TARGET_DIR = "tiny-v2-code"
DRAFT_DIR = "tiny-v2-code-eagle3"
MLA_DRAFT_DIR = "tiny-v2-code-eagle3-mla"
MAX_MLA_DRAFT_BYTES = 4 * 1000 * 1000
MAX_PAIR_BYTES = 23 * 1000 * 1000


def write_json(path, obj):
    with open(path, "w") as f:
        json.dump(obj, f, indent=2)
        f.write("\n")


def file_bytes(directory):
    return {f: os.path.getsize(os.path.join(directory, f)) for f in sorted(os.listdir(directory))}


def export_target(out_dir, model, hub, tok):
    directory = os.path.join(out_dir, TARGET_DIR)
    os.makedirs(directory, exist_ok=True)
    write_json(os.path.join(directory, "config.json"), hub)
    state = {n: w.detach().to("cpu", torch.bfloat16).contiguous() for n, w in to_hub_state(model, hub).items()}
    save_file(state, os.path.join(directory, "model.safetensors"), metadata={"format": "pt"})
    tok.save(os.path.join(directory, "tokenizer.json"))
    return directory


def export_draft(out_dir, draft, dc, name=DRAFT_DIR):
    """Either head (the Llama-style one or draft_mla's): its state dict as stored, d2t and t2d."""
    directory = os.path.join(out_dir, name)
    os.makedirs(directory, exist_ok=True)
    write_json(os.path.join(directory, "config.json"), dc)
    state = {n: w.detach().to("cpu", torch.bfloat16).contiguous() for n, w in draft.state_dict().items()}
    state["d2t"] = draft.d2t.detach().to("cpu", torch.int64).contiguous()
    target_ids = check_vocab_map(state["d2t"], dc["vocab_size"], directory)
    state["t2d"] = torch.zeros(dc["vocab_size"], dtype=torch.bool)
    state["t2d"][target_ids] = True
    save_file(state, os.path.join(directory, "model.safetensors"), metadata={"format": "pt"})
    return directory


def verify_target(directory, model, windows):
    """from_pretrained of the written directory (transformers' own hub -> fused-experts conversion) must
    load every tensor and give the in-memory model's logits (fp32, eager) on a held-out window."""
    loaded, info = transformers.DeepseekV2ForCausalLM.from_pretrained(
        directory, dtype=torch.float32, attn_implementation="eager", experts_implementation="eager",
        output_loading_info=True)
    if any(info.get(k) for k in ("missing_keys", "unexpected_keys", "mismatched_keys", "error_msgs")):
        raise SystemExit(f"{directory}: from_pretrained loading report: {info}")
    reference = transformers.DeepseekV2ForCausalLM._from_config(
        loaded.config, attn_implementation="eager", experts_implementation="eager", dtype=torch.float32)
    reference.load_state_dict({n: p.detach().cpu().float() for n, p in model.state_dict().items()})
    x = windows[:1, :128]
    with torch.no_grad():
        want = reference.eval()(input_ids=x, use_cache=False).logits
        got = loaded.eval()(input_ids=x, use_cache=False).logits
    if not torch.equal(want, got):
        raise SystemExit(f"{directory}: reloaded logits differ from the trained model's "
                         f"(max |diff| {(want - got).abs().max():.3e})")


def verify_draft(directory, draft):
    stored = load_file(os.path.join(directory, "model.safetensors"))
    for name, w in draft.state_dict().items():
        if not torch.equal(stored[name].float(), w.detach().cpu().float()):
            raise SystemExit(f"{directory}: tensor {name} differs from the trained draft (not bf16-rounded?)")
    target_ids = check_vocab_map(stored["d2t"], len(stored["t2d"]), directory)
    if int(stored["t2d"].sum()) != len(target_ids) or not bool(stored["t2d"][target_ids].all()):
        raise SystemExit(f"{directory}: t2d is not the indicator of the target ids d2t maps to")


def check_vocab_map(d2t, vocab_size, where):
    """d2t holds offsets: every draft id + d2t[draft id] is a distinct id in [0, vocab_size). Returns them."""
    target_ids = torch.arange(len(d2t)) + d2t
    bad = ((target_ids < 0) | (target_ids >= vocab_size)).nonzero().flatten()
    if len(bad):
        i = int(bad[0])
        raise SystemExit(f"{where}: d2t[{i}] = {int(d2t[i])} maps draft id {i} to target id {int(target_ids[i])}, "
                         f"outside [0, {vocab_size})")
    if len(set(target_ids.tolist())) != len(target_ids):
        raise SystemExit(f"{where}: d2t maps two draft ids to the same target id")
    return target_ids


def sizes(out_dir):
    target = file_bytes(os.path.join(out_dir, TARGET_DIR))
    draft = file_bytes(os.path.join(out_dir, DRAFT_DIR))
    weights = target["model.safetensors"] + draft["model.safetensors"]
    total = sum(target.values()) + sum(draft.values())
    log(f"export: target files {target}, draft files {draft}; weights {weights / 1e6:.2f} MB, all files "
        f"{total / 1e6:.2f} MB")
    if weights > MAX_PAIR_BYTES:
        raise SystemExit(f"the pair's weights are {weights} bytes, over the {MAX_PAIR_BYTES} byte budget")
    return {"target_files": target, "draft_files": draft, "weights_bytes": weights, "all_files_bytes": total}


def mla_draft_size(out_dir):
    """The MLA head ships beside the pair, under its own budget."""
    files = file_bytes(os.path.join(out_dir, MLA_DRAFT_DIR))
    log(f"export: MLA draft files {files}")
    if files["model.safetensors"] > MAX_MLA_DRAFT_BYTES:
        raise SystemExit(f"the MLA draft's weights are {files['model.safetensors']} bytes, over the "
                         f"{MAX_MLA_DRAFT_BYTES} byte budget")
    return {"draft_files": files, "weights_bytes": files["model.safetensors"],
            "all_files_bytes": sum(files.values())}
