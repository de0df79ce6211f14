#!/usr/bin/env python3
"""Regenerates benchmarks/RESULTS.md and the roofline chart from run_all.sh results directories.

    make_results.py --in DIR [DIR=NAME[,NAME...] ...] [--out-md RESULTS.md] [--out-png roofline.png]
                    [--targets targets.json] [--notes NOTES.md] [--no-matplotlib]

DIR holds <name>.json per benchmark binary (Google Benchmark JSON: rows named
"BM_X/arg:value/.../manual_time" with the counters of benchmarks/cuda/bench_util.h; the median
aggregate is used), peers.jsonl (JSON lines {"benchmark", "params", "peer", "us"} from
benchmarks/peers/*.py, joined to the C++ row with the same benchmark and params), env.json and
status.txt (from run_all.sh). Everything is generic: a new *_benchmark binary or peer shows up as a new
table or column. DIR=NAME,... takes only the named binaries' rows from DIR (e.g. the collectives of
an older two-GPU run beside a complete one-GPU run: runs/OLD=collectives_benchmark); such a run adds
no peers and no status lines.

RESULTS.md opens with a summary built from the targets file (hand-maintained, benchmarks/targets.json):
each target's goal, the rows of these runs that show where it stands (their figure, fraction of the
floor and peer figure read from the runs; whether each row meets the goal computed from them), the
hand-written verdict, and the end-to-end tables that scripts measured outside the benchmark binaries.
The notes file (predictions, explanations, history) is linked, not copied. Model ids of the decode
benchmarks are shown by name (MODEL_NAMES).
Standard library only; matplotlib draws the chart when importable, else a small built-in rasterizer
(no text on the image).
"""
import argparse
import glob
import json
import math
import os
import struct
import zlib
import sys

STD_COUNTERS = ("us", "floor_us", "frac_of_floor", "GB/s", "TFLOP/s", "bytes", "flops", "copy_GB/s",
                "gemm_TFLOP/s")


# Run settings that Google Benchmark puts into names; they are shown but never join a peer row.
RUN_SETTINGS = ("min_time", "repeats", "iterations")
# Model ids of the benchmarks that take a `model` argument, by name (decode_step_benchmark.cc's
# kModelNames; decode_ops_benchmark.cc's BM_MoeDecode models, whose labels say the same).
STEP_MODELS = {0: "v2lite-tp1", 1: "v2-tp8-rank", 2: "v3-fp8-tp8-rank", 3: "k2-int4-tp8-rank"}
MODEL_NAMES = {"BM_DecodeStep": STEP_MODELS, "BM_VerifyStep": STEP_MODELS,
               "BM_MoeDecode": {0: "v3-tp8-rank", 1: "k2-tp8-rank", 2: "v2lite-tp1", 3: "v2-tp8-rank"}}
# Values of other row keys shown by name: BM_MtpDraftStep's weight form (draft_step_benchmark.cc).
PARAM_VALUE_NAMES = {("BM_MtpDraftStep", "fp8"): {0: "bf16", 1: "fp8-kept"}}
# Argument names of benchmarks that older runs registered without ArgNames (positional "/16/4096").
POSITIONAL_ARG_NAMES = {"BM_BatchedLatentAttention": ["heads", "context", "batch", "qtokens", "cache_bits"]}
# Arguments that older runs did not have, with the value those runs implied: rows of different runs
# then join (a newer row replaces an older one of the same shape).
DEFAULT_PARAMS = {"BM_BatchedLatentAttention": {"cache_bits": 32}, "BM_DecodeStep": {"model": 0},
                  "BM_DraftStep": {"graph": 0}}  # rows of runs before the parameter existed
# BM_VerifyStep had no context argument before 2026-12-01c: it ran at decode_step_benchmark's
# MaxContext(), 1024 in quick runs and 4096 in full ones. The runs that recorded verify rows so far:
VERIFY_CONTEXT_OF_RUN = {"2026-12-01-h200": 1024, "2026-12-01b-h200": 1024, "2026-12-01c-h200": 4096,
                         "2026-12-01d-h200": 4096}


def parse_name(run_name):
    """'BM_X/a:1/b:2/manual_time' -> ('BM_X', {'a': 1, 'b': 2}); positional '/16/4096' args are
    named from POSITIONAL_ARG_NAMES (else arg0, arg1, ...)."""
    parts = run_name.split("/")
    params = {}
    names = POSITIONAL_ARG_NAMES.get(parts[0], [])
    positional = 0
    for p in parts[1:]:
        if ":" in p:
            k, v = p.split(":", 1)
        elif p.lstrip("-").isdigit():
            k = names[positional] if positional < len(names) else "arg%d" % positional
            v = p
            positional += 1
        else:
            continue
        try:
            params[k] = int(v)
        except ValueError:
            params[k] = v
    return parts[0], params


# Arguments that pick how a benchmark computes a shape, not the shape: a peer row (which has no such
# argument) joins every form. BM_MoeDecode's join: the shared experts joined to the routed experts'
# op or run as their own MLP, the same MoE layer either way (benchmarks/peers/moe_peer.py).
FORM_ARGS = {"BM_MoeDecode": ("join",)}


def join_key(bench, params):
    """The key a peer row and a C++ row share: the benchmark and its shape arguments."""
    skip = RUN_SETTINGS + FORM_ARGS.get(bench, ())
    return (bench, tuple(sorted((k, v) for k, v in params.items() if k not in skip)))


def load_benchmarks(indir):
    """{binary: {"context": {...}, "rows": [row]}}, row = {bench, params, counters, label, error}."""
    out = {}
    for path in sorted(glob.glob(os.path.join(indir, "*.json"))):
        # <binary>.json, or <binary>.<tag>.json for one part of a binary run over several calls
        # (run_all.sh --tag): the parts' rows join under the binary, later files replacing earlier
        # rows of the same shape.
        name = os.path.basename(path)[:-len(".json")].split(".")[0]
        if name == "env":
            continue
        try:
            data = json.load(open(path))
        except (OSError, ValueError) as e:
            out.setdefault(name, {"context": {}, "rows": [], "load_error": str(e)})
            continue
        prior = out.get(name)
        rows, seen = ([], {}) if prior is None or not prior["rows"] else (prior["rows"], prior["seen"])
        for b in data.get("benchmarks", []):
            run_name = b.get("run_name", b.get("name", ""))
            bench, params = parse_name(run_name)
            # Run settings (min_time, repeats, iterations) say how a row was timed, not its shape.
            params = {k: v for k, v in params.items() if k not in RUN_SETTINGS}
            for k, v in DEFAULT_PARAMS.get(bench, {}).items():
                params.setdefault(k, v)
            if bench == "BM_DraftStep":
                # EAGLE3_BENCH_PAGED_REGISTERS: which kernel ran the draft's attention.
                params["paged_registers"] = int(b.get("paged_registers", 0))
            if bench in ("BM_DecodeStep", "BM_VerifyStep"):
                # The cache dtype is an environment setting (EAGLE3_BENCH_KV_CACHE), not in the name.
                params["cache_bits"] = int(8 * b.get("cache_elem_bytes", 4))
            run_dir = os.path.basename(os.path.normpath(indir))
            if bench == "BM_VerifyStep" and "context" not in params and run_dir in VERIFY_CONTEXT_OF_RUN:
                params["context"] = VERIFY_CONTEXT_OF_RUN[run_dir]
            agg = b.get("aggregate_name")
            if agg not in (None, "", "median") or (agg is None and b.get("run_type") == "aggregate"):
                continue
            key = (bench, tuple(sorted(params.items())))
            if key in seen and agg != "median":
                continue  # keep the median aggregate over a plain iteration row
            row = {"bench": bench, "params": params, "label": b.get("label", ""),
                   "error": b.get("error_message") if b.get("error_occurred") else None,
                   "counters": {k: v for k, v in b.items() if isinstance(v, (int, float)) and not isinstance(v, bool)
                                and k not in (
                       "family_index", "per_family_instance_index", "repetitions", "repetition_index",
                       "threads", "iterations", "real_time", "cpu_time")}}
            if key in seen:
                rows[seen[key]] = row
            else:
                seen[key] = len(rows)
                rows.append(row)
        out[name] = {"context": data.get("context", {}), "rows": rows, "seen": seen}
    for b in out.values():
        b.pop("seen", None)
    return out


def split_run_arg(arg):
    """'DIR' -> (DIR, None); 'DIR=a,b' -> (DIR, {'a', 'b'}): the binaries whose rows DIR contributes."""
    if "=" not in arg:
        return arg, None
    d, names = arg.split("=", 1)
    return d, {n.strip() for n in names.split(",") if n.strip()}


def load_runs(indirs):
    """Rows of several run directories (oldest first; DIR=NAME,... keeps only the named binaries), merged
    per binary: a newer row replaces an older row of the same benchmark and shape; each row records its
    run (the directory's name)."""
    merged = {}
    for arg in indirs:
        d, only = split_run_arg(arg)
        run = os.path.basename(os.path.normpath(d))
        for name, b in load_benchmarks(d).items():
            if only is not None and name not in only:
                continue
            m = merged.setdefault(name, {"context": {}, "rows": [], "index": {}})
            if b.get("load_error"):
                m.setdefault("load_error", b["load_error"])
                continue
            if b["context"]:
                m["context"] = b["context"]
            for r in b["rows"]:
                r["run"] = run
                key = (r["bench"], tuple(sorted((k, str(v)) for k, v in r["params"].items() if k not in RUN_SETTINGS)))
                if key in m["index"]:
                    m["rows"][m["index"][key]] = r
                else:
                    m["index"][key] = len(m["rows"])
                    m["rows"].append(r)
    for m in merged.values():
        m.pop("index")
        if m["rows"]:
            m.pop("load_error", None)
    return merged


def load_peers(indir):
    peers = {}
    path = os.path.join(indir, "peers.jsonl")
    if not os.path.exists(path):
        return peers
    for line in open(path):
        line = line.strip()
        if not line.startswith("{"):
            continue
        try:
            r = json.loads(line)
            if "benchmark" not in r and "name" in r:
                # verify_peer.py's form: {"name", "batch", "tokens", "vocab", "dtype", "median_us"}.
                r = {"benchmark": r["name"], "params": {k: r[k] for k in ("batch", "tokens", "vocab")},
                     "peer": "torch", "us": r["median_us"]}
            key = join_key(r["benchmark"], r["params"])
            peers.setdefault(key, {})[r["peer"]] = float(r["us"])
        except (ValueError, KeyError, TypeError):
            continue
    return peers


def fmt(v):
    if v is None:
        return ""
    if isinstance(v, str):
        return v
    if v == 0:
        return "0"
    a = abs(v)
    if a >= 100:
        return f"{v:.0f}"
    if a >= 10:
        return f"{v:.1f}"
    if a >= 1:
        return f"{v:.2f}"
    return f"{v:.3g}"


def ceilings(benchmarks):
    for b in benchmarks.values():
        ctx = b["context"]
        if "copy_GB/s" in ctx:
            return float(ctx["copy_GB/s"]), float(ctx["gemm_TFLOP/s"])
        for r in b["rows"]:
            if "copy_GB/s" in r["counters"]:
                return r["counters"]["copy_GB/s"], r["counters"]["gemm_TFLOP/s"]
    return None, None


def interp_loglog(points, x):
    """Log-log interpolation of sorted (x, y) points at x; (y, extrapolated?)."""
    pts = sorted(p for p in points if p[0] > 0 and p[1] > 0)
    if not pts:
        return None, False
    if len(pts) == 1:
        return pts[0][1], x != pts[0][0]
    if x <= pts[0][0]:
        return pts[0][1], x < pts[0][0]  # latency-bound below the smallest size: flat
    for (x0, y0), (x1, y1) in zip(pts, pts[1:]):
        if x <= x1:
            f = (math.log(x) - math.log(x0)) / (math.log(x1) - math.log(x0))
            return math.exp(math.log(y0) + f * (math.log(y1) - math.log(y0))), False
    (x0, y0), (x1, y1) = pts[-2], pts[-1]
    f = (math.log(x) - math.log(x0)) / (math.log(x1) - math.log(x0))
    return math.exp(math.log(y0) + f * (math.log(y1) - math.log(y0))), True


def param_cell(bench, key, value):
    """A row key as a table shows it: model ids by name (MODEL_NAMES), values PARAM_VALUE_NAMES names by
    name, everything else as is."""
    if key == "model" and value in MODEL_NAMES.get(bench, {}):
        return MODEL_NAMES[bench][value]
    if value in PARAM_VALUE_NAMES.get((bench, key), {}):
        return PARAM_VALUE_NAMES[(bench, key)][value]
    return str(value)


def table(rows, peers):
    benches = []
    for r in rows:
        if r["bench"] not in benches:
            benches.append(r["bench"])
    lines = []
    for bench in benches:
        rs = [r for r in rows if r["bench"] == bench]
        pnames = sorted({p for r in rs for p in peers.get(join_key(bench, r["params"]), {})})
        pkeys = []
        for r in rs:
            pkeys += [k for k in r["params"] if k not in pkeys]
        if len({r.get("run") for r in rs}) > 1:
            pkeys.append("run")
        # Counters that are also row keys (paged_registers, cache_bits' source) are shown once, as keys.
        extra = sorted({k for r in rs for k in r["counters"]
                        if k not in STD_COUNTERS and not k.endswith("_time") and k not in pkeys})
        # A named model column says what such a benchmark's label says (BM_MoeDecode's "V3-TP8").
        has_label = any(r["label"] for r in rs) and not ("model" in pkeys and bench in MODEL_NAMES)
        head = pkeys + (["label"] if has_label else []) + ["median µs", "floor µs", "of floor", "GB/s", "TFLOP/s"]
        head += extra
        for p in pnames:
            head += [f"{p} µs", f"× vs {p}"]
        lines += [f"### `{bench}`", "", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        for r in rs:
            c = r["counters"]
            cells = [str(r.get("run", "")) if k == "run" and k not in r["params"] else
                     param_cell(bench, k, r["params"].get(k, "")) for k in pkeys] + ([r["label"]] if has_label else [])
            if r["error"]:
                cells += [f"skipped: {r['error']}"] + [""] * (len(head) - len(cells) - 1)
                lines.append("| " + " | ".join(cells) + " |")
                continue
            cells += [fmt(c.get("us")), fmt(c.get("floor_us")), fmt(c.get("frac_of_floor")), fmt(c.get("GB/s")),
                      fmt(c.get("TFLOP/s"))]
            cells += [fmt(c.get(k)) for k in extra]
            pr = peers.get(join_key(bench, r["params"]), {})
            for p in pnames:
                us = pr.get(p)
                cells += [fmt(us), fmt(us / c["us"]) if us and c.get("us") else ""]
            lines.append("| " + " | ".join(cells) + " |")
        lines.append("")
    return lines


def fc_model(benchmarks):
    """fc column-sharded over 8 ranks + the all-gather of [T, 7168] f32, from measured rows."""
    fc = [r for b in benchmarks.values() for r in b["rows"]
          if r["bench"] == "BM_FcProjection" and not r["error"]]
    ag = [(r["counters"].get("bytes", 0), r["counters"].get("us", 0)) for b in benchmarks.values()
          for r in b["rows"] if r["bench"] == "BM_AllGather" and not r["error"] and r["params"].get("bf16") == 0]
    if not fc:
        return []
    lines = ["### Modeled: fc replicated vs column-sharded over 8 ranks + all-gather", "",
             "A model, not a measurement of one program: the sharded GEMM's measured time plus the all-gather's "
             "measured time at the gathered size (log-log interpolation between the measured message sizes; "
             "`extrapolated` when outside them).", "",
             "| tokens | bf16 | replicated µs | sharded GEMM µs | all-gather bytes | all-gather µs | sharded + "
             "all-gather µs | replicated ÷ sharded |", "|---|---|---|---|---|---|---|---|"]
    by = {(r["params"]["tokens"], r["params"]["shards"], r["params"]["bf16"]): r for r in fc}
    for (tokens, shards, bf16), r in sorted(by.items()):
        if shards == 1:
            continue
        rep = by.get((tokens, 1, bf16))
        nbytes = r["counters"].get("allgather_bytes", 0)
        ag_us, extra = interp_loglog(ag, nbytes) if ag else (None, False)
        total = r["counters"]["us"] + ag_us if ag_us is not None else None
        lines.append("| " + " | ".join([
            str(tokens), str(bf16), fmt(rep["counters"]["us"]) if rep else "", fmt(r["counters"]["us"]),
            fmt(nbytes), (fmt(ag_us) + (" (extrapolated)" if extra else "")) if ag_us is not None else "not measured",
            fmt(total), fmt(rep["counters"]["us"] / total) if rep and total else ""]) + " |")
    return lines + [""]


# DeepSeek-V2 at TP 8 (BM_DecodeStep / BM_VerifyStep model 1 = one rank's compute, see
# decode_step_benchmark.cc): the rank's collectives per target step are the embedding all-reduce, two
# all-reduces per layer (attention output, MLP/MoE output) of [tokens, 5120] f32 and the all-gather of
# the logits shards ([tokens, 102400] f32 gathered); the draft (the SpecForge V3 head at its TP 8 rank
# shape, BM_DraftStep tp 8: no public EAGLE-3 head for V2 exists, and V3's is larger than a V2-sized
# one would be) adds two all-reduces of [tokens, 7168] f32 per draft pass.
V2_LAYERS, V2_HIDDEN, V2_VOCAB, DRAFT_HIDDEN = 60, 5120, 102400, 7168
E2E_TREES = ((4, 3, 8), (4, 5, 16), (8, 6, 32), (8, 7, 64))  # (topk, draft passes, tree tokens)
E2E_ACCEPT = (2.4, 5.2)  # mean accepted length: Kimi-K2 EAGLE-3, chat and code (the range)


def e2e_model(benchmarks, collective_dirs=()):
    """The modeled end-to-end speedup table for the V2 TP 8 rank; [] without its inputs."""
    rows = [r for b in benchmarks.values() for r in b["rows"] if not r["error"]]
    # One cache dtype for both steps: bf16 where this page has bf16-cache rows of the V2 rank (what an
    # engine would run), else f32.
    cache_bits = 16 if any(r["bench"] == "BM_DecodeStep" and r["params"].get("model") == 1 and
                           r["params"].get("cache_bits") == 16 for r in rows) else 32
    rows = [r for r in rows if r["bench"] not in ("BM_DecodeStep", "BM_VerifyStep") or
            r["params"].get("cache_bits") == cache_bits]
    step = {(r["params"]["batch"], r["params"]["context"]): r["counters"]["us"] for r in rows
            if r["bench"] == "BM_DecodeStep" and r["params"].get("model") == 1 and r["params"].get("graph") == 1}
    context = max((c for (_, c) in step), default=0)
    # Verify rows at the vanilla step's context only (rows of unknown context are left out).
    verify = {(r["params"]["batch"], r["params"]["tokens"]): r["counters"]["us"] for r in rows
              if r["bench"] == "BM_VerifyStep" and r["params"].get("model") == 1 and r["params"].get("graph") == 1
              and r["params"].get("context") == context}
    # A graphed decode loop replays the draft step's Launch (graph 1); rows without the graph
    # parameter (runs before 2026-12-01c) are Forward calls with host I/O (graph 0).
    draft_rows = [r for r in rows if r["bench"] == "BM_DraftStep" and r["params"].get("tp") == 8]
    # The draft's attention kernel: the register kernel's rows where measured.
    if any(r["params"].get("paged_registers") == 1 for r in draft_rows):
        draft_rows = [r for r in draft_rows if r["params"].get("paged_registers") == 1]
    draft_graph = 1 if any(r["params"].get("graph", 0) == 1 for r in draft_rows) else 0
    draft = {}
    for r in draft_rows:
        if r["params"].get("graph", 0) == draft_graph:
            draft.setdefault(r["params"].get("from_target", 1), []).append((r["params"]["tokens"], r["counters"]["us"]))
    tree = {}
    for r in rows:
        if r["bench"] == "BM_TreeBuild":
            p = r["params"]
            tree[(p.get("batch"), p.get("topk"), p.get("steps"), p.get("tokens"))] = r["counters"]["us"]
    # Collectives: this run's, else the newest earlier run's under benchmarks/runs/ (named in the text).
    ar_rows, source = [], "this run"
    for r in rows:
        if r["bench"] in ("BM_AllReduce", "BM_AllGather") and r["params"].get("bf16") == 0:
            ar_rows.append(r)
    if not ar_rows:
        for d in collective_dirs:
            older = load_benchmarks(d)
            ar_rows = [r for b in older.values() for r in b["rows"] if not r["error"] and
                       r["bench"] in ("BM_AllReduce", "BM_AllGather") and r["params"].get("bf16") == 0]
            if ar_rows:
                source = "the run in `%s`" % os.path.relpath(d, os.path.dirname(os.path.abspath(__file__)))
                break
    ar = [(r["params"]["bytes"], r["counters"]["us"]) for r in ar_rows if r["bench"] == "BM_AllReduce"]
    ag = [(r["params"]["bytes"], r["counters"]["us"]) for r in ar_rows if r["bench"] == "BM_AllGather"]
    if not step or not verify or not draft or not ar or not ag:
        missing = [n for n, v in ((f"BM_DecodeStep model {STEP_MODELS[1]}", step),
                                  (f"BM_VerifyStep model {STEP_MODELS[1]}", verify),
                                  ("BM_DraftStep tp 8", draft), ("BM_AllReduce", ar), ("BM_AllGather", ag)) if not v]
        return ["### Modeled: end-to-end speedup of EAGLE-3 on a DeepSeek-V2 TP 8 rank", "",
                "Not computed: this run lacks " + ", ".join(missing) + ".", ""]

    def allreduce(nbytes):
        return interp_loglog(ar, nbytes)[0]

    def target_collectives(tokens):
        return ((1 + 2 * V2_LAYERS) * allreduce(tokens * V2_HIDDEN * 4) +
                interp_loglog(ag, tokens * V2_VOCAB * 4)[0])

    def draft_pass(tokens, first):
        pts = draft.get(1 if first else 0) or draft.get(1) or draft.get(0)
        return interp_loglog([(t, us) for t, us in pts], tokens)[0] + 2 * allreduce(tokens * DRAFT_HIDDEN * 4)

    lines = ["### Modeled: end-to-end speedup of EAGLE-3 on a DeepSeek-V2 TP 8 rank", "",
             "**A model, not a measurement of one program.** speedup = mean accepted length × vanilla step ÷ "
             "(draft round + verify step), every term from measured rows of this page: vanilla step = "
             f"`BM_DecodeStep` model {STEP_MODELS[1]} (one V2 rank, graph, {'bf16' if cache_bits == 16 else 'f32'} latent cache) "
             f"at context {context} + the rank's collectives "
             "(1 + 2 × 60 all-reduces of [tokens, 5120] f32, the logits all-gather) interpolated from "
             f"`BM_AllReduce` / `BM_AllGather` of {source} (measured on 2 GPUs; 8 GPUs cost more per call); "
             f"verify step = `BM_VerifyStep` model {STEP_MODELS[1]} (a complete 4-ary tree of the given size after "
             f"{context} cached tokens, graph) + the same collectives at batch × tree tokens; draft round = "
             "the first draft pass over the accepted tokens (mean accepted length + 1 per sequence, "
             "`BM_DraftStep` tp 8, from_target 1, graph 1 where measured) + (passes − 1) passes over topk tokens per sequence "
             "(from_target 0, or 1 when not measured), each with two all-reduces, + the device tree build "
             "(`BM_TreeBuild`, when measured). The draft is the SpecForge V3 head at its TP 8 rank shape "
             "(no public V2 head; a V2-sized head would be smaller). Mean accepted lengths 2.4 and 5.2 are "
             "the range reported for Kimi-K2's EAGLE-3 head (chat vs code), not measured here.", "",
             "| batch | topk | passes | tree tokens | vanilla step µs | verify step µs | draft round µs (τ 2.4 / 5.2) "
             "| speedup at τ 2.4 | speedup at τ 5.2 |", "|---|---|---|---|---|---|---|---|---|"]
    unmatched = []
    for batch in sorted({b for (b, _) in step}):
        if (batch, context) not in step:
            continue
        vanilla = step[(batch, context)] + target_collectives(batch)
        for topk, passes, n in E2E_TREES:
            if (batch, n) not in verify:
                continue
            ver = verify[(batch, n)] + target_collectives(batch * n)
            # The device tree build at this batch / topk / passes; its time barely depends on the tree
            # size (the logits read dominate), so the nearest measured size stands in.
            sizes = sorted((abs(tokens - n), us) for (b, k, st, tokens), us in tree.items()
                           if (b, k, st) == (batch, topk, passes))
            build = sizes[0][1] if sizes else 0.0
            if not sizes and tree:
                unmatched.append(f"batch {batch} topk {topk} passes {passes}")
            rounds, speedups = [], []
            for tau in E2E_ACCEPT:
                rnd = (draft_pass(batch * (tau + 1), True) + (passes - 1) * draft_pass(batch * topk, False) + build)
                rounds.append(rnd)
                speedups.append(tau * vanilla / (rnd + ver))
            lines.append("| " + " | ".join([str(batch), str(topk), str(passes), str(n), fmt(vanilla), fmt(ver),
                                            f"{fmt(rounds[0])} / {fmt(rounds[1])}", fmt(speedups[0]) + "×",
                                            fmt(speedups[1]) + "×"]) + " |")
    if not tree:
        lines += ["", "The device tree build was not measured; its time is left out of the draft round."]
    elif unmatched:
        lines += ["", "No tree-build row at " + "; ".join(unmatched) + ": left out of those draft rounds."]
    runs = sorted({r.get("run", "") for r in rows if r["bench"] == "BM_DraftStep"})
    if runs:
        lines += ["", "Draft-pass rows come from run(s) " + ", ".join(f"`{x}`" for x in runs) + " (check the "
                  "`BM_DraftStep` table for the weight dtype of that run)."]
    return lines + [""]


# ---- summary (benchmarks/targets.json) -------------------------------------------------------------

# What a goal compares, and how the summary names it.
GOAL_METRICS = {"frac_of_floor": "of floor", "peer_speedup": "× the peer", "us": "µs"}


def load_targets(path):
    """The targets file (see benchmarks/targets.json), or None when there is none."""
    if not path or not os.path.exists(path):
        return None
    with open(path) as f:
        data = json.load(f)
    if not isinstance(data, dict) or not isinstance(data.get("targets", []), list):
        raise ValueError("expected an object with a 'targets' list")
    for i, t in enumerate(data.get("targets", [])):
        where = f"targets[{i}]"
        if not isinstance(t, dict) or not isinstance(t.get("target"), str) or not isinstance(t.get("cases"), list):
            raise ValueError(f"{where}: needs 'target' (text) and 'cases' (a list)")
        goal = t.get("goal")
        if goal is not None and (goal.get("metric") not in GOAL_METRICS or ("min" in goal) == ("max" in goal)):
            raise ValueError(f"{where}.goal: needs 'metric' ({', '.join(GOAL_METRICS)}) and one of 'min' / 'max'")
        for j, case in enumerate(t["cases"]):
            if not isinstance(case, dict) or ("bench" in case) == ("figure" in case):
                raise ValueError(f"{where}.cases[{j}]: needs 'bench' (a benchmark row) or 'figure' (measured by hand)")
    for i, e in enumerate(data.get("end_to_end", [])):
        if not all(k in e for k in ("title", "columns", "rows")):
            raise ValueError(f"end_to_end[{i}]: needs 'title', 'columns' and 'rows'")
    return data


def find_rows(benchmarks, bench, params):
    """Rows of `bench` (error rows excluded) whose params hold every given key and value."""
    return [r for b in benchmarks.values() for r in b["rows"]
            if r["bench"] == bench and not r["error"] and all(r["params"].get(k) == v for k, v in params.items())]


def goal_text(goal):
    """'≥ 0.8 of floor', '≥ 5 × the peer', '≤ 2200 µs'."""
    name = GOAL_METRICS[goal["metric"]]
    if "min" in goal:
        return f"≥ {goal['min']:g} {name}"
    return f"≤ {goal['max']:g} {name}"


def goal_met(goal, value):
    if value is None:
        return None
    return value >= goal["min"] if "min" in goal else value <= goal["max"]


def target_case(case, benchmarks, peers, goal):
    """The cells figure, of floor, peer, meets goal for one case of a target: read from the runs for a
    case naming a benchmark row ({"bench", "params"[, "peer"]}), as written for a hand-measured one
    ({"figure", "meets"[, "of_floor", "peer"]})."""
    if "bench" not in case:
        met = case.get("meets")
        return [case.get("figure", ""), case.get("of_floor", "—"), case.get("peer", "—"),
                "yes" if met is True else "no" if met is False else str(met or "—")]
    rows = find_rows(benchmarks, case["bench"], case.get("params", {}))
    if len(rows) != 1:
        return ["not in these runs" if not rows else f"{len(rows)} rows match: name more params", "", "", ""]
    c = rows[0]["counters"]
    by_peer = peers.get(join_key(case["bench"], rows[0]["params"]), {})
    peer = case.get("peer") or (sorted(by_peer)[0] if by_peer else None)
    peer_us = by_peer.get(peer) if peer else None
    speedup = peer_us / c["us"] if peer_us and c.get("us") else None
    peer_cell = f"{fmt(peer_us)} µs ({fmt(speedup)}×)" if speedup else "—"
    met = None
    if goal:
        value = {"frac_of_floor": c.get("frac_of_floor"), "us": c.get("us"), "peer_speedup": speedup}[goal["metric"]]
        met = goal_met(goal, value)
    return [f"{fmt(c.get('us'))} µs", fmt(c.get("frac_of_floor")) or "—", peer_cell,
            "—" if met is None else "yes" if met else "no"]


def summary_lines(targets, benchmarks, peers, notes_link):
    """The summary at the top of RESULTS.md: the targets table and the end-to-end tables."""
    lines = ["## Summary", ""]
    if targets is None:
        return lines + ["No targets file (benchmarks/targets.json) was found: no summary.", ""]
    if targets.get("intro"):
        lines += [targets["intro"], ""]
    head = ["target", "case", "figure", "of floor", "peer (× ours)", "meets goal", "verdict"]
    lines += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for t in targets.get("targets", []):
        goal = t.get("goal")
        title = t["target"] + (f" ({goal_text(goal)})" if goal else "")
        for i, case in enumerate(t.get("cases", [])):
            cells = [title if i == 0 else "", case.get("case", "")]
            cells += target_case(case, benchmarks, peers, goal)
            cells.append(t.get("verdict", "") if i == 0 else "")
            lines.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
    lines.append("")
    for note in targets.get("notes", []):
        lines += [note.replace("{notes}", notes_link), ""]
    for e in targets.get("end_to_end", []):
        lines += [f"### {e['title']}", ""]
        if e.get("text"):
            lines += [e["text"], ""]
        cols = e["columns"]
        lines += ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
        for r in e["rows"]:
            lines.append("| " + " | ".join(str(x) for x in r) + " |")
        lines.append("")
        tail = []
        if e.get("command"):
            tail.append(f"Command: `{e['command']}`.")
        if e.get("source"):
            tail.append(f"Data: {e['source']}.")
        if tail:
            lines += [" ".join(tail), ""]
    return lines


# ---- roofline chart ---------------------------------------------------------------------------------

def roofline_points(benchmarks):
    pts = {}
    for b in benchmarks.values():
        for r in b["rows"]:
            c = r["counters"]
            if r["error"] or not c.get("flops") or not c.get("bytes") or not c.get("us"):
                continue
            pts.setdefault(r["bench"], []).append((c["flops"] / c["bytes"], c["flops"] / (c["us"] * 1e-6)))
    return pts


PALETTE = [(31, 119, 180), (255, 127, 14), (44, 160, 44), (214, 39, 40), (148, 103, 189), (140, 86, 75),
           (227, 119, 194), (127, 127, 127), (188, 189, 34), (23, 190, 207)]


def write_png_rgb(path, width, height, pixels):
    """pixels: bytearray of width*height*3. A minimal PNG writer (zlib + struct)."""
    raw = b"".join(b"\x00" + bytes(pixels[y * width * 3:(y + 1) * width * 3]) for y in range(height))

    def chunk(tag, data):
        return struct.pack(">I", len(data)) + tag + data + struct.pack(">I", zlib.crc32(tag + data) & 0xFFFFFFFF)
    png = b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0))
    png += chunk(b"IDAT", zlib.compress(raw, 9)) + chunk(b"IEND", b"")
    with open(path, "wb") as f:
        f.write(png)


def raster_roofline(path, pts, copy_bps, gemm_fps):
    """Log-log axes (AI 1e-2..1e4 flop/byte, 1e9..1e16 flop/s), the two ceilings in black, decade grid
    lines in grey, one colour per benchmark (legend in RESULTS.md)."""
    w, h, margin = 800, 560, 40
    px = bytearray([255]) * (w * h * 3)
    x_lo, x_hi, y_lo, y_hi = -2.0, 4.0, 9.0, 16.0

    def to_px(ai, fps):
        x = margin + (math.log10(ai) - x_lo) / (x_hi - x_lo) * (w - 2 * margin)
        y = h - margin - (math.log10(fps) - y_lo) / (y_hi - y_lo) * (h - 2 * margin)
        return int(round(x)), int(round(y))

    def put(x, y, color):
        if 0 <= x < w and 0 <= y < h:
            i = (y * w + x) * 3
            px[i:i + 3] = bytes(color)

    def line(x0, y0, x1, y1, color):
        n = max(abs(x1 - x0), abs(y1 - y0), 1)
        for i in range(n + 1):
            put(round(x0 + (x1 - x0) * i / n), round(y0 + (y1 - y0) * i / n), color)

    grey = (220, 220, 220)
    for d in range(int(x_lo), int(x_hi) + 1):
        x, _ = to_px(10 ** d, 10 ** y_lo)
        line(x, margin, x, h - margin, grey)
    for d in range(int(y_lo), int(y_hi) + 1):
        _, y = to_px(10 ** x_lo, 10 ** d)
        line(margin, y, w - margin, y, grey)
    line(margin, h - margin, w - margin, h - margin, (0, 0, 0))
    line(margin, margin, margin, h - margin, (0, 0, 0))
    if copy_bps and gemm_fps:
        prev = None
        for i in range(601):
            ai = 10 ** (x_lo + (x_hi - x_lo) * i / 600)
            p = to_px(ai, min(gemm_fps, ai * copy_bps))
            if prev:
                line(*prev, *p, (0, 0, 0))
            prev = p
    for k, (bench, ps) in enumerate(sorted(pts.items())):
        color = PALETTE[k % len(PALETTE)]
        for ai, fps in ps:
            x, y = to_px(max(ai, 1e-9), max(fps, 1))
            for dx in range(-3, 4):
                for dy in range(-3, 4):
                    put(x + dx, y + dy, color)
    write_png_rgb(path, w, h, px)


def plot_roofline(path, pts, copy_bps, gemm_fps, use_matplotlib=True, title="Roofline"):
    """Returns a description of how the chart was drawn (for RESULTS.md)."""
    if use_matplotlib:
        try:
            import matplotlib
            matplotlib.use("Agg")
            import matplotlib.pyplot as plt
        except ImportError:
            # The built-in rasterizer draws points and lines but no text (axes, ticks, legend,
            # title): say so, so that a chart without labels is never committed by accident.
            print("make_results.py: matplotlib is not importable; roofline drawn WITHOUT axes, "
                  "legend or title (install python3-matplotlib)", file=sys.stderr)
            use_matplotlib = False
    if use_matplotlib:
        fig, ax = plt.subplots(figsize=(10, 6))
        ais = [10 ** (-2 + 6 * i / 300) for i in range(301)]
        if copy_bps and gemm_fps:
            ax.plot(ais, [min(gemm_fps, a * copy_bps) / 1e12 for a in ais], "k-", linewidth=1.5,
                    label=f"ceiling: copy {copy_bps / 1e9:.0f} GB/s, bf16 GEMM {gemm_fps / 1e12:.0f} TFLOP/s")
        markers = "os^vD<>ph*"
        for k, (bench, ps) in enumerate(sorted(pts.items())):
            ax.scatter([p[0] for p in ps], [p[1] / 1e12 for p in ps], s=16, label=bench,
                       marker=markers[(k // len(PALETTE)) % len(markers)],
                       color=[c / 255 for c in PALETTE[k % len(PALETTE)]])
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlim(1e-2, 1e4)
        ax.set_xlabel("arithmetic intensity (FLOP/byte)")
        ax.set_ylabel("attainable TFLOP/s (line: the roof; points: achieved)")
        ax.set_title(title)
        ax.grid(True, which="major", alpha=0.3)
        ax.grid(True, which="minor", alpha=0.1)
        ax.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.01, 0.5))
        fig.tight_layout()
        fig.savefig(path, dpi=110)
        plt.close(fig)
        return "matplotlib"
    raster_roofline(path, pts, copy_bps, gemm_fps)
    return "built-in rasterizer"


# ---- report -----------------------------------------------------------------------------------------

def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    here = os.path.dirname(os.path.abspath(__file__))
    ap.add_argument("--in", dest="indirs", nargs="+", required=True,
                    help="run directories, oldest first: a newer run's row replaces an older one of the same shape; "
                         "DIR=NAME,... takes only the named binaries' rows from DIR")
    ap.add_argument("--out-md", default=os.path.join(here, "RESULTS.md"))
    ap.add_argument("--out-png", default=os.path.join(here, "roofline.png"))
    ap.add_argument("--notes", default=os.path.join(here, "NOTES.md"),
                    help="the hand-written notes RESULTS.md links to (not copied into it)")
    ap.add_argument("--targets", default=os.path.join(here, "targets.json"),
                    help="the hand-maintained summary source: targets, verdicts, end-to-end tables")
    ap.add_argument("--no-matplotlib", action="store_true", help="use the built-in rasterizer")
    args = ap.parse_args()
    command = regenerate_command(args, here)

    selected = [split_run_arg(a) for a in args.indirs]
    for d, only in selected:
        if not os.path.isdir(d):
            ap.error(f"--in {d}: not a directory")
        if only is not None:
            if not only:
                ap.error(f"--in {d}=: no binary named after '='")
            present = set(load_benchmarks(d))
            missing = sorted(only - present)
            if missing:
                ap.error(f"--in {d}={','.join(sorted(only))}: {', '.join(missing)} has no NAME[.TAG].json in {d} "
                         f"(it has: {', '.join(sorted(present)) or 'none'})")
    try:
        targets = load_targets(args.targets)
    except (OSError, ValueError) as e:
        ap.error(f"--targets {args.targets}: {e}")
    benchmarks = load_runs(args.indirs)
    args.indirs = [d for d, _ in selected]
    whole = [d for d, only in selected if only is None]
    peers = {}
    for d in whole:
        for key, by_peer in load_peers(d).items():
            peers.setdefault(key, {}).update(by_peer)
    envs = []
    for d, only in selected:
        if os.path.exists(os.path.join(d, "env.json")):
            e = json.load(open(os.path.join(d, "env.json")))
            if only is not None:
                e["note"] = "; ".join(x for x in (e.get("note"), "rows taken from it: " + ", ".join(sorted(only)) +
                                                  " only") if x)
            envs.append((os.path.basename(os.path.normpath(d)), e))
    env = envs[-1][1] if envs else {}
    copy_gbs, gemm_tfs = ceilings(benchmarks)
    pts = roofline_points(benchmarks)
    gpu = (env.get("gpus") or ["unknown GPU"])[0].split(",")
    title = "Roofline of the eagle3 CUDA benchmarks" + (f", {gpu[1].strip()}" if len(gpu) > 1 else "")
    how = plot_roofline(args.out_png, pts, copy_gbs and copy_gbs * 1e9, gemm_tfs and gemm_tfs * 1e12,
                        not args.no_matplotlib, title)
    out_dir = os.path.dirname(os.path.abspath(args.out_md))
    notes_link = f"[{os.path.basename(args.notes)}]({os.path.relpath(os.path.abspath(args.notes), out_dir)})"

    md = ["# Benchmark results", "",
          "Generated by `benchmarks/make_results.py`; do not edit by hand. The summary's targets, verdicts and "
          f"end-to-end tables come from the hand-maintained [{os.path.basename(args.targets)}]"
          f"({os.path.relpath(os.path.abspath(args.targets), out_dir)}); every other figure is read from the "
          f"runs listed under \"Runs\". Predictions, explanations of each miss and the history: {notes_link}.", "",
          "Regenerate (repository root" + (", with a Python that imports matplotlib, e.g. Debian's python3-matplotlib"
                                           if how == "matplotlib" else "") + f"): `{command}`", ""]
    md += summary_lines(targets, benchmarks, peers, notes_link)
    md += ["## Runs", ""]
    if len(envs) > 1:
        md += ["Rows come from several runs (a newer run's row replaces an older one of the same shape; tables "
               "that mix runs have a `run` column):", ""]
    for run, e in envs or [("unknown", {})]:
        gpus = e.get("gpus") or ["unknown"]
        md += [f"- run `{run}`: GPU {'; '.join(gpus)}; driver {', '.join(e.get('driver', [])) or 'unknown'}; "
               f"CUDA {', '.join(e.get('nvcc', [])) or 'unknown'}; commit {e.get('commit', 'unknown')}"
               f"{' (with uncommitted changes)' if e.get('dirty') else ''}; command (GPU host, repository root): "
               f"`{e.get('command', 'benchmarks/run_all.sh')}`" + (f"; {e['note']}" if e.get("note") else "")]
    if copy_gbs:
        md.append(f"- measured ceilings: device-to-device copy {copy_gbs:.0f} GB/s (read + write counted, 1 GiB), "
                  f"cuBLASLt bf16 GEMM {gemm_tfs:.0f} TFLOP/s (8192³)")
    md += ["", "Timing: CUDA events around each run on the op's stream after warm-up, Google Benchmark manual "
           "time, median over repetitions; inputs rotated so their total exceeds twice the L2 where one set "
           "would fit. `floor µs` = max(bytes / copy rate, flops / GEMM rate) (collectives: bus bytes over the "
           "assumed NVLink rate); `of floor` = floor / median (1.0 = at the floor). Peer columns: the PyTorch "
           "peer's median on the same GPU and the speedup over it (peer µs ÷ ours). Model columns name the "
           "model a row ran: " + "; ".join(f"`{b}` " + ", ".join(f"{k} = {v}" for k, v in names.items())
                                           for b, names in MODEL_NAMES.items()) + ".", ""]
    for d in whole:
        status = os.path.join(d, "status.txt")
        if os.path.exists(status):
            failed = [l.strip() for l in open(status) if l.strip() and "rc=0" not in l]
            if failed:
                md += [f"Status of run `{os.path.basename(os.path.normpath(d))}` (its status.txt, lines other "
                       "than a clean `rc=0`: partial programs, commands, notes):", ""]
                md += [f"- {f}" for f in failed] + [""]
    md += ["## Tables", ""]
    for name, b in benchmarks.items():
        md += [f"## `{name}`", ""]
        if b.get("load_error"):
            md += [f"Could not read its JSON: {b['load_error']}", ""]
            continue
        if not b["rows"]:
            md += ["No rows (the binary failed before its first benchmark; see logs/).", ""]
            continue
        md += table(b["rows"], peers)
    md += fc_model(benchmarks)
    runs = sorted(glob.glob(os.path.join(here, "runs", "*")), reverse=True)
    given = {os.path.abspath(d) for d in args.indirs}
    md += e2e_model(benchmarks, [d for d in runs if os.path.abspath(d) not in given])
    md += ["## Roofline", "", f"![roofline]({os.path.basename(args.out_png)})", ""]
    if how == "matplotlib":
        md += ["Each benchmark row with both flops and bytes counted, placed by its arithmetic intensity "
               "(FLOP/byte) and achieved TFLOP/s on log-log axes, under the roof of the two ceilings measured "
               "in the same run (copy bandwidth × intensity, then the bf16 GEMM rate). Drawn by matplotlib.", ""]
    else:
        legend = ", ".join(f"{bench} = rgb{PALETTE[k % len(PALETTE)]}" for k, bench in enumerate(sorted(pts)))
        md += ["Drawn by the built-in rasterizer, which writes no text: x = arithmetic intensity, log, 1e-2 to "
               "1e4 FLOP/byte; y = achieved flop/s, log, 1e9 to 1e16; grid lines at decades; the black line is "
               f"the roof of the two measured ceilings. Colours: {legend}.", ""]
    with open(args.out_md, "w") as f:
        f.write("\n".join(md))


def regenerate_command(args, here):
    """The command line that regenerates this RESULTS.md, from the repository root."""
    root = os.path.dirname(here)

    def rel(path):
        return os.path.relpath(os.path.abspath(path), root)

    ins = []
    for a in args.indirs:
        d, only = split_run_arg(a)
        ins.append(rel(d) + ("=" + ",".join(sorted(only)) if only else ""))
    cmd = ["python3", "benchmarks/make_results.py", "--in"] + ins
    for flag, value, default in (("--out-md", args.out_md, "RESULTS.md"), ("--out-png", args.out_png, "roofline.png"),
                                 ("--targets", args.targets, "targets.json"), ("--notes", args.notes, "NOTES.md")):
        if os.path.abspath(value) != os.path.join(here, default):
            cmd += [flag, rel(value)]
    if args.no_matplotlib:
        cmd.append("--no-matplotlib")
    return " ".join(cmd)

if __name__ == "__main__":
    main()
