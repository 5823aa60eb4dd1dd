"""Filling one cache entry: its missing parts fetched by parallel ranges into its partial file,
then made complete.

The reader's needs first: the first missing part (a checkpoint's header and first tensors)
is fetched alone, with the whole link to itself, and each part whose body has arrived lets one
more start, up to ``concurrency``, in file order, so parts land about in the order a reader
going front to back asks for them and the link is kept full (``_Ramp``).

Each part is a range GET pinned to the entry's version (``expect=``: If-Match on the ETag, or
the GCS generation), streamed into the file at its offset and hashed on the way
(``streaming.drain_into``), fdatasync'd, and only then recorded in the index with its digest:
a part the index names is on disk whole. A filler that dies leaves the recorded parts for the
next one; a part it was writing is written again whole. A source that changed answers
PreconditionFailed, and the caller drops the entry: no entry holds bytes of two versions.
Commit: fsync, rename into ``objects/``, fsync the directory, mark the entry complete.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import xxhash

from ..errors import PreconditionFailed, Transient
from ..hashing import object_digest
from ..retry import RetryPolicy, retrying
from ..stores.base import RangeStreamer, ReadStore
from ..stores.local_files import pwrite_all
from ..streaming import drain_into
from ..types import Buffer, ByteRange
from .files import Layout
from .index import Entry, Index

# Bytes of each part written so far (part number → bytes from its start), for a reader in
# this process: it may read them before the part is fdatasync'd and recorded (the page cache
# holds them), so its first byte comes as the first piece lands.
Landed = dict[int, int]


@dataclass(frozen=True, slots=True)
class _File:
    fd: int
    landed: Landed | None = None
    number: int = 0
    start: int = 0

    def write_at(self, offset: int, data: Buffer) -> None:
        pwrite_all(self.fd, data, offset)
        if self.landed is not None:  # pieces come in order: what is below is written
            self.landed[self.number] = offset + len(data) - self.start


def part_range(entry: Entry, number: int) -> ByteRange:
    start = number * entry.part_size
    return ByteRange(start, min(entry.size, start + entry.part_size))


def _drain(pieces: Iterator[Buffer], out: _File, rng: ByteRange) -> bytes:
    return drain_into(pieces, out, rng, [rng])[0]


def _write(data: Buffer, fd: int, rng: ByteRange) -> bytes:
    pwrite_all(fd, data, rng.start)
    os.fdatasync(fd)
    return xxhash.xxh3_128_digest(data)


class _Ramp:
    """How many parts may be in flight: one at first, one more each time a part's body has
    arrived (before its fdatasync and record, so the link does not idle), up to ``limit``."""

    def __init__(self, limit: int) -> None:
        self.limit = max(1, limit)
        self.allowed = 1
        self.busy = 0
        self.changed = asyncio.Event()

    async def take(self) -> None:
        while self.busy >= self.allowed:
            self.changed.clear()
            await self.changed.wait()
        self.busy += 1

    def arrived(self) -> None:
        self.allowed = min(self.limit, self.allowed + 1)
        self.changed.set()

    def done(self) -> None:
        self.busy -= 1
        self.changed.set()


async def fill(store: ReadStore, key: str, entry: Entry, fd: int, index: Index,
               layout: Layout, *, concurrency: int, policy: RetryPolicy,
               on_bytes: Callable[[int], None] = lambda n: None,
               landed: Landed | None = None) -> str:
    """Fetch the parts of ``entry`` the index does not hold into its partial file ``fd``
    (whose lock the caller holds), commit the entry and return its digest. Raises
    PreconditionFailed when the source is no longer the entry's version."""
    expect = entry.info(key)
    done = index.parts_done(entry.id)
    digests: dict[int, bytes] = dict(done)
    ramp = _Ramp(concurrency)
    streams = isinstance(store, RangeStreamer)

    async def part(number: int) -> None:
        rng = part_range(entry, number)

        async def once() -> bytes:
            if streams:
                assert isinstance(store, RangeStreamer)
                body = await store.open_range(key, rng, expect=expect)
                got = await asyncio.to_thread(_drain, body, _File(fd, landed, number, rng.start),
                                              rng)
                ramp.arrived()
                await asyncio.to_thread(os.fdatasync, fd)
                return got
            data = await store.get(key, rng, expect=expect)
            if len(data) != rng.length:
                raise Transient(f"read {len(data)} bytes of a {rng.length}-byte range")
            ramp.arrived()
            return await asyncio.to_thread(_write, data, fd, rng)

        try:
            # A request is retried by the store's retry layer; a body broken off on the way
            # is a new request for the whole part, here.
            digest = await retrying(once, policy, retry_on=Transient)
            await asyncio.to_thread(index.part_done, entry.id, number, digest)
            digests[number] = digest
            on_bytes(rng.length)
        finally:
            ramp.done()

    if entry.size == 0:
        digests = {0: xxhash.xxh3_128_digest(b"")}
    else:
        missing = [n for n in range(entry.parts) if n not in done]
        try:
            async with asyncio.TaskGroup() as group:
                for number in missing:  # started here, one by one: file order
                    await ramp.take()
                    group.create_task(part(number))
        except BaseExceptionGroup as failed:
            # One part's error is the entry's: a changed source first (the caller drops it)
            changed = failed.subgroup(PreconditionFailed)
            raise (changed or failed).exceptions[0] from None
    digest = object_digest([digests[n] for n in range(entry.parts)])
    await asyncio.to_thread(_commit, fd, entry, index, layout, digest)
    return digest


def _commit(fd: int, entry: Entry, index: Index, layout: Layout, digest: str) -> None:
    if os.fstat(fd).st_size != entry.size:
        os.ftruncate(fd, entry.size)  # parts written at offsets: a trailing hole is no byte
    os.fsync(fd)
    partial, final = layout.partial(entry.id), layout.object(entry.id)
    if partial.exists():
        os.rename(partial, final)
    layout.sync_dir(final.parent)
    index.complete(entry.id, digest)


def rehash(path: str, entry: Entry) -> str:
    """The digest of a complete entry's file as fill computed it: per part, then the object.
    Blocking."""
    digests = []
    with open(path, "rb", buffering=0) as f:
        size = os.fstat(f.fileno()).st_size
        if size != entry.size:
            return f"size {size}"
        if entry.size == 0:
            return object_digest([xxhash.xxh3_128_digest(b"")])
        for _ in range(entry.parts):
            state = xxhash.xxh3_128()
            left = entry.part_size
            while left:
                chunk = f.read(min(left, 8 << 20))
                if not chunk:
                    break
                state.update(chunk)
                left -= len(chunk)
            digests.append(state.digest())
    return object_digest(digests)
