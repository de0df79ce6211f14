#!/usr/bin/env python3
"""Golden fixtures for eagle3's DeepSeek-V2-family target forward and its EAGLE-3 draft step.

Writes, under OUT/, one directory per fixture and OUT/README.md describing them:
- target fixtures (golden/target.py): tiny random DeepSeek-V2-family checkpoints in the hub layout (two in
  the quantized hub forms of DeepSeek-V3 FP8 and Kimi-K2.5 INT4, golden/quantized.py) and
  expected.safetensors with the prompt, the logits, the residual stream at every layer boundary and the
  routing of every MoE layer, from transformers' DeepseekV2ForCausalLM / DeepseekV3ForCausalLM (fp32,
  eager), which must agree with the script's own hub -> transformers mapping and with an independent fp64
  implementation of DeepSeek's reference math (golden/deepseek_reference.py); `v3_mtp` also carries
  DeepSeek-V3's MTP module and gets its drafter fixtures (golden/mtp.py);
- EAGLE-3 draft fixtures (golden/llama_draft.py): random Llama-style draft heads on a target fixture, with
  the outputs of an independent fp32 implementation of the draft step, cross-checked in fp64 and against
  the draft assembled from transformers' Llama modules;
- MLA EAGLE-3 draft fixtures (golden/mla_draft.py): the same for drafts made of one DeepSeek MLA layer,
  against transformers' DeepSeek-V3 modules;
- EAGLE-2 dynamic tree fixtures (golden/tree.py) for the drafters with "trees".

The fixture specs are golden/fixtures.py; the code is the package tools/golden/, one concept a module (its
__init__.py lists them). This file is the entry point: the command line, the global torch settings, and
the names other tools take from `make_golden` (tools/train_tiny), re-exported.

Usage: python3 tools/make_golden.py --out tests/data/golden [--only NAME ...]
The fixtures of issue 21 alone: --only v3_mtp mla_draft_k25 mla_draft_k25_eagle31 (the MLA drafts read
k25_int4 from --out).
--only builds just the named fixtures (e.g. `--only v3_fp8 k25_int4`), rewriting nothing else: not the
other fixtures, not README.md (it prints the README sections of what it built, to merge by hand).
Deterministic (one CPU thread, deterministic kernels, fixed seeds): a rerun reproduces every file byte
for byte on the generating host; across hosts configs, checkpoints and integer outputs are identical
and float outputs may differ by ~1e-6 relative (CPU kernel differences).
Needs torch, transformers, safetensors and numpy (versions used: see OUT/README.md).
"""

import argparse
import os

import torch
import transformers

from golden.fixtures import DRAFTS, MLA_DRAFTS, MODELS
from golden.llama_draft import build_draft
from golden.mla_draft import build_mla_draft
from golden.readme import draft_readme, mla_draft_readme, model_readme, mtp_readme, quant_readme, write_readme
from golden.target import build

# Re-exported: the names tools/train_tiny takes from `make_golden` (draft.py's import_make_golden, used by
# draft.py, draft_mla.py, check_cpp.py and test_train_tiny.py).
from golden.llama_draft import DraftReference  # noqa: F401
from golden.mla_draft import MlaDraftReference, mla_draft_weight_shapes  # noqa: F401
from golden.oracle import max_rel, run_transformers  # noqa: F401
from golden.weights import hub_to_transformers, weight_shapes  # noqa: F401

__all__ = ["DraftReference", "MlaDraftReference", "hub_to_transformers", "main", "max_rel",
           "mla_draft_weight_shapes", "run_transformers", "weight_shapes"]

# One thread and deterministic kernels: reruns on one host reproduce the files byte for byte (float
# outputs may differ by ~1e-6 relative across hosts).
torch.set_num_threads(1)
torch.use_deterministic_algorithms(True)


def main():
    usage = __doc__[__doc__.index("Usage:"):]
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0], epilog=usage,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True, help="output directory, e.g. tests/data/golden")
    parser.add_argument("--only", nargs="*",
                        help="fixture names to (re)generate, e.g. v3_fp8 k25_int4; nothing else is written, "
                        "README.md included (its sections are printed). Default: all")
    args = parser.parse_args()
    os.makedirs(args.out, exist_ok=True)
    transformers.logging.set_verbosity_error()
    known = {spec["name"] for spec in MODELS + DRAFTS + MLA_DRAFTS}
    if args.only and set(args.only) - known:
        raise SystemExit(f"--only: unknown fixtures {sorted(set(args.only) - known)}; known: {sorted(known)}")
    infos, draft_infos, mla_infos = [], [], []
    for spec in MODELS:
        if args.only and spec["name"] not in args.only:
            continue
        infos.append(build(spec, args.out, print))
    # Drafts read their target fixture from --out, so they run after the targets.
    for spec in DRAFTS:
        if args.only and spec["name"] not in args.only:
            continue
        draft_infos.append(build_draft(spec, args.out, print))
    for spec in MLA_DRAFTS:
        if args.only and spec["name"] not in args.only:
            continue
        mla_infos.append(build_mla_draft(spec, args.out, print))
    if not args.only:
        write_readme(args.out, infos, draft_infos, mla_infos)
    else:
        # A partial run leaves README.md alone: its sections for what it built, to merge by hand.
        sections = [line for info in infos if not info["quant"] for line in model_readme(info)]
        sections += quant_readme([info for info in infos if info["quant"]])
        sections += draft_readme(draft_infos) if draft_infos else []
        sections += mla_draft_readme(mla_infos)
        sections += mtp_readme(infos)
        print("----- README.md sections of the fixtures built (merge by hand) -----")
        print("\n".join(sections).rstrip())
        print("----- end -----")
    for info, budget in [(i, 1_500_000) for i in infos] + [(i, 1_000_000) for i in draft_infos + mla_infos]:
        total = sum(info["sizes"].values())
        if total > budget:
            raise SystemExit(f"{info['name']}: {total} bytes exceeds the {budget / 1e6:.1f} MB budget")


if __name__ == "__main__":
    main()
