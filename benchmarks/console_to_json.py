#!/usr/bin/env python3
"""Converts Google Benchmark console output into the JSON form make_results.py reads, for runs whose
JSON did not come back (only the console log did). Both console forms: tabular counters (a column a
counter, --benchmark_counters_tabular=true) and the default "UserCounters..." column, where each
row's counters are `key=value` cells followed by the row's label:

    console_to_json.py LOG > NAME.json

Only the median aggregate rows are kept (and plain rows of benchmarks run without repetitions).
Counter cells use Google Benchmark's suffixes (k, M, G, m, u, n); a cell that does not parse (nan)
is left out.
"""
import json
import re
import sys

SUFFIX = {"k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "m": 1e-3, "u": 1e-6, "n": 1e-9}


def number(cell):
    m = re.fullmatch(r"(-?[0-9.]+(?:e[-+]?[0-9]+)?)([kMGTmun]?)", cell)
    if not m:
        return None
    return float(m.group(1)) * SUFFIX.get(m.group(2), 1.0)


def convert(lines):
    counters, out = [], []
    for line in lines:
        if line.startswith("Benchmark") and "Iterations" in line:
            counters = line.split()[4:]  # Benchmark Time CPU Iterations <counters...>
            continue
        parts = line.split()
        if len(parts) < 6 or "/" not in parts[0] or not counters:
            continue
        name = parts[0]
        aggregate = None
        for agg in ("mean", "median", "stddev", "cv"):
            if name.endswith("_" + agg):
                aggregate = agg
        if aggregate not in (None, "median"):
            continue
        cells = parts[6:]  # after name, time, unit, cpu, unit, iterations
        row = {"name": name, "run_name": name[: -len("_median")] if aggregate else name,
               "run_type": "aggregate" if aggregate else "iteration"}
        if aggregate:
            row["aggregate_name"] = aggregate
        if counters == ["UserCounters..."]:  # key=value cells, then the label
            label = []
            for cell in cells:
                key, eq, value = cell.partition("=")
                v = number(value) if eq else None
                if v is not None:
                    row[key] = v
                elif not eq:
                    label.append(cell)
            if label:
                row["label"] = " ".join(label)
            out.append(row)
            continue
        if len(cells) > len(counters):  # an error message or label after the counters
            cells = cells[: len(counters)]
        for key, cell in zip(counters, cells):
            v = number(cell)
            if v is not None:
                row[key] = v
        out.append(row)
    return {"context": {"converted_from": "console output"}, "benchmarks": out}


if __name__ == "__main__":
    json.dump(convert(open(sys.argv[1]).read().splitlines()), sys.stdout, indent=1)
