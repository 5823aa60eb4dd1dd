"""Change a safetensors checkpoint a little, the way a training step or a fine-tune would.

    python benchmarks/bench_mutate.py {rewrite2pct|add-tensor} IN OUT [--seed N]

Two mutations, both deterministic (seeded) and both writing a new, valid safetensors file:

- ``rewrite2pct``: the data of tensors making up about 2% of the data bytes (the total closest to
  2% without going over it), chosen with a seeded RNG and never two neighbours, is replaced by
  new random bytes of the same size. The header, the size and every other byte stay as they were.
- ``add-tensor``: one new 4 MiB F16 tensor is added to the header and its data placed in the
  middle of the data section: the header grows (so every tensor's position in the file moves)
  and the tensors after it also move by 4 MiB. All other tensors keep their bytes.

A safetensors file is an 8-byte little-endian header length N, N bytes of JSON
``{name: {"dtype", "shape", "data_offsets": [begin, end]}, "__metadata__": {...}}`` (offsets
relative to the first byte after the header, padded with spaces to a multiple of 8), then the
tensors' bytes, contiguous and without gaps. :func:`read_header` and :func:`write_safetensors`
read and write that; :func:`check` validates a file. Standard library only.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import shutil
import struct
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

MIB = 1 << 20
CHUNK = 8 * MIB
DTYPE_SIZE = {
    "BOOL": 1, "U8": 1, "I8": 1, "F8_E4M3": 1, "F8_E5M2": 1,
    "I16": 2, "U16": 2, "F16": 2, "BF16": 2,
    "I32": 4, "U32": 4, "F32": 4, "I64": 8, "U64": 8, "F64": 8,
}  # fmt: skip
MAX_HEADER = 100 * MIB  # what the safetensors library accepts

MUTATIONS = ("rewrite2pct", "add-tensor")


@dataclass(frozen=True)
class Tensor:
    name: str
    dtype: str
    shape: tuple[int, ...]
    begin: int  # offset of the first byte, relative to the start of the data section
    end: int

    @property
    def nbytes(self) -> int:
        return self.end - self.begin


@dataclass(frozen=True)
class Layout:
    data_start: int  # 8 + header length: where the data section starts in the file
    metadata: dict[str, str] | None
    tensors: list[Tensor]  # in data order

    @property
    def data_size(self) -> int:
        return self.tensors[-1].end if self.tensors else 0

    @property
    def file_size(self) -> int:
        return self.data_start + self.data_size


class SafetensorsError(ValueError):
    pass


def read_header(path: Path) -> Layout:
    """Parse and validate the header of a safetensors file."""
    with open(path, "rb") as f:
        raw_len = f.read(8)
        if len(raw_len) != 8:
            raise SafetensorsError(f"{path}: shorter than 8 bytes")
        (n,) = struct.unpack("<Q", raw_len)
        if n > MAX_HEADER:
            raise SafetensorsError(f"{path}: header of {n} bytes is too large")
        raw = f.read(n)
    if len(raw) != n:
        raise SafetensorsError(f"{path}: header truncated ({len(raw)} of {n} bytes)")
    try:
        header = json.loads(raw)
    except ValueError as exc:
        raise SafetensorsError(f"{path}: header is not JSON: {exc}") from exc
    if not isinstance(header, dict):
        raise SafetensorsError(f"{path}: header is not a JSON object")
    metadata = header.pop("__metadata__", None)
    tensors = []
    for name, info in header.items():
        try:
            begin, end = info["data_offsets"]
            tensors.append(Tensor(name, info["dtype"], tuple(info["shape"]), begin, end))
        except (KeyError, TypeError, ValueError) as exc:
            raise SafetensorsError(f"{path}: bad entry for tensor {name!r}") from exc
    tensors.sort(key=lambda t: (t.begin, t.end))
    layout = Layout(8 + n, metadata, tensors)
    _validate(layout, str(path))
    return layout


def _validate(layout: Layout, what: str) -> None:
    pos = 0
    for t in layout.tensors:
        if t.dtype not in DTYPE_SIZE:
            raise SafetensorsError(f"{what}: tensor {t.name!r} has unknown dtype {t.dtype}")
        if t.begin != pos or t.end < t.begin:
            raise SafetensorsError(
                f"{what}: tensor {t.name!r} at [{t.begin}, {t.end}) leaves a gap or overlaps "
                f"(expected to start at {pos})"
            )
        if t.nbytes != DTYPE_SIZE[t.dtype] * math.prod(t.shape):
            raise SafetensorsError(f"{what}: tensor {t.name!r}: size does not match its shape")
        pos = t.end


def check(path: Path) -> Layout:
    """Validate a whole file: header, offsets, and a file size that matches the data."""
    layout = read_header(path)
    size = path.stat().st_size
    if size != layout.file_size:
        raise SafetensorsError(f"{path}: {size} bytes, the header describes {layout.file_size}")
    return layout


def encode_header(metadata: dict[str, str] | None, tensors: list[Tensor]) -> bytes:
    """8-byte length + JSON header, space-padded to a multiple of 8 (as the library writes)."""
    header: dict[str, object] = {}
    if metadata is not None:
        header["__metadata__"] = metadata
    for t in tensors:
        header[t.name] = {
            "dtype": t.dtype,
            "shape": list(t.shape),
            "data_offsets": [t.begin, t.end],
        }
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    return struct.pack("<Q", len(raw)) + raw


# A tensor's bytes when writing: a range of an existing file, or bytes in memory.
@dataclass(frozen=True)
class FromFile:
    path: Path
    offset: int
    length: int


Source = FromFile | bytes


def _copy_range(src, dst, offset: int, length: int) -> None:
    """Copy ``length`` bytes at ``offset`` of ``src`` to the current position of ``dst``."""
    src.seek(offset)
    left = length
    while left:
        chunk = src.read(min(CHUNK, left))
        if not chunk:
            raise SafetensorsError(f"{src.name}: ends before offset {offset + length}")
        dst.write(chunk)
        left -= len(chunk)


def write_safetensors(
    out: Path,
    metadata: dict[str, str] | None,
    entries: list[tuple[str, str, tuple[int, ...], Source]],
) -> Layout:
    """Write ``entries`` (name, dtype, shape, bytes) in this order as a safetensors file.

    Offsets are computed here; the file goes to a temporary name and is renamed when complete.
    """
    tensors = []
    pos = 0
    for name, dtype, shape, source in entries:
        n = source.length if isinstance(source, FromFile) else len(source)
        tensors.append(Tensor(name, dtype, tuple(shape), pos, pos + n))
        pos += n
    layout_names = {t.name for t in tensors}
    if len(layout_names) != len(tensors):
        raise SafetensorsError("duplicate tensor names")
    header = encode_header(metadata, tensors)
    layout = Layout(len(header), metadata, tensors)
    _validate(layout, str(out))
    tmp = out.with_name(f".{out.name}.tmp")
    handles: dict[Path, object] = {}
    try:
        with open(tmp, "wb") as f:
            f.write(header)
            for _name, _dtype, _shape, source in entries:
                if isinstance(source, FromFile):
                    src = handles.get(source.path)
                    if src is None:
                        src = handles[source.path] = open(source.path, "rb")  # noqa: SIM115
                    _copy_range(src, f, source.offset, source.length)
                else:
                    f.write(source)
    finally:
        for h in handles.values():
            h.close()
    os.replace(tmp, out)
    return layout


def iter_tensor_bytes(path: Path, layout: Layout) -> Iterator[tuple[Tensor, bytes]]:
    """Each tensor with its bytes (for tests and checks on small files)."""
    with open(path, "rb") as f:
        for t in layout.tensors:
            f.seek(layout.data_start + t.begin)
            yield t, f.read(t.nbytes)


# -- the mutations ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Mutation:
    name: str
    file_size: int
    changed_bytes: int  # bytes of tensor data that are new (not counting the header)
    tensors: list[str]  # the tensors rewritten or added
    unit: str = "file"  # what file_size is the size of
    of_tensors: int = 0  # tensors there were to choose from (0: not said)

    @property
    def changed_fraction(self) -> float:
        return self.changed_bytes / self.file_size if self.file_size else 0.0

    def describe(self) -> str:
        of = f" of {self.of_tensors}" if self.of_tensors else ""
        return (
            f"{self.name}: {len(self.tensors)}{of} tensor{'s' if len(self.tensors) != 1 else ''}, "
            f"{self.changed_bytes / MIB:,.1f} MiB of new data ({100 * self.changed_fraction:.2f}% "
            f"of the {self.file_size / MIB:,.0f} MiB {self.unit})"
        )


def choose_rewrite(layout: Layout, fraction: float, seed: int) -> list[Tensor]:
    """Tensors whose total size comes closest to ``fraction`` of the data without exceeding it.

    Candidates come in a seeded random order, so the choice is spread over the file; a tensor
    next to one already chosen is passed over, so each change is a region of its own.
    """
    target = fraction * layout.data_size
    order = list(range(len(layout.tensors)))
    random.Random(f"rewrite/{seed}").shuffle(order)
    chosen: set[int] = set()
    total = 0
    for i in order:
        t = layout.tensors[i]
        if t.nbytes == 0 or i - 1 in chosen or i + 1 in chosen:
            continue
        new_total = total + t.nbytes
        if new_total <= target:
            chosen.add(i)
            total = new_total
    return [layout.tensors[i] for i in sorted(chosen)]


def rewrite_tensors(src: Path, out: Path, fraction: float = 0.02, seed: int = 0) -> Mutation:
    """``rewrite2pct``: a copy of ``src`` with ~fraction of its tensor data replaced in place.

    The header bytes are copied as they are (not re-encoded), so they stay identical.
    """
    layout = check(src)
    chosen = choose_rewrite(layout, fraction, seed)
    _rewrite_copy(src, out, layout, chosen, random.Random(f"rewrite-bytes/{seed}"))
    return Mutation(
        "rewrite2pct", layout.file_size, sum(t.nbytes for t in chosen), [t.name for t in chosen]
    )


def _rewrite_copy(
    src: Path, out: Path, layout: Layout, chosen: list[Tensor], rng: random.Random
) -> None:
    """Copy ``src`` to ``out`` with the data of ``chosen`` replaced by bytes from ``rng``."""
    tmp = out.with_name(f".{out.name}.tmp")
    shutil.copyfile(src, tmp)
    with open(tmp, "r+b") as f:
        for t in chosen:
            f.seek(layout.data_start + t.begin)
            left = t.nbytes
            while left:
                n = min(CHUNK, left)
                f.write(rng.randbytes(n))
                left -= n
    os.replace(tmp, out)


def new_step(step1: Path, step2: Path, fraction: float = 0.03, seed: int = 0) -> Mutation:
    """``new-step``: write ``step2``, the checkpoint directory ``step1`` one training step later.

    Whole tensors making up about ``fraction`` of the tensor bytes of all its ``.safetensors``
    shards together (one :func:`choose_rewrite` walk over the shards' tensors in file order)
    get new random bytes; every other file, and every other byte of the shards, is copied as it
    is (new files: the copies share no inode with ``step1``). ``step2`` is emptied first.
    """
    rels = sorted(p.relative_to(step1) for p in step1.rglob("*") if p.is_file())
    layouts = {r: check(step1 / r) for r in rels if r.suffix == ".safetensors"}
    pooled: list[Tensor] = []  # every shard's tensors, offsets as if the shards were one file
    where: dict[Tensor, tuple[Path, Tensor]] = {}
    base = 0
    for r, layout in layouts.items():
        for t in layout.tensors:
            moved = Tensor(t.name, t.dtype, t.shape, base + t.begin, base + t.end)
            pooled.append(moved)
            where[moved] = (r, t)
        base += layout.data_size
    chosen = [where[t] for t in choose_rewrite(Layout(0, None, pooled), fraction, seed)]
    if step2.exists():
        shutil.rmtree(step2)
    rng = random.Random(f"new-step-bytes/{seed}")
    for r in rels:
        (step2 / r).parent.mkdir(parents=True, exist_ok=True)
        mine = [t for owner, t in chosen if owner == r]
        if mine:
            _rewrite_copy(step1 / r, step2 / r, layouts[r], mine, rng)
        else:
            shutil.copyfile(step1 / r, step2 / r)
    total = sum((step2 / r).stat().st_size for r in rels)
    return Mutation(
        "new-step", total, sum(t.nbytes for _r, t in chosen), [f"{r}:{t.name}" for r, t in chosen],
        unit=f"step-2 ({len(rels)} files)", of_tensors=len(pooled),
    )  # fmt: skip


def add_tensor(
    src: Path,
    out: Path,
    nbytes: int = 4 * MIB,
    seed: int = 0,
    name: str = "model.bench_adapter.weight",
) -> Mutation:
    """``add-tensor``: ``src`` plus one new F16 tensor of ``nbytes`` in the middle of the data."""
    layout = check(src)
    if nbytes % 2:
        raise ValueError("an F16 tensor has an even number of bytes")
    if any(t.name == name for t in layout.tensors):
        raise SafetensorsError(f"{src}: already has a tensor {name!r}")
    elements = nbytes // 2
    cols = 1024 if elements % 1024 == 0 else 1
    shape = (elements // cols, cols)
    entries: list[tuple[str, str, tuple[int, ...], Source]] = []
    middle = len(layout.tensors) // 2
    for i, t in enumerate(layout.tensors):
        if i == middle:
            entries.append((name, "F16", shape, random.Random(f"add/{seed}").randbytes(nbytes)))
        entries.append(
            (t.name, t.dtype, t.shape, FromFile(src, layout.data_start + t.begin, t.nbytes))
        )
    if not layout.tensors:
        entries.append((name, "F16", shape, random.Random(f"add/{seed}").randbytes(nbytes)))
    new = write_safetensors(out, layout.metadata, entries)
    return Mutation("add-tensor", new.file_size, nbytes, [name])


def mutate(kind: str, src: Path, out: Path, seed: int = 0) -> Mutation:
    if kind == "rewrite2pct":
        return rewrite_tensors(src, out, 0.02, seed)
    if kind == "add-tensor":
        return add_tensor(src, out, 4 * MIB, seed)
    raise ValueError(f"unknown mutation {kind!r} (expected one of {', '.join(MUTATIONS)})")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="Write a slightly changed copy of a safetensors file.")
    p.add_argument("mutation", choices=MUTATIONS)
    p.add_argument("src", type=Path)
    p.add_argument("out", type=Path)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    m = mutate(args.mutation, args.src, args.out, args.seed)
    check(args.out)
    print(f"{args.out}: {m.describe()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
