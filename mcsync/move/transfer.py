"""Carry out one planned action. A dispatcher: a whole-object copy, a copy in parts (new or
resumed, see ``upload``), a block delta (see ``compose``), a server-side copy, or a delete.

Every byte that passes through the client is hashed (xxh3-128) as it moves, chunk by chunk
(see ``chunking``), and what was written becomes one ``ManifestEntry`` (``entry_for``).

Memory: a buffer's size is taken from the run's ByteBudget *before* it is read and given back
once the target has acknowledged it. Requests: each GET / PUT / part holds one slot of the
requests semaphore while it is on the wire.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
from dataclasses import dataclass

from .. import checksums
from ..checkpoints.frameworks import is_commit_marker
from ..chunking import Layout, group_parts
from ..delta.match import Part
from ..delta.planner import DeltaPlanner, Holdings
from ..delta.read import LocalScan, Scan, cut
from ..errors import IntegrityError, MCSyncError, NotFound, PreconditionFailed, SourceGone
from ..events import BytesMoved
from ..hashing import block_digest_async
from ..records import Action, ManifestEntry, OpenUpload, WrittenPart
from ..report import ObjectResult
from ..retry import RetryPolicy, retrying
from ..state.manifest import entry_for
from ..stores.base import (
    FileTarget,
    PartCopyUpload,
    RangeStreamer,
    ReadsInto,
    ServerSideCopier,
    Upload,
)
from ..streaming import STREAM_PART_SIZE
from ..types import Buffer, ByteRange, ObjectInfo
from .context import RunContext
from .delta_sender import Composed, DeltaSender
from .hash_tasks import RemoteScan, WorkerTasks
from .part_sender import PartSender
from .part_tasks import RemoteParts, parts_per_task
from .upload import Journal, MovePart, UploadPlan, Uploads

log = logging.getLogger(__name__)

SERVER_COPY_MIN_PART = 512 * 1024 * 1024  # objects beyond one CopyObject: copied in these
LARGE_OBJECT = 1024 * 1024  # a whole object this large takes a slot of Limits.parts


class NotWhole(Exception):
    """A transfer that takes whole objects only (a worker process's) met one that would go in
    parts, as a delta or resumed: the driver's process moves it, which journals uploads."""


@dataclass(frozen=True, slots=True)
class Done:
    """A finished action: what the report says, and what the manifest records."""

    result: ObjectResult
    entry: ManifestEntry | None  # None for deletes


class Transfer:
    """The context every action of one run shares."""

    def __init__(self, ctx: RunContext, *, journal: Journal | None = None,
                 open_uploads: dict[str, OpenUpload] | None = None,
                 known: Holdings | None = None, whole_only: bool = False,
                 part_tasks: WorkerTasks | None = None) -> None:
        """``journal``: where open uploads are recorded (None for a dry run); ``known``: the
        records and chunk index a delta composes from; ``open_uploads``: those a killed run
        left, to take up; ``whole_only``: raise NotWhole for an object that is not one
        request (a worker process, which has no journal); ``part_tasks``: workers that send
        the parts of a copy in parts (``part_tasks``; not into files: see there) and read and
        hash an object whole for its cut or its delta (``hash_tasks``)."""
        src, dst, options, limits, emit = ctx.src, ctx.dst, ctx.options, ctx.limits, ctx.emit
        self.ctx = ctx
        self.whole_only = whole_only
        # A file upload reopened by a worker would hold a descriptor that the Upload protocol
        # cannot give back but by abort, which deletes the file: files stay in this process.
        self.part_tasks = part_tasks if not isinstance(dst, FileTarget) else None
        self.src = src
        self.dst = dst
        self.options = options
        self.limits = limits
        self.emit = emit
        self.uploads = Uploads(ctx, journal, dict(open_uploads or {}))
        # The source's hashing reads, whatever the target: they write nothing.
        self.scan: Scan = (RemoteScan(part_tasks, src, limits) if part_tasks is not None
                           else LocalScan(src, limits))
        self.delta_planner = DeltaPlanner(src, dst, options, limits, known, self.scan)
        self.delta_sender = DeltaSender(ctx, known)
        # Abilities asked once per run, not per object: on Python 3.11 each check against a
        # runtime protocol walks the protocol's members (~20 us for ServerSideCopier here),
        # ~5% of the client CPU of a server-side copy of 1,000 small objects.
        self._streams_into_files = isinstance(dst, FileTarget) and isinstance(src,
                                                                              RangeStreamer)
        self._copier = dst if isinstance(dst, ServerSideCopier) else None
        self._copy_origin = src if isinstance(src, ServerSideCopier) else None
        self._reads_into = src if isinstance(src, ReadsInto) else None
        # A previous run left uploads open: it was stopped, and may have left staging objects
        # of a block delta behind too.
        self.after_stop = bool(open_uploads)

    async def run(self, action: Action) -> Done:
        if action.kind == "delete":
            async with self.limits.requests:
                await self.dst.delete(action.key)
            return Done(ObjectResult(action.key, "delete", action.size, 0), None)
        self.dst.validate_key(action.key)
        current = action

        async def take_new_version(_: PreconditionFailed) -> None:
            # The source changed after it was listed: never stitch two versions together.
            # Take the new version, once; a source still changing is reported. The target is
            # looked at again too: a delta must never compose from a target version other
            # than the one mcsync recorded.
            nonlocal current
            async with self.limits.requests:
                fresh = await self.src.head(action.key)
            log.info("%s changed while it was copied; copying the new version", action.key)
            current = dataclasses.replace(action, src=fresh, dst=None)

        # A marker's new version may name a checkpoint this run never listed: not taken (the
        # run reports it deferred, and the next one copies that checkpoint, then the marker).
        tries = 1 if is_commit_marker(action.key) else 2
        try:
            return await retrying(lambda: self._write(current), RetryPolicy.immediate(tries),
                                  retry_on=PreconditionFailed, before_retry=take_new_version)
        except NotFound as exc:
            # Of the source (deleted since it was listed) or of the target's side (an upload
            # gone): only the source can tell which.
            if not await self._gone_from_source(action.key):
                raise
            raise SourceGone(f"{self.src.url}{action.key}: deleted at the source after it "
                             "was listed; nothing to copy") from exc

    async def _gone_from_source(self, key: str) -> bool:
        try:
            async with self.limits.requests:
                await self.src.head(key)
        except NotFound:
            return True
        except MCSyncError:  # cannot tell: the NotFound stands
            return False
        return False

    async def finish(self) -> None:
        """After the last action: abort what a killed run left and this one did not take up,
        and, after a stop, sweep the staging space."""
        await self.uploads.abort_all_stale()
        if self.after_stop:
            await self.delta_sender.sweep()

    def may_go_as_delta(self, action: Action) -> bool:
        """Could this action go as a block delta (before looking at any byte)?"""
        return not self.delta_sender.refused and self.delta_planner.possible(action)

    def is_whole(self, action: Action) -> bool:
        """Is ``action`` one request, never journalled: a delete, a copy of an object up to
        the multipart threshold (never a delta: see _write) or a server-side copy of one
        CopyObject?"""
        if action.kind == "delete":
            return True
        if action.src is None:
            return False
        if action.kind == "server_copy":
            return action.src.size <= self.dst.caps.max_copy_size
        return action.kind == "copy" and action.src.size <= self.options.multipart_threshold

    async def _write(self, action: Action) -> Done:
        src = action.src
        assert src is not None
        if self.whole_only and not self.is_whole(action):  # a new version, grown past it
            raise NotWhole(action.key)
        if action.kind == "server_copy":
            return await self._server_copy(action, src)
        if src.size <= self.options.multipart_threshold:
            return await self._copy_whole(action, src)
        prior = await self.uploads.take_up(action.key, src)
        if prior is not None and not self.uploads.still_open(action.key):
            done = await self._recognise(action, src, prior)
            if done is not None:
                return done
            await self.uploads.abort_stale(prior)
            prior = None
        if self.may_go_as_delta(action):
            composed = await self._delta(action, src, prior)
            if not isinstance(composed, str):
                found = composed.found
                return self._done(action, src, composed.uploaded.written,
                                  composed.uploaded.sent, found.digests, found.layout,
                                  reused=composed.reused, reused_own=composed.reused_own,
                                  changed=found.plan.bytes_changed,
                                  reused_from=found.reused_from())
            log.info("%s: %s; sending it whole", action.key, composed)
        return await self._copy_parts(action, src, prior)

    async def _delta(self, action: Action, src: ObjectInfo,
                     prior: OpenUpload | None) -> Composed | str:
        found = await self.delta_planner.plan(action, src)
        if isinstance(found, str):
            return found
        # Parts of new bytes are read whole or streamed like any part; the copied ones carry
        # no bytes, so no CRC32C of the whole object can be summed on the way.
        sender = self._part_sender(action.key, src, None, check_crc=False)
        try:
            return await self.delta_sender.send(action, src, found, prior, self.uploads, sender,
                                                streamed=sender.streams)
        finally:
            sender.close()

    async def _recognise(self, action: Action, src: ObjectInfo, prior: OpenUpload) -> Done | None:
        """A killed run's upload of this version is gone: if it completed, record it (cut as
        that upload was: a delta's in the recorded version's blocks)."""
        part_size = self.options.part_size_for(src.size, self.dst.caps)
        was_delta = (prior.layout or "").startswith("delta:")
        block, chunker = (self.delta_planner.cut_of(action, src.size) if was_delta
                          else (part_size, self.options.chunker))
        layout = await cut(self.src, src, block, chunker, self.limits, self.scan)
        found = await self.uploads.recognise(prior, src, layout, self.src, part_size)
        if found is None:
            return None
        return self._done(action, src, found.there, 0, found.digests, layout,
                          changed=0 if was_delta else None)

    # -- through the client --------------------------------------------------------------------

    async def _copy_whole(self, action: Action, src: ObjectInfo) -> Done:
        charge = src.size * (1 + self.dst.caps.send_copies)
        # An object of a megabyte or more is a data-bearing request like a part; smaller ones
        # are bounded by the requests in flight alone.
        slot = self.limits.parts.slot() if src.size >= LARGE_OBJECT else contextlib.nullcontext()
        async with slot, self.limits.memory.hold(charge), self.limits.requests:
            # A megabyte or more is read as a part is, into a buffer of the run's: a buffer
            # made for each object is zero-filled on the loop's thread first. A source that
            # keeps a CRC32C (GCS) checks a whole-object read itself (the store knows the CRC
            # of what it served), so it is asked for the whole object.
            reader = self._reads_into if src.crc32c is None else None
            if reader is not None and src.size >= LARGE_OBJECT:
                with self.limits.buffers.lent(src.size) as buf:
                    view = await reader.read_into(action.key, ByteRange(0, src.size), buf,
                                                  expect=src)
                    written, digest = await self._put_whole(action, src, view)
                    del view
            else:
                data = await self.src.get(action.key, expect=src)
                written, digest = await self._put_whole(action, src, data)
                del data
        if src.size >= LARGE_OBJECT:
            self.limits.parts.moved(src.size)
        self.emit(BytesMoved(action.key, src.size))
        whole = Layout(src.size, [ByteRange(0, src.size)])
        return self._done(action, src, written, src.size, [digest], whole)

    async def _put_whole(self, action: Action, src: ObjectInfo,
                         data: Buffer) -> tuple[ObjectInfo, bytes]:
        if len(data) != src.size:
            raise IntegrityError(f"{action.key}: read {len(data)} bytes, listing said {src.size}")
        digest = await block_digest_async(data)
        # A source that keeps a CRC32C checked the whole object's bytes against it as it
        # served them (see _copy_whole): the target's checksum header is that one, not summed
        # a second time.
        crc = checksums.from_base64(src.crc32c) if src.crc32c is not None else None
        return await self.dst.put(action.key, data, mtime=src.mtime, crc32c=crc), digest

    def _streams(self) -> bool:
        """Do parts read here stream into the target (an S3 range into a file)?"""
        return self._streams_into_files

    async def _copy_parts(self, action: Action, src: ObjectInfo,
                          prior: OpenUpload | None) -> Done:
        part_size = self.options.part_size_for(src.size, self.dst.caps)
        layout = await cut(self.src, src, part_size, self.options.chunker, self.limits,
                           self.scan)
        chunks = layout.chunks
        sender = self._part_sender(action.key, src, layout.digests,
                                   check_crc=src.crc32c is not None)
        # Streamed into a file, a part is one large GET of several chunks (the chunks, hashed
        # and recorded, stay the same); unless a part size was asked for.
        group = part_size
        if sender.streams and self.options.part_size is None:
            group = max(part_size, STREAM_PART_SIZE)
        specs = tuple(Part(n, ByteRange(chunks[a].start, chunks[b - 1].end),
                               chunks=tuple(chunks[a:b]), first_chunk=a)
                      for n, (a, b) in enumerate(group_parts(chunks, group), start=1))
        sender.n_parts = len(specs)
        plan = UploadPlan(action.key, src, specs, group, layout.fingerprint(part_size),
                          streamed=sender.streams)
        dst = self.dst
        opener = (lambda: dst.open_file(action.key, src.size, mtime=src.mtime)) \
            if sender.streams and isinstance(dst, FileTarget) else None
        remote = None
        if self.part_tasks is not None and not sender.streams:  # the parts go to workers
            remote = RemoteParts(self.part_tasks, sender, parts_per_task(
                self.part_tasks, len(specs), group, self.options.part_concurrency))
        move: MovePart = remote if remote is not None else sender
        try:
            uploaded = await self.uploads.run(plan, prior, move, n_chunks=len(chunks),
                                              before_complete=sender.verify,
                                              open_upload=opener)
        finally:
            sender.close()
            if remote is not None:
                await remote.aclose()
        digests = [d for d in uploaded.digests if d is not None]
        if len(digests) != len(chunks):
            raise IntegrityError(f"{self.src.url}{action.key}: {len(chunks) - len(digests)} "
                                 "chunks were never hashed")
        return self._done(action, src, uploaded.written, uploaded.sent, digests, layout)

    def _part_sender(self, key: str, src: ObjectInfo, cut_digests: list[bytes] | None, *,
                     check_crc: bool) -> PartSender:
        """``check_crc``: a source that keeps a CRC32C (GCS) is checked against it before
        Complete; parts are then read whole (a streamed part is not summed)."""
        return PartSender(self.src, key, src, cut_digests, self.limits,
                          streams=self._streams() and not check_crc, check_crc=check_crc,
                          threads=self.options.part_concurrency)

    # -- server side ---------------------------------------------------------------------------

    async def _server_copy(self, action: Action, src: ObjectInfo) -> Done:
        # The planner chose server_copy only because dst.can_copy_from(src) said so.
        dst, origin = self._copier, self._copy_origin
        assert dst is not None and origin is not None
        source = origin.copy_source(action.key, src.etag)
        # One CopyObject up to the store's limit (S3: 5 GiB, as rclone's copy cutoff): on
        # SeaweedFS a 256 MiB object copies in 1.57 s whole against 1.80 s as 8 parallel 64 MiB
        # part copies. Larger objects go as parallel UploadPartCopy ranges of 512 MiB or more;
        # no byte passes through us, so the memory budget does not bound them.
        if src.size <= dst.caps.max_copy_size:
            async with self.limits.requests:
                written = await dst.copy_object(source, action.key)
            return self._done(action, src, written, 0, [], None)
        part_size = min(max(self.options.part_size_for(src.size, dst.caps),
                            SERVER_COPY_MIN_PART), dst.caps.max_part_size)
        specs = tuple(Part(n, ByteRange(off, min(off + part_size, src.size)), old_start=off)
                      for n, off in enumerate(range(0, src.size, part_size), start=1))

        async def move(spec: Part, upload: Upload) -> WrittenPart:
            assert isinstance(upload, PartCopyUpload)
            async with self.limits.requests:
                ref = await upload.copy_part(spec.number, spec.rng.start, source, spec.rng)
            return WrittenPart.of(ref)

        # Not journalled: a copy costs the target, not the network; a killed one starts over.
        uploads = Uploads(self.ctx)
        plan = UploadPlan(action.key, src, specs, part_size, "server-copy")
        uploaded = await uploads.run(plan, None, move, n_chunks=0)
        return self._done(action, src, uploaded.written, 0, [], None)

    # -- the record ------------------------------------------------------------------------------

    def _done(self, action: Action, src: ObjectInfo, written: ObjectInfo, sent: int,
              digests: list[bytes], layout: Layout | None, *, reused: int = 0,
              reused_own: int = 0, changed: int | None = None,
              reused_from: tuple[tuple[str, int], ...] = ()) -> Done:
        """``layout`` None: a server-side copy, no byte of which passed through us."""
        entry = entry_for(src, written, digests=digests,
                          block_size=layout.block if layout is not None else 0,
                          chunk_sizes=layout.chunk_sizes() if layout is not None else b"",
                          chunker=layout.chunker if layout is not None else "fixed")
        server = layout is None
        result = ObjectResult(action.key, "server_copy" if server else "copy", src.size, sent,
                              entry.xxh3, None if server else entry.block_size, written.etag,
                              bytes_reused=reused, bytes_reused_own=reused_own,
                              reused_from=reused_from,
                              bytes_changed=None if server else (
                                  src.size if changed is None else changed))
        return Done(result, entry)
