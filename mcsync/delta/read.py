"""Read an object to cut it into chunks and hash them: what the delta, ``--checksum`` and
``verify`` know of an object's bytes without keeping them."""

from __future__ import annotations

import asyncio
import contextlib
import logging

from .. import checksums
from ..chunking import (
    CDC_AVG,
    CDC_MAX,
    SAFETENSORS_PROBE,
    SAFETENSORS_SUFFIX,
    Layout,
    NotSafetensors,
    SafetensorsHeader,
    cdc_cut,
    fixed_chunks,
    group_parts,
    header_length,
    parse_safetensors,
    safetensors_chunks,
)
from ..errors import IntegrityError
from ..hashing import chunk_digests, chunk_digests_async
from ..limits import Limits
from ..stores.base import ReadsInto, ReadStore
from ..types import Buffer, ByteRange, ObjectInfo

log = logging.getLogger(__name__)

SCAN_WINDOW = 8  # reads of one object in flight, as for the parts of one upload


async def scan_chunks(store: ReadStore, info: ObjectInfo, chunks: list[ByteRange], read_size: int,
                      limits: Limits, *, pinned: bool = True) -> list[bytes]:
    """The xxh3-128 of each chunk of ``info``. Chunks are read in groups of at least
    ``read_size`` bytes, each read pinned to the listed version (``pinned``), so a concurrent
    change raises PreconditionFailed instead of mixing two versions' hashes."""
    digests: list[bytes] = [b""] * len(chunks)
    window = asyncio.Semaphore(SCAN_WINDOW)
    groups = group_parts(chunks, read_size)
    # A source that keeps a CRC32C (GCS) is checked against it on the way: the delta records
    # these digests and sends some of these bytes without reading them again whole.
    check_crc = (pinned and info.crc32c is not None and bool(chunks) and chunks[0].start == 0
                 and sum(c.length for c in chunks) == info.size)  # the whole object only
    crcs: list[tuple[int, int]] = [(0, 0)] * len(groups)

    async def one(index: int, first: int, last: int) -> None:
        try:
            rng = ByteRange(chunks[first].start, chunks[last - 1].end)
            whole = rng.length == info.size
            expect = info if pinned else None
            async with limits.parts.slot(), limits.memory.hold(rng.length), limits.requests:
                # A file is read into a buffer of the run's (see BufferPool), others whole.
                with contextlib.ExitStack() as held:
                    if isinstance(store, ReadsInto) and rng.length:
                        buf = held.enter_context(limits.buffers.lent(rng.length))
                        data: Buffer = await store.read_into(info.key, rng, buf, expect=expect)
                    else:
                        data = await store.get(info.key, None if whole else rng, expect=expect)
                    limits.parts.moved(len(data))
                    if len(data) != rng.length:
                        raise IntegrityError(f"{store.url}{info.key}: read {len(data)} bytes "
                                             f"of {rng.length} at {rng.start}")
                    digests[first:last] = await chunk_digests_async(data, rng.start,
                                                                    chunks[first:last])
                    if check_crc:
                        crcs[index] = (await checksums.crc32c_async(data), len(data))
                    del data
        finally:
            window.release()

    async with asyncio.TaskGroup() as tg:
        for index, (first, last) in enumerate(groups):
            await window.acquire()
            tg.create_task(one(index, first, last))
    if check_crc:
        checksums.verify(info.crc32c, checksums.combine_parts(crcs), f"{store.url}{info.key}")
    return digests


CDC_WINDOW = 32 * 1024 * 1024  # bytes read per request while cutting by content


async def scan_cdc(store: ReadStore, info: ObjectInfo, limits: Limits,
                   window: int = CDC_WINDOW) -> tuple[list[ByteRange], list[bytes]]:
    """Cut ``info`` by content and hash each chunk, reading it front to back in windows (the
    next window is fetched while this one is cut), each read pinned to the listed version."""
    size = info.size
    window = max(window, 2 * CDC_MAX)
    chunks: list[ByteRange] = []
    digests: list[bytes] = []
    crc = 0

    async def read(start: int) -> Buffer:
        rng = ByteRange(start, min(start + window, size))
        async with limits.requests:
            data = await store.get(info.key, None if rng.length == size else rng, expect=info)
        if len(data) != rng.length:
            raise IntegrityError(f"{store.url}{info.key}: read {len(data)} bytes of "
                                 f"{rng.length} at {rng.start}")
        return data

    async with limits.memory.hold(3 * window):  # the window, the next one, and the carry
        carry = b""  # the bytes after the last boundary found, cut again with the next window
        base = 0  # object offset of carry[0]
        read_pos = 0
        ahead: asyncio.Task[Buffer] | None = None
        if size:
            ahead = asyncio.create_task(read(0))
        try:
            while ahead is not None:
                data = await ahead
                if info.crc32c is not None:
                    crc = checksums.combine(crc, await checksums.crc32c_async(data), len(data))
                read_pos += len(data)
                ahead = asyncio.create_task(read(read_pos)) if read_pos < size else None
                # One copy of the window, only when a carry must precede it.
                buf: bytes | memoryview = (memoryview(data) if not carry
                                           else b"".join((carry, data)))
                eof = read_pos >= size
                lengths = await asyncio.to_thread(cdc_cut, buf, eof=eof)
                cut = []
                pos = base
                for n in lengths:
                    cut.append(ByteRange(pos, pos + n))
                    pos += n
                digests.extend(await asyncio.to_thread(chunk_digests, buf, base, cut))
                chunks.extend(cut)
                carry = bytes(buf[pos - base:])  # < one chunk
                base = pos
        finally:
            if ahead is not None:
                ahead.cancel()
    checksums.verify(info.crc32c, crc, f"{store.url}{info.key}")
    if not chunks:
        chunks, digests = [ByteRange(0, 0)], [chunk_digests(b"", 0, [ByteRange(0, 0)])[0]]
    return chunks, digests


async def cut(store: ReadStore, info: ObjectInfo, block: int, chunker: str,
              limits: Limits) -> Layout:
    """How ``info`` is cut into chunks: content-defined with ``cdc`` (reads the object once to
    find the boundaries, hashing it on the way), by tensor for a safetensors file (``auto``,
    ``safetensors``: one small read of the header), else in fixed blocks of ``block``."""
    if chunker == "cdc":
        chunks, digests = await scan_cdc(store, info, limits)
        return Layout(CDC_AVG, chunks, "cdc", digests=digests)
    if chunker in ("auto", "safetensors") and info.key.endswith(SAFETENSORS_SUFFIX):
        try:
            header = await read_safetensors_header(store, info, limits)
        except NotSafetensors as exc:
            log.info("%s: not cut by tensor: %s; fixed blocks instead", info.key, exc)
        else:
            return Layout(block, safetensors_chunks(header, block), "safetensors", header)
    return Layout(block, fixed_chunks(info.size, block))


async def read_safetensors_header(store: ReadStore, info: ObjectInfo,
                                  limits: Limits) -> SafetensorsHeader:
    probe = ByteRange(0, min(SAFETENSORS_PROBE, info.size))
    async with limits.requests:
        head = await store.get(info.key, probe, expect=info)
    length = header_length(bytes(head[:8]), info.size)
    if length > len(head):
        async with limits.memory.hold(length), limits.requests:
            head = await store.get(info.key, ByteRange(0, length), expect=info)
    return parse_safetensors(bytes(head[:length]), info.size)
