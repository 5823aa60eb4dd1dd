#!/usr/bin/env python3
"""Write a sample ML tree: a safetensors checkpoint, dataset shards and many small files.

    python scripts/make_sample_data.py OUT_DIR [--checkpoint-mib N] [--shards K --shard-mib M]
                                       [--small N --small-kib S] [--midsize K --midsize-mib M]
                                       [--mixed-mib N --mixed-shards K] [--sets SET,...]
                                       [--seed X]

OUT_DIR gets:

    model.safetensors             a valid safetensors file of about N MiB: 8-byte little-endian
                                  header length, JSON header (dtype, shape, data_offsets), then
                                  the tensors' bytes; F16 weights and F32 norms named like a
                                  Llama-style transformer
    model.safetensors.index.json  weight map (every tensor in model.safetensors) + total_size
    config.json                   the matching model config
    data/shard-00000.bin ...      K dataset shards of M MiB
    small/00000.bin ...           N small files of S KiB
    midsize/chunk-00000.bin ...   K mid-size files of M MiB (--midsize; none by default)
    checkpoint-1000/              a training checkpoint directory of about N MiB, as a trainer
                                  writes it (--mixed-mib; none by default):
        model-00001-of-0000K.safetensors ...  K valid safetensors shards (own headers, F16/F32
                                              Llama-style tensors, split in file order)
        model.safetensors.index.json          weight map over the shards + total_size
        config.json, generation_config.json   model and generation config
        tokenizer.json                        a BPE tokenizer of about 4 MiB (seeded tokens)
        tokenizer_config.json, special_tokens_map.json
        trainer_state.json                    100 log_history entries
        optimizer.pt                          N/64 MiB of optimizer state
        scheduler.pt, scaler.pt, training_args.bin, rng_state_0.pth, rng_state_1.pth
                                              small states of 1-15 KiB each

The .pt/.pth/.bin states are seeded random bytes of realistic sizes, not real pickles.

and nothing else: files of the selected groups (--sets, default all) of an earlier run that are
not wanted now are removed (so --midsize 0 removes midsize/ files); groups not selected are left
as they are.

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
from collections.abc import Callable, Iterator
from pathlib import Path

MiB = 1024 * 1024
KiB = 1024
CHUNK = 4 * MiB
DTYPE_SIZE = {"F16": 2, "F32": 4}
SETS = ("checkpoint", "shards", "small", "midsize", "mixed")
MIXED_DIR = "checkpoint-1000"
MIXED_STEP = 1000
TOKENIZER_BYTES = 4 * MiB
TRANSFORMERS_VERSION = "4.44.2"
# Small trainer states: (name, size). Sizes of the kind a Hugging Face Trainer writes.
MIXED_STATES = (
    ("scheduler.pt", 1_064),
    ("scaler.pt", 988),
    ("training_args.bin", 5_368),
    ("rng_state_0.pth", 14_512),
    ("rng_state_1.pth", 14_576),
)


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


def split_tensors(
    tensors: list[tuple[str, str, list[int]]], parts: int
) -> list[list[tuple[str, str, list[int]]]]:
    """``tensors`` in order, cut into ``parts`` non-empty runs of about equal bytes.

    A tensor goes to the part whose share of the bytes holds its middle; each part gets one at
    least (so there are at most ``len(tensors)`` parts).
    """
    parts = max(1, min(parts, len(tensors)))
    total = sum(tensor_nbytes(d, s) for _n, d, s in tensors)
    out: list[list[tuple[str, str, list[int]]]] = [[] for _ in range(parts)]
    k = done = 0
    for i, t in enumerate(tensors):
        size = tensor_nbytes(t[1], t[2])
        left = len(tensors) - i  # this one included
        while (
            k < parts - 1
            and out[k]
            and (done + size / 2 > total * (k + 1) / parts or left <= parts - 1 - k)
        ):
            k += 1
        out[k].append(t)
        done += size
    return out


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


# A file to write: relative path, size, and its bytes as an iterator (made when written).
Spec = tuple[str, int, Callable[[], Iterator[bytes]]]


def _const(data: bytes) -> Callable[[], Iterator[bytes]]:
    return lambda: one(data)


def _random(seed: str, size: int) -> Callable[[], Iterator[bytes]]:
    return lambda: random_chunks(seed, size)


def _safetensors(
    seed: str, tensors: list[tuple[str, str, list[int]]]
) -> tuple[int, Callable[[], Iterator[bytes]]]:
    header, data_size = safetensors_header(tensors)

    def parts() -> Iterator[bytes]:
        yield header
        yield from random_chunks(seed, data_size)

    return len(header) + data_size, parts


def checkpoint_specs(args: argparse.Namespace) -> list[Spec]:
    config, tensors = model_layout(args.checkpoint_mib * MiB)
    size, parts = _safetensors(f"{args.seed}/model.safetensors", tensors)
    _header, data_size = safetensors_header(tensors)
    index = {
        "metadata": {"total_size": data_size},
        "weight_map": {name: "model.safetensors" for name, _, _ in tensors},
    }
    return [
        ("model.safetensors", size, parts),
        *(
            (name, len(data), _const(data))
            for name, data in (
                ("model.safetensors.index.json", _json(index)),
                ("config.json", _json(config)),
            )
        ),
    ]


def shard_specs(args: argparse.Namespace) -> list[Spec]:
    size = args.shard_mib * MiB
    names = [f"data/shard-{i:05d}.bin" for i in range(args.shards)]
    return [(n, size, _random(f"{args.seed}/{n}", size)) for n in names]


def small_specs(args: argparse.Namespace) -> list[Spec]:
    # One stream for all of them, read in order as the files are written (as before: the same
    # bytes for the same arguments), so each producer is called once, in this order.
    rng = random.Random(f"{args.seed}/small")
    size = args.small_kib * KiB

    def produce() -> Iterator[bytes]:
        yield rng.randbytes(size)

    return [(f"small/{i:05d}.bin", size, produce) for i in range(args.small)]


def midsize_specs(args: argparse.Namespace) -> list[Spec]:
    size = args.midsize_mib * MiB
    names = [f"midsize/chunk-{i:05d}.bin" for i in range(args.midsize)]
    return [(n, size, _random(f"{args.seed}/{n}", size)) for n in names]


# -- the mixed set: a checkpoint directory as a trainer writes it ----------------------------

_TOKEN_CHARS = (
    "abcdefghijklmnopqrstuvwxyzabcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"
)
_SPECIAL = ("<unk>", "<s>", "</s>")


def tokenizer_json(seed: str, target: int) -> bytes:
    """A BPE tokenizer.json (the tokenizers library's layout) of about ``target`` bytes.

    Special tokens, 256 byte-fallback tokens, then seeded random word pieces, each also given
    a merge rule; written with indent=2 and UTF-8 as the library writes it.
    """
    rng = random.Random(seed)
    vocab: dict[str, int] = {}
    for tok in (*_SPECIAL, *(f"<0x{b:02X}>" for b in range(256))):
        vocab[tok] = len(vocab)
    merges: list[str] = []
    budget = target - 2_000  # the fixed parts (normalizer, decoder, ...)
    used = 0
    while used < budget:
        n = 2 + min(int(rng.expovariate(0.35)), 14)
        word = "".join(rng.choice(_TOKEN_CHARS) for _ in range(n))
        if rng.random() < 0.5:
            word = "\u2581" + word
        if word in vocab:
            continue
        vocab[word] = len(vocab)
        cut = rng.randrange(1, len(word))
        merge = f"{word[:cut]} {word[cut:]}"
        merges.append(merge)
        # '      "word": id,\n' and '      "a b",\n' in UTF-8 (6 spaces of indent)
        used += len(word.encode()) + len(str(vocab[word])) + 12 + len(merge.encode()) + 10
    added = [
        {
            "id": i, "content": tok, "single_word": False, "lstrip": False, "rstrip": False,
            "normalized": False, "special": True,
        }
        for i, tok in enumerate(_SPECIAL)
    ]  # fmt: skip
    doc = {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": added,
        "normalizer": {
            "type": "Sequence",
            "normalizers": [
                {"type": "Prepend", "prepend": "\u2581"},
                {"type": "Replace", "pattern": {"String": " "}, "content": "\u2581"},
            ],
        },
        "pre_tokenizer": None,
        "post_processor": {
            "type": "TemplateProcessing",
            "single": [
                {"SpecialToken": {"id": "<s>", "type_id": 0}},
                {"Sequence": {"id": "A", "type_id": 0}},
            ],
            "pair": [
                {"SpecialToken": {"id": "<s>", "type_id": 0}},
                {"Sequence": {"id": "A", "type_id": 0}},
                {"SpecialToken": {"id": "<s>", "type_id": 1}},
                {"Sequence": {"id": "B", "type_id": 1}},
            ],
            "special_tokens": {"<s>": {"id": "<s>", "ids": [1], "tokens": ["<s>"]}},
        },
        "decoder": {
            "type": "Sequence",
            "decoders": [
                {"type": "Replace", "pattern": {"String": "\u2581"}, "content": " "},
                {"type": "ByteFallback"},
                {"type": "Fuse"},
                {"type": "Strip", "content": " ", "start": 1, "stop": 0},
            ],
        },
        "model": {
            "type": "BPE",
            "dropout": None,
            "unk_token": "<unk>",
            "continuing_subword_prefix": None,
            "end_of_word_suffix": None,
            "fuse_unk": True,
            "byte_fallback": True,
            "ignore_merges": False,
            "vocab": vocab,
            "merges": merges,
        },
    }
    return (json.dumps(doc, indent=2, ensure_ascii=False) + "\n").encode()


def trainer_state(seed: str, step: int) -> dict:
    """A Hugging Face Trainer's trainer_state.json after ``step`` steps, logging every 10."""
    rng = random.Random(seed)
    max_steps, warmup, peak_lr = 2 * step + 400, step // 10, 2e-5
    history = []
    for s in range(10, step + 1, 10):
        if s < warmup:
            lr = peak_lr * s / warmup
        else:
            lr = peak_lr * 0.5 * (1 + math.cos(math.pi * (s - warmup) / (max_steps - warmup)))
        history.append({
            "epoch": round(s / (max_steps / 2), 4),
            "grad_norm": round(0.4 + rng.random() * 1.6, 6),
            "learning_rate": float(f"{lr:.6e}"),
            "loss": round(2.6 * math.exp(-s / (0.8 * step)) + 0.9 + rng.gauss(0, 0.05), 4),
            "step": s,
        })  # fmt: skip
    return {
        "best_metric": None,
        "best_model_checkpoint": None,
        "epoch": round(step / (max_steps / 2), 4),
        "eval_steps": 500,
        "global_step": step,
        "is_hyper_param_search": False,
        "is_local_process_zero": True,
        "is_world_process_zero": True,
        "log_history": history,
        "logging_steps": 10,
        "max_steps": max_steps,
        "num_input_tokens_seen": 0,
        "num_train_epochs": 2,
        "save_steps": step,
        "stateful_callbacks": {
            "TrainerControl": {
                "args": {
                    "should_epoch_stop": False,
                    "should_evaluate": False,
                    "should_log": False,
                    "should_save": True,
                    "should_training_stop": False,
                },
                "attributes": {},
            }
        },
        "total_flos": float(f"{rng.random() * 1e17:.6e}"),
        "train_batch_size": 8,
        "trial_name": None,
        "trial_params": None,
    }


def _token(content: str) -> dict:
    return {
        "content": content, "lstrip": False, "normalized": False, "rstrip": False,
        "single_word": False,
    }  # fmt: skip


def mixed_specs(args: argparse.Namespace) -> list[Spec]:
    """The files of checkpoint-1000/: small configs and states first, the shards take the rest."""
    if args.mixed_mib <= 0:
        return []
    seed, d = args.seed, MIXED_DIR
    target = args.mixed_mib * MiB
    tokenizer = tokenizer_json(f"{seed}/{d}/tokenizer.json", min(TOKENIZER_BYTES, target // 16))
    tok_config = {
        "add_bos_token": True,
        "add_eos_token": False,
        "added_tokens_decoder": {
            str(i): {**_token(t), "special": True} for i, t in enumerate(_SPECIAL)
        },
        "bos_token": "<s>",
        "clean_up_tokenization_spaces": False,
        "eos_token": "</s>",
        "legacy": False,
        "model_max_length": 4096,
        "pad_token": None,
        "padding_side": "right",
        "sp_model_kwargs": {},
        "tokenizer_class": "LlamaTokenizer",
        "unk_token": "<unk>",
        "use_default_system_prompt": False,
    }
    specials = {
        "bos_token": _token("<s>"),
        "eos_token": _token("</s>"),
        "unk_token": _token("<unk>"),
    }
    small: list[tuple[str, bytes]] = [
        ("tokenizer.json", tokenizer),
        ("tokenizer_config.json", _json(tok_config)),
        ("special_tokens_map.json", _json(specials)),
        ("trainer_state.json", _json(trainer_state(f"{seed}/{d}/trainer_state", MIXED_STEP))),
    ]
    states = [("optimizer.pt", max(KiB, target // 64 // KiB * KiB)), *MIXED_STATES]
    # The shards get what is left, less 16 KiB for the configs and the index (a few KiB).
    rest = target - sum(len(b) for _n, b in small) - sum(n for _f, n in states) - 16 * KiB
    config, tensors = model_layout(max(64 * KiB, rest))
    parts = split_tensors(tensors, args.mixed_shards)
    k = len(parts)
    shard_names = [f"model-{i + 1:05d}-of-{k:05d}.safetensors" for i in range(k)]
    specs: list[Spec] = []
    weight_map: dict[str, str] = {}
    total_size = 0
    for name, part in zip(shard_names, parts, strict=True):
        size, produce = _safetensors(f"{seed}/{d}/{name}", part)
        specs.append((f"{d}/{name}", size, produce))
        weight_map.update({t: name for t, _dt, _sh in part})
        total_size += sum(tensor_nbytes(dt, sh) for _t, dt, sh in part)
    index = {"metadata": {"total_size": total_size}, "weight_map": dict(sorted(weight_map.items()))}
    config = {**config, "transformers_version": TRANSFORMERS_VERSION}
    generation = {
        "_from_model_config": True,
        "bos_token_id": 1,
        "eos_token_id": 2,
        "transformers_version": TRANSFORMERS_VERSION,
    }
    small = [
        ("model.safetensors.index.json", _json(index)),
        ("config.json", _json(config)),
        ("generation_config.json", _json(generation)),
        *small,
    ]
    specs += [(f"{d}/{n}", len(b), _const(b)) for n, b in small]
    specs += [(f"{d}/{n}", size, _random(f"{seed}/{d}/{n}", size)) for n, size in states]
    return specs


SPECS: dict[str, Callable[[argparse.Namespace], list[Spec]]] = {
    "checkpoint": checkpoint_specs,
    "shards": shard_specs,
    "small": small_specs,
    "midsize": midsize_specs,
    "mixed": mixed_specs,
}
# What a group owns in OUT_DIR: files matching these that are not wanted now are removed.
OWNED = {
    "checkpoint": (),
    "shards": ("data/shard-*.bin",),
    "small": ("small/*.bin",),
    "midsize": ("midsize/chunk-*.bin",),
    "mixed": (f"{MIXED_DIR}/*",),
}


def plan(args: argparse.Namespace) -> dict[str, int]:
    """Every file to write (of the selected --sets), with its size."""
    return {rel: size for group in args.sets for rel, size, _p in SPECS[group](args)}


def generate(out: Path, args: argparse.Namespace) -> tuple[int, int]:
    """Write the selected groups; return (files, bytes)."""
    count = total = 0
    wanted: set[str] = set()
    for group in args.sets:
        for rel, size, produce in SPECS[group](args):
            written = write_file(out / rel, produce())
            if written != size:
                raise AssertionError(f"{rel}: wrote {written} bytes, planned {size}")
            total += written
            count += 1
            wanted.add(rel)
        # Files of an earlier run with more shards or small files would be synced too: remove
        # them (and temporary files of an interrupted run).
        for pattern in OWNED[group]:
            for path in out.glob(pattern):
                if path.is_file() and path.relative_to(out).as_posix() not in wanted:
                    path.unlink()
    return count, total


def _json(obj: object) -> bytes:
    return (json.dumps(obj, indent=2) + "\n").encode()


def _sets(text: str) -> list[str]:
    items = [t.strip() for t in text.split(",") if t.strip()]
    bad = [t for t in items if t not in SETS]
    if bad or not items:
        raise argparse.ArgumentTypeError(f"expected a subset of {','.join(SETS)}, got {text!r}")
    return [s for s in SETS if s in items]


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
    parser.add_argument(
        "--midsize", type=int, default=0, help="mid-size files under midsize/ (default 0)"
    )
    parser.add_argument(
        "--midsize-mib", type=int, default=32, help="MiB per mid-size file (default 32)"
    )
    parser.add_argument(
        "--mixed-mib",
        type=int,
        default=0,
        help=f"MiB of the {MIXED_DIR}/ training checkpoint directory (default 0: none)",
    )
    parser.add_argument(
        "--mixed-shards", type=int, default=3, help="safetensors shards in it (default 3)"
    )
    parser.add_argument(
        "--sets",
        type=_sets,
        default=list(SETS),
        metavar="SET,...",
        help=f"groups to write (default all: {','.join(SETS)}); the others are left as they are",
    )
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    for name in (
        "checkpoint_mib", "shards", "shard_mib", "small", "small_kib", "midsize", "midsize_mib",
        "mixed_mib",
    ):  # fmt: skip
        if getattr(args, name) < 0:
            parser.error(f"--{name.replace('_', '-')} must not be negative")
    if "checkpoint" in args.sets and args.checkpoint_mib < 1:
        parser.error("--checkpoint-mib must be at least 1")
    if args.mixed_shards < 1:
        parser.error("--mixed-shards must be at least 1")

    out: Path = args.out_dir
    out.mkdir(parents=True, exist_ok=True)
    start = time.monotonic()
    count, total = generate(out, args)
    seconds = time.monotonic() - start
    print(f"{out}: wrote {count} files, {total / MiB:.1f} MiB in {seconds:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
