#!/usr/bin/env python3
"""FlashMLA's Hopper dense decode, built from its public source and timed on the shapes of eagle3's
BM_BatchedLatentAttention (issue 18, "Measures": the MLA rows beside FlashMLA itself).

Two subcommands, both run by build_and_bench.sh:

  build  --src DIR --build DIR      compile the extension (torch.utils.cpp_extension.load, ninja,
                                    sm_90a only) from dense_api.cpp + the three FlashMLA sources
  bench  --src DIR --build DIR --out DIR [--deadline-s N]
                                    load it (no recompilation), check it against an fp32 PyTorch
                                    reference on four small shapes, then time every shape

What is timed, per shape (one latent KV head: bf16 cache [num_blocks, 64, 1, 576], values = the first
512 columns, block table a random permutation of the blocks, cache_seqlens = context for every
sequence, q [batch, qtokens, heads, 576] bf16, causal within the new tokens when qtokens > 1,
softmax scale 1/sqrt(576)):

  us_kernel          dense_decode_fwd given precomputed scheduling metadata: the sm90 split-KV
                     kernel + the combine kernel (+ the call's output allocations)
  us_with_metadata   dense_decode_fwd given no metadata: the scheduling-metadata kernel first, as
                     flash_mla_with_kvcache's first call with a fresh get_mla_metadata() object does
  us_metadata        the scheduling-metadata kernel alone (get_decoding_sched_meta of dense_api.cpp)

Each is the median of REPS (30) CUDA-event timings, one per call, after WARMUP (5) untimed calls,
rotating through enough copies of the KV cache (at most 128) that together they exceed twice the L2
(as benchmarks/peers/_common.py and benchmarks/cuda/bench_util.h do), so no call finds its cache in
L2. Two timing modes, both reported:
  *_graph  (the primary figures, columns us_kernel / us_with_metadata / us_metadata): each call
           captured once per cache copy in a CUDA graph; the event pair brackets one graph replay,
           so the host's launch path (pybind, TMA descriptor encoding, allocations) is not counted
           (bench_util.h's RunTimedInGraph does the same for ops a decode step runs from a graph).
  *_eager  the same calls launched eagerly, the event pair bracketing the Python call (the host path
           counts where it is longer than the GPU work, as in benchmarks/peers/mla_peer.py).
If a graph capture fails the *_graph fields are null and the primary columns fall back to eager
(field "timing" says which).

bytes = batch x context x 576 x 2 (each cached row read once) + q (bf16) + out (bf16, 512 wide);
GB_s = bytes / us_kernel; copy_GB_s = read + write bytes per second of a 1 GiB device-to-device copy
measured in the same run (bench_util.h's copy ceiling); frac_of_copy = GB_s / copy_GB_s.
"""
import argparse
import json
import math
import os
import sys
import time

W, DV, PAGE = 576, 512, 64
WARMUP, REPS = 5, 30
MAX_CACHE_BYTES = 60e9  # skip shapes whose cache copies would exceed this
DEV = "cuda"


def log(msg):
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


# ---------------------------------------------------------------------------------------- build
def extension_args(src, build_dir):
    from torch.utils.cpp_extension import CUDA_HOME
    fm = os.path.join(src, "FlashMLA")
    cutlass = os.path.join(src, "cutlass")
    here = os.path.dirname(os.path.abspath(__file__))
    binding = os.path.join(src, "dense_api.cpp")
    if not os.path.exists(binding):
        binding = os.path.join(here, "dense_api.cpp")
    sources = [
        binding,
        os.path.join(fm, "csrc/smxx/decode/get_decoding_sched_meta/get_decoding_sched_meta.cu"),
        os.path.join(fm, "csrc/smxx/decode/combine/combine.cu"),
        os.path.join(fm, "csrc/sm90/decode/dense/instantiations/bf16.cu"),
    ]
    # FlashMLA setup.py's flags (nvcc list verbatim), with fp16 and sm100 left out.
    cxx = ["-O3", "-std=c++20", "-DNDEBUG", "-Wno-deprecated-declarations", "-DFLASH_MLA_DISABLE_FP16",
           # CUDA 13 moved libcu++ (cuda/std/...) under include/cccl; nvcc adds it, the host compiler
           # (which compiles dense_api.cpp -> dense_decode.h -> cutlass/half.h) does not.
           f"-I{os.path.join(CUDA_HOME, 'include', 'cccl')}"]
    nvcc = [
        "-O3", "-std=c++20", "-DNDEBUG", "-D_USE_MATH_DEFINES", "-Wno-deprecated-declarations",
        "-U__CUDA_NO_HALF_OPERATORS__", "-U__CUDA_NO_HALF_CONVERSIONS__", "-U__CUDA_NO_HALF2_OPERATORS__",
        "-U__CUDA_NO_BFLOAT16_CONVERSIONS__", "--expt-relaxed-constexpr", "--expt-extended-lambda",
        "--use_fast_math",
        "--ptxas-options=-v,--register-usage-level=10,--warn-on-spills,--warn-on-local-memory-usage,"
        "--warn-on-double-precision-use",
        "-lineinfo",
        "-DFLASH_MLA_DISABLE_FP16",
        # An explicit -gencode: torch then adds no arch flags of its own (no compute_90 without 'a',
        # which the wgmma / setmaxnreg code of the kernel cannot be built for).
        "-gencode", "arch=compute_90a,code=sm_90a",
    ]
    includes = [
        os.path.join(fm, "csrc"),
        os.path.join(fm, "csrc", "kerutils", "include"),
        os.path.join(fm, "csrc", "sm90"),
        os.path.join(fm, "csrc", "api"),
        os.path.join(cutlass, "include"),
    ]
    return dict(name="flash_mla_dense_sm90", sources=sources, extra_cflags=cxx, extra_cuda_cflags=nvcc,
                extra_include_paths=includes, build_directory=build_dir, with_cuda=True)


def load_extension(src, build_dir, verbose):
    os.environ.setdefault("TORCH_CUDA_ARCH_LIST", "9.0a")
    os.environ.setdefault("MAX_JOBS", "16")
    os.makedirs(build_dir, exist_ok=True)
    import subprocess
    import torch
    import torch.utils.cpp_extension as ce
    from torch.utils.cpp_extension import load
    # torch refuses to build with an nvcc of another major version than its own CUDA. The kit is
    # meant for a CUDA 13 torch beside CUDA 13 nvcc; should they differ there is no other compiler
    # to use offline, so say so and build anyway (the extension then brings its own libcudart).
    try:
        out = subprocess.check_output([os.path.join(ce.CUDA_HOME, "bin", "nvcc"), "--version"]).decode()
        nvcc_ver = out.split("release ")[1].split(",")[0].strip()
    except Exception:  # torch's own check reports a missing nvcc
        nvcc_ver = None
    if nvcc_ver and torch.version.cuda and nvcc_ver.split(".")[0] != torch.version.cuda.split(".")[0]:
        log(f"WARNING: nvcc {nvcc_ver} but torch built with CUDA {torch.version.cuda}: bypassing torch's "
            "version check (two CUDA runtimes in one process; figures still valid if it runs)")
        ce._check_cuda_version = lambda *a, **k: None
    return load(verbose=verbose, **extension_args(src, build_dir))


def cmd_build(args):
    t0 = time.time()
    log(f"building FlashMLA dense decode (sm_90a) in {args.build} with MAX_JOBS={os.environ.get('MAX_JOBS', '16')}")
    load_extension(args.src, args.build, verbose=True)
    log(f"build done in {time.time() - t0:.1f} s")


# ---------------------------------------------------------------------------------------- bench
def shapes():
    """(heads, context, batch, qtokens), cheapest and most-cited first so a deadline cuts the tail."""
    rows = [(16, c, b, 1) for c in (1024, 4096, 16384, 65536) for b in (1, 8, 32, 64)]
    rows += [(16, 4096, b, t) for b in (1, 8, 32) for t in (8, 32, 64)]
    rows += [(128, c, b, 1) for c in (1024, 4096, 16384, 65536) for b in (1, 8, 32, 64)]
    return rows


def copies_to_defeat_l2(nbytes, l2, max_copies=128):
    if nbytes <= 0:
        return 1
    return max(1, min(max_copies, int(2 * l2 / nbytes) + 1))


def median(xs):
    xs = sorted(xs)
    n = len(xs)
    return xs[n // 2] if n % 2 else 0.5 * (xs[n // 2 - 1] + xs[n // 2])


def time_calls(torch, fn, n_inputs):
    """Median CUDA-event time (us) of fn(i), i rotating over n_inputs; WARMUP untimed calls first."""
    for i in range(WARMUP):
        fn(i % n_inputs)
    torch.cuda.synchronize()
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(REPS)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(REPS)]
    times = []
    for r in range(REPS):
        starts[r].record()
        fn((WARMUP + r) % n_inputs)
        ends[r].record()
        ends[r].synchronize()
        times.append(starts[r].elapsed_time(ends[r]) * 1e3)
    return median(times), min(times)


def make_graphs(torch, call, n_inputs, pool):
    """One CUDA graph of call(i) per input i, captured on a side stream after one warm-up call per
    input there. (capture_begin / capture_end directly: torch.cuda.graph() would also run
    gc.collect() and empty_cache() for each of up to 128 captures.)"""
    graphs, keep = [], []
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for i in range(n_inputs):
            call(i)
        side.synchronize()
        for i in range(n_inputs):
            g = torch.cuda.CUDAGraph()
            g.capture_begin(pool=pool)
            try:
                keep.append(call(i))
            finally:
                g.capture_end()
            graphs.append(g)
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    return graphs, keep


def measure_copy_rate(torch):
    n = 1 << 30
    src = torch.empty(n, dtype=torch.uint8, device=DEV).random_()
    dst = torch.empty_like(src)
    us, _ = time_calls(torch, lambda i: dst.copy_(src), 1)
    del src, dst
    torch.cuda.empty_cache()
    return 2.0 * n / (us * 1e-6) / 1e9


def make_inputs(torch, heads, context, batch, qtok, n_copies, seed):
    g = torch.Generator(device=DEV)
    g.manual_seed(seed)
    pages = (context + PAGE - 1) // PAGE
    num_blocks = batch * pages
    caches = []
    for _ in range(n_copies):
        caches.append(torch.randn(num_blocks, PAGE, 1, W, device=DEV, dtype=torch.bfloat16, generator=g))
    perm = torch.randperm(num_blocks, device="cpu", generator=torch.Generator().manual_seed(seed))
    block_table = perm.to(torch.int32).view(batch, pages).to(DEV)
    seqlens = torch.full((batch,), context, dtype=torch.int32, device=DEV)
    # N(0, 1) rows and queries: scores q.k / 24 of unit spread, a softmax far from uniform (a kernel that
    # read the wrong rows would fail the check).
    q = torch.randn(batch, qtok, heads, W, device=DEV, dtype=torch.bfloat16, generator=g)
    return caches, block_table, seqlens, q


def reference(torch, q, cache, block_table, seqlens, scale, causal):
    """fp32 attention of every sequence over its gathered latent rows (FlashMLA tests/ref semantics:
    query i of s_q attends keys j <= i + s_k - s_q when causal)."""
    b, s_q, h, _ = q.shape
    out = torch.empty(b, s_q, h, DV, dtype=torch.float32, device=q.device)
    for i in range(b):
        s_k = int(seqlens[i].item())
        nb = (s_k + PAGE - 1) // PAGE
        kv = cache[block_table[i, :nb].long()].reshape(-1, W)[:s_k].float()  # [s_k, 576]
        qq = q[i].float().transpose(0, 1)  # [h, s_q, 576]
        s = (qq @ kv.t()) * scale  # [h, s_q, s_k]
        if causal and s_q > 1:
            mask = torch.ones(s_q, s_k, dtype=torch.bool, device=q.device).tril(diagonal=s_k - s_q)
            s = s.masked_fill(~mask, float("-inf"))
        p = torch.softmax(s, dim=-1)
        out[i] = (p @ kv[:, :DV]).transpose(0, 1)
    return out


def check(torch, mod, rows):
    ok_all = True
    for heads, context, batch, qtok in rows:
        caches, bt, sl, q = make_inputs(torch, heads, context, batch, qtok, 1, seed=11)
        scale = 1.0 / math.sqrt(W)
        causal = qtok > 1
        out, lse, _, _ = mod.dense_decode_fwd(q, caches[0], DV, sl, bt, scale, causal, None, None)
        meta, splits = mod.get_decoding_sched_meta(sl, qtok, heads, 1)
        out2, _, _, _ = mod.dense_decode_fwd(q, caches[0], DV, sl, bt, scale, causal, meta, splits)
        ref = reference(torch, q, caches[0], bt, sl, scale, causal)
        diff = (out.float() - ref).abs()
        err = diff.max().item()
        err2 = (out2.float() - out.float()).abs().max().item()
        mag = ref.abs().max().item()
        # FlashMLA's own test tolerance for bf16 (tests/test_flash_mla_dense_decoding.py): abs 8e-4 +
        # rel 2/128, elementwise; here abs 2e-3. Given or computed metadata must agree.
        within = bool((diff <= 2e-3 + (2.01 / 128) * ref.abs()).all().item())
        ok = bool(torch.isfinite(out.float()).all().item()) and within and err2 <= 1e-3 * mag
        ok_all &= ok
        log(f"check heads={heads} context={context} batch={batch} qtokens={qtok} causal={causal}: "
            f"max|out-ref|={err:.3e} (max|ref|={mag:.3e}), metadata-given vs not: {err2:.1e} -> {'ok' if ok else 'FAIL'}")
        del caches, q, out, out2, ref
    torch.cuda.empty_cache()
    return ok_all


def bench_row(torch, mod, heads, context, batch, qtok, l2, copy_gbs):
    pages = (context + PAGE - 1) // PAGE
    cache_bytes = batch * pages * PAGE * W * 2
    copies = copies_to_defeat_l2(cache_bytes, l2)
    row = {"heads": heads, "context": context, "batch": batch, "qtokens": qtok, "page": PAGE,
           "dtype": "bf16", "copies": copies}
    if cache_bytes * copies > MAX_CACHE_BYTES:
        row["skipped"] = f"cache {cache_bytes * copies / 1e9:.1f} GB > {MAX_CACHE_BYTES / 1e9:.0f} GB"
        return row
    caches, bt, sl, q = make_inputs(torch, heads, context, batch, qtok, copies, seed=1)
    scale = 1.0 / math.sqrt(W)
    causal = qtok > 1
    meta, splits = mod.get_decoding_sched_meta(sl, qtok, heads, 1)
    torch.cuda.synchronize()
    row["num_sm_parts"] = int(meta.shape[0])

    def with_meta(i):
        return mod.dense_decode_fwd(q, caches[i], DV, sl, bt, scale, causal, None, None)

    def kernel_only(i):
        return mod.dense_decode_fwd(q, caches[i], DV, sl, bt, scale, causal, meta, splits)

    def meta_only(i):
        return mod.get_decoding_sched_meta(sl, qtok, heads, 1)

    row["us_kernel_eager"], row["us_kernel_eager_min"] = time_calls(torch, kernel_only, copies)
    row["us_with_metadata_eager"], _ = time_calls(torch, with_meta, copies)
    row["us_metadata_eager"], _ = time_calls(torch, meta_only, 1)
    try:
        pool = torch.cuda.graph_pool_handle()  # one pool for the row's graphs, released with them
        gk, keep_k = make_graphs(torch, kernel_only, copies, pool)
        row["us_kernel_graph"], row["us_kernel_graph_min"] = time_calls(torch, lambda i: gk[i].replay(), copies)
        gm, keep_m = make_graphs(torch, with_meta, copies, pool)
        row["us_with_metadata_graph"], _ = time_calls(torch, lambda i: gm[i].replay(), copies)
        g0, keep_0 = make_graphs(torch, meta_only, 1, pool)
        row["us_metadata_graph"], _ = time_calls(torch, lambda i: g0[i].replay(), 1)
        del gk, gm, g0, keep_k, keep_m, keep_0
        row["timing"] = "graph"
    except Exception as e:  # graph capture of this call failed: keep the eager figures
        row["graph_error"] = f"{type(e).__name__}: {e}"[:300]
        for k in ("us_kernel_graph", "us_with_metadata_graph", "us_metadata_graph"):
            row[k] = None
        row["timing"] = "eager"
        torch.cuda.synchronize()
    mode = row["timing"]
    row["us_kernel"] = row[f"us_kernel_{mode}"]
    row["us_with_metadata"] = row[f"us_with_metadata_{mode}"]
    row["us_metadata"] = row[f"us_metadata_{mode}"]
    t = batch * qtok
    row["bytes"] = batch * context * W * 2 + t * heads * W * 2 + t * heads * DV * 2
    row["flops"] = t * heads * context * 2 * (W + DV)
    row["GB_s"] = row["bytes"] / (row["us_kernel"] * 1e-6) / 1e9
    row["TFLOP_s"] = row["flops"] / (row["us_kernel"] * 1e-6) / 1e12
    row["copy_GB_s"] = copy_gbs
    row["frac_of_copy"] = row["GB_s"] / copy_gbs
    del caches, q, bt, sl, meta, splits
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    return row


CSV_COLS = ["heads", "context", "batch", "qtokens", "us_kernel", "us_with_metadata", "us_metadata",
            "bytes", "GB_s", "frac_of_copy", "timing", "us_kernel_eager", "us_with_metadata_eager",
            "us_kernel_graph", "us_with_metadata_graph", "num_sm_parts", "copies", "skipped"]


def cmd_bench(args):
    t_start = time.time()
    import torch
    if not torch.cuda.is_available():
        log("no CUDA device visible; nothing to measure")
        return 2
    props = torch.cuda.get_device_properties(0)
    cap = torch.cuda.get_device_capability(0)
    l2 = getattr(props, "L2_cache_size", 0) or (50 << 20)
    log(f"device {props.name} sm_{cap[0]}{cap[1]} SMs={props.multi_processor_count} L2={l2 >> 20} MiB "
        f"mem={props.total_memory / 2**30:.0f} GiB torch {torch.__version__} cuda {torch.version.cuda}")
    if cap != (9, 0):
        log("FlashMLA's dense decode runs on sm_90 (Hopper) only; stopping")
        return 2
    t0 = time.time()
    mod = load_extension(args.src, args.build, verbose=False)
    log(f"extension loaded in {time.time() - t0:.1f} s")
    os.makedirs(args.out, exist_ok=True)
    env = {"device": props.name, "sms": props.multi_processor_count, "l2_bytes": l2,
           "torch": torch.__version__, "cuda": torch.version.cuda,
           "flashmla_commit": open(os.path.join(args.src, "FlashMLA", "COMMIT")).read().split()[3],
           "cutlass_commit": open(os.path.join(args.src, "cutlass", "COMMIT")).read().split()[3],
           "warmup": WARMUP, "reps": REPS}

    with torch.inference_mode():
        ok = check(torch, mod, [(16, 1024, 2, 1), (128, 4096, 2, 1), (16, 4096, 2, 8), (16, 4096, 1, 64)])
        env["check"] = "ok" if ok else "FAIL"
        copy_gbs = measure_copy_rate(torch)
        env["copy_GB_s"] = copy_gbs
        log(f"device-to-device copy (1 GiB, read + write): {copy_gbs:.0f} GB/s")
        with open(os.path.join(args.out, "env.json"), "w") as f:
            json.dump(env, f, indent=1)

        jpath = os.path.join(args.out, "flashmla_rows.jsonl")
        cpath = os.path.join(args.out, "flashmla_rows.csv")
        with open(jpath, "w") as jf, open(cpath, "w") as cf:
            cf.write(",".join(CSV_COLS) + "\n")
            for heads, context, batch, qtok in shapes():
                if args.deadline_s and time.time() - t_start > args.deadline_s:
                    row = {"heads": heads, "context": context, "batch": batch, "qtokens": qtok,
                           "skipped": f"deadline {args.deadline_s} s reached"}
                else:
                    t_row = time.time()
                    try:
                        row = bench_row(torch, mod, heads, context, batch, qtok, l2, copy_gbs)
                    except Exception as e:  # keep going: one failing shape must not lose the rest
                        row = {"heads": heads, "context": context, "batch": batch, "qtokens": qtok,
                               "error": f"{type(e).__name__}: {e}"[:500]}
                        torch.cuda.synchronize()
                        torch.cuda.empty_cache()
                    row["row_s"] = round(time.time() - t_row, 2)
                row["peer"] = "FlashMLA dense decode (sm90, bf16)"
                jf.write(json.dumps(row) + "\n")
                jf.flush()
                cf.write(",".join("" if row.get(c) is None else (f"{row[c]:.3f}" if isinstance(row[c], float) else str(row[c]))
                                  for c in CSV_COLS) + "\n")
                cf.flush()
                if "us_kernel" in row:
                    log(f"h={heads:3d} ctx={context:5d} b={batch:2d} t={qtok:2d}: kernel {row['us_kernel']:8.1f} us "
                        f"(+metadata {row['us_with_metadata']:8.1f}, metadata alone {row['us_metadata']:5.1f}; "
                        f"eager {row['us_kernel_eager']:8.1f} / {row['us_with_metadata_eager']:8.1f}) "
                        f"{row['GB_s']:6.0f} GB/s = {row['frac_of_copy']:.2f} of copy [{row['timing']}, "
                        f"{row['copies']} copies, {row['row_s']} s]")
                else:
                    log(f"h={heads:3d} ctx={context:5d} b={batch:2d} t={qtok:2d}: "
                        f"{row.get('skipped') or row.get('error')}")
    log(f"bench done in {time.time() - t_start:.1f} s; rows in {jpath} and {cpath}")
    return 0 if ok else 1


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("cmd", choices=["build", "bench"])
    ap.add_argument("--src", required=True, help="unpacked kit (holds FlashMLA/ and cutlass/)")
    ap.add_argument("--build", required=True, help="build directory of the extension")
    ap.add_argument("--out", help="output directory (bench)")
    ap.add_argument("--deadline-s", type=float, default=0, help="bench: skip the remaining shapes after this many s")
    args = ap.parse_args()
    if args.cmd == "build":
        cmd_build(args)
        return 0
    if not args.out:
        ap.error("bench needs --out")
    return cmd_bench(args)


if __name__ == "__main__":
    sys.exit(main())
