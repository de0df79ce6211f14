#!/usr/bin/env python3
"""Checks a trained pair (train.sh's OUT_DIR) with eagle3's C++ tools against transformers.

  check_cpp.py BUILD_DIR OUT_DIR [--device cpu|cuda] [--tp N] [--max-new-tokens 64]
  check_cpp.py BUILD_DIR OUT_DIR --target models/tiny-v2-code --draft OUT_DIR/tiny-v2-code-eagle3-mla

--target / --draft replace OUT_DIR's pair (the MLA head of train_mla_draft.sh against the shipped
target: its prompt comes from OUT_DIR/train_log_mla.json when OUT_DIR has no train_log.json). The
draft's reference is make_golden.py's DraftReference or, for an Eagle3DeepseekV2ForCausalLM head,
MlaDraftReference; an MLA head's results go to OUT_DIR/check_cpp_mla.json.

BUILD_DIR is a CMake build of eagle3 with the eagle3-inspect and eagle3-decode targets. Steps (each
must pass; the results go to OUT_DIR/check_cpp.json):
  1. `eagle3-inspect check` accepts the pair.
  2. `eagle3-inspect target` on the held-out prompt of train_log.json: its logits and every boundary
     (b = 0..8) against transformers' DeepseekV2ForCausalLM (fp32, eager, from_pretrained of the
     written directory; boundaries from make_golden.py's hooks): max |diff| / max |value| < 1e-3.
  3. `eagle3-inspect draft`: the first draft step at every position against make_golden.py's
     DraftReference / MlaDraftReference (fp32) fed transformers' boundaries {2, 4, 5}: same tolerance.
  4. `eagle3-decode` on the prompt: runs, greedy speculative output identical to plain; the plain
     continuation is compared with transformers' greedy continuation (leading tokens that agree:
     reported, not required, since fp32 near-ties may flip an argmax).
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile

import torch
import transformers
from safetensors.torch import load_file

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from draft import AUX_LAYER_IDS, LAYER_PREFIX, import_make_golden  # noqa: E402
from draft_mla import ARCHITECTURE as MLA_ARCHITECTURE  # noqa: E402
from export import DRAFT_DIR, TARGET_DIR  # noqa: E402

TOLERANCE = 1e-3


def find_tool(build_dir, name):
    for candidate in (os.path.join(build_dir, "examples", name), os.path.join(build_dir, name)):
        if os.access(candidate, os.X_OK):
            return candidate
    raise SystemExit(f"{name} not found under {build_dir} (build it: ninja -C {build_dir} {name})")


def run(cmd):
    print("$ " + " ".join(cmd), flush=True)
    proc = subprocess.run(cmd, capture_output=True, text=True)
    lines = (proc.stdout + proc.stderr).rstrip().split("\n")
    print("\n".join(lines[-12:]), flush=True)  # the end holds the summary (decode prints progress before)
    if proc.returncode != 0:
        raise SystemExit(f"exit status {proc.returncode}: {' '.join(cmd)}")
    return proc.stdout


def prompt_tokens(out_dir):
    """The held-out prompt of the run's log (train.py's, else train_mla_draft.py's: the same prompt)."""
    for name in ("train_log.json", "train_log_mla.json"):
        path = os.path.join(out_dir, name)
        if os.path.exists(path):
            with open(path) as f:
                log = json.load(f)
            return log["heldout_prompt"]["path"], log["heldout_prompt"]["tokens"]
    raise SystemExit(f"{out_dir}: neither train_log.json nor train_log_mla.json")


def is_mla_draft(dc):
    return dc.get("architectures") == [MLA_ARCHITECTURE]


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("build_dir")
    p.add_argument("out_dir")
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    p.add_argument("--tp", type=int, default=1)
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--target", default=None, help="target directory (default OUT_DIR/tiny-v2-code)")
    p.add_argument("--draft", default=None, help="draft directory (default OUT_DIR/tiny-v2-code-eagle3)")
    args = p.parse_args()
    transformers.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    golden = import_make_golden()
    torch.set_num_threads(max(1, torch.get_num_threads()))
    inspect_bin, decode_bin = find_tool(args.build_dir, "eagle3-inspect"), find_tool(args.build_dir, "eagle3-decode")
    target_dir = args.target or os.path.join(args.out_dir, TARGET_DIR)
    draft_dir = args.draft or os.path.join(args.out_dir, DRAFT_DIR)
    with open(os.path.join(draft_dir, "config.json")) as f:
        dc = json.load(f)
    mla = is_mla_draft(dc)
    path, tokens = prompt_tokens(args.out_dir)
    ids = ",".join(str(t) for t in tokens)
    result = {"prompt_path": path, "prompt_tokens": len(tokens), "device": args.device, "tp": args.tp,
              "target": target_dir, "draft": draft_dir, "draft_kind": "mla" if mla else "llama"}
    common = ["--device", args.device, "--tp", str(args.tp)]
    # The comparisons are against transformers in fp32: f32 weight storage on every device (CUDA's
    # default bf16 storage rounds every product's inputs, ~1e-2 on these logits).
    exact = ["--weights", "f32"]

    out = run([inspect_bin, "check", "--target", target_dir, "--draft", draft_dir])
    if "pair OK" not in out:
        raise SystemExit("eagle3-inspect check did not report 'pair OK'")
    result["inspect_check"] = "pair OK"

    with tempfile.TemporaryDirectory() as tmp:
        # Target: logits and boundaries.
        target_file = os.path.join(tmp, "target.safetensors")
        run([inspect_bin, "target", "--model", target_dir, "--tokens", ids, "--out", target_file] + common + exact)
        cpp = load_file(target_file)
        model = transformers.DeepseekV2ForCausalLM.from_pretrained(
            target_dir, dtype=torch.float32, attn_implementation="eager", experts_implementation="eager").eval()
        x = torch.tensor(tokens, dtype=torch.int64)
        logits, boundaries, _ = golden.run_transformers(model, x)
        result["target_logits_max_rel_diff"] = golden.max_rel(cpp["logits"], logits)
        result["target_boundary_max_rel_diff"] = {
            str(b): golden.max_rel(cpp[f"boundary.{b}"], boundaries[b]) for b in range(len(boundaries))}
        result["target_argmax_agreement"] = float((cpp["logits"].argmax(-1) == logits.argmax(-1)).float().mean())

        # Draft: first step at every position from transformers' aux states.
        draft_file = os.path.join(tmp, "draft.safetensors")
        run([inspect_bin, "draft", "--target", target_dir, "--draft", draft_dir, "--tokens", ids, "--out",
             draft_file] + common + exact)
        cpp_draft = load_file(draft_file)
        weights = {n: w.float() for n, w in load_file(os.path.join(draft_dir, "model.safetensors")).items()
                   if n not in ("d2t", "t2d")}
        embed = model.model.embed_tokens.weight.detach()
        reference = golden.MlaDraftReference if mla else golden.DraftReference
        ref = reference(dc, LAYER_PREFIX, weights, embed, torch.float32)
        aux = torch.cat([boundaries[i + 1] for i in AUX_LAYER_IDS], -1)
        root = int(logits[-1].argmax())
        shifted = torch.cat([x[1:], torch.tensor([root])])
        with torch.no_grad():
            want, _ = ref.step(shifted, ref.fc(aux), torch.arange(len(tokens)))
        result["draft_logits_max_rel_diff"] = golden.max_rel(cpp_draft["draft_logits"], want)
        result["draft_argmax_agreement"] = float(
            (cpp_draft["draft_logits"].argmax(-1) == want.argmax(-1)).float().mean())

        # Decode.
        decode_json = os.path.join(tmp, "decode.json")
        out = run([decode_bin, "--target", target_dir, "--draft", draft_dir, "--tokens", ids, "--max-new-tokens",
                   str(args.max_new_tokens), "--json", decode_json] + common)
        with open(decode_json) as f:
            decode = json.load(f)
    result["decode"] = decode
    result["decode_greedy_identical"] = "greedy outputs identical" in out
    with torch.no_grad():
        generated = model.generate(x[None], max_new_tokens=args.max_new_tokens, do_sample=False,
                                   pad_token_id=model.config.eos_token_id)[0, len(tokens):].tolist()
    plain = decode["plain"]["tokens"]
    agree = 0
    while agree < min(len(plain), len(generated)) and plain[agree] == generated[agree]:
        agree += 1
    result["plain_vs_transformers_leading_tokens_equal"] = agree
    result["transformers_greedy"] = generated

    failures = []
    if result["target_logits_max_rel_diff"] >= TOLERANCE:
        failures.append(f"target logits differ by {result['target_logits_max_rel_diff']:.2e}")
    worst_boundary = max(result["target_boundary_max_rel_diff"].values())
    if worst_boundary >= TOLERANCE:
        failures.append(f"a target boundary differs by {worst_boundary:.2e}")
    if result["draft_logits_max_rel_diff"] >= TOLERANCE:
        failures.append(f"draft logits differ by {result['draft_logits_max_rel_diff']:.2e}")
    if not result["decode_greedy_identical"]:
        failures.append("eagle3-decode: greedy speculative output differs from plain")
    result["failures"] = failures
    with open(os.path.join(args.out_dir, "check_cpp_mla.json" if mla else "check_cpp.json"), "w") as f:
        json.dump(result, f, indent=1)
        f.write("\n")
    print(f"target logits {result['target_logits_max_rel_diff']:.2e}, worst boundary {worst_boundary:.2e}, draft "
          f"logits {result['draft_logits_max_rel_diff']:.2e} (max |diff| / max |value|, tolerance {TOLERANCE}); "
          f"decode: mean accepted length {decode['speculative']['mean_accepted_length']:.3f}, plain == transformers "
          f"for the first {agree} of {len(plain)} tokens")
    if failures:
        raise SystemExit("FAILED: " + "; ".join(failures))
    print("check_cpp: all checks passed")


if __name__ == "__main__":
    main()
