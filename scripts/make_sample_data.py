#!/usr/bin/env python3
"""Write a sample ML tree: a safetensors checkpoint, dataset shards and many small files.

    python scripts/make_sample_data.py OUT_DIR [--checkpoint-mib N] [--shards K --shard-mib M]
                                       [--small N --small-kib S] [--seed X]

OUT_DIR gets:

    model.safetensors             a valid safetensors file of about N MiB: 8-byte little-endian
                                  header length, JSON header (dtype, shape, data_offsets), then
                                  the tensors' bytes; F16 weights and F32 norms named like a
                                  Llama-style transformer
    model.safetensors.index.json  weight map (every tensor in model.safetensors) + total_size
    config.json                   the matching model config
    data/shard-00000.bin ...      K dataset shards of M MiB
    small/00000.bin ...           N small files of S KiB

and nothing else: shards and small files of an earlier run that are not wanted now are removed.

Bytes are pseudo-random, seeded: the same arguments give the same files on every machine and
Python version 3.9+. Each file has its own stream (seeded by --seed and its name), so changing
--shards does not change the checkpoint. Files are written in 4 MiB chunks to a temporary name
and renamed, so a 2 GiB checkpoint needs little memory and an interrupted run leaves no
truncated file under a final name. Standard library only.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import struct
import sys
import time
from collections.abc import Iterator
from pathlib import Path

MiB = 1024 * 1024
KiB = 1024
CHUNK = 4 * MiB
DTYPE_SIZE = {"F16": 2, "F32": 4}


# --------------------------------------------------------------------------------------------
# Checkpoint layout


def model_layout(target_bytes: int) -> tuple[dict, list[tuple[str, str, list[int]]]]:
    """A transformer config and its tensors ``(name, dtype, shape)`` of ~target_bytes in total.

    Layers are sized first (hidden size a multiple of 64); the vocabulary then takes up the
    rest, so the total is within 4 * hidden bytes of the target.
    """
    target_bytes = max(target_bytes, 64 * KiB)
    layers = 2 if target_bytes < 64 * MiB else 4 if target_bytes < 512 * MiB else 16
    # per layer: q, k, v, o (h*h) + gate, up, down (h*4h) in F16 = 32 h^2 bytes (+ norms)
    hidden = int(math.sqrt(0.8 * target_bytes / (32 * layers))) // 64 * 64
    hidden = max(hidden, 64)
    while True:
        inter = 4 * hidden
        per_layer = 2 * (4 * hidden * hidden + 3 * hidden * inter) + 2 * 4 * hidden
        rest = target_bytes - layers * per_layer - 4 * hidden  # final norm
        vocab = rest // (2 * 2 * hidden)  # embed_tokens + lm_head, F16
        if vocab >= 1 or hidden == 64:
            vocab = max(vocab, 1)
            break
        hidden -= 64
    config = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": hidden,
        "intermediate_size": inter,
        "num_hidden_layers": layers,
        "num_attention_heads": max(1, hidden // 64),
        "num_key_value_heads": max(1, hidden // 64),
        "vocab_size": vocab,
        "max_position_embeddings": 4096,
        "rms_norm_eps": 1e-5,
        "torch_dtype": "float16",
        "tie_word_embeddings": False,
    }
    tensors: list[tuple[str, str, list[int]]] = [
        ("model.embed_tokens.weight", "F16", [vocab, hidden])
    ]
    for i in range(layers):
        p = f"model.layers.{i}"
        tensors += [
            (f"{p}.input_layernorm.weight", "F32", [hidden]),
            (f"{p}.self_attn.q_proj.weight", "F16", [hidden, hidden]),
            (f"{p}.self_attn.k_proj.weight", "F16", [hidden, hidden]),
            (f"{p}.self_attn.v_proj.weight", "F16", [hidden, hidden]),
            (f"{p}.self_attn.o_proj.weight", "F16", [hidden, hidden]),
            (f"{p}.post_attention_layernorm.weight", "F32", [hidden]),
            (f"{p}.mlp.gate_proj.weight", "F16", [inter, hidden]),
            (f"{p}.mlp.up_proj.weight", "F16", [inter, hidden]),
            (f"{p}.mlp.down_proj.weight", "F16", [hidden, inter]),
        ]
    tensors += [
        ("model.norm.weight", "F32", [hidden]),
        ("lm_head.weight", "F16", [vocab, hidden]),
    ]
    return config, tensors


def tensor_nbytes(dtype: str, shape: list[int]) -> int:
    return DTYPE_SIZE[dtype] * math.prod(shape)


def safetensors_header(tensors: list[tuple[str, str, list[int]]]) -> tuple[bytes, int]:
    """The 8-byte length + JSON header (space-padded to a multiple of 8), and the data size."""
    header: dict[str, object] = {"__metadata__": {"format": "pt"}}
    offset = 0
    for name, dtype, shape in tensors:
        end = offset + tensor_nbytes(dtype, shape)
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, end]}
        offset = end
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    return struct.pack("<Q", len(raw)) + raw, offset


# --------------------------------------------------------------------------------------------
# Writing


def random_chunks(seed: str, size: int) -> Iterator[bytes]:
    rng = random.Random(seed)
    left = size
    while left > 0:
        n = min(CHUNK, left)
        yield rng.randbytes(n)
        left -= n


def write_file(path: Path, parts: Iterator[bytes]) -> int:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    written = 0
    with open(tmp, "wb") as f:
        for part in parts:
            f.write(part)
            written += len(part)
    os.replace(tmp, path)
    return written


def one(data: bytes) -> Iterator[bytes]:
    yield data


def plan(args: argparse.Namespace) -> dict[str, int]:
    """Every file to write, with its size."""
    _config, tensors = model_layout(args.checkpoint_mib * MiB)
    header, data_size = safetensors_header(tensors)
    files = {"model.safetensors": len(header) + data_size}
    files.update({f"data/shard-{i:05d}.bin": args.shard_mib * MiB for i in range(args.shards)})
    files.update({f"small/{i:05d}.bin": args.small_kib * KiB for i in range(args.small)})
    return files


def generate(out: Path, args: argparse.Namespace) -> tuple[int, int]:
    """Write everything; return (files, bytes)."""
    seed = args.seed
    config, tensors = model_layout(args.checkpoint_mib * MiB)
    header, data_size = safetensors_header(tensors)

    def checkpoint() -> Iterator[bytes]:
        yield header
        yield from random_chunks(f"{seed}/model.safetensors", data_size)

    count = 0
    total = write_file(out / "model.safetensors", checkpoint())
    index = {
        "metadata": {"total_size": data_size},
        "weight_map": {name: "model.safetensors" for name, _, _ in tensors},
    }
    total += write_file(out / "model.safetensors.index.json", one(_json(index)))
    total += write_file(out / "config.json", one(_json(config)))
    count += 3
    for i in range(args.shards):
        name = f"data/shard-{i:05d}.bin"
        total += write_file(out / name, random_chunks(f"{seed}/{name}", args.shard_mib * MiB))
        count += 1
    rng = random.Random(f"{seed}/small")
    for i in range(args.small):
        total += write_file(out / f"small/{i:05d}.bin", one(rng.randbytes(args.small_kib * KiB)))
        count += 1
    # Files of an earlier run with more shards or small files would be synced too: remove them.
    wanted = set(plan(args))
    for pattern in ("data/shard-*.bin", "small/*.bin"):
        for path in out.glob(pattern):
            if path.relative_to(out).as_posix() not in wanted:
                path.unlink()
    return count, total


def _json(obj: object) -> bytes:
    return (json.dumps(obj, indent=2) + "\n").encode()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description="Write a seeded sample ML tree (safetensors checkpoint, shards, small files)."
    )
    parser.add_argument("out_dir", type=Path)
    parser.add_argument("--checkpoint-mib", type=int, default=64, help="default 64")
    parser.add_argument("--shards", type=int, default=4, help="dataset shards (default 4)")
    parser.add_argument("--shard-mib", type=int, default=8, help="MiB per shard (default 8)")
    parser.add_argument("--small", type=int, default=200, help="small files (default 200)")
    parser.add_argument("--small-kib", type=int, default=16, help="KiB per small file (16)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    for name in ("checkpoint_mib", "shards", "shard_mib", "small", "small_kib"):
        if getattr(args, name) < 0:
            parser.error(f"--{name.replace('_', '-')} must not be negative")
    if args.checkpoint_mib < 1:
        parser.error("--checkpoint-mib must be at least 1")

    out: Path = args.out_dir
    out.mkdir(parents=True, exist_ok=True)
    start = time.monotonic()
    count, total = generate(out, args)
    seconds = time.monotonic() - start
    print(f"{out}: wrote {count} files, {total / MiB:.1f} MiB in {seconds:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
