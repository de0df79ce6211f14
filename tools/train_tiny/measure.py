#!/usr/bin/env python3
"""Acceptance and speed of the shipped pair (models/tiny-v2-code + models/tiny-v2-code-eagle3) with eagle3-decode.

  measure.py --build DIR [--device cpu|cuda] [--out F.json] [--quick] [--prompts N] [--max-new-tokens N]
             [--draft models/tiny-v2-code-eagle3-mla] [--batch 8]
  measure.py --make-prompts [--site-packages DIR] [--heldout-list F]      # writes models/heldout_prompts.jsonl
  measure.py --self-test                                                   # CPU checks of the aggregation

Measuring: runs the C++ `eagle3-decode` (DIR/examples/eagle3-decode) on every held-out prompt of
models/heldout_prompts.jsonl for each configuration below, greedy and at temperature 1 (seeded), and
aggregates its --json output per configuration:
  - mean accepted length = tokens emitted by verify passes / verify passes, summed over all prompts
    (so a prompt weighs by its number of verify passes), from each run's accepted-drafted-tokens
    histogram (a pass that accepts a drafted tokens emits a + 1); the unweighted mean over prompts too;
  - acceptance by depth d = verify passes that accepted at least d drafted tokens / verify passes;
  - tokens/s of plain and speculative decoding (total tokens / total seconds over the prompts; every
    eagle3-decode call runs both, back to back in one process) and their ratio;
  - greedy only: how many prompts give speculative output identical to plain, and the tokens that
    agree (common prefix) over all tokens.
--batch B (B > 1): each configuration is one `eagle3-decode --batch B` call decoding the first B
prompts of models/heldout_prompts.jsonl together (eagle3-decode reads that file itself, each prompt cut
to the shortest one's length), greedy only, no field failures; the rows hold the batch's tokens/s,
speedup, acceptance and how many of the B sequences match plain decoding.
--draft picks the draft (default models/tiny-v2-code-eagle3; the MLA head models/tiny-v2-code-eagle3-mla
is measured the same way, on the same prompts and configurations; the JSON records which).
Configurations: chains (topk 1) of 3 and 5 steps (draft tokens = steps + 1), trees topk 4 with 16 / 32
draft tokens (steps 4 / 5) and topk 8 with 32 / 64 (steps 5 / 6). When eagle3-decode has
--aux-layers, the field failures are added (greedy): the draft fed taps shifted by one layer and
with the embedding boundary swapped in (see FIELD_FAILURES).
--quick: 4 prompts, 32 new tokens; full: all prompts, 96 new tokens (--num-prompts / --max-new-tokens
override either). The JSON is rewritten after every configuration; --budget-seconds B starts no new
configuration after B seconds (greedy first, then temperature 1, then the field failures).

Making the prompts: the training run's held-out files (sha1(relative path) % 50 == 0, data.py) with
the GPU host's absolute paths are mapped to a local site-packages holding the same versions of torch
and transformers; each local file must be unmodified (its dist-info RECORD sha256), held out by the
rule, and from a package whose version equals the training host's (train_log.json). A prompt is a
run of whole lines (the last without its newline) of about PROMPT_TOKENS tokens starting at a def / class / decorator line a third
of the way into the file, tokenized with models/tiny-v2-code/tokenizer.json.
"""

import argparse
import base64
import hashlib
import json
import os
import re
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.normpath(os.path.join(HERE, "..", ".."))
MODELS = os.path.join(REPO, "models")
TARGET = os.path.join(MODELS, "tiny-v2-code")
DRAFT = os.path.join(MODELS, "tiny-v2-code-eagle3")
PROMPTS = os.path.join(MODELS, "heldout_prompts.jsonl")

PROMPT_TOKENS = 200
MIN_PROMPT_TOKENS = 150
PROMPT_COUNT = 24
MIN_FILE_BYTES = 2000
GPU_HOST_SITE = "/opt/torch/.venv/lib/python3.12/site-packages/"
# Packages whose versions on this machine equal the training host's; version.py is generated per build.
SAME_VERSION_PACKAGES = {"torch": "torch", "transformers": "transformers"}
EXCLUDED = {"torch/version.py"}

# (name, topk, steps, draft tokens): chains take steps + 1 draft tokens (the root and one per step).
CONFIGS = [
    ("chain-3", 1, 3, 4),
    ("chain-5", 1, 5, 6),
    ("tree-k4-n16", 4, 4, 16),
    ("tree-k4-n32", 4, 5, 32),
    ("tree-k8-n32", 8, 5, 32),
    ("tree-k8-n64", 8, 6, 64),
]
TEMPERATURES = [0.0, 1.0]
SEED = 1
# Field failures: the draft's own taps are output-of-layer ids [1, 3, 4] = boundaries {2, 4, 5}.
# (name, --aux-layers ids, --convention, boundaries, what it models). HiddenStateTap refuses negative
# ids ("there is no -1 = embedding"), so the embedding boundary 0 cannot be written in the
# output-of-layer convention; it is written as input-of-layer id 0.
FIELD_FAILURES = [
    ("correct (override path)", [1, 3, 4], "output", [2, 4, 5], "the config's own ids through --aux-layers"),
    ("shifted +1 layer", [2, 4, 5], "output", [3, 5, 6], "taps one layer deeper"),
    ("embedding swapped in", [0, 4, 5], "input", [0, 4, 5], "boundary 0 (embedding output) in place of boundary 2"),
    ("convention mix-up", [1, 3, 4], "input", [1, 3, 4], "the config's ids read as input-of-layer (vLLM): one layer shallower"),
]
FIELD_CONFIGS = ["chain-5", "tree-k8-n64"]


# ---------------------------------------------------------------------------------------------------
# Prompts


def is_heldout(relpath):
    sys.path.insert(0, HERE)
    try:
        from data import is_heldout as rule  # the training split's own rule
    except ImportError:  # data.py needs torch/numpy; the rule itself is this one line
        digest = hashlib.sha1(relpath.encode("utf-8")).digest()
        return int.from_bytes(digest[:8], "little") % 50 == 0
    return rule(relpath)


def record_hashes(site, package, version):
    """{relative path: urlsafe-b64 sha256} from the package's dist-info RECORD."""
    record = os.path.join(site, f"{package}-{version}.dist-info", "RECORD")
    hashes = {}
    with open(record) as f:
        for line in f:
            parts = line.rstrip("\n").rsplit(",", 2)
            if len(parts) == 3 and parts[1].startswith("sha256="):
                hashes[parts[0]] = parts[1][len("sha256="):]
    return hashes


def installed_version(site, package):
    for name in os.listdir(site):
        m = re.fullmatch(re.escape(package) + r"-([^-]+)\.dist-info", name)
        if m:
            return m.group(1)
    return None


def cut_prompt(tok, text):
    """(start line, prompt text, token ids): whole lines from a def / class / decorator line a third of
    the way in (else from line 0), as many as keep the prompt at most PROMPT_TOKENS tokens, without the
    final newline."""
    lines = text.splitlines(keepends=True)
    starts = [i for i in range(len(lines) // 3, len(lines)) if re.match(r"\s*(def |class |async def |@)", lines[i])]
    for start in starts[:1] + [0]:
        prompt, ids = "", []
        for line in lines[start:]:
            candidate = tok.encode(prompt + line).ids
            if len(candidate) > PROMPT_TOKENS:
                break
            prompt, ids = prompt + line, candidate
        # End on the last line's text, without its newline: the pre-tokenizer joins a newline with the next
        # line's indentation ("\n" + "    "), so a bare final "\n" token is, in training, mostly seen before
        # column-0 text or the end of a document, and the target then often ends the document at once.
        prompt = prompt.rstrip("\n")
        ids = tok.encode(prompt).ids
        if len(ids) >= MIN_PROMPT_TOKENS:
            return start, prompt, ids
    return None


def make_prompts(args):
    from tokenizers import Tokenizer

    with open(os.path.join(MODELS, "train_log.json")) as f:
        log = json.load(f)
    host_versions = {"torch": log["versions"]["torch"].split("+")[0], "transformers": log["versions"]["transformers"]}
    tok = Tokenizer.from_file(os.path.join(TARGET, "tokenizer.json"))
    site = args.site_packages
    with open(args.heldout_list) as f:
        host_paths = [line.strip() for line in f if line.strip()]
    candidates, skipped = {}, {"not site-packages": 0, "other package": 0, "missing here": 0, "small": 0}
    checks = {}
    for package in SAME_VERSION_PACKAGES:
        version = installed_version(site, package)
        if version != host_versions[package]:
            raise SystemExit(f"{site}: {package} {version} installed, the training host had {host_versions[package]}")
        checks[package] = record_hashes(site, package, version)
    for path in host_paths:
        if not path.startswith(GPU_HOST_SITE):
            skipped["not site-packages"] += 1
            continue
        rel = path[len(GPU_HOST_SITE):]
        package = rel.split("/")[0]
        if package not in SAME_VERSION_PACKAGES or rel in EXCLUDED:
            skipped["other package"] += 1
            continue
        local = os.path.join(site, rel)
        if not os.path.isfile(local):
            skipped["missing here"] += 1
            continue
        raw = open(local, "rb").read()
        digest = base64.urlsafe_b64encode(hashlib.sha256(raw).digest()).rstrip(b"=").decode()
        if checks[package].get(rel) != digest:
            raise SystemExit(f"{local}: sha256 {digest} differs from {package}'s RECORD: not the released file")
        if not is_heldout(rel):
            raise SystemExit(f"{rel} is in the held-out list but not held out by the rule of data.py")
        if len(raw) < MIN_FILE_BYTES:
            skipped["small"] += 1
            continue
        candidates.setdefault(package, []).append((rel, raw.decode("utf-8")))
    per_package = args.count // len(SAME_VERSION_PACKAGES)
    records = []
    for package in sorted(candidates):
        files = sorted(candidates[package])
        picked = 0
        # Evenly spaced through the sorted list, so the prompts spread over subpackages.
        stride = max(1, len(files) // per_package)
        order = files[::stride] + [f for i, f in enumerate(files) if i % stride]
        for rel, text in order:
            if picked == per_package:
                break
            cut = cut_prompt(tok, text)
            if cut is None:
                continue
            start, prompt, ids = cut
            records.append({"path": rel, "start_line": start + 1, "text": prompt, "tokens": ids,
                            "file_sha256": hashlib.sha256(text.encode("utf-8")).hexdigest()})
            picked += 1
    with open(args.prompts, "w") as f:
        for r in records:
            f.write(json.dumps(r) + "\n")
    print(f"wrote {len(records)} prompts to {args.prompts} ({os.path.getsize(args.prompts):,} bytes); "
          f"candidates {', '.join(f'{k} {len(v)}' for k, v in sorted(candidates.items()))}; skipped {skipped}")


def load_prompts(path):
    with open(path) as f:
        records = [json.loads(line) for line in f if line.strip()]
    if not records:
        raise SystemExit(f"{path}: no prompts")
    for i, r in enumerate(records):
        if not r.get("tokens") or not all(isinstance(t, int) and t >= 0 for t in r["tokens"]):
            raise SystemExit(f"{path}: prompt {i} ({r.get('path')}): 'tokens' must be a non-empty list of token ids")
    return records


# ---------------------------------------------------------------------------------------------------
# Measuring


def decode_help(binary):
    proc = subprocess.run([binary, "--help"], capture_output=True, text=True)
    return proc.stdout + proc.stderr


def run_decode(binary, draft, prompt, max_new, topk, steps, draft_tokens, temperature, device, graphs, extra,
               workdir):
    out = os.path.join(workdir, "run.json")
    if os.path.exists(out):
        os.remove(out)
    cmd = [binary, "--target", TARGET, "--draft", draft, "--tokens", ",".join(map(str, prompt)),
           "--max-new-tokens", str(max_new), "--topk", str(topk), "--steps", str(steps),
           "--draft-tokens", str(draft_tokens), "--temperature", f"{temperature:g}", "--seed", str(SEED),
           "--device", device, "--json", out] + (["--graphs", graphs] if graphs else []) + extra
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        shown = [c if len(c) < 200 else c[:40] + "..." for c in cmd]
        raise SystemExit(f"exit status {proc.returncode}: {' '.join(shown)}\n{proc.stdout[-2000:]}{proc.stderr[-2000:]}")
    with open(out) as f:
        result = json.load(f)
    # The printed table: run, tokens, tokens/s, target passes, total s, syncs/step, D2H B/step; the
    # per-phase seconds come from the JSON (the host loop times target / draft / verify apart).
    for m in re.finditer(r"^(plain|speculative)\s+(\d+)\s+([\d.]+)\s+(\d+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s*$",
                         proc.stdout, re.M):
        result[m.group(1)]["target_passes"] = int(m.group(4))
    for name in ("plain", "speculative"):
        for key in ("target", "draft", "verify"):
            seconds = result.get("seconds", {}).get(name, {})
            if key in seconds:
                result[name][key + "_seconds"] = seconds[key]
    tap = [line for line in proc.stdout.split("\n") if line.startswith("draft tap: ")]
    if tap:
        result["draft_tap"] = tap[0][len("draft tap: "):]
    return result


def run_batch(binary, draft, batch, prompt_tokens, max_new, topk, steps, draft_tokens, device, graphs, workdir):
    """One eagle3-decode call decoding the first `batch` held-out prompts together (greedy)."""
    out = os.path.join(workdir, "batch.json")
    if os.path.exists(out):
        os.remove(out)
    cmd = [binary, "--target", TARGET, "--draft", draft, "--batch", str(batch), "--prompt-tokens",
           str(prompt_tokens), "--max-new-tokens", str(max_new), "--topk", str(topk), "--steps", str(steps),
           "--draft-tokens", str(draft_tokens), "--temperature", "0", "--seed", str(SEED), "--device", device,
           "--json", out] + (["--graphs", graphs] if graphs else [])
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"exit status {proc.returncode}: {' '.join(cmd)}\n{proc.stdout[-2000:]}{proc.stderr[-2000:]}")
    with open(out) as f:
        return json.load(f)


def aggregate_batch(r, steps):
    """A batched eagle3-decode --json object -> the row fields (acceptance from its histogram)."""
    hist = r["speculative"]["accepted_histogram"]
    passes = sum(hist)
    emitted = sum((a + 1) * c for a, c in enumerate(hist))
    at_least = [sum(c for a, c in enumerate(hist) if a > d) for d in range(steps)]
    plain_tps, spec_tps = r["plain"]["tokens_per_s"], r["speculative"]["tokens_per_s"]
    return {"batch": r["batch"], "prompts": len(r["prompts"]), "prompt_tokens": r["prompts"][0]["prompt_tokens"],
            "verify_passes": passes, "mean_accepted_length": emitted / passes if passes else 0.0,
            "acceptance_by_depth": [c / passes if passes else 0.0 for c in at_least],
            "plain_tokens_per_s": plain_tps, "spec_tokens_per_s": spec_tps,
            "speedup": spec_tps / plain_tps if plain_tps else 0.0,
            "greedy_identical_prompts": sum(p["plain"] == p["speculative"] for p in r["prompts"]),
            "seconds": r["seconds"]}


def draft_architecture(directory):
    with open(os.path.join(directory, "config.json")) as f:
        return json.load(f)["architectures"][0]


def aggregate(runs, steps, greedy):
    """runs: eagle3-decode --json objects, one per prompt."""
    passes = emitted = 0
    at_least = [0] * steps
    plain_tokens = spec_tokens = 0
    plain_seconds = spec_seconds = 0.0
    per_prompt_mal = []
    identical = agree = total = stopped_at_once = 0
    split = {"plain": {}, "speculative": {}}  # summed time split printed by eagle3-decode
    for r in runs:
        hist = r["speculative"]["accepted_histogram"]
        n = sum(hist)
        e = sum((a + 1) * c for a, c in enumerate(hist))
        if n == 0:  # the target ended the document (EOS) right after the prompt: nothing to verify
            stopped_at_once += 1
            continue
        # The run's own figure must be the histogram's (it counts every emitted token of a pass).
        if abs(e / n - r["speculative"]["mean_accepted_length"]) > 1e-3 * max(1.0, e / n):
            raise SystemExit(f"mean_accepted_length {r['speculative']['mean_accepted_length']} != histogram's {e / n}")
        passes += n
        emitted += e
        per_prompt_mal.append(e / n)
        for a, c in enumerate(hist):
            for d in range(min(a, steps)):
                at_least[d] += c
        for name in ("plain", "speculative"):
            for key in ("target_passes", "target_seconds", "draft_seconds", "verify_seconds"):
                if key in r[name]:
                    split[name][key] = split[name].get(key, 0) + r[name][key]
            k = len(r[name]["tokens"])
            s = k / r[name]["tokens_per_s"] if r[name]["tokens_per_s"] > 0 else 0.0
            if name == "plain":
                plain_tokens, plain_seconds = plain_tokens + k, plain_seconds + s
            else:
                spec_tokens, spec_seconds = spec_tokens + k, spec_seconds + s
        if greedy:
            p, s_ = r["plain"]["tokens"], r["speculative"]["tokens"]
            identical += p == s_
            prefix = 0
            while prefix < min(len(p), len(s_)) and p[prefix] == s_[prefix]:
                prefix += 1
            agree += prefix
            total += len(p)
    plain_tps = plain_tokens / plain_seconds if plain_seconds else 0.0
    spec_tps = spec_tokens / spec_seconds if spec_seconds else 0.0
    result = {
        "prompts": len(runs),
        "prompts_ended_at_once": stopped_at_once,
        "verify_passes": passes,
        "mean_accepted_length": emitted / passes if passes else 0.0,
        "mean_accepted_length_unweighted": sum(per_prompt_mal) / len(per_prompt_mal) if per_prompt_mal else 0.0,
        "acceptance_by_depth": [c / passes if passes else 0.0 for c in at_least],
        "plain_tokens": plain_tokens, "plain_seconds": plain_seconds, "plain_tokens_per_s": plain_tps,
        "spec_tokens": spec_tokens, "spec_seconds": spec_seconds, "spec_tokens_per_s": spec_tps,
        "speedup": spec_tps / plain_tps if plain_tps else 0.0,
        "plain_split": split["plain"],
        "spec_split": split["speculative"],
    }
    if greedy:
        result["greedy_identical_prompts"] = identical
        result["greedy_agreeing_tokens"] = agree
        result["greedy_tokens"] = total
    return result


def measure(args):
    binary = os.path.join(args.build, "examples", "eagle3-decode")
    if not os.access(binary, os.X_OK):
        raise SystemExit(f"{binary} not found (build it: ninja -C {args.build} eagle3-decode)")
    prompts = load_prompts(args.prompts)
    count = args.num_prompts or (4 if args.quick else len(prompts))
    max_new = args.max_new_tokens or (32 if args.quick else 96)
    prompts = prompts[:count]
    help_text = decode_help(binary)
    has_aux = "--aux-layers" in help_text
    has_convention = "--convention" in help_text
    command = " ".join(["python3", "tools/train_tiny/measure.py"] + sys.argv[1:])
    draft_rel = os.path.relpath(os.path.abspath(args.draft), REPO)
    out = {
        "command": command,
        "device": args.device,
        "machine": machine_description(args.device),
        "binary": binary,
        "prompts_file": os.path.relpath(args.prompts, REPO),
        "prompts": [p["path"] for p in prompts],
        "prompt_tokens": [len(p["tokens"]) for p in prompts],
        "max_new_tokens": max_new,
        "seed": SEED,
        "draft": draft_rel,
        "draft_architecture": draft_architecture(args.draft),
        "decode_flags": f"--target models/tiny-v2-code --draft {draft_rel} --tokens <prompt> "
                        f"--max-new-tokens {max_new} --topk K --steps S --draft-tokens N --temperature T "
                        f"--seed {SEED} --device {args.device}"
                        + (f" --graphs {args.graphs}" if args.graphs else "") + " --json F",
        "configs": [],
        "field_failures": [],
        "aux_layers_flag": has_aux,
    }
    t_start = time.time()
    if args.batch > 1:
        measure_batched(args, binary, prompts, max_new, out, t_start)
        return
    with tempfile.TemporaryDirectory() as work:
        jobs = [(name, k, s, n, t, []) for t in TEMPERATURES for name, k, s, n in CONFIGS]
        if has_aux:
            for failure, ids, convention, boundaries, what in FIELD_FAILURES:
                extra = ["--aux-layers", ",".join(map(str, ids))]
                if has_convention:
                    extra += ["--convention", convention]
                elif convention != "output":
                    out["field_failures_note"] = f"eagle3-decode has no --convention: '{failure}' not measured"
                    continue
                for name, k, s, n in CONFIGS:
                    if name in FIELD_CONFIGS:
                        jobs.append((name, k, s, n, 0.0, extra, (failure, ids, convention, boundaries, what)))
        out["skipped_for_budget"] = []
        for job in jobs:
            name, k, s, n, t, extra = job[:6]
            if args.budget_seconds and time.time() - t_start > args.budget_seconds:
                out["skipped_for_budget"].append(f"{name} T={t:g}" + (f" [{job[6][0]}]" if extra else ""))
                continue
            t0 = time.time()
            runs = [run_decode(binary, args.draft, p["tokens"], max_new, k, s, n, t, args.device, args.graphs, extra, work) for p in prompts]
            row = {"config": name, "topk": k, "steps": s, "draft_tokens": n, "temperature": t}
            row.update(aggregate(runs, s, greedy=t == 0))
            row["wall_seconds"] = time.time() - t0
            row["draft_tap"] = sorted({r["draft_tap"] for r in runs if r.get("draft_tap")})
            if extra:
                failure, ids, convention, boundaries, what = job[6]
                row.update({"failure": failure, "aux_layers": ids, "convention": convention, "boundaries": boundaries,
                            "what": what, "flags": " ".join(extra)})
                out["field_failures"].append(row)
            else:
                out["configs"].append(row)
            print(f"{name:12s} T={t:g} {'[' + job[6][0] + ']' if extra else '':28s} mean accepted length "
                  f"{row['mean_accepted_length']:.3f}  depth {', '.join(f'{a:.2f}' for a in row['acceptance_by_depth'])}"
                  f"  tok/s plain {row['plain_tokens_per_s']:.1f} spec {row['spec_tokens_per_s']:.1f} "
                  f"x{row['speedup']:.2f}  ({row['wall_seconds']:.0f} s)", flush=True)
            out["wall_seconds"] = time.time() - t_start
            write_json(out, args.out)  # after every configuration, so a run cut short keeps what it measured
    if not has_aux:
        out["field_failures_note"] = "eagle3-decode has no --aux-layers: field-failure rows not measured"
    out["wall_seconds"] = time.time() - t_start
    write_json(out, args.out)
    if out["skipped_for_budget"]:
        print(f"skipped for --budget-seconds: {', '.join(out['skipped_for_budget'])}")
    print(f"wrote {args.out} ({out['wall_seconds']:.0f} s)")


def measure_batched(args, binary, prompts, max_new, out, t_start):
    if os.path.abspath(args.prompts) != PROMPTS:
        raise SystemExit(f"--batch: eagle3-decode reads {PROMPTS} itself; --prompts {args.prompts} cannot be used")
    if len(prompts) < args.batch:
        raise SystemExit(f"--batch {args.batch}: only {len(prompts)} prompts")
    prompts = prompts[:args.batch]
    cut = min(len(p["tokens"]) for p in prompts)
    out.update({"batch": args.batch, "prompts": [p["path"] for p in prompts], "prompt_tokens": [cut] * len(prompts),
                "decode_flags": out["decode_flags"].replace("--tokens <prompt>", f"--batch {args.batch} "
                                                            f"--prompt-tokens {cut}").replace("--temperature T",
                                                                                              "--temperature 0"),
                "skipped_for_budget": []})
    with tempfile.TemporaryDirectory() as work:
        for name, k, s, n in CONFIGS:
            if args.budget_seconds and time.time() - t_start > args.budget_seconds:
                out["skipped_for_budget"].append(f"{name} T=0")
                continue
            t0 = time.time()
            row = {"config": name, "topk": k, "steps": s, "draft_tokens": n, "temperature": 0.0}
            row.update(aggregate_batch(run_batch(binary, args.draft, args.batch, cut, max_new, k, s, n, args.device,
                                                 args.graphs, work), s))
            row["wall_seconds"] = time.time() - t0
            out["configs"].append(row)
            print(f"{name:12s} batch {args.batch} mean accepted length {row['mean_accepted_length']:.3f}  depth "
                  f"{', '.join(f'{a:.2f}' for a in row['acceptance_by_depth'])}  tok/s plain "
                  f"{row['plain_tokens_per_s']:.1f} spec {row['spec_tokens_per_s']:.1f} x{row['speedup']:.2f}  "
                  f"identical {row['greedy_identical_prompts']}/{row['prompts']}", flush=True)
            out["wall_seconds"] = time.time() - t_start
            write_json(out, args.out)
    out["wall_seconds"] = time.time() - t_start
    write_json(out, args.out)
    print(f"wrote {args.out} ({out['wall_seconds']:.0f} s)")


def write_json(out, path):
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(out, f, indent=1)
        f.write("\n")
    os.replace(tmp, path)


def self_test():
    """CPU checks of the aggregation and the prompt file checks (no binary, no model)."""
    def run(hist, plain, spec, tps=(100.0, 50.0)):
        n, e = sum(hist), sum((a + 1) * c for a, c in enumerate(hist))
        return {"plain": {"tokens": plain, "tokens_per_s": tps[0]},
                "speculative": {"tokens": spec, "tokens_per_s": tps[1], "mean_accepted_length": e / n if n else 0,
                                "accepted_histogram": hist}}
    # Weighted by verify passes: 1 pass emitting 4 and 3 passes emitting 1 -> 7 / 4, not (4 + 1) / 2.
    agg = aggregate([run([0, 0, 0, 1], [1, 2, 3, 4], [1, 2, 3, 4]), run([3], [5, 6, 7], [5, 6, 9])], 3, greedy=True)
    assert abs(agg["mean_accepted_length"] - 7 / 4) < 1e-12, agg
    assert abs(agg["mean_accepted_length_unweighted"] - 2.5) < 1e-12, agg
    assert agg["acceptance_by_depth"] == [0.25, 0.25, 0.25], agg
    assert agg["greedy_identical_prompts"] == 1 and agg["greedy_agreeing_tokens"] == 6 and agg["greedy_tokens"] == 7
    assert abs(agg["plain_tokens_per_s"] - 100.0) < 1e-9 and abs(agg["speedup"] - 0.5) < 1e-9, agg
    # A run that ended at EOS right after the prompt has no verify pass: counted, left out of the averages.
    agg = aggregate([run([], [0], [0]), run([1, 1], [1, 2, 3], [1, 2, 3])], 2, greedy=True)
    assert agg["prompts_ended_at_once"] == 1 and agg["mean_accepted_length"] == 1.5, agg
    # A run whose reported mean disagrees with its histogram is refused.
    bad = run([1, 1], [1], [1])
    bad["speculative"]["mean_accepted_length"] = 3.0
    try:
        aggregate([bad], 2, greedy=False)
        raise AssertionError("a disagreeing mean_accepted_length was accepted")
    except SystemExit as e:
        assert "mean_accepted_length" in str(e)
    # A batched run: acceptance from its histogram; identical sequences counted per prompt.
    batched = {"batch": 2, "seconds": {}, "plain": {"tokens_per_s": 80.0},
               "speculative": {"tokens_per_s": 120.0, "accepted_histogram": [1, 0, 3]},
               "prompts": [{"prompt_tokens": 5, "plain": [1, 2], "speculative": [1, 2]},
                           {"prompt_tokens": 5, "plain": [3, 4], "speculative": [3, 5]}]}
    row = aggregate_batch(batched, 3)
    assert row["mean_accepted_length"] == 10 / 4 and row["acceptance_by_depth"] == [0.75, 0.75, 0.0], row
    assert row["speedup"] == 1.5 and row["greedy_identical_prompts"] == 1, row
    # Prompt files: empty, or a prompt without token ids, are refused naming the file.
    with tempfile.TemporaryDirectory() as d:
        for content, expect in (("", "no prompts"), ('{"path": "a.py", "tokens": []}\n', "prompt 0 (a.py)"),
                                ('{"path": "b.py", "tokens": [1, -2]}\n', "prompt 0 (b.py)")):
            path = os.path.join(d, "p.jsonl")
            with open(path, "w") as f:
                f.write(content)
            try:
                load_prompts(path)
                raise AssertionError(f"accepted {content!r}")
            except SystemExit as e:
                assert path in str(e) and expect in str(e), str(e)
    print("measure.py self-test passed")


def machine_description(device):
    if device == "cuda":
        try:
            gpu = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True,
                                 text=True).stdout.strip().split("\n")[0]
        except OSError:
            gpu = "unknown GPU"
        return f"{gpu}, {os.cpu_count()} CPU threads"
    model = "unknown CPU"
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    model = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return f"{model}, {os.cpu_count()} CPU threads (load average {os.getloadavg()[0]:.1f} at start)"


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--build", help="CMake build directory holding examples/eagle3-decode")
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    p.add_argument("--out", default=None, help="result JSON (default measure_<device>.json)")
    p.add_argument("--draft", default=DRAFT, help="draft directory (default models/tiny-v2-code-eagle3)")
    p.add_argument("--batch", type=int, default=1,
                   help="decode the first B held-out prompts together per configuration (greedy; see above)")
    p.add_argument("--quick", action="store_true", help="4 prompts, 32 new tokens")
    p.add_argument("--prompts", default=PROMPTS, help="held-out prompts (JSON lines)")
    p.add_argument("--num-prompts", type=int, default=None, help="use the first N prompts")
    p.add_argument("--max-new-tokens", type=int, default=None)
    p.add_argument("--graphs", choices=["on", "off"], default=None, help="passed to eagle3-decode (cuda)")
    p.add_argument("--budget-seconds", type=float, default=None,
                   help="start no configuration after this many seconds (skipped ones are listed in the JSON)")
    p.add_argument("--make-prompts", action="store_true", help="write --prompts from the held-out files")
    p.add_argument("--site-packages", default=None, help="with --make-prompts: local site-packages")
    p.add_argument("--heldout-list", default="/tmp/heldout_files_gpuhost.txt",
                   help="with --make-prompts: the training run's heldout_files.txt")
    p.add_argument("--count", type=int, default=PROMPT_COUNT)
    p.add_argument("--self-test", action="store_true", help="check the aggregation on synthetic runs and exit")
    args = p.parse_args()
    if args.self_test:
        self_test()
        return
    if args.make_prompts:
        if args.site_packages is None:
            import sysconfig
            args.site_packages = sysconfig.get_paths()["purelib"]
        make_prompts(args)
        return
    if not args.build:
        p.error("--build DIR is required (or --make-prompts)")
    if args.out is None:
        args.out = f"measure_{args.device}.json"
    measure(args)


if __name__ == "__main__":
    main()
