"""Parts streamed into a file as they arrive (an S3 range into a local file).

One worker thread drains the range's pieces, hashing each chunk as it passes and writing the
piece at its offset: no buffer of the part's size is assembled, so a part in flight holds about
one piece of memory, and a part can be a large range (few requests) at no memory cost.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Protocol

import xxhash

from .types import Buffer, ByteRange

MiB = 1024 * 1024
# Bytes per request when a part streams into a file. Fewer, larger GETs cost the client and the
# server less per byte; 64 MiB did best of the range sizes measured (benchmarks/results/
# figures-from-code.md, and 2026-12-01.md). The chunks hashed and recorded stay the part size
# the layout was cut with.
STREAM_PART_SIZE = 64 * MiB
# Memory a streamed part is charged against the budget: the piece in hand, the one obstore is
# filling and its read buffer (the RSS a stream measured: benchmarks/results/figures-from-code.md).
STREAM_PART_HOLD = 2 * MiB


class ChunkHasher:
    """The xxh3-128 of each chunk of a part, fed the part's bytes in order in pieces of any
    size: the same digests ``hashing.chunk_digests`` gives for the whole part at once."""

    def __init__(self, chunks: Sequence[ByteRange]) -> None:
        self._ends = [c.end for c in chunks]
        self._pos = chunks[0].start if chunks else 0
        self._state = xxhash.xxh3_128()
        self._done: list[bytes] = []

    def update(self, piece: Buffer) -> None:
        view = memoryview(piece)
        while view:
            if len(self._done) == len(self._ends):
                raise ValueError("more bytes than the chunks hold")
            take = min(len(view), self._ends[len(self._done)] - self._pos)
            self._state.update(view[:take])
            self._pos += take
            view = view[take:]
            if self._pos == self._ends[len(self._done)]:
                self._done.append(self._state.digest())
                self._state.reset()

    def digests(self) -> list[bytes]:
        if len(self._done) != len(self._ends):
            raise ValueError("fewer bytes than the chunks hold")
        return self._done


class WritesAt(Protocol):
    """Where streamed bytes go: a ``FileUpload`` of a target, or a file of the node cache."""

    def write_at(self, offset: int, data: Buffer) -> None: ...


def drain_into(pieces: Iterator[Buffer], upload: WritesAt, rng: ByteRange,
               chunks: Sequence[ByteRange]) -> list[bytes]:
    """Write ``pieces`` (the bytes of ``rng``, in order) into ``upload`` at their offsets and
    return the digests of ``chunks``. Blocking: runs in a worker thread."""
    hasher = ChunkHasher(chunks)
    pos = rng.start
    for piece in pieces:
        hasher.update(piece)
        upload.write_at(pos, piece)
        pos += len(piece)
    return hasher.digests()  # the iterator raised if the range came back short or long
