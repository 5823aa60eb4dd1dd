"""Carry out one planned action: a whole-object copy, a multipart copy (new or resumed), a
block delta (a changed object rebuilt at the target from its previous version plus the new
bytes, see ``delta``), a server-side copy or a delete. Every byte that passes through the
client is hashed (xxh3-128) as it moves, chunk by chunk (see ``chunking``), and multipart
progress is journalled so a killed run resumes from its missing parts.

Memory: a buffer's size is taken from the run's ByteBudget *before* it is read and given back
once the target has acknowledged it. Requests: each GET / PUT / part holds one slot of the
requests semaphore while it is on the wire.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import hashlib
import logging
import time
from collections.abc import Awaitable, Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import xxhash

from . import checksums, delta
from .chunking import Layout, group_parts
from .config import SyncOptions
from .errors import (
    IntegrityError,
    Interrupted,
    MCSyncError,
    NotFound,
    Permanent,
    PreconditionFailed,
    first_error,
)
from .events import BytesMoved, DeltaPlanned, Event
from .hashing import block_digest_async, chunk_digests_async, object_digest
from .limits import Limits
from .manifest import (
    DIGEST_SIZE,
    JournalPart,
    Manifest,
    ManifestEntry,
    OpenUpload,
    split_digests,
)
from .plan import RESERVED_PREFIX, Action
from .report import ObjectResult
from .scan import cut, scan_chunks
from .stores.base import (
    Composer,
    CopySource,
    FileTarget,
    FileUpload,
    PartCopyUpload,
    RangeStreamer,
    ReadStore,
    ScratchSpace,
    ServerSideCopier,
    Store,
    Upload,
)
from .streaming import STREAM_PART_HOLD, STREAM_PART_SIZE, drain_into
from .types import ByteRange, ObjectInfo, PartClaim, PartRef

log = logging.getLogger(__name__)

SERVER_COPY_MIN_PART = 512 * 1024 * 1024
STAGING_PREFIX = f"{RESERVED_PREFIX}stage/"  # a block delta's staging objects at the target


@dataclass(frozen=True, slots=True)
class PartSpec:
    """One part of an upload: bytes ``rng`` of the new object, read from the source, or, with
    ``old_start``, copied by the target from its current version (or the copy source)."""

    number: int
    rng: ByteRange
    old_start: int | None = None
    chunks: tuple[ByteRange, ...] = ()  # the chunks the part is hashed in; (): rng, whole
    first_chunk: int | None = None  # index of its first chunk in the object's chunk list
    stage: int = 0  # > 0: a staged part (delta.py): ``stage`` bytes copied, then new bytes

    @property
    def sent(self) -> int:
        return delta.sent_bytes(self.rng.length, self.old_start, self.stage)


@dataclass(frozen=True, slots=True)
class DeltaFound:
    """A delta worth sending: the target's version it composes from, the new version's
    chunks and digests, and the parts."""

    current: ObjectInfo
    layout: Layout
    digests: list[bytes]
    plan: delta.DeltaPlan
    changed_tensors: tuple[str, ...]

    def event(self, key: str) -> DeltaPlanned:
        p = self.plan
        return DeltaPlanned(key, p.size, p.bytes_changed, p.bytes_sent, p.bytes_reused,
                            len(p.parts), self.changed_tensors)


class ComposeRefused(MCSyncError):
    """The target does not take ranged part copies: send changed objects whole."""


@dataclass(frozen=True, slots=True)
class Done:
    """A finished action: what the report says, and what the manifest records."""

    result: ObjectResult
    entry: ManifestEntry | None  # None for deletes


@dataclass
class Transfer:
    """The context every action of one run shares."""

    src: ReadStore
    dst: Store
    options: SyncOptions
    limits: Limits
    emit: Callable[[Event], None]
    journal: Manifest | None = None
    stop: asyncio.Event = field(default_factory=asyncio.Event)
    open_uploads: dict[str, OpenUpload] = field(default_factory=dict)
    _compose_refused: bool = False
    _stage_creates: set[asyncio.Future[Upload]] = field(default_factory=set)
    # Uploads reopened to learn whether they were still open, handed on to _multipart (a
    # local one holds a file descriptor that must not be opened twice, nor leak).
    _reopened: dict[str, Upload] = field(default_factory=dict)

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
            # The target is looked at again too: a delta must never compose from a target
            # version other than the one mcsync recorded.
            return await self._write(dataclasses.replace(action, src=fresh, dst=None))

    async def _write(self, action: Action) -> Done:
        src = action.src
        assert src is not None
        if action.kind == "server_copy":
            return await self._server_copy(action, src)
        if src.size <= self.options.multipart_threshold:
            return await self._copy_whole(action, src)
        if self.may_delta(action):
            return await self._delta(action, src)
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
        whole = Layout(src.size, [ByteRange(0, src.size)])
        return self._done(action, src, written, src.size, [digest], whole)

    async def _copy_parts(self, action: Action, src: ObjectInfo) -> Done:
        part_size = self.options.part_size_for(src.size)
        layout = await cut(self.src, src, part_size, self.options.chunker, self.limits)
        chunks = layout.chunks
        # Streamed into a file, a part is one large GET of several chunks (the chunks, hashed
        # and recorded, stay the same); unless a part size was asked for.
        group = part_size
        if self._streams() and self.options.part_size is None:
            group = max(part_size, STREAM_PART_SIZE)
        specs = [PartSpec(n, ByteRange(chunks[a].start, chunks[b - 1].end),
                          chunks=tuple(chunks[a:b]), first_chunk=a)
                 for n, (a, b) in enumerate(group_parts(chunks, group), start=1)]
        return await self._multipart(action, src, group, layout, specs,
                                     layout.fingerprint(part_size))

    def _streams(self) -> bool:
        """Do parts read here stream into the target (an S3 range into a file)?"""
        return isinstance(self.dst, FileTarget) and isinstance(self.src, RangeStreamer)

    def may_delta(self, action: Action) -> bool:
        """Could this action go as a block delta (before looking at any byte)?"""
        src = action.src
        return (action.kind == "copy" and action.known is not None and src is not None
                and src.size > self.options.multipart_threshold
                and isinstance(self.dst, Composer) and not self._compose_refused)

    async def _delta(self, action: Action, src: ObjectInfo) -> Done:
        """Send only what changed since mcsync wrote the target's version, and have the
        target copy the rest from that version (see ``delta``)."""
        prior = self.open_uploads.get(action.key)
        if (prior is not None and (prior.layout or "").startswith("delta:")
                and prior.matches_source(src)):
            finished = await self._delta_finished_before(action, src, prior)
            if finished is not None:
                return finished
        found = await self.plan_delta(action, src)
        if isinstance(found, str) or self._compose_refused:
            why = found if isinstance(found, str) else "the target refused ranged part copies"
            log.info("%s: %s; sending it whole", action.key, why)
            return await self._copy_parts(action, src)
        self.emit(found.event(action.key))
        part_size = self.options.part_size_for(src.size)
        specs = [PartSpec(p.number, p.rng, old_start=p.old_start, stage=p.stage)
                 for p in found.plan.parts]
        assert isinstance(self.dst, Composer)  # may_delta said so
        source = self.dst.compose_source(found.current)
        staged = any(p.stage for p in found.plan.parts)
        if staged:  # what a killed run of this key left (a lock keeps other runs away)
            await self._clear_staging(action.key)
        try:
            return await self._multipart(action, src, part_size, found.layout, specs,
                                         found.plan.fingerprint(), delta=found, source=source)
        except ComposeRefused as exc:
            self._compose_refused = True
            log.warning("%s; sending changed objects whole from now on", exc)
            await self._clear_staging(action.key)
            return await self._copy_parts(action, src)
        except (MCSyncError, OSError):
            if staged:  # a part cancelled while its staging upload was being created
                await self._clear_staging(action.key)
            raise

    async def _clear_staging(self, key: str) -> None:
        if self._stage_creates:  # let creates in flight land, so the listing below sees them
            await asyncio.gather(*self._stage_creates, return_exceptions=True)
        if not isinstance(self.dst, ScratchSpace):
            return
        try:
            async with self.limits.requests:
                await asyncio.shield(self.dst.clear(_staging_prefix(key)))
        except (MCSyncError, OSError) as exc:
            log.warning("could not clear the staging objects of %s: %s", key, exc)

    async def _delta_finished_before(self, action: Action, src: ObjectInfo,
                                     prior: OpenUpload) -> Done | None:
        """A composed upload the journal holds may have completed just before a kill: then
        the target no longer is the recorded version (so no new delta can be planned), but it
        is exactly the upload's result. Recognise it by its multipart ETag and record it."""
        async with self.limits.requests:
            still_open = await self.dst.resume_upload(action.key, prior.upload_id, src.size)
        if still_open is not None:
            self._reopened[action.key] = still_open
            return None  # not completed: resumed from its parts below
        try:
            async with self.limits.requests:
                there = await self.dst.head(action.key)
        except NotFound:
            return None
        etags = [prior.parts[n].etag for n in sorted(prior.parts)]
        if there.size != src.size or not etags or not (there.etag or "").endswith(
                f"-{len(etags)}"):
            return None
        assert action.known is not None
        chunker = (action.known.chunker if self.options.chunker == "auto"
                   else self.options.chunker)
        layout = await cut(self.src, src, action.known.block_size, chunker, self.limits)
        read_size = self.options.part_size_for(src.size)
        digests = layout.digests or await scan_chunks(self.src, src, layout.chunks, read_size,
                                                      self.limits)
        expected = _multipart_etag(etags)
        if expected is None:
            # Part copies of multipart sources carry ETags like "…-3" (SeaweedFS), so the
            # object's ETag cannot be derived: read the target back and compare instead.
            there_digests = await scan_chunks(self.dst, there, layout.chunks, read_size,
                                              self.limits)
            if there_digests != digests:
                return None
        elif there.etag != expected:
            return None
        self.open_uploads.pop(action.key, None)
        if self.journal is not None:
            self.journal.drop_upload(action.key)
        log.info("%s: the composed upload had completed before the last run stopped",
                 action.key)
        return self._done(action, src, there, 0, digests, layout, changed=0)

    async def plan_delta(self, action: Action, src: ObjectInfo) -> DeltaFound | str:
        """The delta for a changed object mcsync wrote before, or why there is none. Reads
        (and hashes) the whole source; sends nothing."""
        known = action.known
        if known is None or not self.options.delta:
            return "no delta asked for"
        old = known.chunks()
        if not old:
            return "no block hashes recorded for the target's version"
        if not isinstance(self.dst, Composer):
            return f"{self.dst.url} cannot build objects from ranges"
        current = action.dst
        if current is None:
            try:
                async with self.limits.requests:
                    current = await self.dst.head(action.key)
            except NotFound:
                return "not at the target any more"
        if not known.matches_target(current):
            return "the target changed behind mcsync's back"
        part_size = self.options.part_size_for(src.size)
        # Cut the new version the way the recorded one was cut, unless told otherwise.
        chunker = known.chunker if self.options.chunker == "auto" else self.options.chunker
        layout = await cut(self.src, src, known.block_size, chunker, self.limits)
        digests = layout.digests or await scan_chunks(self.src, src, layout.chunks, part_size,
                                                      self.limits)
        segments = delta.match(list(zip(layout.chunks, digests, strict=True)), old)
        plan = delta.pack(segments, src.size, part_size=part_size,
                          min_part=self.dst.caps.min_part_size, max_parts=self.dst.caps.max_parts,
                          stage=_can_stage(self.dst))
        if plan is None:
            return "too many changed regions for one upload"
        if plan.bytes_reused == 0:
            return "nothing of the target's version can be reused"
        tensors = () if layout.header is None else tuple(delta.changed_tensors(
            segments, [(t.name, t.start, t.end) for t in layout.header.tensors]))
        return DeltaFound(current, layout, digests, plan, tensors)

    async def _multipart(self, action: Action, src: ObjectInfo, part_size: int,
                         layout: Layout, specs: list[PartSpec], layout_id: str | None, *,
                         delta: DeltaFound | None = None,
                         source: CopySource | None = None) -> Done:
        """One multipart upload of ``specs`` (new or resumed from the journal), completed only
        when every part is there, so the new version appears whole or not at all."""
        key = action.key
        upload: Upload | None = None
        kept: dict[int, JournalPart] = {}
        n_chunks = len(layout.chunks)
        # Each chunk's digest: from the delta's scan, or filled as the parts are read.
        digests: list[bytes] = list(delta.digests) if delta else [b""] * n_chunks
        cut_digests = layout.digests if delta is None else None
        prior = self.open_uploads.pop(key, None)
        reopened = self._reopened.pop(key, None)
        if prior is not None:
            if (prior.matches_source(src) and prior.part_size == part_size
                    and prior.layout == layout_id):
                upload = reopened
                if upload is None:
                    async with self.limits.requests:
                        upload = await self.dst.resume_upload(key, prior.upload_id, src.size,
                                                              mtime=src.mtime)
                if upload is None:
                    finished = await self._finished_before(action, src, prior, specs, layout,
                                                           delta)
                    if finished is not None:
                        return finished
                    # Some stores answer NoSuchUpload for an upload that has no part yet:
                    # abort it by id all the same, or it would be orphaned.
                    await self.abort_stale(prior)
                else:
                    kept = await self._confirmed_parts(upload, prior, specs)
            else:
                if reopened is not None:
                    with contextlib.suppress(MCSyncError, OSError):
                        await reopened.abort()
                await self.abort_stale(prior)
        if upload is None:
            async with self.limits.requests:
                upload = await self.dst.open_upload(key, src.size, mtime=src.mtime)
            if self.journal is not None:
                self.journal.begin_upload(key, upload.upload_id, src, part_size, layout_id)

        refs: dict[int, PartRef] = {}
        by_number = {spec.number: spec for spec in specs}
        for n, jp in kept.items():
            refs[n] = PartRef(n, jp.etag, jp.size)
            spec = by_number[n]
            if spec.first_chunk is not None:
                pieces = split_digests(jp.digest)
                digests[spec.first_chunk:spec.first_chunk + len(pieces)] = pieces
        journal = self.journal
        live = upload
        copies = any(spec.old_start is not None for spec in specs)
        check_crc = src.crc32c is not None and not kept and not copies
        crcs: list[tuple[int, int]] = [(0, 0)] * len(specs)
        # Parts streamed into the file are drained by threads of their own: the loop's
        # default executor has a handful, and a streamed part holds its thread until done.
        file = (upload if self._streams() and not check_crc and isinstance(upload, FileUpload)
                else None)
        pool = (ThreadPoolExecutor(self.options.part_concurrency, "mcsync-stream")
                if file is not None else None)

        def check_second_read(spec: PartSpec, pieces: list[bytes]) -> None:
            """Cutting by content read these bytes once already: a second read that hashes
            differently is never sent."""
            first = spec.first_chunk
            if cut_digests is not None and first is not None and (
                    pieces != cut_digests[first:first + len(pieces)]):
                raise IntegrityError(f"{self.src.url}{key}: bytes {spec.rng.start}-"
                                     f"{spec.rng.end} read differently twice")

        async def move(spec: PartSpec) -> PartRef:
            number, rng = spec.number, spec.rng
            if spec.stage:
                assert source is not None
                part = await self._staged_part(key, src, live, spec, source)
                chunk_hashes = b""
            elif spec.old_start is not None:
                assert source is not None
                old = ByteRange(spec.old_start, spec.old_start + rng.length)
                async with self.limits.requests:
                    with _refusal_means_no_compose(self.dst.url, key):
                        assert isinstance(live, PartCopyUpload)  # a Composer's upload
                        part = await live.copy_part(number, rng.start, source, old)
                chunk_hashes = b""  # no byte passed through us
            else:
                # One request slot from read to acknowledgement: a part read ahead of a free
                # slot to send it would only hold memory.
                async with self.limits.requests:
                    chunks = list(spec.chunks or (rng,))
                    if file is not None:  # into the hidden file as the bytes arrive; a
                        # part failing a check is never journalled, so never completed
                        assert pool is not None and isinstance(self.src, RangeStreamer)
                        body = await self.src.open_range(key, rng, expect=src)
                        pieces = await asyncio.get_running_loop().run_in_executor(
                            pool, drain_into, body, file, rng, chunks)
                        check_second_read(spec, pieces)
                        part = file.part_written(number, rng.length)
                    else:
                        data = await self.src.get(key, rng, expect=src)
                        pieces = await chunk_digests_async(data, rng.start, chunks)
                        check_second_read(spec, pieces)
                        if check_crc:
                            crcs[number - 1] = (await checksums.crc32c_async(data), len(data))
                        part = await live.put_part(number, rng.start, data)
                        del data
                if spec.first_chunk is not None:
                    digests[spec.first_chunk:spec.first_chunk + len(pieces)] = pieces
                chunk_hashes = b"".join(pieces)
            if journal is not None:
                journal.record_part(key, JournalPart(number, part.etag, part.size, chunk_hashes))
            self.emit(BytesMoved(key, rng.length))
            return part

        todo = [spec for spec in specs if spec.number not in kept]
        try:
            for part in await self._run_parts(key, upload, todo, move, budgeted=True,
                                              streamed=pool is not None):
                refs[part.number] = part
        finally:
            if pool is not None:  # a thread still draining a cancelled part ends with it
                pool.shutdown(wait=False)
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
        sent = sum(spec.sent for spec in todo)
        reused = sum(spec.rng.length - spec.sent for spec in specs)
        return self._done(action, src, written, sent, digests, layout, reused=reused,
                          changed=delta.plan.bytes_changed if delta else src.size)

    async def _staged_part(self, key: str, src: ObjectInfo, upload: Upload, spec: PartSpec,
                           source: CopySource) -> PartRef:
        """A part of unchanged bytes followed by a few new ones, built at the target: a staging
        object under .mcsync/ gets the unchanged bytes by copy and the new bytes as its short
        last part, and is then copied whole into the upload and deleted."""
        assert spec.old_start is not None
        dst = self.dst
        assert isinstance(dst, ServerSideCopier) and isinstance(upload, PartCopyUpload)
        stage_key = (f"{_staging_prefix(key)}"
                     f"{xxhash.xxh3_64_hexdigest(upload.upload_id.encode())}-{spec.number}")
        new = ByteRange(spec.rng.start + spec.stage, spec.rng.end)
        # Shielded: a part cancelled while its staging upload is being created must not leave
        # an upload the server creates after we stopped listening; _clear_staging waits for it.
        create = asyncio.ensure_future(dst.open_upload(stage_key, spec.rng.length))
        self._stage_creates.add(create)
        create.add_done_callback(self._stage_creates.discard)
        async with self.limits.requests:
            staging = await asyncio.shield(create)
        try:
            async with self.limits.requests:
                with _refusal_means_no_compose(self.dst.url, key):
                    first = await staging.copy_part(
                        1, 0, source, ByteRange(spec.old_start, spec.old_start + spec.stage))
            async with self.limits.requests:
                data = await self.src.get(key, new, expect=src)
                second = await staging.put_part(2, spec.stage, data)
            del data
            async with self.limits.requests:
                staged = await staging.complete([first, second])
        except BaseException:
            await asyncio.shield(staging.abort())
            raise
        try:
            async with self.limits.requests:
                with _refusal_means_no_compose(self.dst.url, key):
                    return await upload.copy_part(
                        spec.number, spec.rng.start, dst.copy_source(stage_key, staged.etag),
                        ByteRange(0, spec.rng.length))
        finally:
            with contextlib.suppress(MCSyncError, OSError):
                async with self.limits.requests:
                    await asyncio.shield(dst.delete(stage_key))

    async def _confirmed_parts(self, upload: Upload, prior: OpenUpload,
                               specs: list[PartSpec]) -> dict[int, JournalPart]:
        by_number = {spec.number: spec for spec in specs}
        claims = []
        for p in prior.parts.values():
            spec = by_number.get(p.number)
            if spec is None or p.size != spec.rng.length:
                continue
            if spec.old_start is None and len(p.digest) != DIGEST_SIZE * len(
                    spec.chunks or (spec.rng,)):
                continue  # recorded with another cut: send again
            claims.append(PartClaim(PartRef(p.number, p.etag, p.size), spec.rng.start, p.digest,
                                    tuple(c.length for c in spec.chunks)))
        async with self.limits.requests:
            good = await upload.confirm_parts(claims)
        log.info("%s: resuming upload, %d of %d parts already there", prior.key, len(good),
                 len(specs))
        return {n: prior.parts[n] for n in good}

    async def _finished_before(self, action: Action, src: ObjectInfo, prior: OpenUpload,
                               specs: list[PartSpec], layout: Layout,
                               delta: DeltaFound | None) -> Done | None:
        """The journalled upload is gone: a previous run may have been killed between completing
        it and recording it. If the target holds exactly that object, record it; otherwise
        start over (a fresh upload is always correct)."""
        if self.journal is not None:
            self.journal.drop_upload(action.key)
        if len(prior.parts) != len(specs):
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
        if delta is not None:
            digests = list(delta.digests)
        else:
            digests = [d for p in parts for d in split_digests(p.digest)]
            if len(digests) != len(layout.chunks):
                return None
        return self._done(action, src, there, 0, digests, layout,
                          reused=delta.plan.bytes_reused if delta else 0,
                          changed=delta.plan.bytes_changed if delta else src.size)

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
        dst, origin = self.dst, self.src
        assert isinstance(dst, ServerSideCopier) and isinstance(origin, ServerSideCopier)
        source = origin.copy_source(action.key, src.etag)
        # One CopyObject up to S3's 5 GiB limit (as rclone's copy cutoff): on SeaweedFS a
        # 256 MiB object copies in 1.57 s whole against 1.80 s as 8 parallel 64 MiB part
        # copies. Larger objects go as parallel UploadPartCopy ranges of 512 MiB or more; no
        # byte passes through us, so the memory budget does not bound them.
        if src.size <= dst.caps.max_copy_size:
            async with self.limits.requests:
                written = await dst.copy_object(source, action.key)
            return self._done(action, src, written, 0, [], None)
        part_size = min(max(self.options.part_size_for(src.size), SERVER_COPY_MIN_PART),
                        dst.caps.max_part_size)
        ranges = [ByteRange(off, min(off + part_size, src.size))
                  for off in range(0, src.size, part_size)]
        async with self.limits.requests:
            upload = await dst.open_upload(action.key, src.size)

        async def move(spec: PartSpec) -> PartRef:
            async with self.limits.requests:
                part = await upload.copy_part(spec.number, spec.rng.start, source, spec.rng)
            self.emit(BytesMoved(action.key, spec.rng.length))
            return part

        specs = [PartSpec(n, rng, old_start=rng.start) for n, rng in enumerate(ranges, start=1)]
        parts = await self._run_parts(action.key, upload, specs, move, budgeted=False)
        async with self.limits.requests:
            written = await _complete(upload, sorted(parts, key=lambda p: p.number))
        return self._done(action, src, written, 0, [], None)

    # -- shared --------------------------------------------------------------------------------

    def _done(self, action: Action, src: ObjectInfo, written: ObjectInfo, sent: int,
              digests: list[bytes], layout: Layout | None, *, reused: int = 0,
              changed: int | None = None) -> Done:
        """``layout`` None: a server-side copy, no byte of which passed through us."""
        server = layout is None
        xxh3 = None if server else object_digest(digests)
        block = layout.block if layout is not None else 0
        result = ObjectResult(action.key, "server_copy" if server else "copy", src.size, sent,
                              xxh3, None if server else block, written.etag,
                              bytes_reused=reused,
                              bytes_changed=None if server else (
                                  src.size if changed is None else changed))
        entry = ManifestEntry(
            key=action.key, src_size=src.size, src_etag=src.etag, src_mtime=src.mtime,
            src_version=src.version, dst_size=src.size, dst_etag=written.etag,
            dst_mtime=written.mtime, block_size=block, block_hashes=b"".join(digests),
            xxh3=xxh3, crc32c=src.crc32c, written_at=time.time(),
            chunk_sizes=layout.chunk_sizes() if layout is not None else b"",
            chunker=layout.chunker if layout is not None else "fixed")
        return Done(result, entry)

    async def _run_parts(self, key: str, upload: Upload, parts: list[PartSpec],
                         move: Callable[[PartSpec], Awaitable[PartRef]],
                         *, budgeted: bool, streamed: bool = False) -> list[PartRef]:
        """Move parts concurrently. A failure aborts the upload (nothing half-written is ever
        completed) and re-raises the first error. A stop request lets the parts in flight
        finish, schedules no more and raises Interrupted, keeping the upload for the next run,
        as does cancellation. With ``budgeted``, each part's bytes are taken from the memory
        budget before its task starts and returned when it ends, however it ends (a task
        cancelled before its first step never runs its own ``finally``). A ``streamed`` part
        holds a few pieces, not its whole size."""
        held: dict[int, int] = {}
        memory = self.limits.memory
        charge = 1 + self.dst.caps.send_copies  # the part read, plus the client's copies

        async def run_one(spec: PartSpec) -> PartRef:
            try:
                return await move(spec)
            finally:
                memory.release(held.pop(spec.number, 0))

        tasks: list[asyncio.Task[PartRef]] = []
        window = asyncio.Semaphore(self.options.part_concurrency)

        async def windowed(spec: PartSpec) -> PartRef:
            try:
                return await run_one(spec)
            finally:
                window.release()

        try:
            async with asyncio.TaskGroup() as tg:
                for spec in parts:
                    await window.acquire()
                    if self.stop.is_set():
                        window.release()
                        break
                    if budgeted and spec.sent:  # a copied part holds no bytes
                        plain = spec.old_start is None and not spec.stage
                        need = (min(spec.sent, STREAM_PART_HOLD) if streamed and plain
                                else spec.sent)
                        held[spec.number] = await memory.acquire(need * charge)
                    tasks.append(tg.create_task(windowed(spec)))
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


def _staging_prefix(key: str) -> str:
    """Where the staging objects of ``key``'s delta live (see ``delta``)."""
    return f"{STAGING_PREFIX}{xxhash.xxh3_64_hexdigest(key.encode())}-"


@contextlib.contextmanager
def _refusal_means_no_compose(target: str, key: str) -> Iterator[None]:
    """A ranged part copy the target answers with a permanent error (not implemented, not
    allowed): this target does not compose; the delta falls back to a full upload."""
    try:
        yield
    except Permanent as exc:
        raise ComposeRefused(f"{target}: a ranged part copy for {key} was refused: "
                             f"{exc}") from exc


def _can_stage(dst: Store) -> bool:
    """Can short changed runs be staged at the target (see ``delta``)? It takes a scratch
    space for the staging objects and server-side copies of them into the upload."""
    return isinstance(dst, ServerSideCopier) and isinstance(dst, ScratchSpace)
