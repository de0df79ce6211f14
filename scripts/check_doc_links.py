#!/usr/bin/env python3
"""Checks that the repository's documentation references resolve to files that exist.

    scripts/check_doc_links.py [--strict] [--root DIR]

Scans README.md, docs/*.md, benchmarks/*.md, tests/*.md, models/README.md and every text file under
include/ src/ cuda/ examples/ tests/ scripts/ benchmarks/ for
  (a) relative markdown links [text](path) in .md files (outside code spans and fenced code), resolved
      against the .md file's directory (a path starting with '/' against the repository root);
      web links (scheme://, mailto:) and pure #anchors are skipped, a #fragment is ignored;
  (b) textual references docs/<name>.md, benchmarks/<name>.md and scripts/<name> anywhere, resolved
      against the repository root (a token holding '://' is a web address and is skipped);
  (c) in README.md and docs/*.md, the documents meant to describe the tree as it is now: repository
      paths written as code spans (`include/...`, `src/...`, `cuda/...`, `tests/...`, `examples/...`,
      `tools/...`, `testing/...`, `models/...`, `cmake/...`; the span's first word, patterns with * < {
      skipped), resolved against the repository root, so that a moved file shows up.
Every reference that does not resolve is printed as `file:line: reference`; the exit status is 1 when
there is one, else 0.

It also lists, separately, the references to the team's design guide, which lives outside the
repository (its file name, or its name followed by a section sign): readers of the repository
cannot open it, so each should point into docs/ instead. They do not change the exit status unless
--strict is given.

Standard library only.
"""
import argparse
import os
import re
import sys

TOP_FILES = ["README.md", "models/README.md"]
TOP_GLOBS = [("docs", ".md"), ("benchmarks", ".md"), ("tests", ".md")]
TREES = ["include", "src", "cuda", "examples", "tests", "scripts", "benchmarks"]
SKIP_DIRS = {"__pycache__", ".git"}

# [text](target): the target up to the closing parenthesis (no nested parentheses in our docs).
MD_LINK = re.compile(r"\[(?:[^\[\]]|\[[^\[\]]*\])*\]\(\s*<?([^()\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
TEXT_REFS = [
    re.compile(r"(?<![\w.-])(docs/[\w.-]+\.md)"),
    re.compile(r"(?<![\w.-])(benchmarks/[\w.-]+\.md)"),
    re.compile(r"(?<![\w.-])(scripts/[\w.-]*\w)"),
]
# Built from pieces so that this file does not list itself.
DESIGN_REF = re.compile("DESIGN" + r"(?:\.md|\s*\u00a7)")
CURRENT_DOCS = re.compile(r"^(README\.md|docs/[^/]+\.md)$")
CODE_PATH = re.compile(r"^(?:include|src|cuda|tests|examples|tools|testing|models|cmake)/[\w./-]*$")
FENCE = re.compile(r"^\s*(```|~~~)")
INLINE_CODE = re.compile(r"(`+)(.+?)\1")


def files_to_scan(root):
    """Repository-relative paths, each once, in a stable order."""
    seen = []

    def add(rel):
        if rel not in seen and os.path.isfile(os.path.join(root, rel)):
            seen.append(rel)

    for rel in TOP_FILES:
        add(rel)
    for folder, ext in TOP_GLOBS:
        d = os.path.join(root, folder)
        if os.path.isdir(d):
            for name in sorted(os.listdir(d)):
                if name.endswith(ext):
                    add(f"{folder}/{name}")
    for tree in TREES:
        base = os.path.join(root, tree)
        for dirpath, dirnames, filenames in os.walk(base):
            dirnames[:] = sorted(d for d in dirnames if d not in SKIP_DIRS)
            for name in sorted(filenames):
                add(os.path.relpath(os.path.join(dirpath, name), root).replace(os.sep, "/"))
    return seen


def read_text(path):
    """The file's lines, or None for a binary (non-UTF-8 or NUL-holding) file."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError:
        return None
    if b"\0" in data:
        return None
    try:
        return data.decode("utf-8").splitlines()
    except UnicodeDecodeError:
        return None


def token_around(line, start, end):
    """The whitespace- or quote-delimited token holding line[start:end]."""
    stops = " \t\"'`<>()[]{},;"
    a = start
    while a > 0 and line[a - 1] not in stops:
        a -= 1
    b = end
    while b < len(line) and line[b] not in stops:
        b += 1
    return line[a:b]


def markdown_links(lines):
    """(line number, target) of the markdown links outside code."""
    out = []
    in_fence = False
    for n, line in enumerate(lines, 1):
        if FENCE.match(line):
            in_fence = not in_fence
            continue
        if in_fence:
            continue
        text = INLINE_CODE.sub(lambda m: " " * len(m.group(0)), line)
        for m in MD_LINK.finditer(text):
            out.append((n, m.group(1)))
    return out


def code_paths(lines):
    """(line number, path) of code spans outside fenced code whose first word is a repository path."""
    out = []
    in_fence = False
    for n, line in enumerate(lines, 1):
        if FENCE.match(line):
            in_fence = not in_fence
            continue
        if in_fence:
            continue
        for m in INLINE_CODE.finditer(line):
            words = m.group(2).strip().split()
            if words and CODE_PATH.match(words[0]):
                out.append((n, words[0].rstrip(".,:;")))
    return out


def resolve_md_link(root, md_rel, target):
    """None when the link is fine or not a file link; else the reference as written."""
    if re.match(r"^[a-zA-Z][a-zA-Z0-9+.-]*:", target) or target.startswith("#"):
        return None
    path = target.split("#", 1)[0]
    if not path:
        return None
    if path.startswith("/"):
        full = os.path.join(root, path.lstrip("/"))
    else:
        full = os.path.join(root, os.path.dirname(md_rel), path)
    return None if os.path.exists(os.path.normpath(full)) else target


def check(root):
    broken, design = [], []
    for rel in files_to_scan(root):
        lines = read_text(os.path.join(root, rel))
        if lines is None:
            continue
        if rel.endswith(".md"):
            for n, target in markdown_links(lines):
                bad = resolve_md_link(root, rel, target)
                if bad is not None:
                    broken.append((rel, n, bad))
        if CURRENT_DOCS.match(rel):
            for n, path in code_paths(lines):
                if not os.path.exists(os.path.join(root, path)):
                    broken.append((rel, n, path))
        for n, line in enumerate(lines, 1):
            found = set()
            for pattern in TEXT_REFS:
                for m in pattern.finditer(line):
                    ref = m.group(1).rstrip(".")
                    if "://" in token_around(line, m.start(1), m.end(1)) or ref in found:
                        continue
                    found.add(ref)
                    if not os.path.exists(os.path.join(root, ref)):
                        broken.append((rel, n, ref))
            if DESIGN_REF.search(line):
                design.append((rel, n, line.strip()))
    return broken, design


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--strict", action="store_true",
                    help="also fail (exit 1) when a reference to the design guide outside the repository remains")
    ap.add_argument("--root", default=os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                    help="repository root (default: this script's parent folder)")
    args = ap.parse_args()
    broken, design = check(args.root)
    print(f"broken references: {len(broken)}")
    for rel, n, ref in broken:
        print(f"{rel}:{n}: {ref}")
    print(f"references to the design guide outside the repository: {len(design)}")
    for rel, n, text in design:
        print(f"{rel}:{n}: {text[:160]}")
    return 1 if broken or (args.strict and design) else 0


if __name__ == "__main__":
    sys.exit(main())
