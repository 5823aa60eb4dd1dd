"""``Cache``: a node-local cache of remote objects, shared by every process that opens its
directory, bounded by a hard limit, safe across kill -9 (the layout, locks and commit order:
``files.py``, ``fill.py``; the index: ``index.py``; room and eviction: ``room.py``, ``space.py``).

The blocking API (``path``, ``open``, ``pin``) and the async one (``apath``) run on one event
loop of the cache's own, in a thread, where its stores live: a store is bound to the loop it
was first used on.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import io
import logging
import os
import threading
import time
from collections.abc import Coroutine, Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO, Literal, TypeVar

from ..config import StoreOptions, parse_duration, parse_size
from ..errors import CacheFull, NotFound, PreconditionFailed, UsageError
from ..events import CacheEvicted, CacheFetched, CacheServed, CacheUsage, Event, EventSink
from ..stores.base import ReadStore
from ..stores.registry import open_store, parse_url
from ..stores.resilience import Pacing, resilient
from ..types import MiB, ObjectInfo
from . import files
from .against import Recorded, target_of, verify_against
from .files import Layout
from .fill import Landed, fill
from .index import Entry, Index, pinned, version_of
from .reader import FillingReader
from .room import Room
from .space import Shortfall, charge, overhead

__all__ = ["Cache", "Validation", "object_url"]

log = logging.getLogger(__name__)
T = TypeVar("T")

ENV_DIR = "MCSYNC_CACHE_DIR"
PART_SIZE = 16 * MiB  # a range GET; a reader streaming while it fills waits for one at most
CONCURRENCY = 8  # parts of one object in flight
WAIT_POLL_S = 0.05  # how often a waiter looks whether the filler finished, or died


# Whether a store was used in this process, and whether it was forked after one was: obstore's
# runtime threads are not in a forked child, where a request would wait forever.
_FORK = {"used": False, "after_use": False}


def _forked() -> None:
    _FORK["after_use"] = _FORK["used"]


os.register_at_fork(after_in_child=_forked)


@dataclass(frozen=True, slots=True)
class Validation:
    """When a cached entry is checked against its store: ``never`` (no request at all),
    ``ttl`` (a HEAD at most every ``ttl_s`` per entry), ``always`` (a HEAD on every use)."""

    mode: Literal["never", "ttl", "always"]
    ttl_s: float = 0.0

    @classmethod
    def parse(cls, text: str) -> Validation:
        if text in ("never", "always"):
            return cls(text)  # type: ignore[arg-type]
        if text.startswith("ttl:"):
            return cls("ttl", parse_duration(text[4:]))
        raise UsageError(f"not a validation: {text!r} (never, always or ttl:DURATION, e.g. "
                         "ttl:60s)")

    def fresh(self, entry: Entry, now: float) -> bool:
        return self.mode == "never" or (self.mode == "ttl" and now - entry.checked_at < self.ttl_s)


def object_url(url: str) -> tuple[str, str, str]:
    """(the URL as the index keys it, its store's root, the key in that store) of an object's
    address; UsageError for an address that names no remote object."""
    loc = parse_url(url)
    if loc.scheme == "file":
        raise UsageError(f"{url}: the cache holds remote objects (s3://, meta://, gs://, "
                         "az://), not local files")
    key = url.split("://", 1)[1].partition("/")[2].lstrip("/")
    root = f"{loc.scheme}://{loc.bucket}/"
    return root + key, root, key


@dataclass(slots=True)
class CacheStats:
    """What this process's cache did (its metrics are the same figures, as events)."""

    hits: int = 0
    misses: int = 0
    bytes_fetched: int = 0
    evictions: int = 0


class Cache:
    """A cache directory, opened. ``max_size`` (bytes, or a size such as ``"50GiB"``) is
    recorded in the directory, and every process using it keeps the limit recorded last
    (read at each reservation); None: the recorded one, or none when none was given."""

    def __init__(self, cache_dir: str | os.PathLike[str] | None = None, *,
                 max_size: int | str | None = None, validate: str = "ttl:60s",
                 on_event: EventSink | None = None, options: StoreOptions | None = None,
                 part_size: int = PART_SIZE, concurrency: int = CONCURRENCY) -> None:
        where = cache_dir if cache_dir is not None else os.environ.get(ENV_DIR)
        if not where:
            raise UsageError(f"no cache directory: pass cache_dir or set {ENV_DIR}")
        self.validation = Validation.parse(validate)
        self.layout = Layout(Path(where))
        self.layout.make()
        self.index = Index(self.layout.index)
        self.room = Room(self.layout, self.index)
        if isinstance(max_size, str):
            max_size = parse_size(max_size)
        if max_size is not None:
            self.index.set_setting("max_size", str(max_size))
        self.max_size = self.room.limit()
        self.part_size = part_size
        self.concurrency = concurrency
        self.stats = CacheStats()
        self.next_use: Mapping[str, int] | None = None  # a known order of reads: Belady
        self._sink = on_event
        self.store_options = options or StoreOptions()
        self._pacing = Pacing()
        self._validate = validate
        self._closed = False
        self._start()

    def _start(self) -> None:
        """This process's loop, stores and tasks (again in a forked child: a data loader's
        worker, where the parent's loop thread and connections do not exist)."""
        self._pid = os.getpid()
        self._stores: dict[str, ReadStore] = {}
        self._tasks: set[asyncio.Task[Any]] = set()
        self._landed: dict[int, Landed] = {}  # entry id → its parts' bytes written, here
        self._loop = asyncio.new_event_loop()
        # Each part in flight drains its stream in a to_thread worker, and asyncio's default
        # pool can be smaller than one fill's parts: part 0 would wait for another to end
        # (first-byte figures: benchmarks/results/2026-12-05-cache.md).
        self._loop.set_default_executor(concurrent.futures.ThreadPoolExecutor(
            max(32, self.concurrency + 8), thread_name_prefix="mcsync-cache-io"))
        self._thread = threading.Thread(target=self._loop.run_forever, name="mcsync-cache",
                                        daemon=True)
        self._thread.start()

    def _here(self) -> None:
        if self._pid != os.getpid():
            self.index = Index(self.layout.index)  # the parent's connection is not ours
            self.room = Room(self.layout, self.index)
            self._start()

    def __reduce__(self) -> tuple[Any, ...]:
        """Sent to a spawned process (a data loader's worker), a cache is opened there anew
        on the same directory."""
        return (_reopen, (str(self.layout.root), self._validate, self.store_options,
                          self.part_size, self.concurrency))

    # -- the API ---------------------------------------------------------------------------

    def path(self, url: str) -> Path:
        """A complete local copy of ``url``, fetched if needed. A path is not held: it stays
        until its entry is evicted (least recently used first, so the latest last); ``open``
        holds its entry for as long as the file is open, ``pin`` until unpinned."""
        return self._run(self._path(url))

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run ``coro`` on the cache's loop (where its stores live) and wait for it."""
        return self._run(coro)

    async def apath(self, url: str) -> Path:
        return await asyncio.wrap_future(self._submit(self._path(url)))

    def open(self, url: str) -> BinaryIO:
        """``url`` as a readable binary file; while it fills, reads wait for their bytes."""
        raw = self._run(self._open(url))
        return io.BufferedReader(raw, buffer_size=1 << 20)

    def iter_safetensors(self, url: str, framework: Literal["np", "pt"] = "np",
                         ) -> Iterator[tuple[str, Any]]:
        """``(name, tensor)`` of a safetensors object, each as its bytes land (numpy arrays;
        torch's with ``framework="pt"``): ``safetensors.py``."""
        from .safetensors import iter_safetensors  # numpy (the cache extra) on first use

        return iter_safetensors(self.open, url, framework)

    def load_safetensors(self, url: str, framework: Literal["np", "pt"] = "np",
                         ) -> dict[str, Any]:
        return dict(self.iter_safetensors(url, framework))

    def prefetch(self, urls: Iterable[str]) -> concurrent.futures.Future[list[Path]]:
        """Start fetching ``urls`` in the background (four at a time); the future is done
        when all are."""
        return self._submit(self._prefetch(list(urls)))

    def pin(self, url_or_prefix: str) -> int:
        """Keep ``url_or_prefix`` (an object, or every object under a prefix ending in ``/``)
        in the cache, fetching what is missing; never evicted until unpinned. Raises
        CacheFull at once, with the numbers, when the pinned objects cannot all fit. Returns
        the number of objects pinned."""
        return self._run(self._pin(url_or_prefix))

    def objects(self, address: str) -> list[tuple[str, ObjectInfo]]:
        """The objects an address names at its store (a request: nothing is cached): every
        one under it when it ends with ``/``, else the one object."""
        return self._run(self._objects_under(address))

    def unpin(self, url_or_prefix: str) -> bool:
        self._here()
        norm = self._prefix_of(url_or_prefix)
        return self.index.unpin(norm)

    def entries(self, prefix: str = "") -> list[Entry]:
        self._here()
        return self.index.entries(self._prefix_of(prefix) if prefix else "")

    def in_use(self) -> int:
        self._here()
        return self.index.totals()[0]

    def evict(self, prefix: str = "") -> list[Entry]:
        """Evict the entries under ``prefix`` (all: "") that are neither pinned nor open,
        and partial ones whose filler is gone; the entries evicted."""
        self._here()
        gone = self.room.evict(self._prefix_of(prefix) if prefix else "")
        for e in gone:
            self._evicted(e.url, e.charge)
        return gone

    def verify(self, against: Recorded | None = None) -> list[tuple[Entry, str]]:
        """Re-hash every complete entry; those whose bytes are not what was fetched are
        dropped. The entries found so, and what was wrong. ``against``: the records mcsync
        keeps at a target (``mcsync.run.target_manifests``): the entries under it are compared
        with the chunk hashes recorded when their objects were written there
        (``against.py``)."""
        self._here()
        if against is not None:
            return verify_against(self.entries(target_of(against)), self.layout, against,
                                  self.room.drop).bad
        return self.room.verify()

    def close(self) -> None:
        if self._closed:
            return
        self._here()  # a forked child closes its own loop, not the parent's
        try:
            self._run(self._aclose())
        finally:
            self._closed = True
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join()
            self._loop.close()
            self.index.close()

    def __enter__(self) -> Cache:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- on the cache's loop ---------------------------------------------------------------

    def _submit(self, coro: Coroutine[Any, Any, T]) -> concurrent.futures.Future[T]:
        if self._closed:
            coro.close()
            raise UsageError("the cache is closed")
        self._here()
        return asyncio.run_coroutine_threadsafe(coro, self._loop)

    def _run(self, coro: Coroutine[Any, Any, T]) -> T:
        return self._submit(coro).result()

    async def _aclose(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        for store in self._stores.values():
            await store.aclose()

    def store_for(self, root: str) -> ReadStore:
        if _FORK["after_use"]:
            raise UsageError("this process was forked from one whose cache had used its "
                             "stores, and their client's runtime does not survive a fork: "
                             "start workers by spawn or forkserver (a torch DataLoader's "
                             "multiprocessing_context), or fork before the first use")
        _FORK["used"] = True
        if root not in self._stores:
            self._stores[root] = resilient(open_store(root, self.store_options), self._pacing)
        return self._stores[root]

    async def _path(self, url: str) -> Path:
        while True:
            entry = await self.obtain(url)
            path = self.layout.object(entry.id)
            if path.exists():
                return path
            # evicted between its fill and now: fetch it again

    async def _open(self, url: str) -> io.RawIOBase:
        loop = asyncio.get_running_loop()
        first: asyncio.Future[Entry] = loop.create_future()

        def seen(entry: Entry) -> None:
            if not first.done():
                first.set_result(entry)

        task = self._spawn(self.obtain(url, on_filling=seen))
        await asyncio.wait([first, task], return_when=asyncio.FIRST_COMPLETED)
        if task.done():
            entry = task.result()
            fd = await asyncio.to_thread(files.open_shared, self.layout.object(entry.id))
            if fd is None:
                return await self._open(url)
            return FillingReader(fd, entry, self.index, None)
        entry = first.result()
        fd = None
        for path in (self.layout.partial(entry.id), self.layout.object(entry.id)):
            try:
                fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
                break
            except FileNotFoundError:
                continue
        if fd is None:  # dropped or done meanwhile: wait for the fill and read the result
            entry = await task
            found = await asyncio.to_thread(files.open_shared, self.layout.object(entry.id))
            if found is None:
                return await self._open(url)
            fd = found
        done: concurrent.futures.Future[Any] = concurrent.futures.Future()

        def finished(t: asyncio.Task[Entry]) -> None:
            if t.cancelled():
                done.set_exception(UsageError(f"{url}: the cache was closed while it filled"))
            elif (exc := t.exception()) is not None:
                done.set_exception(exc)
            else:
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

    async def _prefetch(self, urls: list[str]) -> list[Path]:
        slots = asyncio.Semaphore(4)

        async def one(url: str) -> Path:
            async with slots:
                return await self._path(url)

        return list(await asyncio.gather(*(one(u) for u in urls)))

    async def obtain(self, url: str, info: ObjectInfo | None = None, *,
                     warmed_by: str | None = None, protect: str | None = None,
                     on_filling: Any = None) -> Entry:
        """The complete entry of ``url`` (of version ``info`` when given: a listing's),
        fetched, taken over from a filler that died, or waited for. ``warmed_by`` marks it
        as a warm's; ``protect``: no entry that warm marked is evicted for it."""
        norm, root, key = object_url(url)
        store = self.store_for(root)
        # A cached entry validation trusts is served as it is, even against a listing of
        # another version (warm --validate never)
        latest = self.index.newest_complete(norm)
        if latest is not None and self.validation.fresh(latest, time.time()) and \
                self.layout.object(latest.id).exists():
            self.index.touch(latest.id, checked=False, warmed_by=warmed_by)
            self._served(latest, hit=True)
            return latest
        if info is None:
            info = await store.head(key)
        hit = True
        while True:
            entry = self.index.find(norm, version_of(info))
            fd: int | None
            if entry is None:
                got = self._reserve(norm, info, warmed_by, protect)
                if got is None:
                    continue  # another process made it meanwhile
                entry, fd = got
            elif entry.state == "complete":
                if not self.layout.object(entry.id).exists():
                    self._drop(entry)  # a crash between an eviction's unlink and its commit
                    continue
                self.index.touch(entry.id, checked=True, warmed_by=warmed_by)
                self._served(entry, hit=hit)
                return entry
            else:
                fd, made = files.holder_gone(self.layout, entry.id)
                now = self.index.get(entry.id) if fd is not None else entry
                if fd is not None and (now is None or now.state == "complete"):
                    os.close(fd)
                    if now is None:
                        self.layout.partial(entry.id).unlink(missing_ok=True)
                    continue
                if fd is not None and made:
                    self.index.forget_parts(entry.id)  # their bytes are gone with the file
                if fd is None:
                    hit = False
                    if on_filling is not None:
                        on_filling(entry)
                    await asyncio.sleep(WAIT_POLL_S)
                    continue
                log.info("%s: taking over a fill its filler left (%d of %d parts done)", norm,
                         len(self.index.parts_done(entry.id)), entry.parts)
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
                self._drop(entry)
                info = await store.head(key)
                continue
            finally:
                os.close(fd)
                self._landed.pop(entry.id, None)
            done = self.index.get(entry.id)
            assert done is not None and done.state == "complete"
            if warmed_by is not None:
                self.index.touch(done.id, checked=True, warmed_by=warmed_by)
            self._served(done, hit=False)
            return done

    async def _pin(self, target: str) -> int:
        norm = self._prefix_of(target)
        infos = await self._objects_under(target)
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

    # -- space -----------------------------------------------------------------------------

    def _reserve(self, url: str, info: ObjectInfo, warmed_by: str | None,
                 protect: str | None) -> tuple[Entry, int] | None:
        got = self.room.reserve(url, info, self.part_size, warmed_by=warmed_by,
                                protect=protect, next_use=self.next_use)
        if got is None:
            return None
        self.max_size = got.limit
        for c in got.evicted:
            self._evicted(c.url, c.charge)
        self.emit(CacheUsage(got.in_use, got.limit))
        return got.entry, got.fd

    def _drop(self, entry: Entry) -> None:
        self.room.drop(entry)

    def _prefix_of(self, target: str) -> str:
        return object_url(target)[0]

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


def _reopen(cache_dir: str, validate: str, options: StoreOptions, part_size: int,
            concurrency: int) -> Cache:
    return Cache(cache_dir, validate=validate, options=options, part_size=part_size,
                 concurrency=concurrency)
