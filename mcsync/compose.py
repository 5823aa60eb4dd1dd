"""Realising a block delta: a changed object that mcsync wrote before is rebuilt at the target
from the version it holds plus the new bytes, in one upload (see ``delta`` for the plan).

Here: planning it against the target's recorded version (reads and hashes the whole source,
sends nothing), the parts the target composes — ranged part copies from its current version,
and *staged* parts (a short run of new bytes behind a minimum part's worth of copied bytes,
built as a scratch object under ``.mcsync/stage/`` and copied whole into the upload) — the
fallback to a full upload when a target refuses ranged part copies (found out once per run),
and the sweep of the staging space a killed run left.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field

import xxhash

from . import bases, delta
from .bases import Base
from .chunking import Layout
from .config import SyncOptions
from .errors import ComposeRefused, MCSyncError, NotFound, Permanent, PreconditionFailed
from .events import DeltaPlanned, Event
from .limits import Limits
from .manifest import Manifest, OpenUpload
from .plan import Action
from .scan import cut, scan_chunks
from .stores.base import (
    Composer,
    CopySource,
    PartCopyUpload,
    ReadStore,
    ScratchSpace,
    ServerSideCopier,
    Store,
    Upload,
)
from .types import RESERVED_PREFIX, ByteRange, ObjectInfo
from .upload import Moved, MovePart, PartSpec, Uploaded, UploadPlan, Uploads

log = logging.getLogger(__name__)

STAGING_PREFIX = f"{RESERVED_PREFIX}stage/"  # a block delta's staging objects at the target


@dataclass(frozen=True, slots=True)
class DeltaFound:
    """A delta worth sending: the objects at the target it composes from (``bases``, the
    parts' ``source`` indices), the new version's chunks and digests, and the parts."""

    bases: tuple[Base, ...]
    layout: Layout
    digests: list[bytes]
    plan: delta.DeltaPlan
    changed_tensors: tuple[str, ...]

    def reused_from(self) -> tuple[tuple[str, int], ...]:
        """Bytes composed from each base, by key, largest first."""
        by_source = self.plan.reused_by_source()
        return tuple(sorted(((self.bases[i].key, n) for i, n in by_source.items() if n),
                            key=lambda kv: (-kv[1], kv[0])))

    def reused_from_own(self) -> int:
        by_source = self.plan.reused_by_source()
        return sum(n for i, n in by_source.items() if self.bases[i].own)

    def event(self, key: str) -> DeltaPlanned:
        p = self.plan
        return DeltaPlanned(key, p.size, p.bytes_changed, p.bytes_sent, p.bytes_reused,
                            len(p.parts), self.changed_tensors, self.reused_from(),
                            self.reused_from_own())

    def specs(self) -> tuple[PartSpec, ...]:
        return tuple(PartSpec(p.number, p.rng, old_start=p.old_start, stage=p.stage,
                              source=p.source) for p in self.plan.parts)

    def fingerprint(self) -> str:
        return self.plan.fingerprint([b.name for b in self.bases])


@dataclass(frozen=True, slots=True)
class Composed:
    """A delta that was sent: its plan, the upload's result, and the bytes composed at the
    target instead of sent (in all, and from the object's own previous version)."""

    found: DeltaFound
    uploaded: Uploaded
    reused: int
    reused_own: int


@dataclass
class Deltas:
    """The block deltas of one run."""

    src: ReadStore
    dst: Store
    options: SyncOptions
    limits: Limits
    emit: Callable[[Event], None]
    manifest: Manifest | None = None  # the records and chunk index composed from
    refused: bool = False  # the target refused a ranged part copy: no more deltas this run
    # The target was listed and holds no object: whatever the chunk index names is gone, so a
    # new object's chunks are not sampled (read) to look for it there.
    target_empty: bool = False
    _stage_creates: set[asyncio.Future[Upload]] = field(default_factory=set)
    _present: set[str] = field(default_factory=set)  # bases seen at the target (Base.name)

    def possible(self, action: Action) -> bool:
        """Could this action go as a block delta (before looking at any byte)? A changed
        object mcsync wrote, or any large object when the chunk index may hold its chunks."""
        src = action.src
        if not (action.kind == "copy" and src is not None and self.options.delta
                and src.size > self.options.multipart_threshold
                and isinstance(self.dst, Composer) and not self.refused):
            return False
        return action.known is not None or self._index_may_help()

    def _index_may_help(self) -> bool:
        return (self.options.delta_scope != "key" and self.manifest is not None
                and not self.target_empty and not self.manifest.index.empty)

    def cut_of(self, action: Action, size: int) -> tuple[int, str]:
        """Block size and chunker to cut the new version with: as the recorded version of the
        key was cut, unless told otherwise; a key without one as a copy of it would be."""
        known = action.known
        if known is not None and known.block_size > 0:
            chunker = known.chunker if self.options.chunker == "auto" else self.options.chunker
            return known.block_size, chunker
        return self.options.part_size_for(size, self.dst.caps), self.options.chunker

    async def plan(self, action: Action, src: ObjectInfo) -> DeltaFound | str:
        """The delta for an object, or why there is none: composed from its own previous
        version and from objects sharing its chunks (see ``bases``). Reads and hashes the
        whole source (a new object: a few chunks first, and all only if one is found at the
        target); sends nothing."""
        if not self.options.delta:
            return "no delta asked for"
        if not isinstance(self.dst, Composer):
            return f"{self.dst.url} cannot build objects from ranges"
        own = await self._own_base(action)
        if isinstance(own, str) and not self._index_may_help():
            return own
        block, chunker = self.cut_of(action, src.size)
        layout = await cut(self.src, src, block, chunker, self.limits)
        part_size = self.options.part_size_for(src.size, self.dst.caps)
        if isinstance(own, str) and not layout.digests:  # a new object: look before reading
            picked = bases.samples(layout.chunks, layout.header is not None)
            sampled = await scan_chunks(self.src, src, picked, 1, self.limits)
            hits = self._holders(action.key, zip(picked, sampled, strict=True))
            if not hits or not await self._any_present(hits):
                return f"{own}, and no chunk of it is at the target"
        digests = layout.digests or await scan_chunks(self.src, src, layout.chunks, part_size,
                                                      self.limits)
        new = list(zip(layout.chunks, digests, strict=True))
        found = [own] if isinstance(own, Base) else []
        found, segments = await self._match_present(
            new, found + self._other_bases(action.key, new))
        caps = self.dst.caps
        plan = delta.pack(segments, src.size, part_size=part_size, min_part=caps.min_part_size,
                          max_parts=caps.max_parts, stage=_can_stage(self.dst))
        if plan is None:
            return "too many changed regions for one upload"
        if plan.bytes_reused == 0:
            return own if isinstance(own, str) else "nothing at the target can be reused"
        tensors = () if layout.header is None else tuple(delta.changed_tensors(
            segments, [(t.name, t.start, t.end) for t in layout.header.tensors]))
        return DeltaFound(tuple(found), layout, digests, plan, tensors)

    async def _own_base(self, action: Action) -> Base | str:
        """The key's own version at the target, as mcsync recorded it, or why it is none."""
        known = action.known
        if known is None:
            return "not at the target before"
        old = known.chunks()
        if not old:
            return "no block hashes recorded for the target's version"
        current = action.dst
        if current is None:
            try:
                async with self.limits.requests:
                    current = await self.dst.head(action.key)
            except NotFound:
                return "not at the target any more"
        if not known.matches_target(current):
            return "the target changed behind mcsync's back"
        return Base(action.key, current, old, own=True)

    def _holders(self, key: str, chunks: Iterable[tuple[ByteRange, bytes]]) -> Counter[str]:
        if self.manifest is None or self.options.delta_scope == "key":
            return Counter()
        hits = self.manifest.index.holders((rng.length, d) for rng, d in chunks if rng.length)
        return Counter({k: n for k, n in hits.items()
                        if bases.in_scope(k, key, self.options.delta_scope)})

    def _other_bases(self, key: str, new: list[tuple[ByteRange, bytes]]) -> list[Base]:
        """Other objects at the target holding chunks of ``new``, best first."""
        hits = self._holders(key, new)
        if not hits or self.manifest is None:
            return []
        records = {k: e for k in hits if (e := self.manifest.get(k)) is not None}
        return [Base(k, records[k].as_target(), records[k].chunks())
                for k in bases.rank(key, hits, records, self.options.delta_scope)]

    async def _match_present(self, new: list[tuple[ByteRange, bytes]], found: list[Base],
                             ) -> tuple[list[Base], list[delta.Segment]]:
        """``delta.match`` against ``found``, every other object it copies from first seen at
        the target as recorded (one HEAD each, once a run). One deleted or replaced behind
        mcsync's back (a retention rule expiring old checkpoints) is dropped from the chunk
        index and the match made again without it: the index outlives what it names."""
        while True:
            segments = delta.match(new, *(b.chunks for b in found))
            used = {seg.source for seg in segments if seg.old_start is not None}
            unseen = [b for i, b in enumerate(found)
                      if i in used and not b.own and b.name not in self._present]
            if not unseen:
                return found, segments
            gone = {b.key for b, here in zip(
                unseen, await asyncio.gather(*map(self._still_there, unseen)), strict=True)
                if not here}
            if not gone:
                return found, segments
            found = [b for b in found if b.key not in gone]

    async def _any_present(self, holders: Iterable[str]) -> bool:
        """Is any of ``holders`` (keys the index names) still at the target as recorded? Asked
        before a new object is read whole to be matched: holders a retention rule deleted
        would make that read for nothing."""
        records = {k: e for k in holders if self.manifest is not None
                   and (e := self.manifest.get(k)) is not None}
        found = await asyncio.gather(*(self._still_there(Base(k, e.as_target(), ()))
                                       for k, e in records.items()))
        return any(found)

    async def _still_there(self, base: Base) -> bool:
        try:
            async with self.limits.requests:
                current = await self.dst.head(base.key)
        except NotFound:
            current = None
        record = self.manifest.get(base.key) if self.manifest is not None else None
        if current is not None and record is not None and record.matches_target(current):
            self._present.add(base.name)
            return True
        log.info("%s is %s the target: not composing from it", base.key,
                 "no longer at" if current is None else "another version at")
        if self.manifest is not None and not self.options.dry_run:
            self.manifest.index.drop(base.key)
        return False

    async def send(self, action: Action, src: ObjectInfo, prior: OpenUpload | None,
                   uploads: Uploads, send_part: MovePart, *, streamed: bool) -> Composed | str:
        """Send only what changed and have the target compose the rest, or say why not (the
        caller then sends the object whole). ``send_part`` moves a part of new bytes
        (``streamed``: into a file as they arrive, holding a few pieces of memory)."""
        found = await self.plan(action, src)
        if isinstance(found, str) or self.refused:
            return found if isinstance(found, str) else "the target refused ranged part copies"
        self.emit(found.event(action.key))
        key, dst = action.key, self.dst
        assert isinstance(dst, Composer)  # plan() said so
        sources = [dst.compose_source(b.info) for b in found.bases]
        specs = found.specs()
        staged = any(spec.stage for spec in specs)
        if staged:  # what a killed run of this key left (a lock keeps other runs away)
            await self.clear_staging(key)

        async def move(spec: PartSpec, upload: Upload) -> Moved:
            if spec.old_start is None:
                return await send_part(spec, upload)
            base = found.bases[spec.source]
            try:
                if spec.stage:
                    return await self._staged_part(key, src, upload, spec, sources[spec.source])
                old = ByteRange(spec.old_start, spec.old_start + spec.rng.length)
                return await self._copy_part(key, upload, spec, sources[spec.source], old)
            except PreconditionFailed:
                # The base is no longer the version recorded, or is gone: never compose from
                # it again.
                # Raised on, the object is planned afresh (transfer), without it.
                if self.manifest is not None:
                    self.manifest.index.drop(base.key)
                log.info("%s: %s changed or went away behind mcsync's back; not composing "
                         "from it", key, base.key)
                raise

        plan = UploadPlan(key, src, specs, self.options.part_size_for(src.size, dst.caps),
                          found.fingerprint(), streamed=streamed)
        try:
            uploaded = await uploads.run(plan, prior, move, n_chunks=len(found.layout.chunks))
        except ComposeRefused as exc:
            self.refused = True
            log.warning("%s; sending changed objects whole from now on", exc)
            await self.clear_staging(key)
            return "the target refused ranged part copies"
        except (MCSyncError, OSError):
            if staged:  # a part cancelled while its staging upload was being created
                await self.clear_staging(key)
            raise
        reused = sum(spec.rng.length - spec.sent for spec in specs)
        return Composed(found, uploaded, reused, found.reused_from_own())

    async def _copy_part(self, key: str, upload: Upload, spec: PartSpec, source: CopySource,
                         old: ByteRange) -> Moved:
        assert isinstance(upload, PartCopyUpload)  # a Composer's upload
        async with self.limits.requests:
            with _refusal_means_no_compose(self.dst.url, key):
                ref = await upload.copy_part(spec.number, spec.rng.start, source, old)
        return Moved(ref)  # no byte passed through us

    async def _staged_part(self, key: str, src: ObjectInfo, upload: Upload, spec: PartSpec,
                           source: CopySource) -> Moved:
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
        # an upload the server creates after we stopped listening; clear_staging waits for it.
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
                    ref = await upload.copy_part(
                        spec.number, spec.rng.start, dst.copy_source(stage_key, staged.etag),
                        ByteRange(0, spec.rng.length))
            return Moved(ref)
        finally:
            with contextlib.suppress(MCSyncError, OSError):
                async with self.limits.requests:
                    await asyncio.shield(dst.delete(stage_key))

    async def clear_staging(self, key: str) -> None:
        await self._clear(_staging_prefix(key))

    async def sweep(self) -> None:
        """After an interrupted run: the staging objects a killed delta may have left."""
        await self._clear(STAGING_PREFIX)

    async def _clear(self, prefix: str) -> None:
        if not isinstance(self.dst, ScratchSpace):
            return
        if self._stage_creates:  # let creates in flight land, so the listing below sees them
            await asyncio.gather(*self._stage_creates, return_exceptions=True)
        try:
            async with self.limits.requests:
                await asyncio.shield(self.dst.clear(prefix))
        except (MCSyncError, OSError) as exc:
            log.warning("could not clear %s at the target: %s", prefix, exc)


def _can_stage(dst: Store) -> bool:
    """Can short changed runs be staged at the target? It takes a scratch space for the
    staging objects and server-side copies of them into the upload."""
    return isinstance(dst, ServerSideCopier) and isinstance(dst, ScratchSpace)


def _staging_prefix(key: str) -> str:
    """Where the staging objects of ``key``'s delta live."""
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

