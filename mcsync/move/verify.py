"""Re-read what a target holds and compare it with what the manifest says mcsync wrote there.

Objects whose bytes passed through mcsync are re-read block by block and each block's xxh3-128
is compared with the recorded one; objects copied server-side (no recorded bytes) are checked
by size and ETag.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator

from ..config import MIN_PART_SIZE
from ..delta.read import scan_chunks
from ..errors import MCSyncError, NotFound
from ..limits import Limits
from ..records import ManifestEntry
from ..stores.base import ReadStore


async def verify_entries(dst: ReadStore, entries: Iterator[ManifestEntry], limits: Limits,
                         *, selects: Callable[[str], bool] = lambda key: True,
                         ) -> tuple[int, list[tuple[str, str]]]:
    """How many recorded objects were checked, and (key, problem) for every one the target
    no longer holds as mcsync wrote it."""
    problems: list[tuple[str, str]] = []
    checked = 0
    objects = asyncio.Semaphore(32)

    async def check(entry: ManifestEntry) -> None:
        try:
            problem = await verify_one(dst, entry, limits)
        except (MCSyncError, OSError) as exc:
            problem = str(exc)
        finally:
            objects.release()
        if problem:
            problems.append((entry.key, problem))

    async with asyncio.TaskGroup() as tg:
        for i, entry in enumerate(entries):
            if not selects(entry.key):
                continue
            await objects.acquire()
            checked += 1
            tg.create_task(check(entry))
            if i % 1000 == 999:
                await asyncio.sleep(0)
    return checked, sorted(problems)


async def verify_one(dst: ReadStore, entry: ManifestEntry, limits: Limits) -> str | None:
    try:
        async with limits.requests:
            there = await dst.head(entry.key)
    except NotFound:
        return "missing at target"
    if there.size != entry.dst_size:
        return f"size {there.size}, manifest says {entry.dst_size}"
    if entry.block_size == 0:
        if entry.dst_etag is not None and there.etag != entry.dst_etag:
            return f"etag {there.etag}, manifest says {entry.dst_etag}"
        return None
    recorded = entry.chunks()
    if not recorded:
        return "the manifest's block hashes do not fit the object's size"
    ranges = [rng for rng, _ in recorded]
    # Read in reads of at least a block (small tensor chunks are grouped), unpinned: the
    # target's bytes are what is being checked.
    found = await scan_chunks(dst, there, ranges, max(entry.block_size, MIN_PART_SIZE), limits,
                              pinned=False)
    bad = [rng for (rng, want), got in zip(recorded, found, strict=True) if want != got]
    if bad:
        return (f"content differs from what mcsync wrote in {len(bad)} of {len(ranges)} "
                f"chunks (first at byte {bad[0].start})")
    return None
