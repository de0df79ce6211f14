#!/usr/bin/env python3
"""Writes the pathological seeds of the safetensors header fuzzer into corpus/safetensors_header/.

Each seed is a whole file image ([u64 LE header length][header][data]) built to stress the
header parser's time and memory limits while staying small enough (<= 64 KiB) to keep libFuzzer's
default max_len reasonable. Most are valid files; the empty-object ones are the shape that once
made a callback JSON parser quadratic. Re-run after changing the list: the files are committed.
"""

import json
import os
import struct

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "corpus", "safetensors_header")


def image(header: str, data: bytes = b"") -> bytes:
    raw = header.encode("utf-8")
    return struct.pack("<Q", len(raw)) + raw + data


def zero_size_tensors(n: int) -> str:
    entries = ",".join(
        f'"t{i}":{{"dtype":"F32","shape":[0],"data_offsets":[0,0]}}' for i in range(n))
    return "{" + entries + "}"


def seeds() -> dict:
    out = {}
    # Many zero-size tensors: all tie on offsets, so ordering falls back to names.
    out["patho_1000_empty_tensors.safetensors"] = image(zero_size_tensors(1000))
    # Members whose values are empty objects, and an array of them: refused at the first one.
    out["patho_empty_objects.safetensors"] = image(
        "{" + ",".join(f'"a{i}":{{}}' for i in range(3000)) + "}")
    out["patho_array_of_objects.safetensors"] = image("[" + ",".join(["{}"] * 8000) + "]")
    # A name exactly at the 1024-byte limit, and one escaped character per name.
    out["patho_long_name.safetensors"] = image(
        json.dumps({"n" * 1024: {"dtype": "U8", "shape": [1], "data_offsets": [0, 1]}}), b"x")
    out["patho_escaped_names.safetensors"] = image(json.dumps(
        {f"\u00e9\"\\{i}\u2028": {"dtype": "U8", "shape": [0], "data_offsets": [0, 0]}
         for i in range(200)}))
    # Many metadata entries next to one real tensor.
    metadata = {f"k{i}": "v" * (i % 17) for i in range(2000)}
    out["patho_many_metadata.safetensors"] = image(json.dumps(
        {"__metadata__": metadata,
         "w": {"dtype": "BF16", "shape": [2, 2], "data_offsets": [0, 8]}}), bytes(8))
    # Rank 6 with a zero dim and huge others: numel 0, no overflow.
    out["patho_rank6_zero.safetensors"] = image(json.dumps(
        {"z": {"dtype": "F8_E4M3", "shape": [0, 2**62, 2**62, 1, 1, 1],
               "data_offsets": [0, 0]}}))
    # A valid header padded with 60 KB of whitespace.
    out["patho_whitespace.safetensors"] = image(
        '{"w":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}}' + " " * 60000, b"x")
    return out


def main() -> None:
    os.makedirs(OUT, exist_ok=True)
    for name, data in seeds().items():
        assert len(data) <= 64 << 10, (name, len(data))
        with open(os.path.join(OUT, name), "wb") as f:
            f.write(data)


if __name__ == "__main__":
    main()
