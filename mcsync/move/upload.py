"""The life of a multipart upload: open it or take up the one a killed run left, confirm the
parts the journal claims, run the missing parts under the run's limits, complete it — and,
once, recognise an upload that a killed run had completed but not recorded.

What a part *is* (a ``delta.Part``: bytes read and sent, streamed into a file, copied at the
target, staged) is the caller's: ``Uploads.run`` is given a ``move`` for each part and owns
everything around it.
An upload is journalled (``Journal.begin_upload``) before its first part is sent and every
part as it is acknowledged, so a run killed at any instant resumes from its missing parts.
A part that fails aborts the upload — nothing half-written is ever completed — while a stop
request or a cancellation keeps it open and journalled for the next run.

Memory: a part's bytes are taken from the run's ByteBudget *before* its task starts (a copied
part holds none, a streamed one a few pieces) and given back however it ends.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from ..chunking import Layout
from ..delta.match import Part
from ..delta.read import scan_chunks
from ..errors import Interrupted, NotFound, first_error
from ..events import BytesMoved, Event
from ..hashing import DIGEST_SIZE
from ..limits import Limits
from ..records import OpenUpload, WrittenPart, split_digests
from ..stores.base import ReadStore, Store, Upload
from ..streaming import STREAM_PART_HOLD
from ..types import ObjectInfo, PartClaim, PartRef
from .context import RunContext

log = logging.getLogger(__name__)


# Moves one part (reads and sends it, or has the target copy it) and returns the target's
# receipt, with the digests of its chunks when its bytes passed through the client.
MovePart = Callable[[Part, Upload], Awaitable[WrittenPart]]


class Journal(Protocol):
    """Where an upload's progress goes as it is made, so a killed run resumes it: the run's
    manifest (``Manifest`` is one), written at once. A worker that has no manifest reports the
    same three calls to the driver that writes it."""

    def begin_upload(self, key: str, upload_id: str, src: ObjectInfo, part_size: int,
                     layout: str | None = None) -> None: ...

    def record_part(self, key: str, part: WrittenPart) -> None: ...

    def drop_upload(self, key: str) -> None: ...


@dataclass(frozen=True, slots=True)
class UploadPlan:
    """One object's upload, laid out once: its parts and what the journal records of it."""

    key: str
    src: ObjectInfo
    specs: tuple[Part, ...]
    part_size: int
    layout_id: str | None  # how the parts were cut (None: fixed parts of ``part_size``)
    streamed: bool = False  # parts stream into a file: each holds a few pieces of memory


@dataclass(frozen=True, slots=True)
class Uploaded:
    written: ObjectInfo
    digests: list[bytes | None]  # per chunk of the object, from the parts that carried it
    sent: int  # bytes this run sent for it (a resumed upload's kept parts not counted)


@dataclass(frozen=True, slots=True)
class Recognised:
    """An upload a killed run completed: what the target holds, and the digests of it."""

    there: ObjectInfo
    digests: list[bytes]


@dataclass
class Uploads:
    """The multipart uploads of one run, and the journal of those a killed run left open."""

    ctx: RunContext
    journal: Journal | None = None
    open_uploads: dict[str, OpenUpload] = field(default_factory=dict)
    # Uploads a killed run left open, taken up by ``take_up`` and handed on to ``run`` (a
    # local one holds a file descriptor that must not be opened twice, nor leak).
    _taken_up: dict[str, Upload] = field(default_factory=dict, init=False)
    # The run's, read once from ``ctx``.
    dst: Store = field(init=False)
    limits: Limits = field(init=False)
    emit: Callable[[Event], None] = field(init=False)
    part_concurrency: int = field(init=False)
    stop: asyncio.Event = field(init=False)

    def __post_init__(self) -> None:
        ctx = self.ctx
        self.dst, self.limits, self.emit, self.stop = ctx.dst, ctx.limits, ctx.emit, ctx.stop
        self.part_concurrency = ctx.options.part_concurrency

    # -- what a killed run left ---------------------------------------------------------------

    async def take_up(self, key: str, src: ObjectInfo) -> OpenUpload | None:
        """The journalled upload of ``key`` made from this version of the source, or None.
        One made from another version is aborted. When the upload is still open it is kept
        for ``run``; when it is gone, ``recognise`` tells whether it completed."""
        prior = self.open_uploads.pop(key, None)
        if prior is None:
            return None
        if not prior.matches_source(src):
            await self.abort_stale(prior)
            return None
        async with self.limits.requests:
            upload = await self.dst.resume_upload(key, prior.upload_id, src.size,
                                                  mtime=src.mtime)
        if upload is not None:
            self._taken_up[key] = upload
        return prior

    def journalled(self, key: str) -> bool:
        return key in self.open_uploads

    def still_open(self, key: str) -> bool:
        return key in self._taken_up

    async def recognise(self, prior: OpenUpload, src: ObjectInfo, layout: Layout,
                        read: ReadStore, read_size: int) -> Recognised | None:
        """The journalled upload is gone: a killed run may have completed it and been killed
        before recording it. If the target holds exactly that upload's result, say so (its
        journal rows go when the object is recorded, in the same transaction); None when
        not: then ``abort_stale`` it and upload afresh, which is always correct. The digests
        come from the journal when every part carried its chunks' bytes, else from the cut,
        else from reading ``read`` (the source) in ``layout``'s chunks."""
        try:
            async with self.limits.requests:
                there = await self.dst.head(prior.key)
        except NotFound:
            return None
        parts = [prior.parts[n] for n in sorted(prior.parts)]
        if there.size != src.size or not parts or sum(p.size for p in parts) != src.size:
            return None
        journalled = [d for p in parts for d in split_digests(p.digest)]
        digests = journalled if len(journalled) == len(layout.chunks) else layout.digests

        async def source_digests() -> list[bytes]:
            return digests or await scan_chunks(read, src, layout.chunks, read_size,
                                                self.limits)

        expected = _multipart_etag([p.etag for p in parts])
        if there.etag is None:  # a file: published with the source's mtime
            if there.mtime != src.mtime:
                return None
        elif expected is not None:
            if there.etag != expected:
                return None
        else:
            # Part copies of multipart sources carry ETags like "…-3" (SeaweedFS), so the
            # object's ETag cannot be derived: read the target back and compare instead.
            digests = await source_digests()
            there_digests = await scan_chunks(self.dst, there, layout.chunks, read_size,
                                              self.limits)
            if there_digests != digests:
                return None
        log.info("%s: the upload had completed before the last run stopped", prior.key)
        return Recognised(there, await source_digests())

    async def abort_stale(self, prior: OpenUpload) -> None:
        """Abort an upload a previous run left open that this run will not finish."""
        async with self.limits.requests:
            await abort_left_open(self.dst, prior, self.journal,
                                  self._taken_up.pop(prior.key, None))

    async def abort_all_stale(self) -> None:
        """Uploads a previous run left open for keys this run did not resume (the source was
        deleted, changed size, or is filtered out now): they would cost storage and could
        never complete."""
        for prior in list(self.open_uploads.values()):
            self.open_uploads.pop(prior.key, None)
            await self.abort_stale(prior)

    def _forget(self, key: str) -> None:
        if self.journal is not None:
            self.journal.drop_upload(key)

    # -- one upload ---------------------------------------------------------------------------

    async def run(self, plan: UploadPlan, prior: OpenUpload | None, move: MovePart, *,
                  n_chunks: int,
                  before_complete: Callable[[], Awaitable[None]] | None = None,
                  open_upload: Callable[[], Awaitable[Upload]] | None = None) -> Uploaded:
        """Upload ``plan``: resume ``prior``'s upload when it is still open and laid out the
        same way (its parts confirmed against the journal), else open a new one. Completed
        only when every part is there, after ``before_complete`` (a last check that raises
        to abort). ``open_upload`` opens a new upload (default ``dst.open_upload``)."""
        key, src = plan.key, plan.src
        upload = self._taken_up.pop(key, None)
        kept: dict[int, WrittenPart] = {}
        if prior is not None and upload is not None and not (
                prior.part_size == plan.part_size and prior.layout == plan.layout_id):
            self._taken_up[key] = upload  # laid out differently: start over
            await self.abort_stale(prior)
            upload = None
        if upload is not None:
            assert prior is not None
            kept = await self._confirmed_parts(upload, prior, plan.specs)
        else:
            async with self.limits.requests:
                upload = await (open_upload() if open_upload is not None
                                else self.dst.open_upload(key, src.size, mtime=src.mtime))
            if self.journal is not None:
                self.journal.begin_upload(key, upload.upload_id, src, plan.part_size,
                                          plan.layout_id)

        refs: dict[int, PartRef] = {}
        digests: list[bytes | None] = [None] * n_chunks
        by_number = {spec.number: spec for spec in plan.specs}
        for n, jp in kept.items():
            refs[n] = jp.ref
            _place(digests, by_number[n], jp.digests())
        live = upload

        async def one(spec: Part) -> PartRef:
            moved = await move(spec, live)
            self.limits.parts.moved(spec.sent)
            _place(digests, spec, moved.digests())
            if self.journal is not None:
                self.journal.record_part(key, moved)
            self.emit(BytesMoved(key, spec.rng.length))
            return moved.ref

        todo = [spec for spec in plan.specs if spec.number not in kept]
        for ref in await self._run_parts(key, upload, todo, one, streamed=plan.streamed):
            refs[ref.number] = ref
        if before_complete is not None:
            try:
                await before_complete()
            except BaseException:  # a mismatch must never become visible
                await asyncio.shield(upload.abort())
                self._forget(key)
                raise
        async with self.limits.requests:
            written = await _complete(upload, [refs[n] for n in sorted(refs)])
        return Uploaded(written, digests, sum(spec.sent for spec in todo))

    async def _confirmed_parts(self, upload: Upload, prior: OpenUpload,
                               specs: Sequence[Part]) -> dict[int, WrittenPart]:
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

    async def _run_parts(self, key: str, upload: Upload, parts: list[Part],
                         move: Callable[[Part], Awaitable[PartRef]],
                         *, streamed: bool = False) -> list[PartRef]:
        """Move parts concurrently, ``part_concurrency`` at a time. A failure aborts the
        upload and re-raises the first error. A stop request lets the parts in flight finish,
        schedules no more and raises Interrupted, keeping the upload for the next run, as
        does cancellation. A part that carries bytes takes one of the run's slots for parts on
        the wire (``Limits.parts``) and its bytes from the memory budget before its task
        starts, and gives both back when it ends, however it ends (a task cancelled before its
        first step never runs its own ``finally``)."""
        held: dict[int, int] = {}
        slotted: set[int] = set()
        memory, slots = self.limits.memory, self.limits.parts
        charge = 1 + self.dst.caps.send_copies  # the part read, plus the client's copies

        def give_back(number: int) -> None:
            memory.release(held.pop(number, 0))
            if number in slotted:
                slotted.discard(number)
                slots.release()

        async def windowed(spec: Part) -> PartRef:
            try:
                return await move(spec)
            finally:
                give_back(spec.number)
                window.release()

        tasks: list[asyncio.Task[PartRef]] = []
        window = asyncio.Semaphore(self.part_concurrency)
        try:
            async with asyncio.TaskGroup() as tg:
                for spec in parts:
                    await window.acquire()
                    if self.stop.is_set():
                        window.release()
                        break
                    if spec.sent:  # a copied part holds no bytes
                        await slots.acquire()
                        slotted.add(spec.number)
                        need = min(spec.sent, STREAM_PART_HOLD) if streamed and spec.plain \
                            else spec.sent
                        held[spec.number] = await memory.acquire(need * charge)
                    tasks.append(tg.create_task(windowed(spec)))
        except asyncio.CancelledError:
            raise  # the upload stays open and journalled: the next run resumes it
        except BaseException as exc:
            if not isinstance(first_error(exc), asyncio.CancelledError | Interrupted):
                await asyncio.shield(upload.abort())
                self._forget(key)
            raise first_error(exc) from None
        finally:
            for n in list(held) + list(slotted):
                give_back(n)
        if len(tasks) < len(parts):
            raise Interrupted(f"{key}: stopped after {len(tasks)} of {len(parts)} parts")
        return [t.result() for t in tasks]


async def abort_left_open(dst: Store, prior: OpenUpload, journal: Journal | None,
                          upload: Upload | None = None) -> None:
    """Abort an upload a previous run left open (``upload``: taken up already) and drop it
    from the journal; best effort: the target's lifecycle rules are the backstop."""
    try:
        if upload is not None:
            await upload.abort()
        else:  # some stores answer NoSuchUpload for an upload with no part yet:
            await dst.abort_upload(prior.key, prior.upload_id)  # by id all the same
    except Exception as exc:
        log.warning("could not abort stale upload of %s: %s", prior.key, exc)
    if journal is not None:
        journal.drop_upload(prior.key)


def _place(digests: list[bytes | None], spec: Part, pieces: list[bytes]) -> None:
    """Put a part's chunk digests at their place in the object's list."""
    if spec.first_chunk is not None and pieces:
        digests[spec.first_chunk:spec.first_chunk + len(pieces)] = pieces


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

