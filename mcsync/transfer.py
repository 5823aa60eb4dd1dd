"""Carry out one planned action: a whole-object copy, a multipart copy, a server-side copy or a
delete. Every byte that passes through the client is hashed (xxh3-128) as it moves.

Memory: a buffer's size is taken from the run's ByteBudget *before* it is read and given back
once the target has acknowledged it. Requests: each GET / PUT / part holds one slot of the
requests semaphore while it is on the wire.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import cast

from .config import S3_MAX_PART_SIZE, SyncOptions
from .errors import IntegrityError, MCSyncError, first_error
from .events import BytesMoved, Event
from .hashing import block_digest_async, object_digest
from .limits import Limits
from .plan import Action
from .report import ObjectResult
from .stores.base import ServerCopyStore, Store, Upload
from .types import ByteRange, ObjectInfo, PartRef


@dataclass
class Transfer:
    """The context every action of one run shares."""

    src: Store
    dst: Store
    options: SyncOptions
    limits: Limits
    emit: Callable[[Event], None]

    async def run(self, action: Action) -> ObjectResult:
        if action.kind == "delete":
            async with self.limits.requests:
                await self.dst.delete(action.key)
            return ObjectResult(action.key, "delete", action.size, 0)
        self.dst.validate_key(action.key)
        if action.kind == "server_copy":
            return await self._server_copy(action)
        return await self._copy(action)

    # -- through the client --------------------------------------------------------------------

    async def _copy(self, action: Action) -> ObjectResult:
        src = action.src
        assert src is not None
        if src.size <= self.options.multipart_threshold or not self.dst.caps.multipart:
            return await self._copy_whole(action)
        return await self._copy_parts(action)

    async def _copy_whole(self, action: Action) -> ObjectResult:
        src = action.src
        assert src is not None
        async with self.limits.memory.hold(src.size), self.limits.requests:
            data = await self.src.get(action.key, expect=src)
            if len(data) != src.size:
                raise IntegrityError(
                    f"{action.key}: read {len(data)} bytes, listing said {src.size}")
            digest = await block_digest_async(data)
            written = await self.dst.put(action.key, data, mtime=src.mtime)
            del data
        self.emit(BytesMoved(action.key, src.size))
        return ObjectResult(action.key, "copy", src.size, src.size, digest.hex(), src.size,
                            written.etag)

    async def _copy_parts(self, action: Action) -> ObjectResult:
        src = action.src
        assert src is not None
        part_size = self.options.part_size_for(src.size)
        ranges = [ByteRange(off, min(off + part_size, src.size))
                  for off in range(0, src.size, part_size)]
        async with self.limits.requests:
            upload = await self.dst.open_upload(action.key, src.size, mtime=src.mtime)
        digests: list[bytes] = [b""] * len(ranges)

        async def move(number: int, rng: ByteRange) -> PartRef:
            async with self.limits.requests:
                data = await self.src.get(action.key, rng, expect=src)
            digests[number - 1] = await block_digest_async(data)
            async with self.limits.requests:
                part = await upload.put_part(number, rng.start, data)
            self.emit(BytesMoved(action.key, rng.length))
            return part

        parts = await _run_parts(upload, ranges, move, self.limits)
        async with self.limits.requests:
            written = await _complete(upload, parts)
        return ObjectResult(action.key, "copy", src.size, src.size, object_digest(digests),
                            part_size, written.etag)

    # -- server side ---------------------------------------------------------------------------

    async def _server_copy(self, action: Action) -> ObjectResult:
        src = action.src
        assert src is not None
        # The planner chose server_copy only because dst.can_copy_from(src) said so.
        dst = cast(ServerCopyStore, self.dst)
        source_store = cast(ServerCopyStore, self.src)
        source = source_store.copy_source(action.key, src.etag)
        # Large objects are copied as parallel ranged UploadPartCopy requests; the copy part
        # size is not bounded by the memory budget since no byte passes through us.
        part_size = max(self.options.part_size_for(src.size), 64 * 1024 * 1024)
        part_size = min(part_size, S3_MAX_PART_SIZE)
        if src.size <= part_size:
            async with self.limits.requests:
                written = await dst.copy_object(source, action.key)
            return ObjectResult(action.key, "server_copy", src.size, 0, None, None, written.etag)
        ranges = [ByteRange(off, min(off + part_size, src.size))
                  for off in range(0, src.size, part_size)]
        async with self.limits.requests:
            upload = await dst.open_upload(action.key, src.size)

        async def move(number: int, rng: ByteRange) -> PartRef:
            async with self.limits.requests:
                part = await upload.copy_part(number, source, rng)
            self.emit(BytesMoved(action.key, rng.length))
            return part

        parts = await _run_parts(upload, ranges, move, None)
        async with self.limits.requests:
            written = await _complete(upload, parts)
        return ObjectResult(action.key, "server_copy", src.size, 0, None, None, written.etag)


async def _run_parts(upload: Upload, ranges: list[ByteRange],
                     move: Callable[[int, ByteRange], Awaitable[PartRef]],
                     limits: Limits | None) -> list[PartRef]:
    """Move every part concurrently; on any failure abort the upload so nothing half-written
    is ever completed, and re-raise the first error. When ``limits`` is given, each part's
    bytes are taken from the memory budget before its task starts and returned when it ends,
    however it ends (a task cancelled before its first step never runs its own ``finally``)."""
    held: dict[int, int] = {}

    async def budgeted(number: int, rng: ByteRange) -> PartRef:
        try:
            return await move(number, rng)
        finally:
            if limits is not None:
                limits.memory.release(held.pop(number, 0))

    try:
        async with asyncio.TaskGroup() as tg:
            tasks = []
            for number, rng in enumerate(ranges, start=1):
                if limits is not None:
                    held[number] = await limits.memory.acquire(rng.length)
                tasks.append(tg.create_task(budgeted(number, rng)))
    except BaseException as exc:
        await asyncio.shield(upload.abort())
        raise first_error(exc) from None
    finally:
        if limits is not None:
            for n in list(held):
                limits.memory.release(held.pop(n))
    return [t.result() for t in tasks]


async def _complete(upload: Upload, parts: list[PartRef]) -> ObjectInfo:
    try:
        return await upload.complete(parts)
    except MCSyncError:
        await asyncio.shield(upload.abort())
        raise
