"""EAGLE-2 dynamic draft trees (tree.safetensors of a draft fixture, mtp_tree.safetensors of a target with
an MTP module): the first tree the decode loop builds after the prompt, written from the contract in
include/eagle3/draft_tree.h and the drafter's (include/eagle3/eagle3_drafter.h): an extend pass over the
prompt rows (row p pairs the target hidden at p with the token at p + 1; the last row's token is the root,
the target's argmax after the prompt), whose last row's logits give the root's children; then one masked
pass per step over the frontier. An independent implementation of the build over a drafter's reference:
only the reference's step (llama_draft.DraftReference, mla_draft.MlaDraftReference, mtp.MtpReference) is
shared with the draft-step fixtures.
"""

import math
import os

import torch

from .checkpoint import save_safetensors
from .deepseek_reference import MIN_ROUTING_MARGIN
from .oracle import max_rel


# Smallest gap (cumulative log-prob) accepted at every selection the tree depends on: the order of
# each expanded node's best k + 1 children, the order of each step's best k + 1 candidates (the
# frontier and its order), and the final cut between the last kept and the first dropped candidate.
# Another fp32 implementation's logits differ by ~1e-6, so a gap this size cannot flip.
MIN_TREE_MARGIN = 1e-4

TREE_SENSITIVITY = {
    "causal_tree": "tree rows attend every earlier tree row (plain causal) instead of their ancestors",
    "no_ancestors": "tree rows attend the extend rows and themselves only",
    "root_hidden": "every node fed the root's hidden instead of its parent's",
    "position_plus_one": "RoPE position T + d instead of (T - 1) + d",
    "position_flat": "every tree row at RoPE position T",
}


class DraftTreeDrafter:
    """The draft side of one build. Extend: rows 0..T-1 at positions 0..T-1 from the first-step
    hidden `g0` [T, H] (fc(aux) for an EAGLE-3 head, the target's final normed hidden for the MTP
    module), causal. A frontier node at depth d >= 1 is one new row: input hidden = its parent's
    fed-back hidden (the root's: the last extend row's), token = the node's target id, position
    (T - 1) + d; it attends every extend row, the tree rows of its ancestors (the root has none of its
    own: it is the last extend row) and itself. `ref` is any draft reference with step(tokens, g,
    positions, allowed), cache_len(), snapshot() and restore()."""

    def __init__(self, ref, g0, ext_tokens, variant=()):
        self.ref = ref
        self.t, self.variant = ext_tokens.shape[0], variant
        logits, fed = self.ref.step(ext_tokens, g0, torch.arange(self.t))
        self.root_logits = logits[-1]
        self.extend_cache = self.ref.snapshot()
        self.slot = {}              # candidate -> its tree row's cache slot
        self.hidden = {0: fed[-1]}  # candidate -> fed-back hidden
        self.expanded_logits = {}   # candidate -> its logits (for the path check)
        self.candidates = []

    def expand(self, candidates, frontier):
        self.candidates = candidates  # the build's list (grows in place)
        n, first = len(frontier), self.ref.cache_len()
        allowed = torch.zeros(n, first + n, dtype=torch.bool)
        allowed[:, :self.t] = True
        for i, c in enumerate(frontier):
            allowed[i, first + i] = True
            a = candidates[c]["parent"]
            while a > 0:
                allowed[i, self.slot[a]] = True
                a = candidates[a]["parent"]
        if "causal_tree" in self.variant:
            allowed[:, self.t:first] = True
            allowed[:, first:] = torch.ones(n, n, dtype=torch.bool).tril()
        if "no_ancestors" in self.variant:
            allowed[:, self.t:first] = False
        tokens = torch.tensor([candidates[c]["token"] for c in frontier], dtype=torch.int64)
        g = torch.stack([self.hidden[0 if "root_hidden" in self.variant else candidates[c]["parent"]]
                         for c in frontier])
        positions = torch.tensor([self.t - 1 + candidates[c]["depth"] for c in frontier])
        if "position_plus_one" in self.variant:
            positions = positions + 1
        if "position_flat" in self.variant:
            positions = torch.full((n,), self.t)
        logits, fed = self.ref.step(tokens, g, positions, allowed)
        for i, c in enumerate(frontier):
            self.slot[c] = first + i
            self.hidden[c] = fed[i]
            self.expanded_logits[c] = logits[i]
        return logits

    def path_check(self):
        """Each expanded node again, as a plain causal decode of its root path (one row per ancestor,
        then itself) after the extend rows: what the tree mask must reproduce. Returns the largest
        max |diff| / max |value| over the nodes."""
        err, candidates = 0.0, self.candidates
        for c, want in self.expanded_logits.items():
            path = []
            a = c
            while a > 0:
                path.append(a)
                a = candidates[a]["parent"]
            self.ref.restore(self.extend_cache)
            g = self.hidden[0]
            for node in reversed(path):
                logits, fed = self.ref.step(torch.tensor([candidates[node]["token"]]), g[None],
                                            torch.tensor([self.t - 1 + candidates[node]["depth"]]))
                g = fed[0]
            err = max(err, max_rel(logits[0], want))
        return err


def build_reference_tree(root, root_logits, expand, topk, num_steps, num_draft_tokens, d2t):
    """EAGLE-2 build as draft_tree.h documents it. Candidate 0 is the root; each step appends, per
    frontier node in frontier order, its top-k children best first (ties: lower draft id), scored
    parent score + log_softmax(logits in double); the next frontier is the best k of the step's
    candidates (ties: lower candidate index); finally the best num_draft_tokens - 1 candidates over all
    steps, in candidate order. Returns tokens, parents, scores (float64) and the smallest gap at a
    selection the result depends on, with where it was."""
    cands = [{"token": root, "parent": -1, "depth": 0, "score": 0.0}]
    margin = (math.inf, "")

    def note(values, what):
        nonlocal margin
        for i in range(len(values) - 1):
            gap = values[i] - values[i + 1]
            if gap < margin[0]:
                margin = (gap, f"{what}, ranks {i}/{i + 1}")

    def by_score(ids):
        return sorted(ids, key=lambda c: (-cands[c]["score"], c))

    frontier = [0]
    for step in range(num_steps):
        logits = root_logits[None] if step == 0 else expand(cands, frontier)
        assert logits.shape == (len(frontier), len(d2t))
        logp = torch.log_softmax(logits.double(), -1)
        step_cands = []
        for r, parent in enumerate(frontier):
            row = logits[r].tolist()
            ranked = sorted(range(len(row)), key=lambda j: (-row[j], j))
            note([logp[r, j].item() for j in ranked[:topk + 1]], f"step {step} children of candidate {parent}")
            for j in ranked[:topk]:
                step_cands.append(len(cands))
                cands.append({"token": j + int(d2t[j]), "parent": parent, "depth": cands[parent]["depth"] + 1,
                              "score": cands[parent]["score"] + logp[r, j].item()})
        if step + 1 < num_steps:
            ranked = by_score(step_cands)
            note([cands[c]["score"] for c in ranked[:topk + 1]], f"step {step} frontier")
            frontier = ranked[:topk]
    ranked = by_score(range(1, len(cands)))
    keep = num_draft_tokens - 1
    note([cands[c]["score"] for c in ranked[keep - 1:keep + 1]], "final cut")
    kept = sorted(ranked[:keep])
    node = {0: 0}
    tokens, parents, scores = [root], [-1], [0.0]
    for c in kept:
        assert cands[c]["parent"] in node, "a kept candidate without its parent"
        node[c] = len(tokens)
        tokens.append(cands[c]["token"])
        parents.append(node[cands[c]["parent"]])
        scores.append(cands[c]["score"])
    return tokens, parents, scores, margin


def build_tree_fixture(spec, directory, make_drafter, d2t, target_expected, log, file="tree.safetensors"):
    """`file` (tree.safetensors): the trees of spec["trees"] after the target fixture's prompt, drafted by
    make_drafter(ext_tokens, dtype, variant) -> DraftTreeDrafter. A reference that routes (the MTP
    module's MoE) reports its smallest routing gap as `ref.margin`, which must be at least
    MIN_ROUTING_MARGIN. Returns the README facts."""
    prompt = target_expected["tokens"].to(torch.int64)
    last = target_expected["logits"][-1].double()
    top2 = last.topk(2).values
    root = int(last.argmax())
    root_gap = (top2[0] - top2[1]).item()
    if root_gap < MIN_TREE_MARGIN:
        raise SystemExit(f"{spec['name']}: the target's top-2 logits after the prompt are {root_gap:.1e} apart")
    ext_tokens = torch.cat([prompt[1:], torch.tensor([root])])
    expected = {"prompt": prompt, "tokens": ext_tokens, "root": torch.tensor([root], dtype=torch.int64)}
    trees, fp64_err, path_err, margin = [], 0.0, 0.0, (math.inf, "")
    for name, topk, num_steps, num_draft_tokens in spec["trees"]:
        built = {}
        for dtype in (torch.float32, torch.float64):
            drafter = make_drafter(ext_tokens, dtype)
            built[dtype] = build_reference_tree(root, drafter.root_logits, drafter.expand, topk, num_steps,
                                                num_draft_tokens, d2t)
            if dtype == torch.float32:
                root_logits = drafter.root_logits
                path_err = max(path_err, drafter.path_check())
                routing_margin = getattr(drafter.ref, "margin", math.inf)
                if routing_margin < MIN_ROUTING_MARGIN:
                    raise SystemExit(f"{spec['name']} tree {name}: routing near-tie {routing_margin:.1e}")
        tokens, parents, scores, m = built[torch.float32]
        if (tokens, parents) != built[torch.float64][:2]:
            raise SystemExit(f"{spec['name']} tree {name}: the fp32 and fp64 builds differ")
        fp64_err = max(fp64_err, max(abs(a - b) for a, b in zip(scores, built[torch.float64][2])))
        if m[0] < MIN_TREE_MARGIN:
            raise SystemExit(f"{spec['name']} tree {name}: near-tie {m[0]:.1e} at {m[1]}")
        if m[0] < margin[0]:
            margin = (m[0], f"{name}: {m[1]}")
        expected[f"{name}.params"] = torch.tensor([topk, num_steps, num_draft_tokens], dtype=torch.int64)
        expected[f"{name}.tree_tokens"] = torch.tensor(tokens, dtype=torch.int64)
        expected[f"{name}.tree_parents"] = torch.tensor(parents, dtype=torch.int32)
        expected[f"{name}.tree_scores"] = torch.tensor(scores, dtype=torch.float64).float()
        trees.append({"name": name, "params": (topk, num_steps, num_draft_tokens), "tokens": tokens,
                      "parents": parents, "scores": scores})
        log(f"{spec['name']} tree {name}: tokens {tokens}, parents {parents}, smallest gap {m[0]:.2e} ({m[1]})")
    # What a mistake in the drafter's tree rows would change (fp64): trees whose tokens or parents
    # change, and the largest score difference over the kept nodes.
    sensitivity = {}
    for variant in TREE_SENSITIVITY:
        changed, worst = 0, 0.0
        for (name, topk, num_steps, num_draft_tokens), t in zip(spec["trees"], trees):
            drafter = make_drafter(ext_tokens, torch.float64, (variant,))
            v = build_reference_tree(root, drafter.root_logits, drafter.expand, topk, num_steps, num_draft_tokens, d2t)
            changed += (v[0], v[1]) != (t["tokens"], t["parents"])
            worst = max(worst, max(abs(a - b) for a, b in zip(v[2], t["scores"])))
        sensitivity[variant] = (changed, worst)
    if fp64_err > 1e-5 or path_err > 1e-5:
        raise SystemExit(f"{spec['name']} trees: fp32 vs fp64 scores {fp64_err:.1e}, tree mask vs path decode "
                         f"{path_err:.1e}")
    expected["root_logits"] = root_logits.float().contiguous()
    metadata = {"model": spec["name"], "target": spec["target"], "torch": torch.__version__,
                "oracle": "independent EAGLE-2 tree build over the fp32 draft reference",
                "trees": " ".join(t[0] for t in spec["trees"])}
    save_safetensors(os.path.join(directory, file), expected, metadata)
    return {"root": root, "root_gap": root_gap, "trees": trees, "fp64_err": fp64_err, "path_err": path_err,
            "margin": margin, "sensitivity": sensitivity}


def tree_margin_ok(spec, make_drafter, target_expected, d2t):
    """Whether every tree of spec["trees"] (fp64) has selection gaps >= 2 MIN_TREE_MARGIN."""
    prompt = target_expected["tokens"].to(torch.int64)
    root = int(target_expected["logits"][-1].double().argmax())
    ext_tokens = torch.cat([prompt[1:], torch.tensor([root])])
    for _, topk, num_steps, num_draft_tokens in spec["trees"]:
        drafter = make_drafter(ext_tokens, torch.float64)
        margin = build_reference_tree(root, drafter.root_logits, drafter.expand, topk, num_steps, num_draft_tokens,
                                      d2t)[3]
        if margin[0] < 2 * MIN_TREE_MARGIN:
            return False
    return True
