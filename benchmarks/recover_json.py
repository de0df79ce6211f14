#!/usr/bin/env python3
"""Recovers the complete entries of a Google Benchmark JSON stream cut short (a binary killed at
its time limit writes no --benchmark_out file, but what it printed with --benchmark_format=json
holds every finished row). Lines that are not part of the JSON (stderr mixed in) are dropped.

    recover_json.py STREAM OUT.json    # exit 1 when STREAM holds no benchmark entry
"""
import json
import sys


def recover(text):
    lines = [l for l in text.split("\n") if l[:1] in (" ", "\t", "{", "}", "]")]
    s = "\n".join(lines)
    marker = '"benchmarks": ['
    i = s.find(marker)
    if i < 0:
        return None
    context = json.loads(s[:i] + '"benchmarks": []}')
    body = s[i + len(marker):]
    entries, depth, start, in_string, escaped = [], 0, 0, False, False
    for k, ch in enumerate(body):
        if in_string:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_string = False
            continue
        if ch == '"':
            in_string = True
        elif ch == "{":
            if depth == 0:
                start = k
            depth += 1
        elif ch == "}":
            depth -= 1
            if depth == 0:
                entries.append(json.loads(body[start:k + 1]))
    context["benchmarks"] = entries
    return context


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    data = recover(open(sys.argv[1], errors="replace").read())
    if not data or not data["benchmarks"]:
        print(f"{sys.argv[1]}: no complete benchmark entry", file=sys.stderr)
        sys.exit(1)
    json.dump(data, open(sys.argv[2], "w"), indent=1)
    print(f"{sys.argv[2]}: {len(data['benchmarks'])} entries recovered from {sys.argv[1]}", file=sys.stderr)


if __name__ == "__main__":
    main()
