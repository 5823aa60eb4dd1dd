"""Planning a block delta: which objects at the target a changed (or new) object can be
composed from, and the parts of the one upload that rebuilds it (see ``delta`` for the
packing, ``delta_bases`` for the choice of objects, ``compose`` for sending it). Reads and
hashes the source, and looks at the target (one HEAD per object composed from, once a run);
sends nothing.

What the planner knows of the target's objects it asks through ``Holdings``, a narrow view of
the manifest (the records and the chunk index) that the run's driver implements: the planner
never opens the manifest's database.
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Protocol

from ..chunking import Layout
from ..config import SyncOptions
from ..errors import NotFound
from ..events import DeltaPlanned
from ..limits import Limits
from ..records import Action, ManifestEntry
from ..stores.base import Composer, ReadStore, ScratchSpace, ServerSideCopier, Store, has
from ..types import ByteRange, ObjectInfo
from . import bases as delta_bases
from . import match as delta
from .bases import Base
from .read import LocalScan, Scan, cut, scan_chunks

log = logging.getLogger(__name__)


class Holdings(Protocol):
    """What the delta's planner (and its sender) know of the objects at the target: their
    records and the chunk index, and the one thing they tell back, an object no longer there
    as recorded (its chunks are then never composed from again)."""

    def get(self, key: str) -> ManifestEntry | None: ...

    def holders(self, wanted: Iterable[tuple[int, bytes]]) -> Counter[str]:
        """Objects holding any of the ``wanted`` chunks (length, digest), with how many."""
        ...

    def may_hold_chunks(self) -> bool:
        """Could the chunk index name a chunk at the target at all?"""
        ...

    def gone(self, key: str) -> None: ...


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

    def fingerprint(self) -> str:
        return self.plan.fingerprint([b.name for b in self.bases])


@dataclass
class DeltaPlanner:
    """Plans the block deltas of one run."""

    src: ReadStore
    dst: Store
    options: SyncOptions
    limits: Limits
    known: Holdings | None = None  # the records and chunk index composed from
    # Where the new version is read and hashed whole: here, or on the run's workers.
    scan: Scan | None = None
    _present: set[str] = field(default_factory=set)  # bases seen at the target (Base.name)

    def possible(self, action: Action) -> bool:
        """Could this action go as a block delta (before looking at any byte)? A changed
        object mcsync wrote, or any large object when the chunk index may hold its chunks."""
        src = action.src
        if not (action.kind == "copy" and src is not None and self.options.delta
                and src.size > self.options.multipart_threshold
                and has(self.dst, Composer)):
            return False
        return action.known is not None or self._index_may_help()

    def _index_may_help(self) -> bool:
        return (self.options.delta_scope != "key" and self.known is not None
                and self.known.may_hold_chunks())

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
        version and from objects sharing its chunks (see ``delta_bases``). Reads and hashes the
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
        scan = self.scan or LocalScan(self.src, self.limits)
        layout = await cut(self.src, src, block, chunker, self.limits, scan)
        part_size = self.options.part_size_for(src.size, self.dst.caps)
        if isinstance(own, str) and not layout.digests:  # a new object: look before reading
            picked = delta_bases.samples(layout.chunks, layout.header is not None)
            sampled = await scan_chunks(self.src, src, picked, 1, self.limits)
            hits = self._holders(action.key, zip(picked, sampled, strict=True))
            if not hits or not await self._any_present(hits):
                return f"{own}, and no chunk of it is at the target"
        digests = layout.digests or await scan.chunks(src, layout.chunks, part_size)
        new = list(zip(layout.chunks, digests, strict=True))
        found = [own] if isinstance(own, Base) else []
        found, segments = await self._match_present(
            new, found + self._other_bases(action.key, new))
        caps = self.dst.caps
        plan = delta.pack(segments, src.size, part_size=part_size, min_part=caps.min_part_size,
                          max_parts=caps.max_parts, stage=can_stage(self.dst))
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
        if self.known is None or self.options.delta_scope == "key":
            return Counter()
        hits = self.known.holders((rng.length, d) for rng, d in chunks if rng.length)
        return Counter({k: n for k, n in hits.items()
                        if delta_bases.in_scope(k, key, self.options.delta_scope)})

    def _other_bases(self, key: str, new: list[tuple[ByteRange, bytes]]) -> list[Base]:
        """Other objects at the target holding chunks of ``new``, best first."""
        hits = self._holders(key, new)
        if not hits or self.known is None:
            return []
        records = {k: e for k in hits if (e := self.known.get(k)) is not None}
        return [Base(k, records[k].as_target(), records[k].chunks())
                for k in delta_bases.rank(key, hits, records, self.options.delta_scope)]

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
        records = {k: e for k in holders if self.known is not None
                   and (e := self.known.get(k)) is not None}
        found = await asyncio.gather(*(self._still_there(Base(k, e.as_target(), ()))
                                       for k, e in records.items()))
        return any(found)

    async def _still_there(self, base: Base) -> bool:
        try:
            async with self.limits.requests:
                current = await self.dst.head(base.key)
        except NotFound:
            current = None
        record = self.known.get(base.key) if self.known is not None else None
        if current is not None and record is not None and record.matches_target(current):
            self._present.add(base.name)
            return True
        log.info("%s is %s the target: not composing from it", base.key,
                 "no longer at" if current is None else "another version at")
        if self.known is not None:
            self.known.gone(base.key)
        return False


def can_stage(dst: Store) -> bool:
    """Can short changed runs be staged at the target? It takes a scratch space for the
    staging objects and server-side copies of them into the upload."""
    return isinstance(dst, ServerSideCopier) and isinstance(dst, ScratchSpace)
