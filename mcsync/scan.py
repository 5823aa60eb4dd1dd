"""Read an object and hash it chunk by chunk: what the delta, ``--checksum`` and ``verify``
know of an object's bytes without keeping them."""

from __future__ import annotations

import asyncio

from .chunking import group_parts
from .errors import IntegrityError
from .hashing import chunk_digests_async
from .limits import Limits
from .stores.base import Store
from .types import ByteRange, ObjectInfo

SCAN_WINDOW = 8  # reads of one object in flight, as for the parts of one upload


async def scan_chunks(store: Store, info: ObjectInfo, chunks: list[ByteRange], read_size: int,
                      limits: Limits, *, pinned: bool = True) -> list[bytes]:
    """The xxh3-128 of each chunk of ``info``. Chunks are read in groups of at least
    ``read_size`` bytes, each read pinned to the listed version (``pinned``), so a concurrent
    change raises PreconditionFailed instead of mixing two versions' hashes."""
    digests: list[bytes] = [b""] * len(chunks)
    window = asyncio.Semaphore(SCAN_WINDOW)

    async def one(first: int, last: int) -> None:
        try:
            rng = ByteRange(chunks[first].start, chunks[last - 1].end)
            whole = rng.length == info.size
            async with limits.memory.hold(rng.length), limits.requests:
                data = await store.get(info.key, None if whole else rng,
                                       expect=info if pinned else None)
                if len(data) != rng.length:
                    raise IntegrityError(f"{store.url}{info.key}: read {len(data)} bytes of "
                                         f"{rng.length} at {rng.start}")
                digests[first:last] = await chunk_digests_async(data, rng.start,
                                                                chunks[first:last])
                del data
        finally:
            window.release()

    async with asyncio.TaskGroup() as tg:
        for first, last in group_parts(chunks, read_size):
            await window.acquire()
            tg.create_task(one(first, last))
    return digests
