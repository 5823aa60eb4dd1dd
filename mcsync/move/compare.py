"""``--checksum``: decide by content, not by size and time, whether a target object already
holds the source's bytes. The planner asks for this only where metadata is no evidence (see
``plan.plan``); here the bytes are read and hashed with xxh3-128, block by block.

Two kinds of evidence, the cheaper first:

* the manifest recorded the block hashes of what mcsync wrote, and the target's ETag (or, for
  files, its mtime) says it was not rewritten since: only the source is read, in the recorded
  block size, and compared with the record;
* otherwise both sides are read in the same blocks and their hashes compared.

Equal means every block hash is equal; nothing is declared equal without reading it.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from ..chunking import fixed_chunks
from ..config import SyncOptions
from ..delta.read import scan_chunks
from ..limits import Limits
from ..records import ManifestEntry
from ..stores.base import ReadStore, Store
from ..types import Capabilities, ObjectInfo


@dataclass(frozen=True, slots=True)
class Verdict:
    same: bool
    reason: str
    bytes_read: int
    block_size: int
    block_hashes: bytes  # the source's, in ``block_size`` blocks (for the manifest)
    chunk_sizes: bytes = b""  # as ManifestEntry.chunk_sizes: set when not fixed blocks
    chunker: str = "fixed"


def block_size_for(size: int, options: SyncOptions, caps: Capabilities) -> int:
    """The blocks a copy of an object this size to a store with ``caps`` would record (one
    for a whole-object PUT)."""
    return size if size <= options.multipart_threshold else options.part_size_for(size, caps)


async def compare(src: ReadStore, dst: Store, src_info: ObjectInfo, dst_info: ObjectInfo,
                  known: ManifestEntry | None, options: SyncOptions, limits: Limits) -> Verdict:
    recorded = (known is not None and known.xxh3 is not None and bool(known.chunks())
                and known.dst_size == src_info.size and known.matches_target(dst_info))
    if recorded:
        assert known is not None
        chunks = [rng for rng, _ in known.chunks()]
        ours = b"".join(await scan_chunks(src, src_info, chunks, known.block_size, limits))
        same = ours == known.block_hashes
        reason = ("same content as recorded for the target (xxh3-128)" if same else
                  "content differs from what the target holds (xxh3-128)")
        return Verdict(same, reason, src_info.size, known.block_size, ours, known.chunk_sizes,
                       known.chunker)
    bs = block_size_for(src_info.size, options, dst.caps)
    blocks = fixed_chunks(src_info.size, bs)
    ours, theirs = (b"".join(d) for d in await asyncio.gather(
        scan_chunks(src, src_info, blocks, bs, limits),
        scan_chunks(dst, dst_info, blocks, bs, limits)))
    same = ours == theirs
    reason = ("same content at source and target (xxh3-128)" if same else
              "content differs at source and target (xxh3-128)")
    return Verdict(same, reason, 2 * src_info.size, bs, ours)
