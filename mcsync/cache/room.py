"""Room in the node cache: reservations (a filling entry made only once its charge fits,
evicting what must go, in one transaction), eviction on demand, and ``verify``.

An entry is evictable when it is not pinned, not protected (a warm's own) and no process
uses it: its file's ``LOCK_EX`` is taken without waiting (a reader or a holder of its path
holds ``LOCK_SH``; a live filler ``LOCK_EX``), and held until the file is gone. A reservation
that cannot be made evicts nothing: the victims are chosen and locked first, moved into the
trash only once enough were, and unlinked after the commit (``files.to_trash``).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import CacheFull
from ..types import ObjectInfo
from . import files
from .files import Layout
from .fill import rehash
from .index import Entry, Index, pinned, version_of
from .order import NextUse
from .space import Candidate, Shortfall, charge, overhead, to_free

Touches = dict[int, tuple[float, float | None]]


@dataclass(slots=True)
class Reserved:
    entry: Entry  # filling, its partial file locked by ``fd``
    fd: int
    evicted: list[Candidate] = field(default_factory=list)
    in_use: int = 0  # charged to entries, this one included
    limit: int = 0


class Room:
    def __init__(self, layout: Layout, index: Index) -> None:
        self.layout = layout
        self.index = index

    def limit(self) -> int:
        """The directory's limit (the last one given; 0: none). Read at each reservation, so
        a process that opened the cache before it was set keeps it too."""
        recorded = self.index.setting("max_size")
        return int(recorded) if recorded else 0

    def reserve(self, url: str, info: ObjectInfo, part_size: int, *,
                warmed_by: str | None = None, protect: str | None = None,
                order: NextUse | None = None, touches: Touches | None = None,
                ) -> Reserved | None:
        """A filling entry for ``info`` with room for it; None when another process made
        the entry meanwhile. Raises CacheFull, evicting nothing, when it cannot fit.
        ``touches``: this process's hits not yet recorded, written first (the LRU order of
        this process's own uses is then exact)."""
        need = charge(info.size)
        pins = self.index.pins()
        victims: list[tuple[Candidate, int]] = []
        seen: list[tuple[str, Entry | None]] = []
        trash: list[Path] = []
        committed = False
        try:
            with self.index.transaction() as db:
                if touches:
                    Index.touch_many(db, touches)
                if self.index.find(url, version_of(info)) is not None:
                    return None
                limit = self.limit()
                in_use, count = self.index.totals(db)
                extra = overhead(self.layout.index_bytes(), count + 1)
                excess = to_free(limit, in_use, extra, need) if limit else 0
                if excess:
                    freed = 0
                    for c in self._candidates(pins, protect, order, seen):
                        fd = self.take(self.index.get(c.id))
                        if fd is None:
                            continue  # open, held, or being filled
                        victims.append((c, fd))
                        freed += c.charge
                        if freed >= excess:
                            break
                    if freed < excess:
                        raise CacheFull(Shortfall(need, limit, in_use, extra,
                                                  freed).message(url))
                    for c, _ in victims:
                        trash.extend(files.to_trash(self.layout, c.id))
                        Index.drop(db, c.id)
                entry_id = Index.insert_filling(db, url, info, need, part_size, warmed_by)
                fd = files.try_lock(self.layout.partial(entry_id), create=True)
                assert fd is not None, "a new entry's partial file is locked by no one"
                os.ftruncate(fd, 0)
            committed = True
            files.empty(trash)
        finally:
            for _, vfd in victims:
                os.close(vfd)
            if order is not None and seen:
                order.settle(seen, {c.id for c, _ in victims} if committed else set(),
                             self.index.entries_of)
        entry = self.index.get(entry_id)
        assert entry is not None
        return Reserved(entry, fd, [c for c, _ in victims], self.index.totals()[0], limit)

    def _candidates(self, pins: list[str], protect: str | None, order: NextUse | None,
                    seen: list[tuple[str, Entry | None]]) -> Iterator[Candidate]:
        """The entries eviction may take, in the order to take them: least recently used
        first, read from the index a page at a time (a large cache is not loaded whole for
        each reservation); with a known order, Belady's (``order.py``), then the rest."""
        def allowed(e: Entry) -> bool:
            return not pinned(e.url, pins) and (protect is None or e.warmed_by != protect)

        def candidate(e: Entry) -> Candidate:
            # a dead filler's partial goes before any complete entry
            return Candidate(e.id, e.url, e.charge,
                             e.last_access if e.state == "complete" else float("-inf"))

        offered: set[int] = set()
        if order is not None:
            for e in order.candidates(self.index.entries_of, seen):
                if allowed(e):
                    offered.add(e.id)
                    yield candidate(e)
        for e in self.index.by_last_use():
            if allowed(e) and e.id not in offered:
                yield candidate(e)

    def take(self, entry: Entry | None) -> int | None:
        """A descriptor holding ``LOCK_EX`` on the entry's file when no one uses it: not open
        (complete), or its filler gone (filling); one of /dev/null when it has no file."""
        if entry is None:
            return None
        paths = ([self.layout.object(entry.id)] if entry.state == "complete"
                 else [self.layout.partial(entry.id), self.layout.object(entry.id)])
        for path in paths:
            try:
                return files.try_lock(path)
            except FileNotFoundError:
                continue
        return os.open(os.devnull, os.O_RDONLY)  # no file: nothing to wait for

    def drop(self, entry: Entry) -> None:
        with self.index.transaction() as db:
            trash = files.to_trash(self.layout, entry.id)
            Index.drop(db, entry.id)
        files.empty(trash)

    def evict(self, prefix: str = "") -> list[Entry]:
        """Evict the entries under ``prefix`` (all: "") that are neither pinned nor in use,
        and partial ones whose filler is gone; the entries evicted."""
        pins = self.index.pins()
        gone: list[Entry] = []
        trash: list[Path] = []
        locked: list[int] = []
        try:
            with self.index.transaction() as db:
                for e in self.index.entries(prefix):
                    if pinned(e.url, pins):
                        continue
                    fd = self.take(e)
                    if fd is None:
                        continue
                    locked.append(fd)
                    trash.extend(files.to_trash(self.layout, e.id))
                    Index.drop(db, e.id)
                    gone.append(e)
            files.empty(trash)
        finally:
            for fd in locked:
                os.close(fd)
        return gone

    def verify(self) -> list[tuple[Entry, str]]:
        """Re-hash every complete entry; those whose bytes are not what was fetched are
        dropped. The entries found so, and what was wrong."""
        bad: list[tuple[Entry, str]] = []
        for e in self.index.entries():
            if e.state != "complete":
                continue
            try:
                found = rehash(str(self.layout.object(e.id)), e)
            except FileNotFoundError:
                found = "missing"
            if found != e.digest:
                problem = ("file missing" if found == "missing" else f"size {found[5:]} of "
                           f"{e.size}" if found.startswith("size ") else "digest mismatch")
                bad.append((e, problem))
                self.drop(e)
        return bad
