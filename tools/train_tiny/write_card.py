#!/usr/bin/env python3
"""Writes the model card (models/README.md) from a run's train_log.json (and check_cpp.json, if present).

  write_card.py OUT_DIR [--card models/README.md] [--measure measure_cpu.json [--measure measure_cuda.json]]
                [--mla MLA_DIR [--measure-mla measure_mla_cuda.json ...] [--tie-check tie_check.jsonl]
                 [--decode-runs DRAFT,BATCH,decode_runs/summary.txt ...]]

With --measure, the card adds the tables of tools/train_tiny/measure.py (acceptance, tokens/s, field
failures), one per measurement file, each with its command and machine. Every number in the card
comes from those files; nothing is typed in by hand. --mla adds the MLA EAGLE-3 draft of
train_mla_draft.sh (MLA_DIR/train_log_mla.json, and MLA_DIR/check_cpp_mla.json if present) beside the
Llama-style one: its architecture, training, held-out agreement next to the Llama-style draft's on the
same windows, and, per --measure-mla file, its acceptance next to the --measure file of the same device;
--tie-check explains greedy mismatches at bf16 (tie_check.py), --decode-runs adds scripts/decode_runs.sh's
end-to-end cost per token of each draft.
"""

import argparse
import json
import os


def target_parameter_table(c):
    """(component, parameters) from the hub config, as the checkpoint stores them."""
    h, heads, layers = c["hidden_size"], c["num_attention_heads"], c["num_hidden_layers"]
    qk = c["qk_nope_head_dim"] + c["qk_rope_head_dim"]
    attn = (c["q_lora_rank"] * h + c["q_lora_rank"] + heads * qk * c["q_lora_rank"]
            + (c["kv_lora_rank"] + c["qk_rope_head_dim"]) * h + c["kv_lora_rank"]
            + heads * (c["qk_nope_head_dim"] + c["v_head_dim"]) * c["kv_lora_rank"] + h * heads * c["v_head_dim"])
    dense_layers = c["first_k_dense_replace"]
    moe_layers = layers - dense_layers
    mi = c["moe_intermediate_size"]
    rows = [
        ("embedding (vocab x hidden)", c["vocab_size"] * h),
        (f"MLA attention ({layers} layers)", layers * attn),
        (f"dense MLP (layer 0..{dense_layers - 1})", dense_layers * 3 * h * c["intermediate_size"]),
        (f"routed experts ({moe_layers} layers x {c['n_routed_experts']})", moe_layers * c["n_routed_experts"] * 3 * h * mi),
        (f"shared experts ({moe_layers} layers x {c['n_shared_experts']})", moe_layers * 3 * h * mi * c["n_shared_experts"]),
        (f"routers ({moe_layers} layers)", moe_layers * c["n_routed_experts"] * h),
        ("RMSNorm weights", layers * 2 * h + h),
        ("lm_head (vocab x hidden)", c["vocab_size"] * h),
    ]
    return rows


def draft_parameter_table(c):
    h, ht = c["hidden_size"], c["target_hidden_size"]
    k = len(c["eagle_config"]["eagle_aux_hidden_state_layer_ids"])
    q = c["num_attention_heads"] * c["head_dim"]
    kv = c["num_key_value_heads"] * c["head_dim"]
    return [
        (f"fc ({k} x {ht} -> {h})", k * ht * h),
        ("attention (q/k/v over concat(embed, hidden), 2H wide; o)", 2 * h * (q + 2 * kv) + q * h),
        ("SiLU MLP", 3 * h * c["intermediate_size"]),
        ("RMSNorm weights", 4 * h),
        (f"lm_head (draft vocab {c['draft_vocab_size']} x hidden)", c["draft_vocab_size"] * h),
    ]


def mla_draft_parameter_table(c):
    h, ht, heads = c["hidden_size"], c["target_hidden_size"], c["num_attention_heads"]
    k = len(c["eagle_config"]["eagle_aux_hidden_state_layer_ids"])
    dn, dr, dv, r, qr = (c["qk_nope_head_dim"], c["qk_rope_head_dim"], c["v_head_dim"], c["kv_lora_rank"],
                         c["q_lora_rank"])
    q = 2 * h * heads * (dn + dr) if qr is None else 2 * h * qr + qr + qr * heads * (dn + dr)
    return [
        (f"fc ({k} x {ht} -> {h})", k * ht * h),
        ("MLA attention over concat(embed, hidden), 2H wide (q, kv_a, latent norms, kv_b, o)",
         q + 2 * h * (r + dr) + r + r * heads * (dn + dv) + heads * dv * h),
        ("SiLU MLP", 3 * h * c["intermediate_size"]),
        ("RMSNorm weights", 4 * h),
        (f"lm_head (draft vocab {c['draft_vocab_size']} x hidden)", c["draft_vocab_size"] * h),
    ]


def table(rows):
    lines = ["| component | parameters |", "|---|---:|"]
    lines += [f"| {name} | {n:,} |" for name, n in rows]
    lines.append(f"| **total** | **{sum(n for _, n in rows):,}** |")
    return lines


def fmt_list(values, digits=3):
    return ", ".join(f"{v:.{digits}f}" for v in values)


def depth_list(values):
    return " / ".join(f"{v:.2f}" for v in values)


def measurement_rows(rows, greedy):
    head = ("| config | topk | steps | draft tokens | mean accepted length | acceptance by depth 1.. | "
            "plain tok/s | spec tok/s | speedup |")
    lines = [head + (" greedy identical |" if greedy else ""),
             "|---|---:|---:|---:|---:|---|---:|---:|---:|" + ("---:|" if greedy else "")]
    for r in rows:
        line = (f"| {r['config']} | {r['topk']} | {r['steps']} | {r['draft_tokens']} | **{r['mean_accepted_length']:.2f}** "
                f"| {depth_list(r['acceptance_by_depth'])} | {r['plain_tokens_per_s']:.1f} | {r['spec_tokens_per_s']:.1f} "
                f"| {r['speedup']:.2f}x |")
        if greedy:
            counted = r["prompts"] - r.get("prompts_ended_at_once", 0)
            line += f" {r['greedy_identical_prompts']}/{counted} |"
        lines.append(line)
    return lines


def batch_section(m):
    """A measure.py --batch B file: each configuration one batched eagle3-decode call (greedy)."""
    label = "GPU" if m["device"] == "cuda" else "CPU"
    lines = [f"### {label}, batch {m['batch']}: {m['machine']}", "", "```sh", m["command"], "```", "",
             f"The first {m['batch']} held-out prompts decoded together (each cut to {m['prompt_tokens'][0]} tokens), "
             f"{m['max_new_tokens']} new tokens each, greedy; one `eagle3-decode {m['decode_flags']}` call per "
             "configuration (plain, then speculative); tokens/s over all sequences.", ""]
    lines += measurement_rows(m["configs"], True)
    if m.get("skipped_for_budget"):
        lines += ["", "Not measured (the run's --budget-seconds ran out): " + ", ".join(m["skipped_for_budget"]) + "."]
    return lines


def measurement_section(m):
    """One measurement file of measure.py: its command, machine, and tables."""
    if m.get("batch", 1) > 1:
        return batch_section(m)
    label = "GPU" if m["device"] == "cuda" else "CPU"
    rows = m["configs"]
    greedy = [r for r in rows if r["temperature"] == 0]
    sampled = [r for r in rows if r["temperature"] != 0]
    ended = max((r.get("prompts_ended_at_once", 0) for r in rows), default=0)
    lines = [
        f"### {label}: {m['machine']}",
        "",
        "```sh",
        m["command"],
        "```",
        "",
        f"{len(m['prompts'])} held-out prompts ({min(m['prompt_tokens'])}-{max(m['prompt_tokens'])} tokens), "
        f"{m['max_new_tokens']} new tokens each, seed {m['seed']}; each prompt and configuration is one "
        f"`eagle3-decode {m['decode_flags']}` call (plain, then speculative, in one process). Measured in "
        f"{m['wall_seconds']:.0f} s.",
        "",
        "Mean accepted length = tokens emitted per verify pass (accepted drafted tokens + the target's own),",
        "over all verify passes of all prompts; acceptance at depth d = share of verify passes that accepted",
        "at least d drafted tokens; tokens/s = all generated tokens / all decode seconds (prefill included).",
    ]
    if ended:
        lines.append(f"Up to {ended} prompt(s) per configuration ended at once (the target's first token was "
                     "`<|endoftext|>`): no verify pass, left out of every average.")
    if m.get("skipped_for_budget"):
        lines.append("Not measured (the run's --budget-seconds ran out): " + ", ".join(m["skipped_for_budget"]) + ".")
    lines += ["", "Greedy (temperature 0):", ""] + measurement_rows(greedy, True)
    if sampled:
        lines += ["", f"Temperature {sampled[0]['temperature']:g} (seeded, lossless stochastic verification):", ""]
        lines += measurement_rows(sampled, False)
    if greedy:
        agree = sum(r["greedy_agreeing_tokens"] for r in greedy)
        total = sum(r["greedy_tokens"] for r in greedy)
        lines += ["", f"Greedy agreement: speculative output identical to plain on "
                      f"{sum(r['greedy_identical_prompts'] for r in greedy)} of "
                      f"{sum(r['prompts'] - r.get('prompts_ended_at_once', 0) for r in greedy)} runs; "
                      f"{agree:,} of {total:,} tokens agree ({agree / total:.1%}, counting each run's tokens "
                      "up to its first difference)."]
    fails = m.get("field_failures", [])
    if fails:
        base = {r["config"]: r for r in greedy}
        lines += [
            "",
            f"Field failures ({label}, greedy): the same draft fed the wrong target states through "
            "`eagle3-decode --aux-layers IDS --convention output|input`; the draft's config says output-of-layer "
            "ids [1, 3, 4] = boundaries {2, 4, 5}.",
            "",
            "| taps | flags | boundaries | config | mean accepted length | vs correct | acceptance by depth 1.. |",
            "|---|---|---|---|---:|---:|---|",
        ]
        for r in fails:
            ref = base.get(r["config"])
            delta = (f"{(r['mean_accepted_length'] / ref['mean_accepted_length'] - 1) * 100:+.0f}%" if ref else "")
            lines.append(f"| {r['failure']}: {r['what']} | `{r['flags']}` | {{{', '.join(map(str, r['boundaries']))}}} "
                         f"| {r['config']} | {r['mean_accepted_length']:.2f} | {delta} | {depth_list(r['acceptance_by_depth'])} |")
    elif m.get("field_failures_note"):
        lines += ["", m["field_failures_note"] + "."]
    lines += [""] + measurement_notes(m, greedy)
    return lines


def measurement_notes(m, greedy):
    if not greedy:
        return []
    by = {r["config"]: r for r in greedy}
    lines = ["Notes:", ""]
    best = max(greedy, key=lambda r: r["speedup"])
    longest = max(greedy, key=lambda r: r["mean_accepted_length"])
    lines.append(f"- Best speedup {best['speedup']:.2f}x ({best['config']}); longest acceptance "
                 f"{longest['mean_accepted_length']:.2f} tokens per pass ({longest['config']}, "
                 f"{longest['speedup']:.2f}x).")
    # eagle3-decode's device loop reports target passes but not the per-phase seconds of the host loop.
    split_rows = [r for r in greedy if all(r.get(f"{run}_split", {}).get("target_passes") and
                                           {"target_seconds", "draft_seconds", "verify_seconds"} <= r[f"{run}_split"].keys()
                                           for run in ("spec", "plain"))]
    if split_rows:
        lines += ["", "Where the speculative time goes (greedy; eagle3-decode's own timers summed over the prompts; a "
                      "plain step = the plain run's target seconds per target pass):", "",
                  "| config | verify pass / plain step | draft s per pass / plain step | target | draft | verify | "
                  "emitted per pass / cost per pass (a model of the speedup) |",
                  "|---|---:|---:|---:|---:|---:|---:|"]
        for r in split_rows:
            ps, ss = r["plain_split"], r["spec_split"]
            step = ps["target_seconds"] / ps["target_passes"]
            verify_pass = ss["target_seconds"] / ss["target_passes"] / step
            draft_pass = ss["draft_seconds"] / ss["target_passes"] / step
            total = r["spec_seconds"]
            modeled = r["mean_accepted_length"] / (verify_pass + draft_pass)
            lines.append(f"| {r['config']} | {verify_pass:.1f} | {draft_pass:.1f} | {ss['target_seconds'] / total:.0%} "
                         f"| {ss['draft_seconds'] / total:.0%} | {ss['verify_seconds'] / total:.0%} | {modeled:.2f}x |")
        lines += ["", "The last column is a model (mean accepted length / (verify pass + drafting) in plain steps, "
                      "ignoring prefill and bookkeeping), not a measurement; the measured speedups are in the tables "
                      "above.", ""]
    if m["device"] == "cpu":
        pays = best["speedup"] > 1.0
        lines.append("- On the CPU reference backend (fp32, a shared 2-core machine) a verify pass over N draft "
                     "tokens costs several plain steps (the batch of N rows does not amortize the way it does on a "
                     "GPU) and drafting adds more (table above), so tokens/s is dominated by the target's tree-verify "
                     "forward and the draft head's steps; "
                     + ("speculation still pays in the best configuration." if pays else
                        "speculation does not pay on this machine even at these accepted lengths.")
                     + " The accepted lengths do not depend on the machine's speed (greedy: up to fp32 near-ties "
                     "between backends). Timings on a shared machine are noisy; each call runs plain then "
                     "speculative back to back, so both see about the same load.")
    if "chain-3" in by and "tree-k8-n64" in by and \
            by["tree-k8-n64"]["mean_accepted_length"] > by["chain-3"]["mean_accepted_length"]:
        lines.append(f"- Trees raise the accepted length over chains ({by['chain-3']['mean_accepted_length']:.2f} for "
                     f"chain-3 to {by['tree-k8-n64']['mean_accepted_length']:.2f} for topk 8 / 64 tokens) at the cost "
                     "of a wider verify pass.")
    return lines


def same_settings(a, b):
    """Two measure.py files measured alike (device, prompts, new tokens, seed), whichever the draft."""
    return all(a.get(k) == b.get(k) for k in ("device", "prompts", "max_new_tokens", "seed", "batch"))


def mla_comparison_rows(llama, mla):
    """One row per configuration measured for both drafts (same device, prompts and settings)."""
    key = lambda r: (r["config"], r["temperature"])  # noqa: E731
    base = {key(r): r for r in llama["configs"]}
    lines = ["| config | T | mean accepted length, Llama-style | MLA | acceptance by depth 1.., Llama-style | MLA "
             "| speedup, Llama-style | MLA | MLA greedy identical |",
             "|---|---:|---:|---:|---|---|---:|---:|---:|"]
    for r in mla["configs"]:
        b = base.get(key(r))
        if b is None:
            continue
        same = (f"{r['greedy_identical_prompts']}/{r['prompts'] - r.get('prompts_ended_at_once', 0)}"
                if r["temperature"] == 0 else "")
        lines.append(f"| {r['config']} | {r['temperature']:g} | {b['mean_accepted_length']:.2f} | "
                     f"**{r['mean_accepted_length']:.2f}** | {depth_list(b['acceptance_by_depth'])} | "
                     f"{depth_list(r['acceptance_by_depth'])} | {b['speedup']:.2f}x | {r['speedup']:.2f}x | {same} |")
    return lines


def mla_section(mla, check, measures, mla_measures, decode_runs=(), tie_check=None):
    """The MLA EAGLE-3 draft beside the Llama-style one."""
    d, dc = mla["draft"], mla["draft"]["config"]
    rows = mla_draft_parameter_table(dc)
    assert sum(n for _, n in rows) == d["parameters"], "MLA draft parameter table disagrees with the model"
    dtrain, deval = d["train"], d["eval"]
    llama = (mla.get("llama_draft") or {}).get("eval")
    q = "no q-LoRA (q_proj)" if dc["q_lora_rank"] is None else f"q_lora_rank {dc['q_lora_rank']}"
    vocab = {True: "the Llama-style draft's (same d2t)", False: "NOT the Llama-style draft's",
             None: "not compared"}[d.get("draft_vocab_equals_llama_draft")]
    lines = [
        "## MLA draft (`tiny-v2-code-eagle3-mla/`)",
        "",
        "The Kimi-K2.5-style MLA EAGLE-3 head (`docs/mla_drafts.md`) trained for the same target by",
        "`tools/train_tiny/train_mla_draft.sh` (the target is only read: model.safetensors sha256 "
        f"`{mla['target']['model_safetensors_sha256'][:16]}…`).",
        "",
        f"- `{dc['architectures'][0]}`, model_type `{dc['model_type']}`: one DeepSeek decoder layer, hidden "
        f"{dc['hidden_size']}, MLA with {dc['num_attention_heads']} heads, {q}, kv_lora_rank {dc['kv_lora_rank']}, "
        f"qk nope/rope {dc['qk_nope_head_dim']}/{dc['qk_rope_head_dim']}, v {dc['v_head_dim']} (latent cache row "
        f"{dc['kv_lora_rank'] + dc['qk_rope_head_dim']}), q / kv_a reading the 2H-wide [embed | hidden] row; dense "
        f"SiLU MLP {dc['intermediate_size']}; own RoPE theta {dc['rope_theta']:g}, adjacent pairs, no scaling.",
        f"- Taps, fc, norms, fed-back hidden, draft vocab ({dc['draft_vocab_size']}; {vocab}), `midlayer.` names and "
        "d2t / t2d as the Llama-style head; the embedding is the target's.",
        "",
    ] + table(rows) + [
        "",
        "```sh",
        mla["command"],
        "```",
        "",
        f"{mla['versions']['device']}; whole run {mla['total_seconds']:.0f} s ("
        + ", ".join(f"{k.replace('_seconds', '')} {v:.0f} s" for k, v in mla["phases_seconds"].items()) + "). "
        f"The Llama-style draft's recipe (TTT, {dtrain['ttt_steps']} steps, decay {dtrain['loss_decay']:g}, AdamW peak "
        f"LR {dtrain['peak_lr']:g}): {dtrain['steps']:,} steps of {dtrain['batch_size']} x {dtrain['seq_len']} = "
        f"**{dtrain['tokens_seen'] / 1e6:.1f}M target tokens** in {dtrain['seconds']:.0f} s. Its forward equals "
        f"`tools/make_golden.py`'s `MlaDraftReference` on every TTT step (max rel diff "
        f"{d['reference_check_max_rel_diff']:.1e}, checked before training).",
        "",
        f"Held-out, teacher-forced ({deval['windows']} windows of {deval['rows_per_window']} rows; both drafts "
        "evaluated in the same run on the same windows):",
        "",
        "| | Llama-style | MLA |",
        "|---|---|---|",
    ]
    ll = llama or {}
    for label, field in (("top-1 agreement with the target's greedy token, depth 1..", "top1_agreement_per_depth"),
                         ("TTT loss by step", "loss_per_step"),
                         ("target argmax inside the draft vocab", "target_argmax_in_draft_vocab")):
        lines.append(f"| {label} | {fmt_list(ll[field]) if field in ll else 'n/a'} | **{fmt_list(deval[field])}** |")
    lines.append(f"| parameters | | {d['parameters']:,} |")
    lines.append("")
    if check:
        dec = check["decode"]["speculative"]
        lines += [
            f"`tools/train_tiny/check_cpp.py` (device {check['device']}, TP {check['tp']}, {check['prompt_tokens']}-token "
            f"held-out prompt): C++ draft logits vs `MlaDraftReference` {check['draft_logits_max_rel_diff']:.1e} (max "
            f"|diff| / max |value|); `eagle3-decode` greedy speculative == plain: "
            f"{'yes' if check['decode_greedy_identical'] else 'NO'}; mean accepted length "
            f"{dec['mean_accepted_length']:.3f}.",
            "",
        ]
    for m in mla_measures:
        llama_m = next((x for x in measures if same_settings(x, m)), None)
        label = "GPU" if m["device"] == "cuda" else "CPU"
        batch = f", batch {m['batch']}" if m.get("batch", 1) > 1 else ""
        lines += [f"### MLA vs Llama-style draft, {label}{batch}: {m['machine']}", "", "```sh", m["command"], "```", ""]
        if llama_m is None:
            lines += [f"(no --measure file of the Llama-style draft on device {m['device']} with the same prompts, "
                      "new tokens and seed: nothing to compare with)", ""]
            continue
        lines += [f"Same prompts ({len(m['prompts'])}), {m['max_new_tokens']} new tokens, seed {m['seed']}, "
                  "configurations and definitions as the Llama-style tables above.", ""]
        if llama_m.get("machine") != m.get("machine"):
            lines += [f"The speedup columns come from different runs (Llama-style: {llama_m['machine']}; MLA: "
                      f"{m['machine']}), each timing whole generate calls with prefill: compare the drafts' speed "
                      "in the end-to-end table below, where both ran the same binary in one device call.", ""]
        lines += mla_comparison_rows(llama_m, m) + [""]
    if tie_check:
        lines += tie_check_lines(tie_check)
    if decode_runs:
        lines += decode_runs_section(decode_runs)
    return lines


def tie_check_lines(path):
    """What tools/train_tiny/tie_check.py found (JSON lines, one per weight storage)."""
    with open(path) as f:
        runs = {r["weights"]: r for r in (json.loads(line) for line in f if line.strip())}
    bf16, f32 = runs.get("bf16"), runs.get("f32")
    if not bf16 or not f32:
        return []
    where = ", ".join(f"prompt {d['prompt']} from its token {d['first_differing_token']}" for d in bf16["differing"])
    return [f"Greedy identical below the prompt count: `tools/train_tiny/tie_check.py` (chain-3, the MLA draft) found "
            f"{bf16['identical']}/{bf16['prompts']} identical at bf16 weight storage ({where or 'none differing'}) "
            f"and {f32['identical']}/{f32['prompts']} at f32: a near-tie that bf16's summation order (verify pass vs "
            f"plain step) flips, not a verification error (`{path}`).", ""]


def read_decode_runs_summary(path):
    """The device-loop row of a scripts/decode_runs.sh summary.txt, as a dict of floats."""
    with open(path) as f:
        rows = [line.split() for line in f if line.strip()]
    header = next(i for i, r in enumerate(rows) if r and r[0] == "loop")
    row = next(r for r in rows[header + 1:] if r and r[0] == "device")
    names = ("plain_us", "spec_us", "speedup", "accept_len", "speedup_per_len", "syncs", "d2h_bytes")
    return dict(zip(names, (float(v) for v in row[1:8])))


def decode_runs_section(runs):
    """End-to-end cost per token of both drafts from decode_runs.sh summaries (DRAFT,BATCH,PATH)."""
    lines = ["### End-to-end, both drafts, same binary (eagle3-decode device loop)", "",
             "```sh",
             "scripts/decode_runs.sh BUILD/examples/eagle3-decode OUT --reps 3 --loops device -- --device cuda "
             "--target models/tiny-v2-code --draft DRAFT_DIR [--batch 8]",
             "```", "",
             "Default tree (topk 4, 3 steps, 8 nodes), greedy, every step one SpeculativeStep replayed from a CUDA "
             "graph; cost per token = (t(320 tokens) - t(64 tokens)) / 256, median of 3 repetitions (prefill and "
             "warm-up excluded); batch 8 decodes the first 8 held-out prompts together.", "",
             "| draft | batch | plain us/token | speculative us/token | speedup | mean accepted length | data |",
             "|---|---:|---:|---:|---:|---:|---|"]
    for spec in runs:
        draft, batch, path = spec.split(",", 2)
        r = read_decode_runs_summary(path)
        lines.append(f"| {draft} | {batch} | {r['plain_us']:.1f} | {r['spec_us']:.1f} | **{r['speedup']:.2f}x** | "
                     f"{r['accept_len']:.2f} | `{path}` |")
    return lines + [""]


def card(log, check, measures=(), mla=None, mla_check=None, mla_measures=(), decode_runs=(), tie_check=None):
    t, d = log["target"], log["draft"]
    tc, dc = t["config"], d["config"]
    corpus, tok = log["corpus"], log["tokenizer"]
    ttrain, dtrain = t["train"], d["train"]
    teval, deval = t["eval"], d["eval"]
    sizes = log["sizes"]
    target_rows, draft_rows = target_parameter_table(tc), draft_parameter_table(dc)
    assert sum(n for _, n in target_rows) == t["parameters"], "target parameter table disagrees with the model"
    assert sum(n for _, n in draft_rows) == d["parameters"], "draft parameter table disagrees with the model"
    lines = [
        "# tiny-v2-code and tiny-v2-code-eagle3",
        "",
        "A tiny DeepSeek-V2-architecture code model and its trained EAGLE-3 draft head, small enough to ship",
        "in the repository, so that `eagle3-decode` shows real speculation and acceptance can be measured.",
        "Generated by `tools/train_tiny/write_card.py` from the run's `train_log.json`"
        + (" and `check_cpp.json`." if check else "."),
        "",
        "| directory | what | files |",
        "|---|---|---|",
        "| `tiny-v2-code/` | target, `DeepseekV2ForCausalLM` hub form, bf16 | "
        + ", ".join(f"`{k}` {v:,} B" for k, v in sizes["target_files"].items()) + " |",
        "| `tiny-v2-code-eagle3/` | EAGLE-3 head, SpecForge `LlamaForCausalLMEagle3` form, bf16 | "
        + ", ".join(f"`{k}` {v:,} B" for k, v in sizes["draft_files"].items()) + " |",
    ] + ([
        "| `tiny-v2-code-eagle3-mla/` | MLA EAGLE-3 head, `Eagle3DeepseekV2ForCausalLM` form, bf16 "
        "(\"MLA draft\" below) | " + ", ".join(f"`{k}` {v:,} B" for k, v in mla["sizes"]["draft_files"].items()) + " |",
    ] if mla else []) + [
        "",
        f"Weights together: {sizes['weights_bytes'] / 1e6:.2f} MB; all files {sizes['all_files_bytes'] / 1e6:.2f} MB.",
        "",
        "## Target architecture",
        "",
        f"- {tc['num_hidden_layers']} layers, hidden {tc['hidden_size']}, vocab {tc['vocab_size']}, "
        f"max positions {tc['max_position_embeddings']}, RoPE theta {tc['rope_theta']:g}, no rope scaling, "
        f"rms_norm_eps {tc['rms_norm_eps']:g}, untied embedding / lm_head.",
        f"- MLA: {tc['num_attention_heads']} heads, q_lora_rank {tc['q_lora_rank']}, kv_lora_rank {tc['kv_lora_rank']}, "
        f"qk nope/rope {tc['qk_nope_head_dim']}/{tc['qk_rope_head_dim']}, v {tc['v_head_dim']} (latent cache row "
        f"{tc['kv_lora_rank'] + tc['qk_rope_head_dim']}).",
        f"- MoE from layer {tc['first_k_dense_replace']} (layer 0 dense, intermediate {tc['intermediate_size']}): "
        f"{tc['n_routed_experts']} routed experts (intermediate {tc['moe_intermediate_size']}), top-"
        f"{tc['num_experts_per_tok']} by {tc['scoring_func']} `{tc['topk_method']}`, norm_topk_prob "
        f"{str(tc['norm_topk_prob']).lower()}, routed_scaling_factor {tc['routed_scaling_factor']:g}, "
        f"{tc['n_shared_experts']} shared expert.",
        "- Every sharded dim divides by 8 (heads, intermediate sizes): runs at TP 1 and TP 8.",
        "",
    ] + table(target_rows) + [
        "",
        "## Draft architecture",
        "",
        f"- One Llama decoder layer: hidden {dc['hidden_size']}, {dc['num_attention_heads']} heads / "
        f"{dc['num_key_value_heads']} kv heads of {dc['head_dim']}, intermediate {dc['intermediate_size']}, "
        f"RoPE theta {dc['rope_theta']:g}, no rope scaling; no variant keys (plain EAGLE-3).",
        f"- Aux input: output-of-layer ids {dc['eagle_config']['eagle_aux_hidden_state_layer_ids']} = boundaries "
        f"{d['aux_boundaries']} (eagle3's default {{2, L/2, L-3}}), concatenated in that order.",
        f"- Draft vocab: the {dc['draft_vocab_size']} most frequent target tokens of the training split "
        f"(covering {d['draft_vocab_coverage_train']:.1%} of its tokens); `d2t` offsets, `t2d` mask. The embedding "
        "is the target's (not stored).",
        "",
    ] + table(draft_rows) + [
        "",
        "## Data",
        "",
        "Python sources available offline on the training host: the standard library and the interpreter's",
        "site-packages (`" + "`, `".join(corpus["roots"]) + "`), `*.py` only, sorted paths, deduplicated by",
        "content hash, files over 1 MB or not valid UTF-8 skipped. Held out by file: sha1(path relative to its",
        "root) % 50 == 0 (the list is `heldout_files.txt` of the run). Documents are joined with `<|endoftext|>`.",
        "",
        f"- files seen {corpus['files_seen']:,}; duplicates {corpus['skipped_duplicate']:,}, over 1 MB "
        f"{corpus['skipped_large']}, not UTF-8 {corpus['skipped_not_utf8']}, empty {corpus['skipped_empty']}.",
        f"- training split: {corpus['train_files']:,} files, {corpus['train_bytes'] / 1e6:.1f} MB (of "
        f"{corpus['train_files_available']:,} files, {corpus['train_bytes_available'] / 1e6:.1f} MB available; "
        f"whole files in seeded order up to the cap), {log['tokens']['train']:,} tokens.",
        f"- held-out split: {corpus['heldout_files']:,} files, {corpus['heldout_bytes'] / 1e6:.1f} MB, "
        f"{log['tokens']['heldout']:,} tokens.",
        "",
        "## Tokenizer",
        "",
        f"Byte-level BPE, {tok['vocab_size']} tokens, `<|endoftext|>` = id {tok['eot_id']} (also bos/eos), trained",
        f"with `tokenizers` on {tok['trained_on']['bytes'] / 1e6:.1f} MB ({tok['trained_on']['files']} files) of "
        "the training split: no normalizer, no post-processor, ByteLevel decoder; pre-tokenizer",
        "`Sequence([Split(Regex(PATTERN), behavior=\"isolated\"), ByteLevel(add_prefix_space=False,",
        "trim_offsets=False, use_regex=False)])`; BPE without byte fallback, dropout, unk or affixes;",
        "`BpeTrainer(min_frequency=2, initial_alphabet=ByteLevel.alphabet())`. PATTERN:",
        "",
        "```",
        tok["pattern"],
        "```",
        "",
        "## Training",
        "",
        "```sh",
        log["command"],
        "```",
        "",
        f"Seed {log['seed']}; {log['versions']['device']}; torch {log['versions']['torch']}, transformers "
        f"{log['versions']['transformers']}, tokenizers {log['versions']['tokenizers']}, Python "
        f"{log['versions']['python']}. Whole run {log['total_seconds']:.0f} s ("
        + ", ".join(f"{k.replace('_seconds', '')} {v:.0f} s" for k, v in log["phases_seconds"].items()) + ").",
        "",
        f"- **Target**: transformers' `DeepseekV2ForCausalLM`, AdamW (0.9, 0.95, wd 0.1), peak LR "
        f"{ttrain['peak_lr']:g}, {ttrain['warmup_steps']} warmup steps then cosine to 0.1x, bf16 autocast, "
        f"expert balance loss x{tc['aux_loss_alpha']:g}; {ttrain['steps']:,} steps of {ttrain['batch_size']} x "
        f"{ttrain['seq_len']} packed tokens = **{ttrain['tokens_seen'] / 1e6:.1f}M tokens** in {ttrain['seconds']:.0f} s "
        f"({ttrain['tokens_per_second'] / 1e3:.0f}k tokens/s, experts `{ttrain['implementation']}`).",
        f"- **Draft**: training-time test with {dtrain['ttt_steps']} unrolled steps (step j: token x[p+1+j], RoPE "
        "position p + j, the previous step's fed-back hidden, attention over the step-0 rows up to p and its own "
        "rows of steps 1..j: the chain eagle3 decodes), loss = sum_j "
        f"{dtrain['loss_decay']:g}^j x cross entropy to the target's next-token distribution restricted to the "
        "draft vocab (rows whose target argmax is outside it masked); the frozen target supplies aux states and "
        f"logits on the fly. AdamW, peak LR {dtrain['peak_lr']:g}; {dtrain['steps']:,} steps of "
        f"{dtrain['batch_size']} x {dtrain['seq_len']} target tokens = **{dtrain['tokens_seen'] / 1e6:.1f}M target "
        f"tokens** ({dtrain['rows_per_window']} rows x {dtrain['ttt_steps']} draft steps per window) in "
        f"{dtrain['seconds']:.0f} s. Its forward equals `tools/make_golden.py`'s `DraftReference` on every TTT step "
        f"(max rel diff {d['reference_check_max_rel_diff']:.1e}, checked before training).",
        "",
        "## Results (bf16 weights as shipped)",
        "",
        "| | value |",
        "|---|---:|",
        f"| target train loss (last steps, running) | {ttrain['final_train_loss_running']:.3f} |",
        f"| target loss, {teval['heldout_tokens']:,} held-out tokens | **{teval['heldout_loss']:.3f}** |",
        f"| target loss, the same number of training tokens | {teval['train_windows_loss']:.3f} |",
        f"| draft TTT loss by step, held-out | {fmt_list(deval['loss_per_step'])} |",
        f"| draft top-1 agreement with the target's greedy token, depth 1..{len(deval['top1_agreement_per_depth'])} "
        f"| **{fmt_list(deval['top1_agreement_per_depth'])}** |",
        f"| target argmax inside the draft vocab, by depth | {fmt_list(deval['target_argmax_in_draft_vocab'])} |",
        "",
        "Agreement is teacher-forced on held-out text: depth 1 from the target's own aux states, depth d > 1",
        "chained through the draft's fed-back hidden (no tree, no verifier): the `eagle3-inspect accuracy`",
        "question.",
        "",
    ]
    if check:
        dec = check["decode"]["speculative"]
        lines += [
            "## eagle3's C++ side on this pair (`tools/train_tiny/check_cpp.py`)",
            "",
            f"On a {check['prompt_tokens']}-token held-out prompt (`{check['prompt_path']}`), device "
            f"{check['device']}, TP {check['tp']}: `eagle3-inspect check` passes; C++ vs transformers (fp32, "
            f"max |diff| / max |value|): target logits {check['target_logits_max_rel_diff']:.1e}, worst boundary "
            f"{max(check['target_boundary_max_rel_diff'].values()):.1e}, draft logits "
            f"{check['draft_logits_max_rel_diff']:.1e}. `eagle3-decode`: greedy speculative == plain: "
            f"{'yes' if check['decode_greedy_identical'] else 'NO'}; mean accepted length "
            f"{dec['mean_accepted_length']:.3f}, acceptance by depth {fmt_list(dec['acceptance_by_depth'])}; tokens/s "
            f"plain {check['decode']['plain']['tokens_per_s']:.1f}, speculative {dec['tokens_per_s']:.1f}.",
            "",
        ]
    if measures:
        lines += [
            "## Speculative decoding on held-out prompts (`tools/train_tiny/measure.py`)",
            "",
            "Prompts: `models/heldout_prompts.jsonl`, made by `measure.py --make-prompts` from the run's held-out",
            "files (the sha1 rule above) that exist unmodified on the measuring machine in the training host's",
            "versions of torch and transformers (checked against their wheel RECORD hashes): about 200 tokens of",
            "whole lines from a def / class line a third of the way into each file. Configurations: chains (topk 1)",
            "of 3 and 5 steps, trees topk 4 with 16 / 32 draft tokens (steps 4 / 5) and topk 8 with 32 / 64 (steps",
            "5 / 6).",
            "",
        ]
        for m in measures:
            lines += measurement_section(m) + [""]
    if mla:
        lines += mla_section(mla, mla_check, measures, mla_measures, decode_runs, tie_check)
    prompt = log["heldout_prompt"]
    lines += [
        "## Sample (greedy, held-out prompt)",
        "",
        f"From `{prompt['path']}`; prompt then `<<<` and the target's greedy continuation:",
        "",
        "```",
        prompt["text"] + "<<<" + prompt["continuation_text"],
        "```",
        "",
        "## Reproduce",
        "",
        "```sh",
        log["command"],
        "python3 tools/train_tiny/check_cpp.py BUILD_DIR OUT_DIR   # eagle3-inspect / eagle3-decode vs transformers",
        "python3 tools/train_tiny/measure.py --build BUILD_DIR --device cpu --out measure_cpu.json   # and/or cuda",
        "python3 tools/train_tiny/write_card.py OUT_DIR --card models/README.md --measure measure_cpu.json",
        "```",
    ] + ([
        "",
        "The MLA draft, against the shipped target:",
        "",
        "```sh",
        mla["command"],
        "python3 tools/train_tiny/check_cpp.py BUILD_DIR MLA_DIR --target models/tiny-v2-code "
        "--draft MLA_DIR/tiny-v2-code-eagle3-mla",
        "python3 tools/train_tiny/measure.py --build BUILD_DIR --device cuda --draft models/tiny-v2-code-eagle3-mla "
        "--out measure_mla_cuda.json",
        "python3 tools/train_tiny/tie_check.py BUILD_DIR/examples/eagle3-decode --draft "
        "models/tiny-v2-code-eagle3-mla > tie_check.jsonl",
        "scripts/decode_runs.sh BUILD_DIR/examples/eagle3-decode E2E_DIR --reps 3 --loops device -- --device cuda "
        "--target models/tiny-v2-code --draft models/tiny-v2-code-eagle3-mla   # and the Llama-style draft, --batch 8",
        "python3 tools/train_tiny/write_card.py OUT_DIR --mla MLA_DIR --measure measure_cuda.json "
        "--measure-mla measure_mla_cuda.json --tie-check tie_check.jsonl --decode-runs MLA,1,E2E_DIR/summary.txt",
        "```",
    ] if mla else []) + [
        "",
        "Training runs against the wall clock (the step count is fixed after timing the first steps), so a",
        "rerun on other hardware trains a different number of steps; `--target-steps` / `--draft-steps`",
        "pin them.",
    ]
    return "\n".join(lines) + "\n"


def read_json(path):
    with open(path) as f:
        return json.load(f)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("out_dir")
    p.add_argument("--card", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..",
                                                 "models", "README.md"))
    p.add_argument("--measure", action="append", default=[], help="measure.py result JSON (repeatable)")
    p.add_argument("--mla", default=None, help="directory with train_mla_draft.sh's train_log_mla.json")
    p.add_argument("--measure-mla", action="append", default=[],
                   help="measure.py --draft <MLA draft> result JSON (repeatable)")
    p.add_argument("--decode-runs", action="append", default=[],
                   help="DRAFT,BATCH,PATH of a scripts/decode_runs.sh summary.txt (repeatable; MLA section)")
    p.add_argument("--tie-check", default=None, help="tools/train_tiny/tie_check.py output (MLA section)")
    args = p.parse_args()
    if args.decode_runs and not args.mla:
        p.error("--decode-runs needs --mla")
    if args.measure_mla and not args.mla:
        p.error("--measure-mla needs --mla")
    log = read_json(os.path.join(args.out_dir, "train_log.json"))
    check_path = os.path.join(args.out_dir, "check_cpp.json")
    check = read_json(check_path) if os.path.exists(check_path) else None
    measures = [read_json(path) for path in args.measure]
    mla = read_json(os.path.join(args.mla, "train_log_mla.json")) if args.mla else None
    mla_check_path = os.path.join(args.mla, "check_cpp_mla.json") if args.mla else None
    mla_check = read_json(mla_check_path) if mla_check_path and os.path.exists(mla_check_path) else None
    mla_measures = [read_json(path) for path in args.measure_mla]
    text = card(log, check, measures, mla, mla_check, mla_measures, args.decode_runs, args.tie_check)
    with open(args.card, "w") as f:
        f.write(text)
    print(f"wrote {os.path.normpath(args.card)}")


if __name__ == "__main__":
    main()
