"""The code corpus: Python sources available offline, split into train and held-out by file.

Roots: the standard library (sysconfig's "stdlib") and the running interpreter's site-packages
(sysconfig's purelib/platlib and site.getsitepackages()). Files: *.py, at most 1 MB, valid UTF-8,
deduplicated by content hash (the first path in sorted order wins). A file is held out when
sha1(its path relative to its root) % 50 == 0: a property of the file alone, so the split does not
depend on which other files a host has.
"""

import dataclasses
import hashlib
import os
import random
import site
import sysconfig

import numpy as np
import torch

from progress import log

MAX_FILE_BYTES = 1 << 20
HELDOUT_MODULUS = 50
EOT = "<|endoftext|>"


@dataclasses.dataclass
class Document:
    path: str      # absolute
    relpath: str   # relative to its root; decides the split
    text: str


@dataclasses.dataclass
class Corpus:
    train: list    # [Document], seeded shuffled order
    heldout: list  # [Document], sorted by path
    stats: dict    # counts and bytes, for train_log.json


def corpus_roots():
    """(label, directory) pairs, deduplicated, existing directories only."""
    paths = sysconfig.get_paths()
    candidates = [("stdlib", paths["stdlib"]), ("site", paths["purelib"]), ("site", paths["platlib"])]
    candidates += [("site", p) for p in site.getsitepackages()]
    roots, seen = [], set()
    for label, d in candidates:
        real = os.path.realpath(d)
        if os.path.isdir(real) and real not in seen:
            seen.add(real)
            roots.append((label, real))
    return roots


def is_heldout(relpath):
    digest = hashlib.sha1(relpath.encode("utf-8")).digest()
    return int.from_bytes(digest[:8], "little") % HELDOUT_MODULUS == 0


def scan(roots):
    """Every *.py file under the roots: sorted (absolute path, path relative to its root). A file under
    two roots (site-packages inside the stdlib tree) is kept once, relative to the deeper root."""
    found = {}
    for _, root in sorted(roots, key=lambda r: len(r[1])):
        for directory, dirs, files in os.walk(root):
            dirs.sort()
            for name in files:
                if name.endswith(".py"):
                    path = os.path.join(directory, name)
                    found[path] = os.path.relpath(path, root)
    return sorted(found.items())


def load_corpus(seed, max_train_bytes=None):
    """Reads, filters, deduplicates and splits the corpus. The training files are shuffled with the seed
    and, with max_train_bytes, cut to a prefix of that order (so a cap keeps a spread of packages)."""
    roots = corpus_roots()
    stats = {"roots": [r for _, r in roots], "files_seen": 0, "skipped_large": 0, "skipped_not_utf8": 0,
             "skipped_duplicate": 0, "skipped_empty": 0}
    hashes = set()
    train, heldout = [], []
    for path, relpath in scan(roots):
        stats["files_seen"] += 1
        try:
            if os.path.getsize(path) > MAX_FILE_BYTES:
                stats["skipped_large"] += 1
                continue
            with open(path, "rb") as f:
                raw = f.read()
        except OSError:
            stats["skipped_not_utf8"] += 1  # unreadable counts with the undecodable
            continue
        if len(raw) > MAX_FILE_BYTES:
            stats["skipped_large"] += 1
            continue
        if not raw.strip():
            stats["skipped_empty"] += 1
            continue
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError:
            stats["skipped_not_utf8"] += 1
            continue
        digest = hashlib.sha256(raw).digest()
        if digest in hashes:
            stats["skipped_duplicate"] += 1
            continue
        hashes.add(digest)
        (heldout if is_heldout(relpath) else train).append(Document(path, relpath, text))
    random.Random(seed).shuffle(train)
    stats["train_files_available"] = len(train)
    stats["train_bytes_available"] = sum(len(d.text.encode("utf-8")) for d in train)
    if max_train_bytes is not None:
        kept, total = [], 0
        for d in train:
            if total >= max_train_bytes:
                break
            kept.append(d)
            total += len(d.text.encode("utf-8"))
        train = kept
    stats["train_files"] = len(train)
    stats["train_bytes"] = sum(len(d.text.encode("utf-8")) for d in train)
    stats["heldout_files"] = len(heldout)
    stats["heldout_bytes"] = sum(len(d.text.encode("utf-8")) for d in heldout)
    log(f"corpus: {stats['files_seen']} .py files under {len(roots)} roots; train {stats['train_files']} files "
        f"{stats['train_bytes'] / 1e6:.1f} MB (of {stats['train_bytes_available'] / 1e6:.1f} MB), held out "
        f"{stats['heldout_files']} files {stats['heldout_bytes'] / 1e6:.1f} MB; skipped {stats['skipped_duplicate']} "
        f"duplicates, {stats['skipped_large']} > 1 MB, {stats['skipped_not_utf8']} not UTF-8")
    return Corpus(train, heldout, stats)


def write_heldout_list(corpus, path):
    with open(path, "w") as f:
        for d in corpus.heldout:
            f.write(d.path + "\n")


def pack(token_lists, eot_id):
    """One int32 stream: each document followed by <|endoftext|>."""
    total = sum(len(t) + 1 for t in token_lists)
    stream = np.empty(total, dtype=np.int32)
    at = 0
    for tokens in token_lists:
        stream[at:at + len(tokens)] = tokens
        at += len(tokens)
        stream[at] = eot_id
        at += 1
    return stream


class WindowSampler:
    """Random windows of `length` tokens from a packed stream, drawn with a seeded generator."""

    def __init__(self, stream, length, seed):
        self.stream = torch.from_numpy(stream.astype(np.int64))
        self.length = length
        self.generator = torch.Generator().manual_seed(seed)
        if len(stream) < length + 1:
            raise ValueError(f"the token stream ({len(stream)} tokens) is shorter than one window ({length})")

    def batch(self, batch_size):
        starts = torch.randint(0, len(self.stream) - self.length + 1, (batch_size,), generator=self.generator)
        return torch.stack([self.stream[s:s + self.length] for s in starts.tolist()])


def fixed_windows(stream, length, max_windows):
    """Non-overlapping windows from the start of the stream (the held-out evaluation set)."""
    count = min(len(stream) // length, max_windows)
    return torch.from_numpy(stream[:count * length].astype(np.int64)).view(count, length)
