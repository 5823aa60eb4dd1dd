"""Checkpoints streamed into memory: a safetensors file read through the cache, its tensors
handed out as their bytes arrive (``Cache.iter_safetensors``, ``Cache.load_safetensors``).

The file is opened as any cache entry (``Cache.open``): a miss starts the fill, which fetches
the entry's parts by parallel range GETs, front to back, into the cache's file, and the
reader reads each byte as soon as it has landed there. The header comes first (its 8-byte
length, then the JSON, which may span several parts), then each tensor in file order, read
into a buffer of its own (``readinto``: no copy of a large tensor through a smaller buffer).
So a restore after preemption needs no download-then-load pass, resumes a fill a killed load
left (only the parts not yet on disk are fetched), and a second load reads local disk.

Tensors are numpy arrays (``framework="np"``), or torch tensors (``"pt"``, torch installed),
which also have bfloat16 and float8, which numpy lacks.
"""

from __future__ import annotations

import io
import json
import math
from collections.abc import Callable, Iterator
from typing import Any, BinaryIO, Literal

import numpy as np

from ..chunking import NotSafetensors, header_length, parse_safetensors
from ..errors import IntegrityError, UsageError

Framework = Literal["np", "pt"]

# safetensors' dtype names → numpy's (little-endian, as the format stores them)
NUMPY = {"F64": "<f8", "F32": "<f4", "F16": "<f2", "I64": "<i8", "I32": "<i4", "I16": "<i2",
         "I8": "i1", "U64": "<u8", "U32": "<u4", "U16": "<u2", "U8": "u1", "BOOL": "?"}
TORCH = {"F64": "float64", "F32": "float32", "F16": "float16", "BF16": "bfloat16",
         "I64": "int64", "I32": "int32", "I16": "int16", "I8": "int8", "U8": "uint8",
         "U16": "uint16", "U32": "uint32", "U64": "uint64", "BOOL": "bool",
         "F8_E4M3": "float8_e4m3fn", "F8_E5M2": "float8_e5m2"}
ITEMSIZE = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1,
            "U8": 1, "U16": 2, "U32": 4, "U64": 8, "BOOL": 1, "F8_E4M3": 1, "F8_E5M2": 1}


def iter_safetensors(open_: Callable[[str], BinaryIO], url: str, framework: Framework = "np",
                     ) -> Iterator[tuple[str, Any]]:
    """``(name, tensor)`` of the safetensors object at ``url``, opened by ``open_`` (the
    cache's ``open``), in file order, each as soon as its bytes are in the cache."""
    if framework not in ("np", "pt"):
        raise UsageError(f"framework {framework!r}: np (numpy) or pt (torch)")
    with open_(url) as f:
        raw: Any = f.raw if isinstance(f, io.BufferedReader) else f
        size = raw.seek(0, 2)
        raw.seek(0)
        prefix = _read(raw, 8, url)
        length = _header_length(url, bytes(prefix), size)
        head = prefix + _read(raw, length - 8, url)
        try:
            layout = parse_safetensors(bytes(head), size)  # offsets checked: they tile the data
            meta = json.loads(head[8:length])
        except NotSafetensors as exc:
            raise IntegrityError(f"{url}: not a safetensors file: {exc}") from None
        for t in layout.tensors:
            dtype, shape = _kind(url, t.name, meta[t.name], t.end - t.start)
            buf = bytearray(t.end - t.start)
            raw.seek(t.start)
            _read_into(raw, buf, url)
            yield t.name, _tensor(buf, dtype, shape, framework, url, t.name)
        # A read at the end returns once this process's fill has committed the entry: a
        # caller that closes the cache next would otherwise cancel its last parts' records.
        raw.seek(size)
        raw.readinto(bytearray(1))


def load_safetensors(open_: Callable[[str], BinaryIO], url: str, framework: Framework = "np",
                     ) -> dict[str, Any]:
    """Every tensor of the safetensors object at ``url``, by name."""
    return dict(iter_safetensors(open_, url, framework))


def _header_length(url: str, prefix: bytes, size: int) -> int:
    try:
        return header_length(prefix, size)
    except NotSafetensors as exc:
        raise IntegrityError(f"{url}: not a safetensors file: {exc}") from None


def _kind(url: str, name: str, info: Any, nbytes: int) -> tuple[str, tuple[int, ...]]:
    dtype, shape = info.get("dtype"), info.get("shape")
    if dtype not in ITEMSIZE or not isinstance(shape, list) or \
            not all(type(n) is int and n >= 0 for n in shape):
        raise IntegrityError(f"{url}: tensor {name[:200]!r}: dtype {str(dtype)[:20]!r} or shape "
                             f"{str(shape)[:60]} not understood")
    if math.prod(shape) * ITEMSIZE[dtype] != nbytes:
        raise IntegrityError(f"{url}: tensor {name[:200]!r}: {nbytes} bytes for shape {shape} "
                             f"of {dtype}")
    return dtype, tuple(shape)


def _tensor(buf: bytearray, dtype: str, shape: tuple[int, ...], framework: Framework,
            url: str, name: str) -> Any:
    if framework == "pt":
        import torch  # an optional dependency: only for framework="pt"

        kind = getattr(torch, TORCH[dtype], None)
        if kind is None:  # uint16-64 and float8 came in later torch releases
            raise UsageError(f"{url}: tensor {name[:200]!r} is {dtype}, which this torch "
                             f"({torch.__version__}) has no type for")
        if not buf:
            return torch.empty(shape, dtype=kind)
        return torch.frombuffer(buf, dtype=kind).reshape(shape)
    if dtype not in NUMPY:
        raise UsageError(f"{url}: tensor {name[:200]!r} is {dtype}, which numpy has no type "
                         "for: load it with framework='pt'")
    return np.frombuffer(buf, dtype=np.dtype(NUMPY[dtype])).reshape(shape)


def _read(raw: Any, n: int, url: str) -> bytearray:
    buf = bytearray(n)
    _read_into(raw, buf, url)
    return buf


def _read_into(raw: Any, buf: bytearray, url: str) -> None:
    view = memoryview(buf)
    got = 0
    while got < len(buf):
        n = raw.readinto(view[got:])
        if not n:
            raise IntegrityError(f"{url}: ended at byte {raw.tell()}, {len(buf) - got} bytes "
                                 "short of its header's tensors")
        got += n
