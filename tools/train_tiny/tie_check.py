#!/usr/bin/env python3
"""Which held-out prompts give speculative greedy != plain greedy, at bf16 and at f32 weight storage.

Speculative greedy decoding equals plain greedy decoding exactly only when both see the same logits;
at bf16 weight storage the verify pass (several tokens per GEMM) and the plain step (one token) sum
in different orders, so a near-tie between the two best tokens can flip. A prompt that differs at
bf16 but not at f32 is such a tie, not a verification bug. Writes one JSON line per weight storage.

  python3 tools/train_tiny/tie_check.py BUILD/examples/eagle3-decode --draft models/tiny-v2-code-eagle3-mla
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("binary", help="eagle3-decode")
    p.add_argument("--target", default="models/tiny-v2-code")
    p.add_argument("--draft", default="models/tiny-v2-code-eagle3")
    p.add_argument("--prompts", default="models/heldout_prompts.jsonl")
    p.add_argument("--device", default="cuda")
    p.add_argument("--max-new-tokens", type=int, default=96)
    p.add_argument("--steps", type=int, default=3, help="chain length (topk 1)")
    args = p.parse_args()
    prompts = [json.loads(line) for line in open(args.prompts)]
    failed = False
    with tempfile.TemporaryDirectory() as tmp:
        for weights in ("bf16", "f32"):
            differing = []
            for i, prompt in enumerate(prompts):
                out = os.path.join(tmp, f"{weights}_{i}.json")
                cmd = [args.binary, "--target", args.target, "--draft", args.draft, "--tokens",
                       ",".join(map(str, prompt["tokens"])), "--max-new-tokens", str(args.max_new_tokens),
                       "--topk", "1", "--steps", str(args.steps), "--draft-tokens", str(args.steps + 1),
                       "--temperature", "0", "--seed", "1", "--device", args.device, "--weights", weights,
                       "--json", out]
                r = subprocess.run(cmd, capture_output=True, text=True)
                if r.returncode != 0:
                    print(f"prompt {i} at {weights}: eagle3-decode failed: {r.stderr[-500:]}", file=sys.stderr)
                    failed = True
                    continue
                with open(out) as f:
                    d = json.load(f)
                a, b = d["plain"]["tokens"], d["speculative"]["tokens"]
                if a != b:
                    first = next((j for j in range(min(len(a), len(b))) if a[j] != b[j]), min(len(a), len(b)))
                    differing.append({"prompt": i, "first_differing_token": first})
            print(json.dumps({"weights": weights, "draft": args.draft, "prompts": len(prompts),
                              "identical": len(prompts) - len(differing), "differing": differing}))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
