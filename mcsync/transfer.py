"""Carry out one planned action: a whole-object copy, a multipart copy (new or resumed), a
server-side copy or a delete. Every byte that passes through the client is hashed (xxh3-128) as
it moves, and multipart progress is journalled so a killed run resumes from its missing parts.

Memory: a buffer's size is taken from the run's ByteBudget *before* it is read and given back
once the target has acknowledged it. Requests: each GET / PUT / part holds one slot of the
requests semaphore while it is on the wire.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import cast

from . import checksums
from .config import S3_MAX_PART_SIZE, SyncOptions
from .errors import IntegrityError, Interrupted, NotFound, PreconditionFailed, first_error
from .events import BytesMoved, Event
from .hashing import block_digest_async, object_digest
from .limits import Limits
from .manifest import JournalPart, Manifest, ManifestEntry, OpenUpload
from .plan import Action
from .report import ObjectResult
from .stores.base import ServerCopyStore, Store, Upload
from .types import ByteRange, ObjectInfo, PartClaim, PartRef

log = logging.getLogger(__name__)

SERVER_COPY_CUTOFF = S3_MAX_PART_SIZE  # larger objects are copied server-side in parts
SERVER_COPY_MIN_PART = 512 * 1024 * 1024


@dataclass(frozen=True, slots=True)
class Done:
    """A finished action: what the report says, and what the manifest records."""

    result: ObjectResult
    entry: ManifestEntry | None  # None for deletes


@dataclass
class Transfer:
    """The context every action of one run shares."""

    src: Store
    dst: Store
    options: SyncOptions
    limits: Limits
    emit: Callable[[Event], None]
    journal: Manifest | None = None
    stop: asyncio.Event = field(default_factory=asyncio.Event)
    open_uploads: dict[str, OpenUpload] = field(default_factory=dict)

    async def run(self, action: Action) -> Done:
        if action.kind == "delete":
            async with self.limits.requests:
                await self.dst.delete(action.key)
            return Done(ObjectResult(action.key, "delete", action.size, 0), None)
        self.dst.validate_key(action.key)
        try:
            return await self._write(action)
        except PreconditionFailed:
            # The source changed after it was listed: never stitch two versions together.
            # Take the new version, once; a source still changing is reported.
            async with self.limits.requests:
                fresh = await self.src.head(action.key)
            log.info("%s changed while it was copied; copying the new version", action.key)
            return await self._write(dataclasses.replace(action, src=fresh))

    async def _write(self, action: Action) -> Done:
        src = action.src
        assert src is not None
        if action.kind == "server_copy":
            return await self._server_copy(action, src)
        if src.size <= self.options.multipart_threshold or not self.dst.caps.multipart:
            return await self._copy_whole(action, src)
        return await self._copy_parts(action, src)

    # -- through the client --------------------------------------------------------------------

    async def _copy_whole(self, action: Action, src: ObjectInfo) -> Done:
        charge = src.size * (1 + self.dst.caps.send_copies)
        async with self.limits.memory.hold(charge), self.limits.requests:
            data = await self.src.get(action.key, expect=src)
            if len(data) != src.size:
                raise IntegrityError(
                    f"{action.key}: read {len(data)} bytes, listing said {src.size}")
            digest = await block_digest_async(data)
            # A source that keeps a CRC32C (GCS) checks a whole-object read itself (the store
            # knows the CRC of what it served); parts are combined and checked below.
            written = await self.dst.put(action.key, data, mtime=src.mtime)
            del data
        self.emit(BytesMoved(action.key, src.size))
        return self._done(action, src, written, src.size, [digest], src.size)

    async def _copy_parts(self, action: Action, src: ObjectInfo) -> Done:
        key = action.key
        part_size = self.options.part_size_for(src.size)
        ranges = [ByteRange(off, min(off + part_size, src.size))
                  for off in range(0, src.size, part_size)]
        upload: Upload | None = None
        kept: dict[int, JournalPart] = {}
        prior = self.open_uploads.pop(key, None)
        if prior is not None:
            if prior.matches_source(src) and prior.part_size == part_size:
                async with self.limits.requests:
                    upload = await self.dst.resume_upload(key, prior.upload_id, src.size,
                                                          mtime=src.mtime)
                if upload is None:
                    finished = await self._finished_before(action, src, prior, ranges)
                    if finished is not None:
                        return finished
                    # Some stores answer NoSuchUpload for an upload that has no part yet:
                    # abort it by id all the same, or it would be orphaned.
                    await self.abort_stale(prior)
                else:
                    kept = await self._confirmed_parts(upload, prior, ranges)
            else:
                await self.abort_stale(prior)
        if upload is None:
            async with self.limits.requests:
                upload = await self.dst.open_upload(key, src.size, mtime=src.mtime)
            if self.journal is not None:
                self.journal.begin_upload(key, upload.upload_id, src, part_size)

        digests: list[bytes] = [b""] * len(ranges)
        refs: dict[int, PartRef] = {}
        for n, jp in kept.items():
            digests[n - 1] = jp.digest
            refs[n] = PartRef(n, jp.etag, jp.size)
        journal = self.journal
        live = upload
        check_crc = src.crc32c is not None and not kept  # resumed parts have no CRC recorded
        crcs: list[tuple[int, int]] = [(0, 0)] * len(ranges)

        async def move(number: int, rng: ByteRange) -> PartRef:
            # One request slot from read to acknowledgement: a part read ahead of a free slot
            # to send it would only hold memory.
            async with self.limits.requests:
                data = await self.src.get(key, rng, expect=src)
                digest = await block_digest_async(data)
                if check_crc:
                    crcs[number - 1] = (await checksums.crc32c_async(data), len(data))
                part = await live.put_part(number, rng.start, data)
            del data
            digests[number - 1] = digest
            if journal is not None:
                journal.record_part(key, JournalPart(number, part.etag, part.size, digest))
            self.emit(BytesMoved(key, rng.length))
            return part

        todo = [(n, rng) for n, rng in enumerate(ranges, start=1) if n not in kept]
        for part in await self._run_parts(key, upload, todo, move, budgeted=True):
            refs[part.number] = part
        if check_crc:  # before Complete: a mismatch must never become visible
            try:
                checksums.verify(src.crc32c, checksums.combine_parts(crcs),
                                 f"{self.src.url}{key}")
            except IntegrityError:
                await asyncio.shield(upload.abort())
                if self.journal is not None:
                    self.journal.drop_upload(key)
                raise
        async with self.limits.requests:
            written = await _complete(upload, [refs[n] for n in sorted(refs)])
        sent = sum(rng.length for _, rng in todo)
        return self._done(action, src, written, sent, digests, part_size)

    async def _confirmed_parts(self, upload: Upload, prior: OpenUpload,
                               ranges: list[ByteRange]) -> dict[int, JournalPart]:
        claims = [PartClaim(PartRef(p.number, p.etag, p.size), ranges[p.number - 1].start,
                            p.digest)
                  for p in prior.parts.values()
                  if p.number <= len(ranges) and p.size == ranges[p.number - 1].length]
        async with self.limits.requests:
            good = await upload.confirm_parts(claims)
        log.info("%s: resuming upload, %d of %d parts already there", prior.key, len(good),
                 len(ranges))
        return {n: prior.parts[n] for n in good}

    async def _finished_before(self, action: Action, src: ObjectInfo, prior: OpenUpload,
                               ranges: list[ByteRange]) -> Done | None:
        """The journalled upload is gone: a previous run may have been killed between completing
        it and recording it. If the target holds exactly that object, record it; otherwise
        start over (a fresh upload is always correct)."""
        if self.journal is not None:
            self.journal.drop_upload(action.key)
        if len(prior.parts) != len(ranges):
            return None
        try:
            async with self.limits.requests:
                there = await self.dst.head(action.key)
        except NotFound:
            return None
        parts = [prior.parts[n] for n in sorted(prior.parts)]
        if there.size != src.size:
            return None
        if there.etag is not None:
            if there.etag != _multipart_etag([p.etag for p in parts]):
                return None
        elif there.mtime != src.mtime:
            return None
        return self._done(action, src, there, 0, [p.digest for p in parts], prior.part_size)

    async def abort_stale(self, prior: OpenUpload) -> None:
        """Abort an upload a previous run left open that this run will not finish."""
        try:
            async with self.limits.requests:
                await self.dst.abort_upload(prior.key, prior.upload_id)
        except Exception as exc:  # best effort: the target's lifecycle rules are the backstop
            log.warning("could not abort stale upload of %s: %s", prior.key, exc)
        if self.journal is not None:
            self.journal.drop_upload(prior.key)

    # -- server side ---------------------------------------------------------------------------

    async def _server_copy(self, action: Action, src: ObjectInfo) -> Done:
        # The planner chose server_copy only because dst.can_copy_from(src) said so.
        dst = cast(ServerCopyStore, self.dst)
        source = cast(ServerCopyStore, self.src).copy_source(action.key, src.etag)
        # One CopyObject up to S3's 5 GiB limit (as rclone's copy cutoff): on SeaweedFS a
        # 256 MiB object copies in 1.57 s whole against 1.80 s as 8 parallel 64 MiB part
        # copies. Larger objects go as parallel UploadPartCopy ranges of 512 MiB or more; no
        # byte passes through us, so the memory budget does not bound them.
        if src.size <= SERVER_COPY_CUTOFF:
            async with self.limits.requests:
                written = await dst.copy_object(source, action.key)
            return self._done(action, src, written, 0, [], 0)
        part_size = min(max(self.options.part_size_for(src.size), SERVER_COPY_MIN_PART),
                        S3_MAX_PART_SIZE)
        ranges = [ByteRange(off, min(off + part_size, src.size))
                  for off in range(0, src.size, part_size)]
        async with self.limits.requests:
            upload = await dst.open_upload(action.key, src.size)

        async def move(number: int, rng: ByteRange) -> PartRef:
            async with self.limits.requests:
                part = await upload.copy_part(number, source, rng)
            self.emit(BytesMoved(action.key, rng.length))
            return part

        parts = await self._run_parts(action.key, upload, list(enumerate(ranges, start=1)),
                                      move, budgeted=False)
        async with self.limits.requests:
            written = await _complete(upload, sorted(parts, key=lambda p: p.number))
        return self._done(action, src, written, 0, [], 0)

    # -- shared --------------------------------------------------------------------------------

    def _done(self, action: Action, src: ObjectInfo, written: ObjectInfo, sent: int,
              digests: list[bytes], block_size: int) -> Done:
        server = action.kind == "server_copy"
        xxh3 = None if server else object_digest(digests)
        result = ObjectResult(action.key, "server_copy" if server else "copy", src.size, sent,
                              xxh3, None if server else block_size, written.etag)
        entry = ManifestEntry(
            key=action.key, src_size=src.size, src_etag=src.etag, src_mtime=src.mtime,
            src_version=src.version, dst_size=src.size, dst_etag=written.etag,
            dst_mtime=written.mtime, block_size=block_size, block_hashes=b"".join(digests),
            xxh3=xxh3, crc32c=src.crc32c, written_at=time.time())
        return Done(result, entry)

    async def _run_parts(self, key: str, upload: Upload, parts: list[tuple[int, ByteRange]],
                         move: Callable[[int, ByteRange], Awaitable[PartRef]],
                         *, budgeted: bool) -> list[PartRef]:
        """Move parts concurrently. A failure aborts the upload (nothing half-written is ever
        completed) and re-raises the first error. A stop request lets the parts in flight
        finish, schedules no more and raises Interrupted, keeping the upload for the next run,
        as does cancellation. With ``budgeted``, each part's bytes are taken from the memory
        budget before its task starts and returned when it ends, however it ends (a task
        cancelled before its first step never runs its own ``finally``)."""
        held: dict[int, int] = {}
        memory = self.limits.memory
        charge = 1 + self.dst.caps.send_copies  # the part read, plus the client's copies

        async def run_one(number: int, rng: ByteRange) -> PartRef:
            try:
                return await move(number, rng)
            finally:
                memory.release(held.pop(number, 0))

        tasks: list[asyncio.Task[PartRef]] = []
        window = asyncio.Semaphore(self.options.part_concurrency)

        async def windowed(number: int, rng: ByteRange) -> PartRef:
            try:
                return await run_one(number, rng)
            finally:
                window.release()

        try:
            async with asyncio.TaskGroup() as tg:
                for number, rng in parts:
                    await window.acquire()
                    if self.stop.is_set():
                        window.release()
                        break
                    if budgeted:
                        held[number] = await memory.acquire(rng.length * charge)
                    tasks.append(tg.create_task(windowed(number, rng)))
        except asyncio.CancelledError:
            raise  # the upload stays open and journalled: the next run resumes it
        except BaseException as exc:
            if not isinstance(first_error(exc), asyncio.CancelledError | Interrupted):
                await asyncio.shield(upload.abort())
                if self.journal is not None:
                    self.journal.drop_upload(key)
            raise first_error(exc) from None
        finally:
            for n in list(held):
                memory.release(held.pop(n))
        if len(tasks) < len(parts):
            raise Interrupted(f"{key}: stopped after {len(tasks)} of {len(parts)} parts")
        return [t.result() for t in tasks]


async def _complete(upload: Upload, parts: list[PartRef]) -> ObjectInfo:
    try:
        return await upload.complete(parts)
    except (asyncio.CancelledError, Interrupted):
        raise
    except Exception:
        await asyncio.shield(upload.abort())
        raise


def _multipart_etag(part_etags: list[str]) -> str | None:
    """The ETag S3 gives a completed multipart upload: md5 of the parts' binary md5s, '-N'."""
    try:
        joined = b"".join(bytes.fromhex(e) for e in part_etags)
    except ValueError:
        return None
    return f"{hashlib.md5(joined).hexdigest()}-{len(part_etags)}"
