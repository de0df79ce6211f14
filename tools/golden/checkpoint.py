"""Safetensors files and hub checkpoints as the fixtures store them: a safetensors writer with a fixed
header layout (so that a rerun reproduces every byte) that reads each file back, and a checkpoint as two
shards split by bytes plus the hub index.
"""

import json
import os
import struct

import torch
from safetensors import safe_open
from safetensors.torch import load_file

from .weights import mtp_weight_shapes, weight_shapes


SAFETENSORS_DTYPES = {torch.bfloat16: "BF16", torch.float32: "F32", torch.int64: "I64", torch.int32: "I32",
                      torch.bool: "BOOL", torch.float8_e4m3fn: "F8_E4M3"}


def bits(t):
    """A tensor to compare with torch.equal: fp8 as its bytes (torch has no fp8 comparison)."""
    return t.view(torch.uint8) if t.dtype == torch.float8_e4m3fn else t


def save_safetensors(path, tensors, metadata):
    """A safetensors file with its tensors in the given order and a fixed header layout (the official
    writer emits __metadata__ in hash order, so its bytes change from run to run)."""
    header = {"__metadata__": dict(sorted(metadata.items()))}
    blobs, offset = [], 0
    # Wider dtypes first (a stable sort), so that every tensor's offset is a multiple of its element size.
    for name, t in sorted(tensors.items(), key=lambda item: -item[1].element_size()):
        data = t.contiguous().view(torch.uint8).numpy().tobytes() if t.numel() else b""
        header[name] = {"dtype": SAFETENSORS_DTYPES[t.dtype], "shape": list(t.shape),
                        "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + b"".join(blobs))
    read = load_file(path)
    assert sorted(read) == sorted(tensors)
    assert all(torch.equal(bits(read[n]), bits(t)) for n, t in tensors.items()), path
    with safe_open(path, "pt") as f:
        assert f.metadata() == metadata


def write_checkpoint(c, hub, directory, mtp=None):
    """Two shards split by bytes in schema order (the MTP module's tensors, when given, after the target's,
    in mtp_weight_shapes order, as DeepSeek-V3 stores layer 61 last), plus the hub index."""
    names = [name for name, _ in weight_shapes(c)] + ([name for name, _ in mtp_weight_shapes(c)] if mtp else [])
    weights = dict(hub, **(mtp or {}))
    stored = {}
    for name in names:
        w = weights[name]
        stored[name] = w.contiguous() if name.endswith("e_score_correction_bias") else w.to(torch.bfloat16)
    return write_two_shards(stored, directory)


def write_two_shards(tensors, directory):
    """`tensors` (name -> tensor, in order) as two safetensors shards split by bytes, plus the hub
    index; returns the total bytes."""
    total = sum(t.numel() * t.element_size() for t in tensors.values())
    shards, current, size = [[], []], 0, 0
    for name, t in tensors.items():
        shards[current].append(name)
        size += t.numel() * t.element_size()
        if current == 0 and size >= total // 2:
            current = 1
    weight_map = {}
    for i, names in enumerate(shards):
        file = f"model-{i + 1:05d}-of-00002.safetensors"
        save_safetensors(os.path.join(directory, file), {n: tensors[n] for n in names}, {"format": "pt"})
        weight_map.update({n: file for n in names})
    with open(os.path.join(directory, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f, indent=2)
        f.write("\n")
    return total
