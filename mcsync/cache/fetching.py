"""The part of ``Cache`` that runs on its loop: an entry obtained (served, waited for while
another process fills it, taken over from a filler that died, or reserved and filled), held
when it is handed out; room waited for; readers opened while an entry fills; prefetch and
pins; the events.

Index and room work runs in worker threads (``asyncio.to_thread``): a reservation may wait
for another process's transaction, and the loop serves every fill of this process meanwhile.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import io
import logging
import os
import time
from collections.abc import Coroutine, Iterable, Mapping
from pathlib import Path
from typing import Any, TypeVar

from ..errors import CacheFull, NotFound, PreconditionFailed, UsageError
from ..events import CacheEvicted, CacheFetched, CacheServed, CacheUsage, Event, EventSink
from ..stores.base import ReadStore
from ..stores.registry import open_store
from ..stores.resilience import Pacing
from ..types import ObjectInfo
from . import files
from .files import Layout
from .fill import Landed, fill
from .holds import Holds, Recency
from .index import Entry, Index, pinned, version_of
from .order import NextUse
from .reader import FillingReader
from .room import Room
from .space import Shortfall, charge, overhead
from .terms import CacheStats, Validation, object_url

log = logging.getLogger(__name__)
T = TypeVar("T")

WAIT_POLL_S = 0.05  # how often a waiter looks whether the filler finished, or died
WAIT_MAX_PAUSE_S = 0.5  # the longest pause between two tries of a fill waiting for room
PREFETCH_WINDOW = 4  # objects a prefetch fetches at once

Held = tuple[Entry, int]  # an entry and a descriptor holding LOCK_SH on its file


class Fetching:
    """What ``Cache`` sets up (``cache.py``)."""

    layout: Layout
    index: Index
    room: Room
    holds: Holds
    recency: Recency
    validation: Validation
    stats: CacheStats
    store_options: Any
    part_size: int
    concurrency: int
    wait: float
    max_size: int
    next_use: Mapping[str, int] | None
    _sink: EventSink | None
    _pacing: Pacing
    _order: NextUse | None
    _tasks: set[asyncio.Task[Any]]
    _landed: dict[int, Landed]
    _fill_fds: set[int]

    def store_for(self, root: str) -> ReadStore:
        raise NotImplementedError

    # -- hits ------------------------------------------------------------------------------

    def _fresh(self, entry: Entry) -> bool:
        return self.validation.fresh(entry, time.time(), self.recency.checked_at(entry))

    def _hit(self, norm: str, warmed_by: str | None = None) -> Held | None:
        """The complete entry of ``norm`` validation trusts as it is (even against a listing
        of another version: warm --validate never), held; None when there is none. An index
        read and a lock: nothing written (``holds.Recency``)."""
        latest = self.index.newest_complete(norm)
        if latest is None or not self._fresh(latest):
            return None
        fd = files.open_shared(self.layout.object(latest.id))
        if fd is None:
            return None
        self._used(latest, checked=False, warmed_by=warmed_by)
        self._served(latest, hit=True)
        return latest, fd

    def _used(self, entry: Entry, *, checked: bool, warmed_by: str | None) -> None:
        if warmed_by is not None:  # a warm's protection reads it: written now
            self.index.touch(entry.id, checked=checked, warmed_by=warmed_by)
        else:
            self.recency.touch(entry.id, checked=checked)

    # -- obtaining -------------------------------------------------------------------------

    async def obtain(self, url: str, info: ObjectInfo | None = None, *,
                     warmed_by: str | None = None, protect: str | None = None) -> Entry:
        """The complete entry of ``url`` (of version ``info`` when given: a listing's),
        fetched, taken over from a filler that died, or waited for; not held. ``warmed_by``
        marks it as a warm's; ``protect``: no entry that warm marked is evicted for it."""
        entry, fd = await self._obtain(url, info, warmed_by=warmed_by, protect=protect)
        os.close(fd)
        return entry

    async def _obtain(self, url: str, info: ObjectInfo | None = None, *,
                      warmed_by: str | None = None, protect: str | None = None,
                      on_filling: Any = None) -> Held:
        """``obtain``, the entry held (the caller closes the descriptor)."""
        norm, root, key = object_url(url)
        store = self.store_for(root)
        got = await asyncio.to_thread(self._hit, norm, warmed_by)
        if got is not None:
            return got
        if info is None:
            info = await store.head(key)
        hit = True
        while True:
            entry = await asyncio.to_thread(self.index.find, norm, version_of(info))
            fd: int | None
            if entry is None:
                made = await self._reserve(norm, info, warmed_by, protect)
                if made is None:
                    continue  # another process made it meanwhile
                entry, fd = made
            elif entry.state == "complete":
                fd = await asyncio.to_thread(files.open_shared, self.layout.object(entry.id))
                if fd is None:
                    now = await asyncio.to_thread(self.index.get, entry.id)
                    if now is not None and now.state == "complete":
                        # its file gone, the entry not: a crash inside an eviction
                        await asyncio.to_thread(self.room.drop, now)
                    continue  # evicted meanwhile: fetch it again
                await asyncio.to_thread(self._used, entry, checked=True, warmed_by=warmed_by)
                self._served(entry, hit=hit)
                return entry, fd
            else:
                fd, made_file = await asyncio.to_thread(files.holder_gone, self.layout,
                                                        entry.id)
                now = await asyncio.to_thread(self.index.get, entry.id) if fd is not None \
                    else entry
                if fd is not None and (now is None or now.state == "complete"):
                    os.close(fd)
                    if now is None:
                        self.layout.partial(entry.id).unlink(missing_ok=True)
                    continue
                if fd is None:
                    hit = False
                    if on_filling is not None:
                        on_filling(entry)
                    await asyncio.sleep(WAIT_POLL_S)
                    continue
                self._fill_fds.add(fd)
                if made_file:  # their bytes are gone with the file
                    await asyncio.to_thread(self.index.forget_parts, entry.id)
                log.info("%s: taking over a fill its filler left (%d of %d parts done)", norm,
                         len(await asyncio.to_thread(self.index.parts_done, entry.id)),
                         entry.parts)
            hit = False
            if on_filling is not None:
                on_filling(entry)
            landed = self._landed.setdefault(entry.id, {})
            try:
                await fill(store, key, entry, fd, self.index, self.layout,
                           concurrency=self.concurrency, policy=self._pacing.policy,
                           on_bytes=functools.partial(self._fetched, norm), landed=landed)
            except PreconditionFailed:
                # changed at the source: this entry's bytes are of a version no longer
                # current; it goes, and the new version is a new entry
                self._let_go(fd)
                await asyncio.to_thread(self.room.drop, entry)
                info = await store.head(key)
                continue
            except BaseException:
                self._let_go(fd)
                raise
            finally:
                self._landed.pop(entry.id, None)
            self._fill_fds.discard(fd)
            # The filler's lock becomes a hold: the path it hands out is held from the start
            held = await asyncio.to_thread(files.downgrade, fd)
            done = await asyncio.to_thread(self.index.get, entry.id)
            if held is None or done is None or done.state != "complete":
                if held is not None:
                    os.close(held)
                continue  # evicted (or dropped) the instant it was complete: again
            if warmed_by is not None:
                await asyncio.to_thread(self.index.touch, done.id, checked=True,
                                        warmed_by=warmed_by)
            self._served(done, hit=False)
            return done, held

    def _let_go(self, fd: int) -> None:
        self._fill_fds.discard(fd)
        os.close(fd)

    async def _reserve(self, url: str, info: ObjectInfo, warmed_by: str | None,
                       protect: str | None) -> Held | None:
        """A filling entry with room for ``info``, its file locked; None when another
        process made it meanwhile. Without room: this process's own implicit holds are
        released, oldest first, then other processes' are waited for (``wait`` seconds),
        then CacheFull."""
        started: float | None = None
        pause = WAIT_POLL_S
        order = await asyncio.to_thread(self._belady)
        while True:
            touches = self.recency.take()
            try:
                got = await asyncio.to_thread(
                    self.room.reserve, url, info, self.part_size, warmed_by=warmed_by,
                    protect=protect, order=order, touches=touches)
            except CacheFull as exc:
                self.recency.restore(touches)
                if self.holds.release_oldest_implicit():
                    continue
                now = time.monotonic()
                started = now if started is None else started
                left = self.wait - (now - started)
                if left <= 0:
                    if self.wait:
                        raise CacheFull(f"{exc} (after waiting {self.wait:g} s for held "
                                        "entries to be released)") from None
                    raise
                await asyncio.sleep(min(pause, left))
                pause = min(2 * pause, WAIT_MAX_PAUSE_S)
                continue
            except BaseException:
                self.recency.restore(touches)
                raise
            if got is None:
                return None
            self._fill_fds.add(got.fd)
            self.max_size = got.limit
            for c in got.evicted:
                self._evicted(c.url, c.charge)
            self.emit(CacheUsage(got.in_use, got.limit))
            return got.entry, got.fd

    def _belady(self) -> NextUse | None:
        """Belady's order of the known order of reads, built once for it."""
        if self.next_use is None:
            self._order = None
        elif self._order is None or self._order.next_use is not self.next_use:
            self._order = NextUse(self.next_use, self.index.by_last_use)
        return self._order

    # -- readers, prefetch, pins -----------------------------------------------------------

    async def _open(self, url: str) -> io.RawIOBase:
        loop = asyncio.get_running_loop()
        first: asyncio.Future[Entry] = loop.create_future()

        def seen(entry: Entry) -> None:
            if not first.done():
                first.set_result(entry)

        task = self._spawn(self._obtain(url, on_filling=seen))
        either: list[asyncio.Future[Any]] = [first, task]
        await asyncio.wait(either, return_when=asyncio.FIRST_COMPLETED)
        if task.done():
            entry, held = task.result()
            return FillingReader(held, entry, self.index, None)
        entry = first.result()
        fd: int | None = None
        for path in (self.layout.partial(entry.id), self.layout.object(entry.id)):
            try:
                fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
                break
            except FileNotFoundError:
                continue
        if fd is None:  # dropped or done meanwhile: wait for the fill and read the result
            entry, fd = await task
            return FillingReader(fd, entry, self.index, None)
        done: concurrent.futures.Future[Any] = concurrent.futures.Future()

        def finished(t: asyncio.Task[Held]) -> None:
            if t.cancelled():
                done.set_exception(UsageError(f"{url}: the cache was closed while it filled"))
            elif (exc := t.exception()) is not None:
                done.set_exception(exc)
            else:
                os.close(t.result()[1])  # the reader holds its own descriptor
                done.set_result(None)

        task.add_done_callback(finished)
        return FillingReader(fd, entry, self.index, done,
                             functools.partial(self._landed_of, entry.id))

    def _landed_of(self, entry_id: int, part: int) -> int:
        return self._landed.get(entry_id, {}).get(part, 0)

    def _spawn(self, coro: Coroutine[Any, Any, T]) -> asyncio.Task[T]:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    async def _prefetch(self, urls: Iterable[str]) -> list[Path]:
        """Each URL obtained, ``PREFETCH_WINDOW`` at a time, the iterable read as they go."""
        slots = asyncio.Semaphore(PREFETCH_WINDOW)
        paths: dict[int, Path] = {}

        async def one(i: int, url: str) -> None:
            try:
                paths[i] = self.layout.object((await self.obtain(url)).id)
            finally:
                slots.release()

        count = 0
        async with asyncio.TaskGroup() as group:
            for url in urls:
                await slots.acquire()
                group.create_task(one(count, url))
                count += 1
        return [paths[i] for i in range(count)]

    async def _pin(self, target: str) -> int:
        norm = object_url(target)[0]
        infos = await self._objects_under(target)

        def check() -> None:
            mine, pins = {url for url, _ in infos}, self.index.pins()
            others = sum(e.charge for e in self.index.entries()
                         if pinned(e.url, pins) and e.url not in mine)
            need = sum(charge(i.size) for _, i in infos)
            _, count = self.index.totals()
            extra = overhead(self.layout.index_bytes(), count + len(infos))
            self.max_size = self.room.limit()
            if self.max_size and need + others + extra > self.max_size:
                raise CacheFull(Shortfall(need, self.max_size, others, extra, None,
                                          "pinned already").message(
                    f"pin {norm} ({len(infos)} objects)"))
            self.index.pin(norm)

        await asyncio.to_thread(check)
        for url, info in infos:
            await self.obtain(url, info)
        return len(infos)

    async def _objects_under(self, target: str) -> list[tuple[str, ObjectInfo]]:
        """The objects an address names: every one under it when it ends with ``/``, else
        the one object."""
        norm, root, key = object_url(target)
        if key and not key.endswith("/"):
            try:
                return [(norm, await self.store_for(root).head(key))]
            except NotFound:
                raise NotFound(f"{norm}: no such object (a prefix ends with /)") from None
        lister = open_store(norm, self.store_options)
        try:
            return [(norm + i.key, i) async for i in lister.list()]
        finally:
            await lister.aclose()

    # -- events ----------------------------------------------------------------------------

    def emit(self, event: Event) -> None:
        if self._sink is not None:
            self._sink.emit(event)

    def _served(self, entry: Entry, *, hit: bool) -> None:
        if hit:
            self.stats.hits += 1
        else:
            self.stats.misses += 1
        self.emit(CacheServed(entry.url, entry.size, hit))

    def _fetched(self, url: str, nbytes: int) -> None:
        self.stats.bytes_fetched += nbytes
        self.emit(CacheFetched(url, nbytes))

    def _evicted(self, url: str, size: int) -> None:
        self.stats.evictions += 1
        self.emit(CacheEvicted(url, size))
