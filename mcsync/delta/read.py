"""Read an object to cut it into chunks and hash them: what the delta, ``--checksum`` and
``verify`` know of an object's bytes without keeping them."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

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


class Scan(Protocol):
    """Where an object's chunks are read and hashed: in this process (``LocalScan``), or in
    byte ranges on workers (``move.hash_tasks.RemoteScan``); the digests are the same."""

    async def chunks(self, info: ObjectInfo, chunks: list[ByteRange],
                     read_size: int) -> list[bytes]: ...

    async def cdc(self, info: ObjectInfo) -> tuple[list[ByteRange], list[bytes]]: ...


@dataclass(frozen=True, slots=True)
class LocalScan:
    """Read and hash in this process."""

    store: ReadStore
    limits: Limits

    async def chunks(self, info: ObjectInfo, chunks: list[ByteRange],
                     read_size: int) -> list[bytes]:
        return await scan_chunks(self.store, info, chunks, read_size, self.limits)

    async def cdc(self, info: ObjectInfo) -> tuple[list[ByteRange], list[bytes]]:
        return await scan_cdc(self.store, info, self.limits)


def covers(info: ObjectInfo, chunks: list[ByteRange]) -> bool:
    return (bool(chunks) and chunks[0].start == 0
            and sum(c.length for c in chunks) == info.size)


async def scan_chunks(store: ReadStore, info: ObjectInfo, chunks: list[ByteRange], read_size: int,
                      limits: Limits, *, pinned: bool = True) -> list[bytes]:
    """The xxh3-128 of each chunk of ``info``. Chunks are read in groups of at least
    ``read_size`` bytes, each read pinned to the listed version (``pinned``), so a concurrent
    change raises PreconditionFailed instead of mixing two versions' hashes."""
    # A source that keeps a CRC32C (GCS) is checked against it on the way: the delta records
    # these digests and sends some of these bytes without reading them again whole.
    check_crc = pinned and info.crc32c is not None and covers(info, chunks)
    digests, crc = await scan_span(store, info, chunks, read_size, limits, pinned=pinned,
                                   crc=check_crc)
    if crc is not None:
        checksums.verify(info.crc32c, crc[0], f"{store.url}{info.key}")
    return digests


async def scan_span(store: ReadStore, info: ObjectInfo, chunks: list[ByteRange], read_size: int,
                    limits: Limits, *, pinned: bool = True,
                    crc: bool = False) -> tuple[list[bytes], tuple[int, int] | None]:
    """``scan_chunks`` of any chunks, and with ``crc`` (chunks back to back) the CRC32C of
    their span and its length, for the caller to combine and check."""
    digests: list[bytes] = [b""] * len(chunks)
    window = asyncio.Semaphore(SCAN_WINDOW)
    groups = group_parts(chunks, read_size)
    check_crc = crc
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
        return digests, (checksums.combine_parts(crcs), sum(n for _, n in crcs))
    return digests, None


CDC_WINDOW = 32 * 1024 * 1024  # bytes read per request while cutting by content


async def scan_cdc(store: ReadStore, info: ObjectInfo, limits: Limits,
                   window: int = CDC_WINDOW) -> tuple[list[ByteRange], list[bytes]]:
    """Cut ``info`` by content and hash each chunk, reading it front to back in windows (the
    next window is fetched while this one is cut), each read pinned to the listed version."""
    chunks, digests, crc = await cdc_from(store, info, limits, 0, info.size,
                                          window=max(window, 2 * CDC_MAX))
    checksums.verify(info.crc32c, crc, f"{store.url}{info.key}")
    if not chunks:
        chunks, digests = [ByteRange(0, 0)], [chunk_digests(b"", 0, [ByteRange(0, 0)])[0]]
    return chunks, digests


async def cdc_from(store: ReadStore, info: ObjectInfo, limits: Limits, start: int, until: int,
                   *, window: int = CDC_WINDOW, done: Callable[[int], bool] | None = None,
                   ahead: bool = True,
                   crc_to: int | None = None) -> tuple[list[ByteRange], list[bytes], int]:
    """Content-defined chunks cut from ``start`` (taken for a boundary) up to the first
    boundary at or past ``until`` (or where ``done`` says, told each chunk's end), their
    digests, and the CRC32C of ``[start, crc_to)`` (``until`` by default). Reads stop at
    ``until + CDC_MAX``: the chunk that crosses ``until`` ends before that, so it is cut by
    content, as a pass over the whole object cuts it. ``ahead``: fetch the next window while
    this one is cut."""
    size = info.size
    limit = min(size, until + CDC_MAX)
    chunks: list[ByteRange] = []
    digests: list[bytes] = []
    crc = 0
    finished = done or (lambda end: end >= until)
    crc_end = until if crc_to is None else crc_to

    async def read(at: int) -> Buffer:
        rng = ByteRange(at, min(at + window, limit))
        async with limits.requests:
            data = await store.get(info.key, None if rng.length == size else rng, expect=info)
        if len(data) != rng.length:
            raise IntegrityError(f"{store.url}{info.key}: read {len(data)} bytes of "
                                 f"{rng.length} at {rng.start}")
        return data

    async with limits.memory.hold(3 * window):  # the window, the next one, and the carry
        carry = b""  # the bytes after the last boundary found, cut again with the next window
        base = start  # object offset of carry[0]
        read_pos = start
        pending: asyncio.Task[Buffer] | None = None
        if start < limit:
            pending = asyncio.create_task(read(start))
        try:
            while pending is not None:
                data = await pending
                if info.crc32c is not None and read_pos < crc_end:
                    part = memoryview(data)[:crc_end - read_pos]
                    crc = checksums.combine(crc, await checksums.crc32c_async(part), len(part))
                read_pos += len(data)
                pending = None
                if ahead and read_pos < limit:
                    pending = asyncio.create_task(read(read_pos))
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
                    if finished(pos):
                        break
                digests.extend(await asyncio.to_thread(chunk_digests, buf, base, cut))
                chunks.extend(cut)
                if cut and finished(cut[-1].end):
                    break
                carry = bytes(buf[pos - base:])  # < one chunk
                base = pos
                if pending is None and read_pos < limit:
                    pending = asyncio.create_task(read(read_pos))
        finally:
            if pending is not None:
                pending.cancel()
    return chunks, digests, crc


async def cut(store: ReadStore, info: ObjectInfo, block: int, chunker: str,
              limits: Limits, scan: Scan | None = None) -> Layout:
    """How ``info`` is cut into chunks: content-defined with ``cdc`` (reads the object once to
    find the boundaries, hashing it on the way: by ``scan``, here by default), by tensor for a
    safetensors file (``auto``, ``safetensors``: one small read of the header), else in fixed
    blocks of ``block``."""
    if chunker == "cdc":
        chunks, digests = await (scan or LocalScan(store, limits)).cdc(info)
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
