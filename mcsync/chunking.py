"""Where an object is cut into chunks: the units mcsync hashes, records and later matches.

A chunk map must be reproducible from the object's bytes alone, so the next run, cutting the
new version the same way, finds every unchanged chunk by its digest (see ``delta``):

- ``fixed``: blocks of ``block`` bytes from offset 0. An in-place rewrite or an append costs
  the changed blocks; an insert shifts everything after it.
- ``safetensors``: the header (8-byte little-endian length + JSON) is one chunk, and each
  tensor's bytes are cut into pieces of at most ``block`` bytes *from the tensor's start*, so a
  tensor keeps its chunks, and their digests, when a grown header shifts it.
- ``cdc``: content-defined boundaries (FastCDC 2020, from pyfastcdc: Cython, ~2 GB/s here),
  2 MiB on average, 512 KiB to 8 MiB, for formats where inserts shift everything after them.
  Boundaries depend only on the bytes since the previous one, so cutting can restart at any
  boundary: a stream is cut window by window (``cdc_cut``).

Upload parts are whole chunks grouped to at least the part size, so a part's bytes can be
hashed chunk by chunk wherever the parts arrive from.
"""

from __future__ import annotations

import functools
import json
import struct
from dataclasses import dataclass
from typing import Any

import xxhash

from .types import ByteRange

CDC_AVG = 2 * 1024 * 1024
CDC_MAX = 4 * CDC_AVG  # pyfastcdc's bounds: min = avg / 4, max = avg * 4

SAFETENSORS_SUFFIX = ".safetensors"
# A header larger than this is not a safetensors header (the reference implementation caps it
# at 100 MB); it is read in one request, so the cap also bounds that request.
MAX_SAFETENSORS_HEADER = 100_000_000
# The first read of a safetensors file: the header length and, usually, the whole header.
SAFETENSORS_PROBE = 1 << 20


class NotSafetensors(ValueError):
    """The bytes are not a safetensors header mcsync can cut by; the object is cut in fixed
    blocks instead."""


@dataclass(frozen=True, slots=True)
class Tensor:
    name: str
    start: int  # absolute offsets in the file
    end: int


@dataclass(frozen=True, slots=True)
class SafetensorsHeader:
    length: int  # bytes of the whole header: 8 + the JSON
    tensors: tuple[Tensor, ...]  # in file order


def header_length(prefix: bytes, size: int) -> int:
    """The header's total length (8 + JSON) from the file's first 8 bytes."""
    if len(prefix) < 8 or size < 8:
        raise NotSafetensors("shorter than 8 bytes")
    n: int = struct.unpack("<Q", prefix[:8])[0]
    if n > MAX_SAFETENSORS_HEADER or 8 + n > size:
        raise NotSafetensors(f"header length {n} does not fit a file of {size} bytes")
    return 8 + n


def parse_safetensors(head: bytes, size: int) -> SafetensorsHeader:
    """Parse the header from ``head`` (at least the header's bytes) of a file of ``size`` bytes.
    Raises NotSafetensors for anything that is not a well-formed header whose tensors tile the
    data section."""
    length = header_length(head, size)
    if len(head) < length:
        raise NotSafetensors("header truncated")
    try:
        meta = json.loads(bytes(head[8:length]).decode("utf-8"))
    except (ValueError, RecursionError) as exc:  # JSONDecodeError, UnicodeDecodeError among them
        # ValueError: also an integer of more digits than int() converts; RecursionError:
        # arrays nested deeper than the parser recurses
        raise NotSafetensors(f"header is not JSON: {str(exc)[:200]}") from None
    if not isinstance(meta, dict):
        raise NotSafetensors("header is not a JSON object")
    tensors = []
    for name, info in meta.items():
        if name == "__metadata__":
            continue
        offsets = info.get("data_offsets") if isinstance(info, dict) else None
        # Offsets are whole numbers, as the reference reader (serde, usize) insists: not 1.5,
        # not true, not Infinity (which Python's json accepts).
        if not (isinstance(offsets, list) and len(offsets) == 2
                and all(type(x) is int for x in offsets)):
            raise NotSafetensors(f"tensor {name[:200]!r} has no valid data_offsets")
        begin, end = offsets
        if not 0 <= begin <= end or length + end > size:
            raise NotSafetensors(f"tensor {name[:200]!r}: data_offsets [{begin}, {end}] out of "
                                 f"range for a data section of {size - length} bytes")
        tensors.append(Tensor(name, length + begin, length + end))
    tensors.sort(key=lambda t: (t.start, t.end))
    pos = length
    for t in tensors:
        if t.start != pos:
            raise NotSafetensors(f"tensor {t.name[:200]!r} at {t.start - length}: gap or overlap")
        pos = t.end
    if pos != size:
        raise NotSafetensors(f"tensors end at {pos - length}, data section is {size - length}")
    return SafetensorsHeader(length, tuple(tensors))


def fixed_chunks(size: int, block: int) -> list[ByteRange]:
    if size == 0:
        return [ByteRange(0, 0)]
    return [ByteRange(off, min(off + block, size)) for off in range(0, size, block)]


def safetensors_chunks(header: SafetensorsHeader, block: int) -> list[ByteRange]:
    chunks = fixed_chunks(header.length, block)
    for t in header.tensors:
        chunks.extend(ByteRange(off, min(off + block, t.end))
                      for off in range(t.start, t.end, block))  # empty tensors: no chunk
    return chunks


def group_parts(chunks: list[ByteRange], part_size: int) -> list[tuple[int, int]]:
    """Consecutive chunks grouped into parts of at least ``part_size`` bytes (the last part may
    be smaller): ``(first, last + 1)`` chunk indices per part."""
    parts = []
    first = 0
    length = 0
    for i, c in enumerate(chunks):
        length += c.length
        if length >= part_size:
            parts.append((first, i + 1))
            first, length = i + 1, 0
    if first < len(chunks):
        parts.append((first, len(chunks)))  # the last part may be short, as S3 allows
    return parts


def chunk_sizes_blob(chunks: list[ByteRange]) -> bytes:
    """Chunk lengths as the manifest stores them for chunk maps that are not fixed blocks."""
    return struct.pack(f"<{len(chunks)}Q", *(c.length for c in chunks))


def chunks_from_sizes(blob: bytes) -> list[ByteRange]:
    sizes = struct.unpack(f"<{len(blob) // 8}Q", blob)
    chunks = []
    pos = 0
    for n in sizes:
        chunks.append(ByteRange(pos, pos + n))
        pos += n
    return chunks


@functools.cache
def _fastcdc() -> Any:
    """The FastCDC cutter, made on first use: most runs never cut by content."""
    import pyfastcdc

    cutter = pyfastcdc.FastCDC(avg_size=CDC_AVG)
    assert cutter.max_size == CDC_MAX
    return cutter


def cdc_cut(buf: bytes | memoryview, *, eof: bool) -> list[int]:
    """Content-defined chunk lengths of ``buf``. Unless ``buf`` ends the object, the last chunk
    (cut by the buffer's end, not by content) is left out: cutting resumes there with more
    bytes, and finds the boundaries one pass over the whole object would."""
    lengths = [c.length for c in _fastcdc().cut_buf(buf)]
    return lengths if eof else lengths[:-1]


@dataclass(frozen=True, slots=True)
class Layout:
    """How an object is cut into chunks (see ``chunking``); ``block`` is the chunk size."""

    block: int
    chunks: list[ByteRange]
    chunker: str = "fixed"  # fixed, safetensors or cdc
    header: SafetensorsHeader | None = None  # set when cut by tensor
    digests: list[bytes] | None = None  # known already when cutting read the bytes (cdc)

    def chunk_sizes(self) -> bytes:
        return chunk_sizes_blob(self.chunks) if self.chunker != "fixed" else b""

    def fingerprint(self, part_size: int) -> str | None:
        """Identifies the parts' cut for the journal; None: fixed parts of part_size."""
        if self.chunker == "fixed":
            return None
        return f"{self.chunker}:{self.block}:{part_size}:" + xxhash.xxh3_64_hexdigest(
            self.chunk_sizes())
